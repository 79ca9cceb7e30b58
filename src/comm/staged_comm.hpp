// staged_comm.hpp — a communicator for float buffers on a backend the host cannot address (a GPU,
// the detached CPU backend): every operation copies what it sends to host staging buffers, runs on
// a host communicator (MPI), and copies what it receives back to the device when it completes.
// So the MPI communicator serves device tensors, and two ranks may share one GPU, which NCCL
// refuses (docs/comm.md, "Device buffers").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "comm/comm.hpp"

namespace piper::comm {

class StagedCommunicator final : public Communicator {
 public:
  // Float buffers are memory of `device`; double buffers (norms, losses) are host memory, as on `host`.
  // `host` outlives this communicator.
  StagedCommunicator(Communicator& host, backend::Backend& device);

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  int world_rank(int i) const override { return host_->world_rank(i); }
  const std::string& name() const override { return host_->name(); }
  const CommOptions& options() const override { return host_->options(); }

  Request isend(const void* buf, size_t n, backend::DType t, int peer, int tag) override;
  Request irecv(void* buf, size_t n, backend::DType t, int peer, int tag) override;
  Request iallreduce(float* buf, size_t n) override;
  Request ireduce_scatter(const float* in, float* out, size_t n_per_rank) override;
  Request iallgather(const void* in, void* out, size_t n_per_rank, backend::DType t) override;
  Request ialltoall(const void* in, void* out, size_t n_per_rank, backend::DType t) override;
  Request ialltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                     const std::vector<int64_t>& recv_counts, backend::DType t) override;
  Request iallreduce_double(double* buf, size_t n) override { return host_->iallreduce_double(buf, n); }
  void barrier() override { host_->barrier(); }

 protected:
  std::unique_ptr<Communicator> split_impl(const std::vector<int>& world_ranks, const std::string& label) override;

 private:
  StagedCommunicator(std::unique_ptr<Communicator> owned, backend::Backend& device);
  // The operation `op` on host buffers: `in` (in_bytes) staged from the device first, the result
  // (out_bytes) copied to `out` on the device when the request completes.
  template <class Op>
  Request staged(const void* in, size_t in_bytes, void* out, size_t out_bytes, Op op);

  std::unique_ptr<Communicator> owned_;  // a split's group; null for the wrapped world
  Communicator* host_;
  backend::Backend& device_;
};

}  // namespace piper::comm
