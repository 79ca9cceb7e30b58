// staged_comm.cpp — device buffers through host staging around a host communicator.
#include "comm/staged_comm.hpp"

#include <numeric>
#include <utility>

namespace piper::comm {

namespace {

// One operation on host staging buffers (the device's page-locked ones where it has them): when the host
// operation completes, the received floats go to the device, once.
class StagedRequest final : public RequestImpl {
 public:
  StagedRequest(backend::Backend& device, backend::HostBuffer in, backend::HostBuffer out, void* dst, size_t dst_bytes)
      : device_(device), in_(std::move(in)), out_(std::move(out)), dst_(dst), dst_bytes_(dst_bytes) {}
  void start(Request host) { host_ = std::move(host); }
  const float* in() const { return in_.data(); }
  float* out() { return out_.data(); }

  bool test() override {
    if (!host_.test()) return false;
    land();
    return true;
  }
  void wait() override {
    host_.wait();
    land();
  }
  // Destroyed while an error unwinds: the host request, destroyed with it, gives up its operation.
  void abandon() noexcept override {}

 private:
  void land() {
    if (dst_ && dst_bytes_) device_.to_device(dst_, out_.data(), dst_bytes_);
    dst_ = nullptr;
  }
  backend::Backend& device_;
  backend::HostBuffer in_, out_;
  void* dst_;
  size_t dst_bytes_;
  Request host_;
};

// The bytes of `counts` elements of type t in all.
size_t total_bytes(const std::vector<int64_t>& counts, backend::DType t) {
  return static_cast<size_t>(std::accumulate(counts.begin(), counts.end(), int64_t{0})) * backend::dtype_size(t);
}

// Host staging for `bytes` bytes, in whole floats.
backend::HostBuffer host_buffer(backend::Backend& device, size_t bytes) {
  return backend::HostBuffer(device, (bytes + sizeof(float) - 1) / sizeof(float));
}

}  // namespace

StagedCommunicator::StagedCommunicator(Communicator& host, backend::Backend& device)
    : host_(&host), device_(device) {}

StagedCommunicator::StagedCommunicator(std::unique_ptr<Communicator> owned, backend::Backend& device)
    : owned_(std::move(owned)), host_(owned_.get()), device_(device) {}

template <class Op>
Request StagedCommunicator::staged(const void* in, size_t in_bytes, void* out, size_t out_bytes, Op op) {
  backend::HostBuffer host_in = host_buffer(device_, in ? in_bytes : 0);
  if (in && in_bytes) device_.to_host(host_in.data(), in, in_bytes);
  auto req = std::make_unique<StagedRequest>(device_, std::move(host_in), host_buffer(device_, out ? out_bytes : 0),
                                             out, out ? out_bytes : 0);
  StagedRequest& r = *req;
  r.start(op(r.in(), r.out()));
  return Request(std::move(req));
}

Request StagedCommunicator::isend(const void* buf, size_t n, backend::DType t, int peer, int tag) {
  return staged(buf, n * backend::dtype_size(t), nullptr, 0,
                [&](const float* in, float*) { return host_->isend(in, n, t, peer, tag); });
}

Request StagedCommunicator::irecv(void* buf, size_t n, backend::DType t, int peer, int tag) {
  return staged(nullptr, 0, buf, n * backend::dtype_size(t),
                [&](const float*, float* out) { return host_->irecv(out, n, t, peer, tag); });
}

Request StagedCommunicator::iallreduce(float* buf, size_t n) {
  // In place on the host copy: the staged input is the buffer the result lands from.
  backend::HostBuffer host(device_, n);
  if (n) device_.to_host(host.data(), buf, n * sizeof(float));
  auto req = std::make_unique<StagedRequest>(device_, backend::HostBuffer(), std::move(host), buf, n * sizeof(float));
  StagedRequest& r = *req;
  r.start(host_->iallreduce(r.out(), n));
  return Request(std::move(req));
}

Request StagedCommunicator::ireduce_scatter(const float* in, float* out, size_t n_per_rank) {
  const size_t n = n_per_rank * static_cast<size_t>(size());
  return staged(in, n * sizeof(float), out, n_per_rank * sizeof(float),
                [&](const float* hin, float* hout) { return host_->ireduce_scatter(hin, hout, n_per_rank); });
}

Request StagedCommunicator::iallgather(const void* in, void* out, size_t n_per_rank, backend::DType t) {
  const size_t bytes = n_per_rank * backend::dtype_size(t);
  return staged(in, bytes, out, bytes * static_cast<size_t>(size()),
                [&](const float* hin, float* hout) { return host_->iallgather(hin, hout, n_per_rank, t); });
}

Request StagedCommunicator::ialltoall(const void* in, void* out, size_t n_per_rank, backend::DType t) {
  const size_t bytes = n_per_rank * static_cast<size_t>(size()) * backend::dtype_size(t);
  return staged(in, bytes, out, bytes,
                [&](const float* hin, float* hout) { return host_->ialltoall(hin, hout, n_per_rank, t); });
}

Request StagedCommunicator::ialltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                                       const std::vector<int64_t>& recv_counts, backend::DType t) {
  return staged(in, total_bytes(send_counts, t), out, total_bytes(recv_counts, t), [&](const float* hin, float* hout) {
    return host_->ialltoallv(hin, send_counts, hout, recv_counts, t);
  });
}

std::unique_ptr<Communicator> StagedCommunicator::split_impl(const std::vector<int>& world_ranks,
                                                             const std::string& label) {
  std::unique_ptr<Communicator> group = host_->split(world_ranks, label);
  if (!group) return nullptr;
  return std::unique_ptr<Communicator>(new StagedCommunicator(std::move(group), device_));
}

}  // namespace piper::comm
