// nccl_comm.cpp — the NCCL communicator (comm/nccl_comm.hpp): lanes, events, timeouts, splits.
#include "comm/nccl_comm.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "comm/deadline.hpp"
#include "comm/liveness.hpp"
#include "comm/op_info.hpp"

namespace piper::comm {

namespace {

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CommError(std::string("piper comm: CUDA ") + what + " failed: " + cudaGetErrorString(e));
}

std::string nccl_text(ncclResult_t r, ncclComm_t c) {
  std::string s = ncclGetErrorString(r);
  const char* last = c ? ncclGetLastError(c) : nullptr;
  if (last && *last) s += std::string(" (") + last + ")";
  return s;
}

// Backs off from a yield to 1 ms between polls of something that has not finished.
class Backoff {
 public:
  void pause() {
    if (us_ == 0) {
      std::this_thread::yield();
      us_ = 10;
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(us_));
    us_ = std::min(us_ * 2, 1000);
  }

 private:
  int us_ = 0;
};

enum Lane : size_t { kCollective = 0, kUp = 1, kDown = 2 };
constexpr size_t kLanes = 3;
const char* lane_name(size_t lane) { return lane == kCollective ? "collectives" : lane == kUp ? "up" : "down"; }

struct LaneState;

// What the world and its splits share: the rank's identity for messages, options, a pool of events,
// and every lane they have.
struct Context {
  CommOptions options;
  int world_rank = -1;
  std::vector<cudaEvent_t> free_events;
  // The lanes of the world and of every live split. A lane's queued operations reach NCCL only when
  // someone moves them on, so a wait on any of them, or on the host communicator, moves all of them:
  // what this rank's wait needs from its peer may be behind what the peer waits for from this rank
  // on another communicator (MPI's shared progress engine does the same).
  std::vector<LaneState*> lanes;

