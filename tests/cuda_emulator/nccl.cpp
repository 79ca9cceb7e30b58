// nccl.cpp — the emulated NCCL behind include/nccl.h (docs/testing.md, "The emulated GPU").
//
// A communicator is a directory (under /dev/shm) that its ranks, processes of one machine, share.
// A message is a file there, named by its channel, sender, receiver and sequence number, written
// under a temporary name and renamed, so it appears whole; its receiver reads and removes it. An
// operation takes its sequence numbers when it is called (NCCL's rule: every rank calls a
// communicator's collectives in the same order, and a peer's sends and receives pair in order) and
// runs on its stream in steps: the first step posts its messages, every step takes those that have
// arrived, and the last combines them, so a stream that waits for a peer holds up no other stream.
// A reduction adds the ranks' contributions in rank order, so every rank gets the same bits.
//
// What NCCL's non-blocking communicators do is kept: creating or splitting one is in progress until
// every rank has taken part, the first message between two ranks is in progress until both have
// posted one (NCCL connects them then), and while a communicator is in progress no call but
// ncclCommGetAsyncError and ncclCommAbort may use it. An aborted communicator's operations end at
// their next step without landing.
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <cuda_bf16.h>

namespace {

namespace fs = std::filesystem;
namespace emu = piper::cuda_emulator;

constexpr double kJoinLimitS = 300;  // a blocking creation or split that waits longer fails
constexpr char kIdPrefix[] = "piper-nccl-";

[[noreturn]] void fault(const std::string& what) {
  std::fprintf(stderr, "piper cuda emulator: NCCL: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// ---- messages: files in the communicator's directory --------------------------------------------

fs::path root() {
  std::error_code ec;
  return fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
}

void put(const fs::path& dir, const std::string& name, const void* data, size_t bytes) {
  const fs::path tmp = dir / (".tmp-" + name), path = dir / name;
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f || (bytes && std::fwrite(data, 1, bytes, f) != bytes) || std::fclose(f) != 0)
    fault("cannot write " + tmp.string() + ": " + std::strerror(errno));
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fault("cannot rename " + tmp.string() + " to " + path.string() + ": " + ec.message());
}

// Reads and removes the message at `path`; false while it has not arrived.
bool take(const fs::path& path, std::vector<unsigned char>& out) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  out.clear();
  unsigned char buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.insert(out.end(), buf, buf + n);
  std::fclose(f);
  std::error_code ec;
  fs::remove(path, ec);
  return true;
}

bool present(const fs::path& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

// ---- communicators ----------------------------------------------------------------------------------

enum Channel { kCollective, kPointToPoint };
const char kChannelName[] = {'a', 'p'};

struct Group {  // a communicator's state, shared with its queued operations
  fs::path dir;
  int rank = 0, size = 1;
  enum Phase { kJoining, kSplitting, kReady, kFinalizing } phase = kJoining;
  bool aborted = false;
  std::string last_error;
  std::vector<uint64_t> sent[2], received[2];  // per channel and peer: messages numbered so far
  std::set<int> connecting, connected;          // point-to-point peers
  int splits = 0;                               // splits made of it, numbering their files
  int queued = 0;                               // operations on streams, not yet done
  // A split in progress: the parent's directory and size, this rank there, the split's number, its colour.
  fs::path parent_dir;
  int parent_rank = 0, parent_size = 0, split = 0, color = 0;

  // The files in `dir`: a message; a rank's joining, leaving and part in split k; a rank's first message to a peer.
  std::string message(Channel c, int from, int to, uint64_t seq) const {
    return std::string(1, kChannelName[c]) + "." + std::to_string(from) + "." + std::to_string(to) + "." +
           std::to_string(seq);
  }
  static std::string joined(int r) { return "j." + std::to_string(r); }
  static std::string left(int r) { return "x." + std::to_string(r); }
  static std::string split_part(int k, int r) { return "s" + std::to_string(k) + "." + std::to_string(r); }
  static std::string connection(int from, int to) { return "c." + std::to_string(from) + "." + std::to_string(to); }
  void sized(int n) {
    size = n;
    for (int c = 0; c < 2; ++c) sent[c].assign(static_cast<size_t>(n), 0), received[c].assign(static_cast<size_t>(n), 0);
  }
};

}  // namespace

struct ncclComm {
  std::shared_ptr<Group> group;
};

namespace {

std::mutex state_lock;  // every Group; never held while calling the device (its steps take it)

// Moves a communicator's asynchronous work on as far as it goes without waiting; its state after it.
ncclResult_t advance(Group& g) {
  if (g.phase == Group::kJoining) {
    for (int r = 0; r < g.size; ++r)
      if (!present(g.dir / Group::joined(r))) return ncclInProgress;
    g.phase = Group::kReady;
  }
  if (g.phase == Group::kSplitting) {
    std::vector<std::pair<int, int>> members;  // (key, parent rank) of this colour
    for (int r = 0; r < g.parent_size; ++r) {
      const fs::path f = g.parent_dir / Group::split_part(g.split, r);
      std::FILE* in = std::fopen(f.c_str(), "rb");
      if (!in) return ncclInProgress;
      int ck[2] = {0, 0};
      const size_t got = std::fread(ck, sizeof(int), 2, in);
      std::fclose(in);
      if (got != 2) return ncclInProgress;  // being written
      if (ck[0] == g.color) members.emplace_back(ck[1], r);
    }
    std::sort(members.begin(), members.end());
    g.sized(static_cast<int>(members.size()));
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i].second == g.parent_rank) g.rank = static_cast<int>(i);
    g.dir = g.parent_dir.string() + "-s" + std::to_string(g.split) + "c" + std::to_string(g.color);
    std::error_code ec;
    fs::create_directories(g.dir, ec);
    g.phase = Group::kReady;
  }
  for (auto it = g.connecting.begin(); it != g.connecting.end();) {
    if (!present(g.dir / Group::connection(*it, g.rank))) {
      ++it;
      continue;
    }
    g.connected.insert(*it);
    it = g.connecting.erase(it);
  }
  if (!g.connecting.empty()) return ncclInProgress;
  if (g.phase == Group::kFinalizing) return g.queued == 0 ? ncclSuccess : ncclInProgress;
  return ncclSuccess;
}

