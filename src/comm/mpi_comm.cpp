// mpi_comm.cpp — the MPI communicator: operations as MPI requests, a progress thread that drives them, timeouts.
#include "comm/mpi_comm.hpp"

#include "comm/deadline.hpp"
#include "comm/liveness.hpp"
#include "comm/op_info.hpp"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

static_assert(MPI_SUCCESS == 0, "PIPER_MPI_CHECK assumes MPI_SUCCESS == 0");

namespace piper::comm {

namespace {

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error code " + std::to_string(rc);
  return std::string(text, static_cast<size_t>(len));
}

std::string where() { return rank_and_host(mpi_world_rank()); }

// ---- one operation ----------------------------------------------------------------

// Shared by the Request and (with a progress thread) the engine that polls it.
struct OpState {
  MPI_Request req = MPI_REQUEST_NULL;
  OpInfo info;
  Clock::time_point posted = Clock::now();
  std::atomic<bool> done{false};
  std::atomic<bool> cancel{false};  // asks the engine to MPI_Cancel it (an abandoned receive)
  std::string failure;              // set before done when the operation failed
  std::shared_ptr<const std::vector<int>> counts;  // alltoallv's counts and displacements, which MPI reads until completion
};

// ---- the progress engine ----------------------------------------------------------

// Owns the pending MPI_Requests of one world (and its splits). Whoever holds
// poll_mu_ may test them: a thread inside wait() or test() polls them itself
// (no hand-off between threads, so a short message completes in the time MPI
// takes), and the progress thread, when there is one, polls them while no
// thread waits. After a poll that completed nothing it sleeps, first
// min_sleep_us, doubling up to max_sleep_us; a completion or a new operation
// starts again from min_sleep_us (protocol hand-shakes right after a post get
// quick turns, a long transfer costs compute little; see docs/comm.md).
class ProgressEngine {
 public:
  ProgressEngine(bool with_thread, int min_sleep_us, int max_sleep_us)
      : max_sleep_us_(std::max(0, max_sleep_us)), min_sleep_us_(std::clamp(min_sleep_us, 0, max_sleep_us_)) {
    if (with_thread) thread_ = std::thread([this] { run(); });
  }
  ~ProgressEngine() { stop(); }
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  // Takes a posted, not yet complete request; from now on only a poll tests it.
  void submit(const std::shared_ptr<OpState>& op) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) {
        op->failure = "the progress engine was stopped (MPI finalised?)";
        op->done.store(true, std::memory_order_release);
        return;
      }
      incoming_.push_back(op);
      ++pending_;
    }
    cv_work_.notify_one();
  }

  // One poll unless another thread is polling; true when op is done.
  bool test(OpState& op) {
    if (op.done.load(std::memory_order_acquire)) return true;
    if (poll_mu_.try_lock()) {
      poll_once();
      poll_mu_.unlock();
    }
    return op.done.load(std::memory_order_acquire);
  }

  // Polls until op is done or the deadline passes; true when done. The
  // progress thread stands aside meanwhile (it would only compete for the core).
  bool wait(OpState& op, Clock::time_point deadline) {
    if (op.done.load(std::memory_order_acquire)) return true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++waiters_;
    }
    // Spin briefly (a message about to land costs no wake-up), then back off
    // with short sleeps, so a waiting rank leaves its core to a computing one
    // when ranks share cores.
    const auto spin_until = Clock::now() + std::chrono::microseconds(50);
    auto backoff = std::chrono::microseconds(2);
    for (unsigned n = 1; !op.done.load(std::memory_order_acquire); ++n) {
      if (poll_mu_.try_lock()) {
        poll_once();
        poll_mu_.unlock();
      }
      if (n % 16 != 0) continue;
      const auto now = Clock::now();
      if (now >= deadline) break;
      if (now >= spin_until) {
        std::this_thread::sleep_for(backoff);
        backoff = std::min(backoff * 2, std::chrono::microseconds(200));
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --waiters_;
    }
    cv_work_.notify_one();  // the thread resumes polling what is left
    return op.done.load(std::memory_order_acquire);
  }

  // Cancels a pending receive: now if nobody is polling, else at the next
  // poll (only the poller may touch a request).
  void cancel(OpState& op) {
    op.cancel.store(true);
    ++cancels_;
    if (poll_mu_.try_lock()) {
      poll_once();
      poll_mu_.unlock();
    } else {
      cv_work_.notify_one();
    }
  }

  // Joins the thread; operations still pending fail with a message.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    cv_work_.notify_one();
    if (thread_.joinable()) thread_.join();
    std::lock_guard<std::mutex> poll_lock(poll_mu_);
    take_incoming();
    fail_active("the progress engine was stopped (MPI finalised?) before the operation completed");
  }

 private:
  void run();
  int poll_once();  // needs poll_mu_; returns how many operations completed
  void take_incoming();
  void fail_active(const std::string& why);
  void mark_done(OpState& op, const std::string& failure) {
    if (!failure.empty()) op.failure = failure;
    op.done.store(true, std::memory_order_release);
    --pending_;
  }

  const int max_sleep_us_;
  const int min_sleep_us_;
  std::mutex mu_;                    // incoming_, stopped_, waiters_ changes, the thread's sleep
  std::condition_variable cv_work_;  // new work, a waiter left, a cancel, or stop
  std::vector<std::shared_ptr<OpState>> incoming_;
  bool stopped_ = false;
  std::atomic<int> waiters_{0};  // threads polling in wait()
  std::atomic<int> pending_{0};  // submitted and not done
  std::atomic<int> cancels_{0};  // cancel() calls not yet served

  std::mutex poll_mu_;  // the right to test the requests below
  std::vector<std::shared_ptr<OpState>> active_;
  std::vector<MPI_Request> reqs_;  // active_[i]->req, owned here
  std::vector<int> indices_;
  std::vector<MPI_Status> statuses_;

  std::thread thread_;
};

