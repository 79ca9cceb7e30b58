// test_device_comm.cpp — comm::for_device (which communicator moves a device's tensors) and the NCCL
// communicator on one GPU in one process: its collectives, messages to itself matched by tag, its order
// after the backend's queued work, splits and the timeout of a message never matched. The NCCL tests are
// GPU tests: not run where there is no CUDA device. Their multi-rank twin is in mpi/test_comm_mpi.cpp.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "comm/device_comm.hpp"
#include "comm/nccl_comm.hpp"
#include "comm/self_comm.hpp"
#include "comm/staged_comm.hpp"

namespace piper::comm {
namespace {

constexpr backend::DType kF32 = backend::DType::DTYPE_F32;  // messages of floats

backend::Tensor on_device(backend::Backend& be, const std::vector<float>& host) {
  backend::Tensor t(be, static_cast<int64_t>(host.size()), backend::MemCategory::MEM_BUFFERS);
  be.to_device(t.data(), host.data(), host.size() * sizeof(float));
  return t;
}
std::vector<float> to_host(backend::Backend& be, const backend::Tensor& t) {
  std::vector<float> host(static_cast<size_t>(t.numel()));
  be.to_host(host.data(), t.data(), host.size() * sizeof(float));
  return host;
}

TEST(DeviceComm, TheHostServesItsOwnMemoryAndStagingServesADetachedDevice) {
  SelfCommunicator self;
  EXPECT_EQ(for_device(self, backend::cpu(), DeviceComm::DEVICE_COMM_AUTO), nullptr);
  EXPECT_EQ(for_device(self, backend::cpu(), DeviceComm::DEVICE_COMM_MPI), nullptr);
  for (DeviceComm how : {DeviceComm::DEVICE_COMM_AUTO, DeviceComm::DEVICE_COMM_MPI}) {
    std::unique_ptr<Communicator> dev = for_device(self, backend::cpu_detached(), how);
    ASSERT_NE(dev, nullptr);
    EXPECT_NE(dynamic_cast<StagedCommunicator*>(dev.get()), nullptr);  // no NCCL for a CPU device
    backend::Tensor in = on_device(backend::cpu_detached(), {1, 2, 3}), out = on_device(backend::cpu_detached(), {0, 0, 0});
    dev->alltoall(in.data(), out.data(), 3, kF32);
    EXPECT_EQ(to_host(backend::cpu_detached(), out), (std::vector<float>{1, 2, 3}));
  }
}

TEST(DeviceComm, NcclForADeviceItCannotServeIsRefusedSayingWhy) {
  SelfCommunicator self;
  try {
    for_device(self, backend::cpu_detached(), DeviceComm::DEVICE_COMM_NCCL);
    FAIL() << "NCCL accepted a CPU device";
  } catch (const CommError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("NCCL serves CUDA buffers, and the device is cpu_detached"), std::string::npos) << what;
    EXPECT_NE(what.find("train.device_comm: mpi"), std::string::npos) << what;
  }
  std::string why;
  EXPECT_EQ(make_nccl(self, backend::cpu(), &why), nullptr);
  EXPECT_NE(why.find("device is cpu"), std::string::npos) << why;
}

// ---- NCCL on one GPU ----------------------------------------------------------------------

// This process's GPU and NCCL over it alone; the test is not run without a CUDA device.
class NcclComm : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    gpu_ = backend::cuda(&why);
    if (!gpu_) GTEST_SKIP() << "GPU test not run: " << why;
#ifndef PIPER_HAVE_NCCL
    GTEST_SKIP() << "GPU test not run: this build's CUDA backend has no NCCL";
#endif
    nccl_ = make_nccl(self_, *gpu_, &why);
    ASSERT_NE(nccl_, nullptr) << why;
  }
  backend::Backend& be() { return *gpu_; }

  SelfCommunicator self_;
  backend::Backend* gpu_ = nullptr;
  std::unique_ptr<Communicator> nccl_;
};