ncclResult_t usage(Group& g, std::string why) {
  g.last_error = std::move(why);
  return ncclInvalidUsage;
}

ncclResult_t invalid(Group* g, std::string why) {
  if (g) g->last_error = std::move(why);
  return ncclInvalidArgument;
}

// A blocking call (config->blocking != 0) waits for what it started.
ncclResult_t settle(ncclComm_t comm, const ncclConfig_t* config, ncclResult_t rc) {
  if (rc != ncclInProgress || (config && config->blocking == 0)) return rc;
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    {
      std::lock_guard<std::mutex> hold(state_lock);
      rc = advance(*comm->group);
    }
    if (rc != ncclInProgress) return rc;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > kJoinLimitS) {
      std::lock_guard<std::mutex> hold(state_lock);
      comm->group->last_error = "the other ranks did not join within " + std::to_string(int(kJoinLimitS)) + " s";
      return ncclSystemError;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// Leaves the directory; the last rank to leave removes it.
void leave(Group& g) {
  if (g.phase == Group::kSplitting || g.dir.empty()) return;
  put(g.dir, Group::left(g.rank), nullptr, 0);
  for (int r = 0; r < g.size; ++r)
    if (!present(g.dir / Group::left(r))) return;
  std::error_code ec;
  fs::remove_all(g.dir, ec);
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
  }
  return 0;
}

// ---- operations ---------------------------------------------------------------------------------------