void ProgressEngine::take_incoming() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& op : incoming_) {
    active_.push_back(op);
    reqs_.push_back(op->req);
  }
  incoming_.clear();
}

void ProgressEngine::fail_active(const std::string& why) {
  for (auto& op : active_) mark_done(*op, why);
  active_.clear();
  reqs_.clear();
}

int ProgressEngine::poll_once() {
  take_incoming();
  const bool cancels = cancels_.exchange(0) > 0;
  if (active_.empty()) return 0;
  if (cancels)  // best effort: a receive that cannot be cancelled any more completes as usual
    for (size_t i = 0; i < reqs_.size(); ++i)
      if (active_[i]->cancel.exchange(false)) MPI_Cancel(&reqs_[i]);
  int count = 0;
  indices_.resize(reqs_.size());
  statuses_.resize(reqs_.size());
  int rc = MPI_Testsome(static_cast<int>(reqs_.size()), reqs_.data(), &count, indices_.data(), statuses_.data());
  if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
    count = static_cast<int>(active_.size());
    fail_active("MPI_Testsome failed: " + mpi_error_string(rc));
    return count;
  }
  if (count <= 0) return 0;
  for (int k = 0; k < count; ++k) {
    const int err = rc == MPI_ERR_IN_STATUS ? statuses_[static_cast<size_t>(k)].MPI_ERROR : MPI_SUCCESS;
    mark_done(*active_[static_cast<size_t>(indices_[static_cast<size_t>(k)])],
              err == MPI_SUCCESS ? std::string() : mpi_error_string(err));
  }
  size_t keep = 0;  // drop completed requests (MPI_Testsome set them to MPI_REQUEST_NULL)
  for (size_t i = 0; i < reqs_.size(); ++i) {
    if (reqs_[i] == MPI_REQUEST_NULL) continue;
    reqs_[keep] = reqs_[i];
    active_[keep] = std::move(active_[i]);
    ++keep;
  }
  reqs_.resize(keep);
  active_.resize(keep);
  return count;
}