TEST_F(NcclComm, CollectivesOfOneRankLandTheirInputs) {
  backend::Backend& be = this->be();
  std::unique_ptr<Communicator> nccl = for_device(self_, be, DeviceComm::DEVICE_COMM_AUTO);
  ASSERT_NE(nccl, nullptr);
  EXPECT_EQ(dynamic_cast<StagedCommunicator*>(nccl.get()), nullptr) << "auto on a CUDA device of its own is NCCL";
  EXPECT_EQ(nccl->size(), 1);
  const std::vector<float> a{1, 2, 3, 4, 5, 6};
  backend::Tensor x = on_device(be, a), y = on_device(be, std::vector<float>(6, -1.f));
  nccl->allreduce(x.data(), 6);
  EXPECT_EQ(to_host(be, x), a);
  nccl->reduce_scatter(x.data(), y.data(), 6);
  EXPECT_EQ(to_host(be, y), a);
  be.fill_zero(y.data(), 6 * sizeof(float));
  nccl->allgather(x.data(), y.data(), 6, kF32);
  EXPECT_EQ(to_host(be, y), a);
  be.fill_zero(y.data(), 6 * sizeof(float));
  nccl->alltoall(x.data(), y.data(), 6, kF32);
  EXPECT_EQ(to_host(be, y), a);
  be.fill_zero(y.data(), 6 * sizeof(float));
  nccl->alltoallv(x.data(), {4}, y.data(), {4}, kF32);
  EXPECT_EQ(to_host(be, y), (std::vector<float>{1, 2, 3, 4, 0, 0}));
  EXPECT_THROW(nccl->alltoallv(x.data(), {4, 1}, y.data(), {4}, kF32), std::invalid_argument);
  double d = 2.5;
  nccl->allreduce_double(&d, 1);  // host memory, over the host communicator
  EXPECT_EQ(d, 2.5);
  nccl->barrier();
}

TEST_F(NcclComm, AnOperationWaitsForTheBackendsQueuedWork) {
  backend::Backend& be = this->be();
  Communicator* nccl = nccl_.get();
  const size_t n = size_t{1} << 24;  // 64 MB: a device copy long enough to be in flight when the next call comes
  std::vector<float> src(n);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i % 1000);
  backend::Tensor from = on_device(be, src), in = on_device(be, std::vector<float>(n, 0.f)),
                  out = on_device(be, std::vector<float>(n, 0.f));
  be.copy(in.data(), from.data(), n * sizeof(float));  // queued on the backend's stream
  nccl->alltoall(in.data(), out.data(), n, kF32);            // must read what the copy wrote
  EXPECT_EQ(to_host(be, out), src);
}

TEST_F(NcclComm, MessagesToItselfMatchByTag) {
  backend::Backend& be = this->be();
  Communicator* nccl = nccl_.get();
  backend::Tensor a = on_device(be, {1, 2}), b = on_device(be, {3, 4, 5});
  backend::Tensor ra = on_device(be, {0, 0}), rb = on_device(be, {0, 0, 0});
  Request s1 = nccl->isend(a.data(), 2, kF32, 0, 1);
  Request s2 = nccl->isend(b.data(), 3, kF32, 0, 2);
  Request r2 = nccl->irecv(rb.data(), 3, kF32, 0, 2);  // tag 2 first: matched by tag, not by order
  Request r1 = nccl->irecv(ra.data(), 2, kF32, 0, 1);
  r2.wait();
  r1.wait();
  s1.wait();
  s2.wait();
  EXPECT_EQ(to_host(be, ra), (std::vector<float>{1, 2}));
  EXPECT_EQ(to_host(be, rb), (std::vector<float>{3, 4, 5}));
  EXPECT_THROW(nccl->isend(a.data(), 2, kF32, 1, 0), std::invalid_argument);  // a group of one has no rank 1
}

TEST_F(NcclComm, ASplitIsNcclToo) {
  backend::Backend& be = this->be();
  Communicator* nccl = nccl_.get();
  std::unique_ptr<Communicator> group = nccl->split({0}, "dp");
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->name(), "dp [0]");
  backend::Tensor x = on_device(be, {7, 8}), y = on_device(be, {0, 0, 0, 0});
  group->allgather(x.data(), y.data(), 2, kF32);
  EXPECT_EQ(to_host(be, y), (std::vector<float>{7, 8, 0, 0}));
}

TEST_F(NcclComm, AMessageNeverMatchedTimesOutNamingIt) {
  backend::Backend& be = this->be();
  CommOptions opt;
  opt.timeout_s = 0.3;
  SelfCommunicator self(opt);
  std::unique_ptr<Communicator> nccl = make_nccl(self, be, nullptr);
  ASSERT_NE(nccl, nullptr);
  backend::Tensor x = on_device(be, {0, 0});
  std::string what;
  try {
    Request r = nccl->irecv(x.data(), 2, kF32, 0, 5);
    r.wait();  // nobody sends: a CommError; the request is abandoned as it unwinds
  } catch (const CommError& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("timeout on world rank 0 (host "), std::string::npos) << what;
  EXPECT_NE(what.find("recv from peer 0 (world rank 0) of self [0], 8 bytes, tag 5"), std::string::npos) << what;
  EXPECT_NE(what.find("its other half not posted"), std::string::npos) << what;
  // The communicator serves on: the abandoned receive left the mailbox, so a new pair matches.
  backend::Tensor src = on_device(be, {9, 10});
  Request s = nccl->isend(src.data(), 2, kF32, 0, 5);
  nccl->recv(x.data(), 2, kF32, 0, 5);
  s.wait();
  EXPECT_EQ(to_host(be, x), (std::vector<float>{9, 10}));
}

}  // namespace
}  // namespace piper::comm