struct Out {  // a message this rank sends
  Channel channel;
  int peer;
  uint64_t seq;
  const void* from;
  size_t bytes;
};
struct In {  // a message this rank receives
  Channel channel;
  int peer;
  uint64_t seq;
  size_t bytes;
  void* to;  // where it lands as it is (nullptr: the operation's finish combines it)
  std::vector<unsigned char> data;
  bool arrived = false;
};

struct Operation {
  std::shared_ptr<Group> group;
  std::string what;
  std::vector<Out> out;
  std::vector<In> in;
  std::function<void(Operation&)> finish;  // once every message is in
  bool posted = false;

  // One step on its stream: true once done (or once its communicator is aborted).
  bool step() {
    std::lock_guard<std::mutex> hold(state_lock);
    Group& g = *group;
    if (g.aborted) return true;
    if (!posted) {
      for (const Out& o : out) put(g.dir, g.message(o.channel, g.rank, o.peer, o.seq), o.from, o.bytes);
      posted = true;
    }
    bool all = true;
    for (In& i : in) {
      if (i.arrived) continue;
      if (!take(g.dir / g.message(i.channel, i.peer, g.rank, i.seq), i.data)) {
        all = false;
        continue;
      }
      if (i.data.size() != i.bytes)
        fault(what + " on rank " + std::to_string(g.rank) + " of " + g.dir.string() + ": rank " +
              std::to_string(i.peer) + " sent " + std::to_string(i.data.size()) + " bytes where " +
              std::to_string(i.bytes) + " were expected (the ranks' counts differ)");
      if (i.to && i.bytes) std::memcpy(i.to, i.data.data(), i.bytes);
      i.arrived = true;
    }
    if (!all) return false;
    if (finish) finish(*this);
    --g.queued;
    return true;
  }
};

// Numbers a message to or from `peer` on `channel`; a point-to-point peer not yet connected starts
// connecting (the communicator is in progress until the peer posts to this rank too).
uint64_t number(Group& g, Channel c, int peer, bool sending) {
  if (c == kPointToPoint && peer != g.rank && !g.connected.count(peer) && !g.connecting.count(peer)) {
    put(g.dir, Group::connection(g.rank, peer), nullptr, 0);
    g.connecting.insert(peer);
  }
  return (sending ? g.sent : g.received)[c][static_cast<size_t>(peer)]++;
}

// The operations of an ncclGroupStart / ncclGroupEnd, queued at the end as one.
thread_local int group_depth = 0;
thread_local std::unique_ptr<Operation> grouped;
thread_local cudaStream_t grouped_stream = nullptr;

// Checks a call's communicator (under state_lock); an empty string when it serves.
std::string refusal(ncclComm_t comm) {
  if (!comm || !comm->group) return "no communicator";
  const Group& g = *comm->group;
  if (g.aborted) return "the communicator is aborted";
  if (g.phase != Group::kReady) return "the communicator is not ready (its creation or split is in progress)";
  if (group_depth == 0 && !g.connecting.empty())
    return "a call while the communicator's previous call is in progress (a non-blocking communicator takes "
           "no call but ncclCommGetAsyncError until it has settled)";
  return "";
}

// Queues `op` on `stream` (or adds it to the open group), under state_lock; in progress while a peer connects.
ncclResult_t submit(cudaStream_t stream, std::unique_ptr<Operation> op) {
  Group& g = *op->group;
  if (group_depth > 0) {
    if (grouped && (grouped->group != op->group || grouped_stream != stream))
      fault("one ncclGroupStart/ncclGroupEnd holds operations of two communicators or streams, which piper "
            "never does and this emulation does not take");
    if (!grouped) {
      grouped = std::move(op);
      grouped_stream = stream;
      return ncclSuccess;
    }
    for (Out& o : op->out) grouped->out.push_back(o);
    for (In& i : op->in) grouped->in.push_back(std::move(i));
    grouped->what += ", " + op->what;
    return ncclSuccess;
  }
  ++g.queued;
  std::shared_ptr<Operation> queued(std::move(op));
  const std::string what = queued->what + " on rank " + std::to_string(g.rank) + " of " + g.dir.string();
  const bool connecting = !g.connecting.empty();
  state_lock.unlock();  // the device's lock comes first
  emu::enqueue_steps(stream, what, [queued] { return queued->step(); });
  state_lock.lock();
  return connecting ? ncclInProgress : ncclSuccess;
}