void ProgressEngine::run() {
#if defined(__linux__)
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  // sleep what we ask, not 50 us more (the default slack)
#endif
  int sleep = min_sleep_us_;  // doubles after each poll that completed nothing, up to max_sleep_us_
  bool idle = false;  // the last poll completed nothing
  while (true) {
    bool yield_now = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!incoming_.empty()) sleep = min_sleep_us_;
      if (waiters_ > 0) {  // a waiting thread polls; stand aside
        cv_work_.wait(lock, [&] { return stopped_ || waiters_ == 0; });
        idle = false;
      } else if (pending_ == 0) {
        cv_work_.wait(lock, [&] { return stopped_ || pending_ > 0; });
        idle = false;
      } else if (idle) {
        if (sleep > 0)
          cv_work_.wait_for(lock, std::chrono::microseconds(sleep),
                            [&] { return stopped_ || !incoming_.empty() || waiters_ > 0 || cancels_ > 0; });
        else
          yield_now = true;
        sleep = incoming_.empty() ? std::min(std::max(2 * sleep, 1), max_sleep_us_) : min_sleep_us_;
      }
      if (stopped_) return;
      if (waiters_ > 0) continue;
    }
    if (yield_now) std::this_thread::yield();
    std::unique_lock<std::mutex> poll_lock(poll_mu_, std::try_to_lock);
    if (!poll_lock) continue;  // a test() is polling
    idle = poll_once() == 0;
    if (!idle) sleep = min_sleep_us_;
  }
}

// Engines alive in this process, stopped by a hook MPI_Finalize runs.
std::mutex g_engines_mu;
std::vector<std::weak_ptr<ProgressEngine>> g_engines;

int stop_engines_at_finalize(MPI_Comm, int, void*, void*) {
  std::vector<std::shared_ptr<ProgressEngine>> alive;
  {
    std::lock_guard<std::mutex> lock(g_engines_mu);
    for (auto& w : g_engines)
      if (auto e = w.lock()) alive.push_back(e);
    g_engines.clear();
  }
  for (auto& e : alive) e->stop();
  return MPI_SUCCESS;
}

std::shared_ptr<ProgressEngine> start_engine(bool with_thread, const CommOptions& options) {
  static std::once_flag hook_once;
  std::call_once(hook_once, [] {
    int keyval = MPI_KEYVAL_INVALID;
    PIPER_MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, stop_engines_at_finalize, &keyval, nullptr));
    PIPER_MPI_CHECK(MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr));
    PIPER_MPI_CHECK(MPI_Comm_free_keyval(&keyval));  // released when MPI_Finalize deletes the attribute
  });
  auto engine =
      std::make_shared<ProgressEngine>(with_thread, options.progress_min_sleep_us, options.progress_max_sleep_us);
  std::lock_guard<std::mutex> lock(g_engines_mu);
  std::erase_if(g_engines, [](const std::weak_ptr<ProgressEngine>& w) { return w.expired(); });
  g_engines.push_back(engine);
  return engine;
}

// ---- requests -------------------------------------------------------------------

class MpiRequest final : public RequestImpl {
 public:
  MpiRequest(std::shared_ptr<OpState> op, std::shared_ptr<ProgressEngine> engine, double timeout_s)
      : op_(std::move(op)), engine_(std::move(engine)), timeout_s_(timeout_s) {}

  bool test() override {
    if (!engine_->test(*op_)) return false;
    throw_if_failed();
    return true;
  }

  void wait() override {
    const auto start = Clock::now();
    if (!engine_->wait(*op_, deadline_after(timeout_s_)))
      throw CommError(timeout_message(mpi_world_rank(), op_->info.describe(), start, timeout_s_, op_->posted));
    throw_if_failed();
  }

  // A receive into a buffer about to go away is cancelled. Sends and
  // collectives cannot be cancelled; they stay with the engine.
  void abandon() noexcept override {
    if (!op_->done.load(std::memory_order_acquire) && op_->info.kind == OpKind::OP_RECV) engine_->cancel(*op_);
  }

 private:
  void throw_if_failed() const {
    if (op_->failure.empty()) return;
    throw CommError("piper comm: MPI error on " + where() + ": " + op_->info.describe() + ": " + op_->failure);
  }

  std::shared_ptr<OpState> op_;
  std::shared_ptr<ProgressEngine> engine_;
  double timeout_s_;
};

// ---- the communicator -------------------------------------------------------------

// A message's elements as MPI sees them: bf16 moves as 16-bit words (no reduction reads it).
MPI_Datatype mpi_type(backend::DType t) {
  switch (t) {
    case backend::DType::DTYPE_F32: return MPI_FLOAT;
    case backend::DType::DTYPE_BF16: return MPI_UINT16_T;
    case backend::DType::DTYPE_I32: return MPI_INT32_T;
  }
  throw std::invalid_argument("piper comm: a message of an unknown storage type");
}