  ~Context() {
    for (cudaEvent_t e : free_events) cudaEventDestroy(e);
  }
  cudaEvent_t event() {
    if (!free_events.empty()) {
      cudaEvent_t e = free_events.back();
      free_events.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    cuda_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void release(cudaEvent_t e) {
    if (e) free_events.push_back(e);
  }
  std::string where() const { return rank_and_host(world_rank); }
};

// The end of one operation: an event on its lane's stream, recorded once NCCL has put the operation
// on the stream.
struct Completion {
  std::shared_ptr<Context> ctx;
  cudaEvent_t done = nullptr;
  bool recorded = false;
  explicit Completion(std::shared_ptr<Context> c) : ctx(std::move(c)), done(ctx->event()) {}
  ~Completion() { ctx->release(done); }
};

using NcclCall = std::function<ncclResult_t(ncclComm_t, cudaStream_t)>;

// An operation posted on a lane and not yet on its stream.
struct Pending {
  NcclCall call;
  cudaEvent_t before = nullptr;  // the backend's stream when it was posted
  std::shared_ptr<Completion> done;
  OpInfo info;  // described only in an error
};

// One NCCL communicator, the stream its operations run on, and the operations posted on it that NCCL
// has not yet put on the stream. A non-blocking NCCL call may return before its operation is on the
// stream (ncclInProgress: the first message to a peer connects to it, in a thread of NCCL's, which
// needs the peer to post its half); no further call may go to the communicator until it has. So the
// lane posts in order, one call in progress at a time, and a post never waits for the peer.
struct LaneState {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  bool aborted = false;
  std::string why_aborted;
  std::deque<Pending> pending;  // the front one is in NCCL's hands when `front_called`
  bool front_called = false;

  // Stops the lane's NCCL communicator without waiting for its operations; it serves no more. The
  // events its unposted operations held are destroyed with them.
  void abort(std::string why) noexcept {
    if (aborted) return;
    ncclCommAbort(comm);
    comm = nullptr;
    aborted = true;
    why_aborted = std::move(why);
    for (Pending& op : pending)
      if (op.before) cudaEventDestroy(op.before);
    pending.clear();
  }
};

// Lanes made for a communicator that failed to start, which never served: aborted, their streams destroyed.
void abort_lanes(std::array<LaneState, kLanes>& lanes) noexcept {
  for (LaneState& l : lanes) {
    if (l.comm) ncclCommAbort(l.comm);
    if (l.stream) cudaStreamDestroy(l.stream);
    l.comm = nullptr, l.stream = nullptr;
  }
}

// A wait on `lane` that ran past the timeout: the lane is aborted and a CommError says what was waited on.
[[noreturn]] void abort_for_timeout(LaneState& lane, const Context& ctx, const std::string& what, Clock::time_point start) {
  std::ostringstream msg;
  msg.setf(std::ios::fixed);
  msg.precision(2);
  msg << "piper comm: NCCL timeout on " << ctx.where() << ": " << what << "; waited " << seconds_since(start)
      << " s (timeout " << ctx.options.timeout_s << " s); the NCCL communicator was aborted"
      << liveness_report(kLivenessProbeS);
  lane.abort(msg.str());
  throw CommError(lane.why_aborted);
}

// A non-blocking NCCL call's state after it returned: polls until it is no longer in progress, within the
// timeout; a failure or a timeout aborts the communicator and throws, saying what was being done.
void settle(ncclResult_t rc, LaneState& lane, const Context& ctx, const std::string& what) {
  const auto start = Clock::now();
  const auto deadline = deadline_after(ctx.options.timeout_s);
  Backoff backoff;
  while (rc == ncclInProgress) {
    if (Clock::now() > deadline) abort_for_timeout(lane, ctx, what, start);
    backoff.pause();
    ncclCommGetAsyncError(lane.comm, &rc);
  }
  if (rc != ncclSuccess) {
    lane.abort("piper comm: NCCL error on " + ctx.where() + ": " + what + ": " + nccl_text(rc, lane.comm));
    throw CommError(lane.why_aborted);
  }
}

// A non-blocking split reports its progress on the new communicator; a rank outside every new group
// (NCCL_SPLIT_NOCOLOR) gets none and polls the parent. The parent must be healthy afterwards too.
void settle_split(ncclResult_t rc, LaneState& parent, LaneState& child, const Context& ctx, const std::string& what) {
  settle(rc, child.comm ? child : parent, ctx, what);
  ncclResult_t state = ncclSuccess;
  ncclCommGetAsyncError(parent.comm, &state);
  settle(state, parent, ctx, what);
}

// Puts the lane's posted operations on its stream, in order, as far as NCCL lets it without waiting:
// each after the backend's work its post saw, its completion event after it. Throws CommError, with
// the lane aborted, when NCCL reports an error.
void progress(LaneState& lane, Context& ctx) {
  while (!lane.aborted && !lane.pending.empty()) {
    Pending& op = lane.pending.front();
    ncclResult_t rc = ncclSuccess;
    if (!lane.front_called) {
      cuda_ok(cudaStreamWaitEvent(lane.stream, op.before, 0), "cudaStreamWaitEvent");
      ctx.release(op.before);  // the wait holds what it needs
      op.before = nullptr;
      rc = op.call(lane.comm, lane.stream);
      lane.front_called = true;
    }
    if (rc == ncclSuccess || rc == ncclInProgress) ncclCommGetAsyncError(lane.comm, &rc);
    if (rc == ncclInProgress) return;
    if (rc != ncclSuccess) {
      lane.abort("piper comm: NCCL error on " + ctx.where() + ": " + op.info.describe() + ": " + nccl_text(rc, lane.comm));
      throw CommError(lane.why_aborted);
    }
    cuda_ok(cudaEventRecord(op.done->done, lane.stream), "cudaEventRecord");
    op.done->recorded = true;
    lane.pending.pop_front();
    lane.front_called = false;
  }
}

// Moves every lane of the world and its splits on (Context::lanes). An error on `mine` throws; one on
// another lane aborts that lane, which says so to whoever waits on it next, and the waiter here goes on.
void progress_all(Context& ctx, const LaneState* mine) {
  for (LaneState* l : ctx.lanes) {
    if (l == mine) {
      progress(*l, ctx);
      continue;
    }
    try {
      progress(*l, ctx);
    } catch (const CommError&) {
    }
  }
}

// Polls `r` until it is done, within the timeout; past it, a CommError names the operation (`what()`).
template <class What>
void poll_until_done(RequestImpl& r, const Context& ctx, What what, Clock::time_point posted) {
  const auto start = Clock::now();
  const auto deadline = deadline_after(ctx.options.timeout_s);
  Backoff backoff;
  while (!r.test()) {
    if (Clock::now() > deadline) throw CommError(timeout_message(ctx.world_rank, what(), start, ctx.options.timeout_s, posted));
    backoff.pause();
  }
}

class NcclCommunicator;

class NcclRequest final : public RequestImpl {
 public:
  NcclRequest(NcclCommunicator& comm, size_t lane, OpInfo info, std::shared_ptr<Completion> done)
      : comm_(comm), lane_(lane), info_(std::move(info)), done_(std::move(done)) {}
  bool test() override;
  void wait() override;
  void abandon() noexcept override;

 private:
  NcclCommunicator& comm_;
  size_t lane_;
  OpInfo info_;
  std::shared_ptr<Completion> done_;
  Clock::time_point posted_ = Clock::now();
};

// An operation of the host communicator (a double sum, the barrier): polling it moves the lanes on too.
// `storage`, when given, is the operation's buffer, kept as long as the operation may write it: an
// abandoned collective may still land, so abandoning leaves the buffer to it.
class HostRequest final : public RequestImpl {
 public:
  HostRequest(NcclCommunicator& comm, Request inner, OpInfo info, std::unique_ptr<double> storage)
      : comm_(comm), inner_(std::move(inner)), info_(std::move(info)), storage_(std::move(storage)) {}
  bool test() override;
  void wait() override;
  void abandon() noexcept override {
    Request unwound = std::move(inner_);  // abandons it, unwinding
    (void)storage_.release();
  }

 private:
  NcclCommunicator& comm_;
  Request inner_;
  OpInfo info_;
  std::unique_ptr<double> storage_;
  Clock::time_point posted_ = Clock::now();
};

class NcclCommunicator final : public Communicator {
 public:
  // Takes the lanes; `owned` is the host group of a split (null for the world over the caller's host).
  NcclCommunicator(std::shared_ptr<Context> ctx, Communicator& host, std::unique_ptr<Communicator> owned,
                   backend::Backend& device, std::array<LaneState, kLanes> lanes)
      : ctx_(std::move(ctx)), owned_(std::move(owned)), host_(owned_ ? owned_.get() : &host), device_(device),
        lanes_(lanes) {
    ctx_->lanes.reserve(ctx_->lanes.size() + kLanes);  // so that registering cannot throw
    for (LaneState& l : lanes_) ctx_->lanes.push_back(&l);
  }
  ~NcclCommunicator() override {
    // While an exception unwinds the job is failing: its peers may be gone, so nothing waits for them.
    const bool failing = std::uncaught_exceptions() > 0;
    for (size_t i = 0; i < kLanes; ++i) {
      LaneState& l = lanes_[i];
      if (l.comm && failing) l.abort("piper comm: the " + std::string(lane_name(i)) + " lane of " + name() +
                                     " was aborted as the job failed");
      if (l.comm) {
        // Posted work finishes first; a lane that cannot finish within the timeout is aborted.
        try {
          drain(i, "finalising");
          settle(ncclCommFinalize(l.comm), l, *ctx_, std::string("finalising the ") + lane_name(i) + " lane of " + name());
        } catch (const CommError&) {
        }
        if (l.comm) ncclCommDestroy(l.comm);
        l.comm = nullptr;
      }
      std::erase(ctx_->lanes, &l);  // drained: no one else's wait needs it moved on
      if (l.stream) cudaStreamDestroy(l.stream);
    }
    if (self_stream_) cudaStreamDestroy(self_stream_);
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  int world_rank(int i) const override { return host_->world_rank(i); }
  const std::string& name() const override { return host_->name(); }
  const CommOptions& options() const override { return ctx_->options; }

  Request isend(const void* buf, size_t n, backend::DType t, int peer, int tag) override {
    return message(OpKind::OP_SEND, const_cast<void*>(buf), n, t, peer, tag);
  }
  Request irecv(void* buf, size_t n, backend::DType t, int peer, int tag) override {
    return message(OpKind::OP_RECV, buf, n, t, peer, tag);
  }

  Request iallreduce(float* buf, size_t n) override {
    return collective(OpKind::OP_ALLREDUCE, n * sizeof(float), [=](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, c, s);
    });
  }
  Request ireduce_scatter(const float* in, float* out, size_t n_per_rank) override {
    return collective(OpKind::OP_REDUCE_SCATTER, n_per_rank * static_cast<size_t>(size()) * sizeof(float),
                      [=](ncclComm_t c, cudaStream_t s) {
                        return ncclReduceScatter(in, out, n_per_rank, ncclFloat32, ncclSum, c, s);
                      });
  }
  Request iallgather(const void* in, void* out, size_t n_per_rank, backend::DType t) override {
    const ncclDataType_t type = nccl_type(t);
    return collective(OpKind::OP_ALLGATHER, n_per_rank * static_cast<size_t>(size()) * backend::dtype_size(t),
                      [=](ncclComm_t c, cudaStream_t s) { return ncclAllGather(in, out, n_per_rank, type, c, s); });
  }
  Request ialltoall(const void* in, void* out, size_t n_per_rank, backend::DType t) override {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    const ncclDataType_t type = nccl_type(t);
    return collective(OpKind::OP_ALLTOALL, n_per_rank * static_cast<size_t>(size()) * backend::dtype_size(t),
                      [=](ncclComm_t c, cudaStream_t s) { return ncclAlltoAll(in, out, n_per_rank, type, c, s); });
#else  // ncclAlltoAll is NCCL 2.28's: before it, the grouped sends and receives of an all-to-all-v
    const std::vector<int64_t> counts(static_cast<size_t>(size()), static_cast<int64_t>(n_per_rank));
    return ialltoallv(in, counts, out, counts, t);
#endif
  }
  // Sends and receives to and from every rank in one NCCL group on the collectives' lane.
  Request ialltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                     const std::vector<int64_t>& recv_counts, backend::DType t) override {
    const auto p = static_cast<size_t>(size());
    if (send_counts.size() != p || recv_counts.size() != p)
      throw std::invalid_argument("piper comm: alltoallv on " + name() + " takes " + std::to_string(p) +
                                  " counts per side, not " + std::to_string(send_counts.size()) + " and " +
                                  std::to_string(recv_counts.size()));
    size_t total = 0;
    for (int64_t c : send_counts) total += static_cast<size_t>(c);
    const ncclDataType_t type = nccl_type(t);
    const size_t elem = backend::dtype_size(t);
    const auto* from = static_cast<const unsigned char*>(in);
    auto* to = static_cast<unsigned char*>(out);
    // The call may run after this returns: it keeps its own copy of the counts.
    return collective(OpKind::OP_ALLTOALL, total * elem, [=](ncclComm_t c, cudaStream_t s) {
      ncclResult_t rc = ncclGroupStart();
      size_t sent = 0, got = 0;
      for (size_t j = 0; j < p && (rc == ncclSuccess || rc == ncclInProgress); ++j) {
        const auto ns = static_cast<size_t>(send_counts[j]), nr = static_cast<size_t>(recv_counts[j]);
        if (ns) rc = ncclSend(from + sent * elem, ns, type, static_cast<int>(j), c, s);
        if (nr && (rc == ncclSuccess || rc == ncclInProgress))
          rc = ncclRecv(to + got * elem, nr, type, static_cast<int>(j), c, s);
        sent += ns;
        got += nr;
      }
      const ncclResult_t end = ncclGroupEnd();
      return rc == ncclSuccess || rc == ncclInProgress ? end : rc;
    });
  }
  // Over the host communicator; waiting on them moves the lanes on too.
  Request iallreduce_double(double* buf, size_t n) override {
    return hosted(host_->iallreduce_double(buf, n), info(OpKind::OP_ALLREDUCE, n * sizeof(double)), nullptr);
  }
  // A sum of one double: no rank's ends before every rank's has begun.
  void barrier() override {
    auto none = std::make_unique<double>(0.0);
    double* sum = none.get();
    hosted(host_->iallreduce_double(sum, 1), info(OpKind::OP_BARRIER, 0), std::move(none)).wait();
  }

  // For NcclRequest and HostRequest.
  LaneState& lane(size_t i) { return lanes_[i]; }
  const Context& context() const { return *ctx_; }
  void progress_lanes() { progress_all(*ctx_, nullptr); }
  void throw_if_aborted(size_t lane, const OpInfo& info) const {
    const LaneState& l = lanes_[lane];
    if (l.aborted)
      throw CommError("piper comm: " + info.describe() + " on " + ctx_->where() + ": the " + lane_name(lane) +
                      " lane of " + name() + " is aborted after an earlier failure: " + l.why_aborted);
  }
  // Moves every lane's posted operations on (Context::lanes); then an error NCCL reports for `lane` throws.
  void advance(size_t lane, const OpInfo& info) {
    progress_all(*ctx_, &lanes_[lane]);
    throw_if_aborted(lane, info);
    LaneState& l = lanes_[lane];
    ncclResult_t rc = ncclSuccess;
    ncclCommGetAsyncError(l.comm, &rc);
    if (rc != ncclSuccess && rc != ncclInProgress) settle(rc, l, *ctx_, info.describe());
  }

 protected:
  std::unique_ptr<Communicator> split_impl(const std::vector<int>& world_ranks, const std::string& label) override {
    std::unique_ptr<Communicator> group = host_->split(world_ranks, label);  // checks the lists
    // A group's colour is its lowest world rank; a rank's key its position in the list.
    const int color = group ? *std::min_element(world_ranks.begin(), world_ranks.end()) : NCCL_SPLIT_NOCOLOR;
    const int key = group ? group->rank() : 0;
    std::array<LaneState, kLanes> child{};
    std::unique_ptr<Communicator> made;
    try {
      for (size_t i = 0; i < kLanes; ++i) {
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        throw_if_aborted(i, OpInfo{OpKind::OP_BARRIER, name(), rank(), size()});
        drain(i, "splitting");
        const ncclResult_t rc = ncclCommSplit(lanes_[i].comm, color, key, &child[i].comm, &config);
        settle_split(rc, lanes_[i], child[i], *ctx_,
                     std::string("splitting the ") + lane_name(i) + " lane of " + name() + " into " +
                         group_name(label, world_ranks));
        if (group) cuda_ok(cudaStreamCreateWithFlags(&child[i].stream, cudaStreamNonBlocking), "cudaStreamCreate");
      }
      if (group) made = std::make_unique<NcclCommunicator>(ctx_, *host_, std::move(group), device_, child);
    } catch (...) {  // the lanes already split go with the split that failed
      abort_lanes(child);
      throw;
    }
    return made;
  }

 private:
  OpInfo info(OpKind kind, size_t bytes, int peer = -1, int tag = -1) const {
    OpInfo i{kind, name(), rank(), size()};
    i.bytes = bytes;
    i.peer = peer;
    i.tag = tag;
    if (peer >= 0 && peer < size()) i.peer_world = world_rank(peer);
    return i;
  }

  // An event on the backend's current stream: where the buffer's last use ends.
  cudaEvent_t ready() {
    cudaEvent_t e = ctx_->event();
    cuda_ok(cudaEventRecord(e, static_cast<cudaStream_t>(device_.native_stream())), "cudaEventRecord");
    return e;
  }

  // Posts `call` on `lane`, after the work queued on the backend so far; the request ends with it.
  Request queued(size_t lane, OpInfo inf, NcclCall call) {
    LaneState& l = lanes_[lane];
    throw_if_aborted(lane, inf);
    auto done = std::make_shared<Completion>(ctx_);
    l.pending.push_back(Pending{std::move(call), ready(), done, inf});
    progress(l, *ctx_);
    return Request(std::make_unique<NcclRequest>(*this, lane, std::move(inf), std::move(done)));
  }

  Request hosted(Request inner, OpInfo inf, std::unique_ptr<double> storage) {
    return Request(std::make_unique<HostRequest>(*this, std::move(inner), std::move(inf), std::move(storage)));
  }

  Request collective(OpKind kind, size_t bytes, NcclCall call) {
    return queued(kCollective, info(kind, bytes), std::move(call));
  }

  // Waits, within the timeout, until every operation posted on `lane` is on its stream (before a call
  // that needs the NCCL communicator idle: a split, the finalisation), moving every lane on meanwhile.
  void drain(size_t lane, const char* doing) {
    LaneState& l = lanes_[lane];
    const auto start = Clock::now();
    const auto deadline = deadline_after(ctx_->options.timeout_s);
    Backoff backoff;
    for (;;) {
      progress_all(*ctx_, &l);
      if (l.aborted || l.pending.empty()) return;
      if (Clock::now() > deadline)
        abort_for_timeout(l, *ctx_,
                          std::string(doing) + " the " + lane_name(lane) + " lane of " + name() + " waits for " +
                              l.pending.front().info.describe() + " to start",
                          start);
      backoff.pause();
    }
  }

  // A message's elements as NCCL sees them.
  static ncclDataType_t nccl_type(backend::DType t) {
    switch (t) {
      case backend::DType::DTYPE_F32: return ncclFloat32;
      case backend::DType::DTYPE_BF16: return ncclBfloat16;
      case backend::DType::DTYPE_I32: return ncclInt32;
    }
    throw std::invalid_argument("piper comm: a message of an unknown storage type");
  }

  Request message(OpKind kind, void* buf, size_t n, backend::DType t, int peer, int tag) {
    if (peer < 0 || peer >= size())
      throw std::invalid_argument("piper comm: " + std::string(op_name(kind)) + " on " + name() + " with peer " +
                                  std::to_string(peer) + ": group ranks are 0.." + std::to_string(size() - 1));
    const size_t bytes = n * backend::dtype_size(t);
    OpInfo inf = info(kind, bytes, peer, tag);
    if (peer == rank()) return to_itself(kind, buf, bytes, std::move(inf));
    const size_t lane = kind == OpKind::OP_SEND ? (peer > rank() ? kUp : kDown) : (peer < rank() ? kUp : kDown);
    const ncclDataType_t type = nccl_type(t);
    return queued(lane, std::move(inf), [=](ncclComm_t c, cudaStream_t s) {
      return kind == OpKind::OP_SEND ? ncclSend(buf, n, type, peer, c, s) : ncclRecv(buf, n, type, peer, c, s);
    });
  }

  // A message to itself waits in a mailbox until its other half is posted (matched by tag in posting
  // order); then one device copy, on a stream of its own, completes both.
  struct Posted {
    void* buf;
    size_t bytes;
    int tag;
    cudaEvent_t ready;
    std::shared_ptr<std::shared_ptr<Completion>> slot;  // filled when matched
  };
  Request to_itself(OpKind kind, void* buf, size_t bytes, OpInfo inf) {
    auto slot = std::make_shared<std::shared_ptr<Completion>>();
    std::deque<Posted>& mine = kind == OpKind::OP_SEND ? self_sends_ : self_recvs_;
    std::deque<Posted>& other = kind == OpKind::OP_SEND ? self_recvs_ : self_sends_;
    Posted p{buf, bytes, inf.tag, ready(), slot};
    auto it = std::find_if(other.begin(), other.end(), [&](const Posted& q) { return q.tag == p.tag; });
    if (it == other.end()) {
      mine.push_back(p);
    } else {
      const Posted q = *it;
      const Posted& send = kind == OpKind::OP_SEND ? p : q;
      const Posted& recv = kind == OpKind::OP_SEND ? q : p;
      if (send.bytes > recv.bytes) {
        ctx_->release(p.ready);  // the other half stays posted
        throw CommError("piper comm: " + inf.describe() + " on " + ctx_->where() + ": a message of " +
                        std::to_string(send.bytes) + " bytes to itself, received into " + std::to_string(recv.bytes) +
                        " (the receive must be at least as large)");
      }
      other.erase(it);
      if (!self_stream_) cuda_ok(cudaStreamCreateWithFlags(&self_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
      cuda_ok(cudaStreamWaitEvent(self_stream_, send.ready, 0), "cudaStreamWaitEvent");
      cuda_ok(cudaStreamWaitEvent(self_stream_, recv.ready, 0), "cudaStreamWaitEvent");
      ctx_->release(send.ready);
      ctx_->release(recv.ready);
      if (send.bytes)
        cuda_ok(cudaMemcpyAsync(recv.buf, send.buf, send.bytes, cudaMemcpyDeviceToDevice, self_stream_),
                "cudaMemcpyAsync");
      auto done = std::make_shared<Completion>(ctx_);
      cuda_ok(cudaEventRecord(done->done, self_stream_), "cudaEventRecord");
      done->recorded = true;
      *send.slot = done;
      *recv.slot = done;
    }
    return Request(std::make_unique<SelfRequest>(*this, std::move(inf), std::move(slot)));
  }

  // A message to itself: incomplete until matched, then as any other.
  class SelfRequest final : public RequestImpl {
   public:
    SelfRequest(NcclCommunicator& comm, OpInfo info, std::shared_ptr<std::shared_ptr<Completion>> slot)
        : comm_(comm), info_(std::move(info)), slot_(std::move(slot)) {}
    bool test() override {
      comm_.progress_lanes();
      if (!*slot_) return false;
      const cudaError_t e = cudaEventQuery((*slot_)->done);
      if (e == cudaErrorNotReady) return false;
      cuda_ok(e, "cudaEventQuery");
      return true;
    }
    void wait() override {
      poll_until_done(*this, comm_.context(), [&] {
        return info_.describe() + (*slot_ ? " (to itself, copying)" : " (to itself, its other half not posted)");
      }, posted_);
    }
    void abandon() noexcept override { comm_.forget_unmatched(slot_); }

   private:
    NcclCommunicator& comm_;
    OpInfo info_;
    std::shared_ptr<std::shared_ptr<Completion>> slot_;
    Clock::time_point posted_ = Clock::now();
  };

 public:
  // An abandoned message to itself that was never matched leaves the mailbox.
  void forget_unmatched(const std::shared_ptr<std::shared_ptr<Completion>>& slot) noexcept {
    for (std::deque<Posted>* q : {&self_sends_, &self_recvs_})
      for (auto it = q->begin(); it != q->end(); ++it)
        if (it->slot == slot) {
          ctx_->release(it->ready);
          q->erase(it);
          return;
        }
  }

 private:
  std::shared_ptr<Context> ctx_;
  std::unique_ptr<Communicator> owned_;
  Communicator* host_;
  backend::Backend& device_;
  std::array<LaneState, kLanes> lanes_;
  std::deque<Posted> self_sends_, self_recvs_;
  cudaStream_t self_stream_ = nullptr;  // the copies of messages to itself, made on first use
};

bool NcclRequest::test() {
  // Done is done, even on a lane aborted since.
  const auto finished = [&] {
    if (!done_->recorded) return false;  // posted, not yet on the stream
    const cudaError_t e = cudaEventQuery(done_->done);
    if (e == cudaErrorNotReady) return false;
    cuda_ok(e, "cudaEventQuery");
    return true;
  };
  if (finished()) return true;
  comm_.advance(lane_, info_);
  return finished();
}

void NcclRequest::wait() {
  poll_until_done(*this, comm_.context(), [&] { return "NCCL " + info_.describe(); }, posted_);
}

bool HostRequest::test() {
  if (inner_.test()) return true;
  comm_.progress_lanes();
  return false;
}

void HostRequest::wait() {
  poll_until_done(*this, comm_.context(), [&] { return info_.describe() + " (over the host communicator)"; }, posted_);
}

// The operation may never finish (its peer is gone or stuck): abort its lane, so nothing waits for it.
void NcclRequest::abandon() noexcept {
  if (comm_.lane(lane_).aborted || (done_->recorded && cudaEventQuery(done_->done) == cudaSuccess)) return;
  comm_.lane(lane_).abort("piper comm: NCCL " + info_.describe() + " on " + comm_.context().where() +
                         " was abandoned unfinished (after an error)");
}

// The key of this rank's GPU, the same on two ranks exactly when they share it: host and PCI bus id.
std::vector<float> gpu_key() {
  int dev = 0;
  cuda_ok(cudaGetDevice(&dev), "cudaGetDevice");
  char bus[32] = {};
  cuda_ok(cudaDeviceGetPCIBusId(bus, sizeof bus, dev), "cudaDeviceGetPCIBusId");
  const std::string key = host_name() + "/" + bus;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  std::vector<float> out(2);
  std::memcpy(out.data(), &h, sizeof h);
  return out;
}

}  // namespace

std::unique_ptr<Communicator> start_nccl(Communicator& host, backend::Backend& device, std::string* why) {
  auto refuse = [&](const std::string& reason) -> std::unique_ptr<Communicator> {
    if (why) *why = reason;
    return nullptr;
  };
  const auto p = static_cast<size_t>(host.size());
  // Which ranks share a GPU: every rank learns the same answer. A rank that cannot name its GPU
  // says so in its third value, so no rank goes on to wait for it.
  std::vector<float> key(3, 0.0f), keys(3 * p);
  std::string key_error;
  try {
    const std::vector<float> k = gpu_key();
    key = {k[0], k[1], 1.0f};
  } catch (const CommError& e) {
    key_error = e.what();
  }
  host.allgather(key.data(), keys.data(), 3, backend::DType::DTYPE_F32);
  if (!key_error.empty()) throw CommError(key_error + " on " + rank_and_host(host.world_rank(host.rank())));
  for (size_t i = 0; i < p; ++i)
    if (keys[3 * i + 2] != 1.0f)
      throw CommError("piper comm: rank " + std::to_string(host.world_rank(static_cast<int>(i))) +
                      " could not name its GPU (its own error says why), so NCCL did not start on " + host.name());
  for (size_t i = 0; i < p; ++i)
    for (size_t j = i + 1; j < p; ++j)
      if (std::memcmp(&keys[3 * i], &keys[3 * j], 2 * sizeof(float)) == 0)
        return refuse("ranks " + std::to_string(i) + " and " + std::to_string(j) + " of " + host.name() +
                      " share one GPU, which NCCL refuses");

  auto ctx = std::make_shared<Context>();
  ctx->options = host.options();
  ctx->world_rank = host.world_rank(host.rank());
  // Rank 0's unique id reaches every rank over the host communicator (as floats: the bytes travel as they are).
  static_assert(sizeof(ncclUniqueId) % sizeof(float) == 0, "ncclUniqueId travels as floats");
  constexpr size_t kIdFloats = sizeof(ncclUniqueId) / sizeof(float);
  // After it, rank 0's result: every rank learns when there is no id.
  ncclUniqueId id{};
  ncclResult_t made = ncclSuccess;
  if (host.rank() == 0) made = ncclGetUniqueId(&id);
  std::vector<float> mine(kIdFloats + 1), all((kIdFloats + 1) * p);
  std::memcpy(mine.data(), &id, sizeof id);
  mine[kIdFloats] = static_cast<float>(made);
  host.allgather(mine.data(), all.data(), kIdFloats + 1, backend::DType::DTYPE_F32);
  if (all[kIdFloats] != static_cast<float>(ncclSuccess))
    throw CommError("piper comm: ncclGetUniqueId failed on rank " + std::to_string(host.world_rank(0)) + " of " +
                    host.name() + ": " + ncclGetErrorString(static_cast<ncclResult_t>(all[kIdFloats])) +
                    "; NCCL did not start on " + ctx->where());
  std::memcpy(&id, all.data(), sizeof id);

  std::array<LaneState, kLanes> lanes{};
  try {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    settle(ncclCommInitRankConfig(&lanes[kCollective].comm, host.size(), id, host.rank(), &config),
           lanes[kCollective], *ctx, "creating the NCCL communicator of " + host.name());
    for (size_t i = kUp; i < kLanes; ++i) {
      ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
      c.blocking = 0;
      const ncclResult_t rc = ncclCommSplit(lanes[kCollective].comm, 0, host.rank(), &lanes[i].comm, &c);
      settle_split(rc, lanes[kCollective], lanes[i], *ctx,
                   std::string("creating the ") + lane_name(i) + " lane of " + host.name());
    }
    for (LaneState& l : lanes) cuda_ok(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    return std::make_unique<NcclCommunicator>(std::move(ctx), host, nullptr, device, lanes);
  } catch (...) {  // what was made of the lanes goes with the start that failed
    abort_lanes(lanes);
    throw;
  }
}

}  // namespace piper::comm