std::string described(const char* name, size_t count, ncclDataType_t t) {
  return std::string(name) + " of " + std::to_string(count) + " elements of " + std::to_string(type_size(t)) + " bytes";
}

float value(const unsigned char* p, ncclDataType_t t) {
  if (t == ncclFloat32) {
    float v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  __nv_bfloat16 v;
  std::memcpy(&v, p, sizeof v);
  return __bfloat162float(v);
}
void store(unsigned char* p, float v, ncclDataType_t t) {
  if (t == ncclFloat32) {
    std::memcpy(p, &v, sizeof v);
    return;
  }
  const __nv_bfloat16 b = __float2bfloat16(v);
  std::memcpy(p, &b, sizeof b);
}

// The sum (f32 or bf16, accumulated in f32) of `count` elements from each rank, in rank order, into `to`.
void sum_in_rank_order(const std::vector<const unsigned char*>& by_rank, size_t count, ncclDataType_t t, void* to) {
  const size_t e = type_size(t);
  auto* out = static_cast<unsigned char*>(to);
  std::vector<float> acc(count, 0.f);
  for (const unsigned char* r : by_rank)
    for (size_t i = 0; i < count; ++i) acc[i] += value(r + i * e, t);
  for (size_t i = 0; i < count; ++i) store(out + i * e, acc[i], t);
}

// A collective's messages, `bytes` each way between this rank and every other: `chunk(peer)` is what goes to peer.
void exchange(Group& g, Operation& op, const std::function<const void*(int)>& chunk, size_t bytes) {
  for (int p = 0; p < g.size; ++p) {
    if (p == g.rank) continue;
    op.out.push_back(Out{kCollective, p, number(g, kCollective, p, true), chunk(p), bytes});
    op.in.push_back(In{kCollective, p, number(g, kCollective, p, false), bytes, nullptr, {}, false});
  }
}

// A finished collective's contributions in rank order: `own` for this rank, each peer's message for the others.
std::vector<const unsigned char*> by_rank(const Operation& op, const void* own) {
  std::vector<const unsigned char*> all(static_cast<size_t>(op.group->size), nullptr);
  all[static_cast<size_t>(op.group->rank)] = static_cast<const unsigned char*>(own);
  for (const In& i : op.in) all[static_cast<size_t>(i.peer)] = i.data.data();
  return all;
}

// The ranks' `bytes` each, in rank order, into `to`.
void place_in_rank_order(const std::vector<const unsigned char*>& by_rank, size_t bytes, void* to) {
  auto* out = static_cast<unsigned char*>(to);
  for (size_t r = 0; r < by_rank.size(); ++r) std::memmove(out + r * bytes, by_rank[r], bytes);
}

}  // namespace