int checked_count(size_t n, const char* what) {
  if (n > static_cast<size_t>(INT_MAX))
    throw std::invalid_argument(std::string("piper comm: ") + what + " of " + std::to_string(n) +
                                " elements exceeds INT_MAX (split the buffer)");
  return static_cast<int>(n);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::vector<int> world_ranks, std::string name, const CommOptions& options,
                  std::shared_ptr<ProgressEngine> engine, int tag_ub)
      : comm_(comm), world_ranks_(std::move(world_ranks)), name_(std::move(name)), options_(options),
        engine_(std::move(engine)), tag_ub_(tag_ub) {
    PIPER_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  int world_rank(int i) const override {
    check_peer(i);
    return world_ranks_[static_cast<size_t>(i)];
  }
  const std::string& name() const override { return name_; }
  const CommOptions& options() const override { return options_; }

  Request isend(const void* buf, size_t n, backend::DType t, int peer, int tag) override {
    int count = checked_count(n, "send");
    return post(p2p_info(OpKind::OP_SEND, n * backend::dtype_size(t), peer, tag), [&](MPI_Request* r) {
      return MPI_Isend(buf, count, mpi_type(t), peer, tag, comm_, r);
    });
  }
  Request irecv(void* buf, size_t n, backend::DType t, int peer, int tag) override {
    int count = checked_count(n, "recv");
    return post(p2p_info(OpKind::OP_RECV, n * backend::dtype_size(t), peer, tag), [&](MPI_Request* r) {
      return MPI_Irecv(buf, count, mpi_type(t), peer, tag, comm_, r);
    });
  }
  Request iallreduce(float* buf, size_t n) override {
    int count = checked_count(n, "allreduce");
    return post(coll_info(OpKind::OP_ALLREDUCE, n * sizeof(float)), [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, comm_, r);
    });
  }
  Request ireduce_scatter(const float* in, float* out, size_t n_per_rank) override {
    int count = checked_count(n_per_rank, "reduce_scatter");
    return post(coll_info(OpKind::OP_REDUCE_SCATTER, n_per_rank * static_cast<size_t>(size()) * sizeof(float)),
                [&](MPI_Request* r) {
                  return MPI_Ireduce_scatter_block(in, out, count, MPI_FLOAT, MPI_SUM, comm_, r);
                });
  }
  Request iallgather(const void* in, void* out, size_t n_per_rank, backend::DType t) override {
    int count = checked_count(n_per_rank, "allgather");
    return post(coll_info(OpKind::OP_ALLGATHER, n_per_rank * static_cast<size_t>(size()) * backend::dtype_size(t)),
                [&](MPI_Request* r) {
                  return MPI_Iallgather(in, count, mpi_type(t), out, count, mpi_type(t), comm_, r);
                });
  }
  Request ialltoall(const void* in, void* out, size_t n_per_rank, backend::DType t) override {
    int count = checked_count(n_per_rank, "alltoall");
    return post(coll_info(OpKind::OP_ALLTOALL, n_per_rank * static_cast<size_t>(size()) * backend::dtype_size(t)),
                [&](MPI_Request* r) {
                  return MPI_Ialltoall(in, count, mpi_type(t), out, count, mpi_type(t), comm_, r);
                });
  }

  Request ialltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                     const std::vector<int64_t>& recv_counts, backend::DType t) override {
    const size_t n = static_cast<size_t>(size());
    if (send_counts.size() != n || recv_counts.size() != n)
      throw std::invalid_argument("piper comm: alltoallv on " + name_ + " needs " + std::to_string(n) +
                                  " send and receive counts, got " + std::to_string(send_counts.size()) + " and " +
                                  std::to_string(recv_counts.size()));
    // [send counts | send displacements | receive counts | receive displacements]
    auto counts = std::make_shared<std::vector<int>>(4 * n);
    std::vector<int>& c = *counts;
    size_t sent = 0, received = 0;
    for (size_t j = 0; j < n; ++j) {
      c[j] = checked_count(static_cast<size_t>(send_counts[j]), "alltoallv send");
      c[n + j] = checked_count(sent, "alltoallv send offset");
      c[2 * n + j] = checked_count(static_cast<size_t>(recv_counts[j]), "alltoallv receive");
      c[3 * n + j] = checked_count(received, "alltoallv receive offset");
      sent += static_cast<size_t>(send_counts[j]), received += static_cast<size_t>(recv_counts[j]);
    }
    return post(coll_info(OpKind::OP_ALLTOALL, received * backend::dtype_size(t)), [&](MPI_Request* r) {
      return MPI_Ialltoallv(in, c.data(), c.data() + n, mpi_type(t), out, c.data() + 2 * n, c.data() + 3 * n,
                            mpi_type(t), comm_, r);
    }, counts);
  }

  Request iallreduce_double(double* buf, size_t n) override {
    int count = checked_count(n, "allreduce_double");
    return post(coll_info(OpKind::OP_ALLREDUCE, n * sizeof(double)), [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, buf, count, MPI_DOUBLE, MPI_SUM, comm_, r);
    });
  }
  void barrier() override {
    post(coll_info(OpKind::OP_BARRIER, 0), [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); }).wait();
  }

 protected:
  std::unique_ptr<Communicator> split_impl(const std::vector<int>& world_ranks, const std::string& label) override;

 private:
  void check_peer(int peer) const {
    if (peer < 0 || peer >= size())
      throw std::invalid_argument("piper comm: peer " + std::to_string(peer) + " outside " + name_);
  }
  OpInfo p2p_info(OpKind kind, size_t bytes, int peer, int tag) const {
    check_peer(peer);
    if (tag < 0 || tag > tag_ub_)
      throw std::invalid_argument("piper comm: tag " + std::to_string(tag) + " outside [0, " +
                                  std::to_string(tag_ub_) + "]");
    OpInfo info = coll_info(kind, bytes);
    info.peer = peer;
    info.peer_world = world_ranks_[static_cast<size_t>(peer)];
    info.tag = tag;
    return info;
  }
  OpInfo coll_info(OpKind kind, size_t bytes) const {
    OpInfo info;
    info.kind = kind;
    info.group = name_;
    info.group_rank = rank_;
    info.group_size = size();
    info.bytes = bytes;
    return info;
  }

  // Starts an operation through `start`, then hands it to the engine (if any).
  // `counts`: arrays `start` hands MPI, kept alive until the operation completes (alltoallv's).
  Request post(OpInfo info, const std::function<int(MPI_Request*)>& start,
               std::shared_ptr<const std::vector<int>> counts = nullptr) {
    auto op = std::make_shared<OpState>();
    op->info = std::move(info);
    op->counts = std::move(counts);
    int rc = start(&op->req);
    if (rc != MPI_SUCCESS)
      throw CommError("piper comm: MPI error on " + where() + " starting " + op->info.describe() + ": " +
                      mpi_error_string(rc));
    int flag = 0;  // already complete (an eager send, a message that was waiting)? then no hand-off
    MPI_Status status;
    rc = MPI_Test(&op->req, &flag, &status);
    if (rc != MPI_SUCCESS) op->failure = mpi_error_string(rc);
    if (flag || rc != MPI_SUCCESS)
      op->done.store(true, std::memory_order_release);
    else
      engine_->submit(op);
    return Request(std::make_unique<MpiRequest>(std::move(op), engine_, options_.timeout_s));
  }

  MPI_Comm comm_;
  std::vector<int> world_ranks_;  // group rank -> world rank
  std::string name_;
  CommOptions options_;
  std::shared_ptr<ProgressEngine> engine_;  // never null
  int tag_ub_;
  int rank_ = 0;
};

