// comm.hpp — the communicator interface: one object per process group, non-blocking operations returning
// RAII requests, and timeouts that name the operation that hung. Collectives reduce and move float
// buffers; a point-to-point message carries n elements of a storage type (activations between
// pipeline stages travel in the type they are stored in).
//
// Contract (every implementation, see docs/comm.md):
// - Ranks: `rank()` is this process's index in the group, `peer` arguments are
//   group ranks, `world_rank(i)` maps a group rank to its world rank.
// - Collectives on one communicator are issued in the same order on every
//   member (as in MPI and NCCL); they carry no tag. Two collectives that may be
//   in flight concurrently in different orders need different communicators.
// - Point-to-point messages are matched by (peer, tag) in posting order; the
//   caller chooses tags (0 .. 32767 always works).
// - A buffer passed to an i* call stays valid, and is not written (isend, the
//   inputs of collectives) or read (irecv, outputs) by the caller, until the
//   request completes. Collectives reduce by sum.
// - `Request::wait()` longer than `CommOptions::timeout_s` throws CommError
//   naming the world rank, host, operation, peer or group, bytes, tag and
//   time waited; the request stays pending, so wait() may be called again.
// - A Communicator and its requests are used by one thread at a time.
#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.hpp"

namespace piper::comm {


struct CommOptions {
  // A wait (or blocking call) longer than this throws CommError.
  double timeout_s = 300;
  // Drive transfers from a background progress thread (needs MPI_THREAD_MULTIPLE;
  // without it, progress happens only inside test() and wait()).
  bool progress_thread = true;
  // After a poll that completed nothing the progress thread sleeps: first
  // min, doubling up to max; a completion or a new operation resets it to min.
  // Each wake-up steals the core from compute: measured on 2 cores, an
  // operation left pending during compute slowed it by +115% at 20 us,
  // +49% at 50 us, +11% at 200 us, +2% at 1000 us (docs/comm.md).
  // max 0 = never sleep (yield only).
  int progress_min_sleep_us = 10;
  int progress_max_sleep_us = 1000;
};

// A communication failure: a timeout, or an error reported by the library.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a backend implements for one pending operation.
class RequestImpl {
 public:
  virtual ~RequestImpl() = default;
  virtual bool test() = 0;  // true once complete; throws CommError on a library error
  virtual void wait() = 0;  // blocks until complete; throws CommError on timeout or error
  // The owning Request is destroyed while an exception unwinds the stack:
  // stop waiting for the operation (cancel a receive) without blocking.
  virtual void abandon() noexcept = 0;
};

// RAII handle of one non-blocking operation; move-only. An empty Request is
// complete. Destroying a pending Request waits for it (a timeout there prints
// the CommError and terminates: destructors cannot throw), except during stack
// unwinding, where it is abandoned so the error can reach the caller's handler.
class Request {
 public:
  Request() = default;
  explicit Request(std::unique_ptr<RequestImpl> impl) : impl_(std::move(impl)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&& other) noexcept;  // finishes the request it held first
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  bool test();  // true once complete (then the request is empty)
  void wait();  // throws CommError after the timeout; the request stays pending
  bool pending() const { return impl_ != nullptr; }

 private:
  void finish() noexcept;
  std::unique_ptr<RequestImpl> impl_;
};

// Waits for every request, in order.
void wait_all(std::vector<Request>& requests);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int world_rank(int i) const = 0;    // group rank -> world rank
  virtual const std::string& name() const = 0;  // "world [0..3]", "dp group [0,2]"
  virtual const CommOptions& options() const = 0;

  // Non-blocking messages of n elements of storage type t (backend::dtype_size bytes each); peer is a
  // group rank. A receive may be longer than the message it matches; its elements past the message
  // are then unspecified (a staged receive lands all of them). NCCL's may not: NCCL pairs a send
  // and a receive of the same count and type only, so on the NCCL communicator they are equal.
  virtual Request isend(const void* buf, size_t n, backend::DType t, int peer, int tag) = 0;
  virtual Request irecv(void* buf, size_t n, backend::DType t, int peer, int tag) = 0;
  // Reductions: n counts floats.
  // buf (n) <- sum over ranks of buf, in place.
  virtual Request iallreduce(float* buf, size_t n) = 0;
  // in (size() * n_per_rank): block r of the sum goes to rank r's out (n_per_rank).
  virtual Request ireduce_scatter(const float* in, float* out, size_t n_per_rank) = 0;
  // A gather moves, as an all-to-all: elements of storage type t (ZeRO-3's parameters travel in the
  // type the units compute with). in (n_per_rank) from rank r lands in out (size() * n_per_rank) at block r.
  virtual Request iallgather(const void* in, void* out, size_t n_per_rank, backend::DType t) = 0;
  // All-to-alls move, as gathers: elements of storage type t (an MoE block's rows travel in the
  // activations' type). Block j of rank i's in (size() * n_per_rank) lands at block i of rank j's out.
  virtual Request ialltoall(const void* in, void* out, size_t n_per_rank, backend::DType t) = 0;
  // Variable sizes: rank i sends send_counts[j] elements to rank j, taken from
  // `in` in rank order (block j after blocks 0..j-1), and receives
  // recv_counts[j] elements from rank j into `out` in rank order. Each count
  // list has size() entries; recv_counts[j] on rank i must equal
  // send_counts[i] on rank j (MoE dispatch and combine).
  virtual Request ialltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                             const std::vector<int64_t>& recv_counts, backend::DType t) = 0;

  // Blocking versions: the i* call, then wait().
  void send(const void* buf, size_t n, backend::DType t, int peer, int tag) { isend(buf, n, t, peer, tag).wait(); }
  void recv(void* buf, size_t n, backend::DType t, int peer, int tag) { irecv(buf, n, t, peer, tag).wait(); }
  void allreduce(float* buf, size_t n) { iallreduce(buf, n).wait(); }
  void reduce_scatter(const float* in, float* out, size_t n_per_rank) {
    ireduce_scatter(in, out, n_per_rank).wait();
  }
  void allgather(const void* in, void* out, size_t n_per_rank, backend::DType t) {
    iallgather(in, out, n_per_rank, t).wait();
  }
  void alltoall(const void* in, void* out, size_t n_per_rank, backend::DType t) {
    ialltoall(in, out, n_per_rank, t).wait();
  }
  void alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                 const std::vector<int64_t>& recv_counts, backend::DType t) {
    ialltoallv(in, send_counts, out, recv_counts, t).wait();
  }

  // buf (n doubles) <- sum over ranks of buf, in place (norms, losses).
  virtual Request iallreduce_double(double* buf, size_t n) = 0;
  // Blocking; honours the timeout.
  void allreduce_double(double* buf, size_t n) { iallreduce_double(buf, n).wait(); }
  // Blocking; honours the timeout.
  virtual void barrier() = 0;

  // Collective over this communicator: every member calls it with the world
  // ranks of the group it belongs to (the same list on every member of that
  // group; group rank = position in the list). Returns nullptr on a rank the
  // list does not contain. Throws std::invalid_argument for a bad list and
  // when members of a group disagree on it. The child inherits the options
  // and is named "<label> [ranks]".
  std::unique_ptr<Communicator> split(const std::vector<int>& world_ranks, const std::string& label = "group") {
    return split_impl(world_ranks, label);
  }

 protected:
  virtual std::unique_ptr<Communicator> split_impl(const std::vector<int>& world_ranks,
                                                   const std::string& label) = 0;
};


// "dp group [0,2]", "world [0..7]": how communicators name themselves.
std::string group_name(std::string_view label, const std::vector<int>& world_ranks);

}  // namespace piper::comm