// ---- the API ------------------------------------------------------------------------------------------

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  static thread_local std::string last;
  std::lock_guard<std::mutex> hold(state_lock);
  last = comm && comm->group ? comm->group->last_error : "";
  return last.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::random_device device;
  std::mt19937_64 random((uint64_t(device()) << 32) ^ device() ^ uint64_t(getpid()));
  char name[64];
  std::snprintf(name, sizeof name, "%s%016llx", kIdPrefix, static_cast<unsigned long long>(random()));
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, name, std::strlen(name));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  id.internal[NCCL_UNIQUE_ID_BYTES - 1] = 0;
  if (nranks < 1 || rank < 0 || rank >= nranks || std::strncmp(id.internal, kIdPrefix, std::strlen(kIdPrefix)) != 0)
    return ncclInvalidArgument;
  auto g = std::make_shared<Group>();
  g->dir = root() / id.internal;
  g->rank = rank;
  g->sized(nranks);
  std::error_code ec;
  fs::create_directories(g->dir, ec);
  if (ec) return ncclSystemError;
  put(g->dir, Group::joined(rank), nullptr, 0);
  *comm = new ncclComm{g};
  ncclResult_t rc;
  {
    std::lock_guard<std::mutex> hold(state_lock);
    rc = advance(*g);
  }
  return settle(*comm, config, rc);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  ncclComm_t made = nullptr;
  ncclResult_t rc = ncclSuccess;
  {
    std::lock_guard<std::mutex> hold(state_lock);
    if (!comm || !comm->group) return ncclInvalidArgument;
    const std::string why = refusal(comm);
    if (!why.empty()) return usage(*comm->group, "ncclCommSplit: " + why);
    Group& parent = *comm->group;
    const int split = parent.splits++;
    const int ck[2] = {color, key};
    put(parent.dir, Group::split_part(split, parent.rank), ck, sizeof ck);
    *newcomm = nullptr;
    if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
    auto g = std::make_shared<Group>();
    g->phase = Group::kSplitting;
    g->parent_dir = parent.dir;
    g->parent_rank = parent.rank;
    g->parent_size = parent.size;
    g->split = split;
    g->color = color;
    made = *newcomm = new ncclComm{g};
    rc = advance(*g);
  }
  return settle(made, config, rc);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  if (!comm || !comm->group) return ncclInvalidArgument;
  // A GPU runs its queued work whatever the host does; the emulated one runs it when the host looks, and a
  // host that polls NCCL is looking (its operations, and a finalisation, wait for the streams).
  emu::poll_device();
  std::lock_guard<std::mutex> hold(state_lock);
  *state = advance(*comm->group);
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  {
    std::lock_guard<std::mutex> hold(state_lock);
    if (!comm || !comm->group) return ncclInvalidArgument;
    const std::string why = refusal(comm);
    if (!why.empty()) return usage(*comm->group, "ncclCommFinalize: " + why);
    comm->group->phase = Group::kFinalizing;
  }
  ncclResult_t state = ncclSuccess;
  ncclCommGetAsyncError(comm, &state);
  return state;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  {
    std::lock_guard<std::mutex> hold(state_lock);
    leave(*comm->group);
  }
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  {
    std::lock_guard<std::mutex> hold(state_lock);
    comm->group->aborted = true;  // its queued operations end at their next step
    leave(*comm->group);
  }
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth > 0 || !grouped) return ncclSuccess;
  std::lock_guard<std::mutex> hold(state_lock);
  return submit(grouped_stream, std::move(grouped));
}