std::string list_string(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

std::unique_ptr<Communicator> MpiCommunicator::split_impl(const std::vector<int>& ranks, const std::string& label) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (ranks.empty() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw std::invalid_argument("piper comm: split of " + name_ + ": group " + list_string(ranks) +
                                " is empty or repeats a rank");
  int color_rank = -1;  // this communicator's rank of the group's lowest world rank
  for (int w : sorted) {
    auto it = std::find(world_ranks_.begin(), world_ranks_.end(), w);
    if (it == world_ranks_.end())
      throw std::invalid_argument("piper comm: split of " + name_ + ": world rank " + std::to_string(w) +
                                  " is not a member");
    if (color_rank < 0) color_rank = static_cast<int>(it - world_ranks_.begin());
  }
  const int me = world_ranks_[static_cast<size_t>(rank_)];
  auto pos = std::find(ranks.begin(), ranks.end(), me);
  const bool member = pos != ranks.end();
  MPI_Comm child = MPI_COMM_NULL;
  PIPER_MPI_CHECK(MPI_Comm_split(comm_, member ? color_rank : MPI_UNDEFINED,
                                 member ? static_cast<int>(pos - ranks.begin()) : 0, &child));
  if (child == MPI_COMM_NULL) return nullptr;
  PIPER_MPI_CHECK(MPI_Comm_set_errhandler(child, MPI_ERRORS_RETURN));
  int child_size = 0;
  PIPER_MPI_CHECK(MPI_Comm_size(child, &child_size));
  std::vector<int> formed(static_cast<size_t>(child_size));
  PIPER_MPI_CHECK(MPI_Allgather(&me, 1, MPI_INT, formed.data(), 1, MPI_INT, child));
  if (formed != ranks) {
    MPI_Comm_free(&child);
    throw std::invalid_argument("piper comm: split of " + name_ + ": " + where() + " passed group " +
                                list_string(ranks) + " but the members that chose the same first rank formed " +
                                list_string(formed) + " (every member must pass the same list)");
  }
  return std::make_unique<MpiCommunicator>(child, ranks, group_name(label, ranks), options_, engine_, tag_ub_);
}

}  // namespace

