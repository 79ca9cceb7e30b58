// self_comm.hpp — the communicator of one process alone, without MPI: every collective is the identity
// (or a copy from input to output), and a message to itself is matched by tag in posting order, as
// MPI_COMM_SELF behaves. For a runtime on one device in a process that does not start MPI (the
// device check's training run, tools and tests); float buffers are host memory, as for MpiCommunicator.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"

namespace piper::comm {

class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(CommOptions options = {}, const std::string& label = "self");

  int rank() const override { return 0; }
  int size() const override { return 1; }
  int world_rank(int i) const override;
  const std::string& name() const override { return name_; }
  const CommOptions& options() const override { return options_; }

  Request isend(const void* buf, size_t n, backend::DType t, int peer, int tag) override;
  Request irecv(void* buf, size_t n, backend::DType t, int peer, int tag) override;
  Request iallreduce(float* /*buf*/, size_t /*n*/) override { return {}; }
  Request ireduce_scatter(const float* in, float* out, size_t n_per_rank) override;
  Request iallgather(const void* in, void* out, size_t n_per_rank, backend::DType t) override;
  Request ialltoall(const void* in, void* out, size_t n_per_rank, backend::DType t) override;
  Request ialltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                     const std::vector<int64_t>& recv_counts, backend::DType t) override;
  Request iallreduce_double(double* /*buf*/, size_t /*n*/) override { return {}; }
  void barrier() override {}

 protected:
  std::unique_ptr<Communicator> split_impl(const std::vector<int>& world_ranks, const std::string& label) override;

 private:
  // Messages to itself not yet received, and receives not yet matched, each in posting order.
  struct Mailbox;
  void check_peer(const char* op, int peer) const;

  CommOptions options_;
  std::string name_;
  std::shared_ptr<Mailbox> mail_;
};

}  // namespace piper::comm