namespace {

// The shared entry of every operation: checks, then builds and submits it under the state's lock.
ncclResult_t operation(const char* name, ncclComm_t comm, cudaStream_t stream, const void* a, size_t a_bytes,
                       const void* b, size_t b_bytes, size_t count, ncclDataType_t t,
                       const std::function<void(Group&, Operation&)>& build) {
  if (!comm || !comm->group) return ncclInvalidArgument;
  if (type_size(t) == 0) return invalid(comm->group.get(), std::string(name) + ": unknown type");
  const bool on_device = emu::is_device_range(a, a_bytes) && emu::is_device_range(b, b_bytes);  // the device's lock first
  std::lock_guard<std::mutex> hold(state_lock);
  if (!on_device) return invalid(comm->group.get(), std::string(name) + ": a buffer outside the device's memory");
  const std::string why = refusal(comm);
  if (!why.empty()) return usage(*comm->group, std::string(name) + ": " + why);
  auto op = std::make_unique<Operation>();
  op->group = comm->group;
  op->what = described(name, count, t);
  build(*comm->group, *op);
  return submit(stream, std::move(op));
}

bool summable(ncclDataType_t t, ncclRedOp_t op) { return (t == ncclFloat32 || t == ncclBfloat16) && op == ncclSum; }

}  // namespace

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  if (!summable(t, op)) return invalid(comm ? comm->group.get() : nullptr, "ncclAllReduce: the emulation sums f32 and bf16");
  const size_t bytes = count * type_size(t);
  return operation("ncclAllReduce", comm, stream, sendbuff, bytes, recvbuff, bytes, count, t, [&](Group& g, Operation& o) {
    exchange(g, o, [&](int) { return sendbuff; }, bytes);
    o.finish = [sendbuff, recvbuff, count, t](Operation& done) {
      sum_in_rank_order(by_rank(done, sendbuff), count, t, recvbuff);
    };
  });
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  if (!summable(t, op))
    return invalid(comm ? comm->group.get() : nullptr, "ncclReduceScatter: the emulation sums f32 and bf16");
  const size_t chunk = recvcount * type_size(t);
  const size_t ranks = comm && comm->group ? static_cast<size_t>(comm->group->size) : 1;
  return operation("ncclReduceScatter", comm, stream, sendbuff, chunk * ranks, recvbuff, chunk, recvcount, t,
                   [&](Group& g, Operation& o) {
                     const auto* in = static_cast<const unsigned char*>(sendbuff);
                     exchange(g, o, [&](int p) { return in + static_cast<size_t>(p) * chunk; }, chunk);
                     const unsigned char* own = in + static_cast<size_t>(g.rank) * chunk;
                     o.finish = [own, recvbuff, recvcount, t](Operation& done) {
                       sum_in_rank_order(by_rank(done, own), recvcount, t, recvbuff);
                     };
                   });
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t stream) {
  const size_t chunk = sendcount * type_size(t);
  const size_t ranks = comm && comm->group ? static_cast<size_t>(comm->group->size) : 1;
  return operation("ncclAllGather", comm, stream, sendbuff, chunk, recvbuff, chunk * ranks, sendcount, t,
                   [&](Group& g, Operation& o) {
                     exchange(g, o, [&](int) { return sendbuff; }, chunk);
                     o.finish = [sendbuff, recvbuff, chunk](Operation& done) {
                       place_in_rank_order(by_rank(done, sendbuff), chunk, recvbuff);
                     };
                   });
}

ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t t, ncclComm_t comm,
                          cudaStream_t stream) {
  const size_t chunk = count * type_size(t);
  const size_t ranks = comm && comm->group ? static_cast<size_t>(comm->group->size) : 1;
  return operation("ncclAlltoAll", comm, stream, sendbuff, chunk * ranks, recvbuff, chunk * ranks, count, t,
                   [&](Group& g, Operation& o) {
                     const auto* in = static_cast<const unsigned char*>(sendbuff);
                     exchange(g, o, [&](int p) { return in + static_cast<size_t>(p) * chunk; }, chunk);
                     const unsigned char* own = in + static_cast<size_t>(g.rank) * chunk;
                     o.finish = [own, recvbuff, chunk](Operation& done) {
                       place_in_rank_order(by_rank(done, own), chunk, recvbuff);
                     };
                   });
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  const size_t bytes = count * type_size(t);
  if (comm && comm->group && (peer < 0 || peer >= comm->group->size))
    return invalid(comm->group.get(), "ncclSend: peer " + std::to_string(peer));
  return operation("ncclSend", comm, stream, sendbuff, bytes, nullptr, 0, count, t, [&](Group& g, Operation& o) {
    o.out.push_back(Out{kPointToPoint, peer, number(g, kPointToPoint, peer, true), sendbuff, bytes});
  });
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
  const size_t bytes = count * type_size(t);
  if (comm && comm->group && (peer < 0 || peer >= comm->group->size))
    return invalid(comm->group.get(), "ncclRecv: peer " + std::to_string(peer));
  return operation("ncclRecv", comm, stream, recvbuff, bytes, nullptr, 0, count, t, [&](Group& g, Operation& o) {
    o.in.push_back(In{kPointToPoint, peer, number(g, kPointToPoint, peer, false), bytes, recvbuff, {}, false});
  });
}