// ---- public functions -------------------------------------------------------------

namespace detail {
void mpi_check_failed(int rc, const char* expr, const char* file, int line) {
  std::string path = file;  // relative to the repository: from "src/" or "tests/" on
  for (const char* root : {"/src/", "/tests/"}) {
    size_t at = path.rfind(root);
    if (at != std::string::npos) {
      path = path.substr(at + 1);
      break;
    }
  }
  throw CommError("piper comm: MPI error at " + path + ":" + std::to_string(line) + " on " + where() + ": " + expr +
                  ": " + mpi_error_string(rc));
}
}  // namespace detail

int mpi_world_rank() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return -1;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

const std::string& mpi_host_name() {
  static const std::string host = [] {
    char name[MPI_MAX_PROCESSOR_NAME];
    int len = 0;
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized || MPI_Get_processor_name(name, &len) != MPI_SUCCESS) return std::string("?");
    return std::string(name, static_cast<size_t>(len));
  }();
  return host;
}

int init_mpi(int* argc, char*** argv) {
  int initialized = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialized);
  if (!initialized)
    PIPER_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  else
    PIPER_MPI_CHECK(MPI_Query_thread(&provided));
  return provided;
}

void finalize_mpi() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
}

bool mpi_thread_multiple() {
  int initialized = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Query_thread(&provided);
  return provided == MPI_THREAD_MULTIPLE;
}

std::unique_ptr<Communicator> make_mpi_world(const CommOptions& options) {
  return make_mpi_world(MPI_COMM_WORLD, options);
}

std::unique_ptr<Communicator> make_mpi_world(MPI_Comm base, const CommOptions& options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw CommError("piper comm: make_mpi_world before MPI is initialised (call init_mpi)");
  bool with_thread = false;
  if (options.progress_thread) {
    if (mpi_thread_multiple()) {
      with_thread = true;
    } else {
      static std::once_flag warn_once;
      std::call_once(warn_once, [] {
        if (mpi_world_rank() == 0)
          std::fprintf(stderr,
                       "piper comm: warning: MPI was not initialised with MPI_THREAD_MULTIPLE; no progress "
                       "thread, so transfers advance only inside test()/wait() and overlap little with compute\n");
      });
    }
  }
  auto engine = start_engine(with_thread, options);
  start_liveness_responder();
  MPI_Comm comm = MPI_COMM_NULL;
  PIPER_MPI_CHECK(MPI_Comm_dup(base, &comm));
  PIPER_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  int size = 0, flag = 0;
  int* tag_ub = nullptr;
  PIPER_MPI_CHECK(MPI_Comm_size(comm, &size));
  PIPER_MPI_CHECK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag));
  // Each group rank's rank in MPI_COMM_WORLD.
  std::vector<int> mine(static_cast<size_t>(size)), ranks(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) mine[static_cast<size_t>(i)] = i;
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  PIPER_MPI_CHECK(MPI_Comm_group(comm, &group));
  PIPER_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  PIPER_MPI_CHECK(MPI_Group_translate_ranks(group, size, mine.data(), world, ranks.data()));
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return std::make_unique<MpiCommunicator>(comm, ranks, group_name("world", ranks), options, std::move(engine),
                                           flag && tag_ub ? *tag_ub : 32767);
}

}  // namespace piper::comm
