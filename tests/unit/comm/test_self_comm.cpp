// test_self_comm.cpp — comm::SelfCommunicator, the communicator of one process without MPI: collectives
// copy or leave in place, messages to itself match by tag in posting order, and what cannot happen in a
// group of one is refused by name.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/self_comm.hpp"

namespace piper::comm {
namespace {

constexpr backend::DType kF32 = backend::DType::DTYPE_F32;  // messages of floats

TEST(SelfComm, CollectivesAreTheIdentityOrACopy) {
  SelfCommunicator self;
  EXPECT_EQ(self.rank(), 0);
  EXPECT_EQ(self.size(), 1);
  EXPECT_EQ(self.world_rank(0), 0);
  EXPECT_EQ(self.name(), "self [0]");
  std::vector<float> a{1, 2, 3}, b(3, -1.f);
  self.allreduce(a.data(), a.size());
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3}));
  self.reduce_scatter(a.data(), b.data(), 3);
  EXPECT_EQ(b, a);
  b.assign(3, -1.f);
  self.allgather(a.data(), b.data(), 3, kF32);
  EXPECT_EQ(b, a);
  b.assign(3, -1.f);
  self.alltoall(a.data(), b.data(), 3, kF32);
  EXPECT_EQ(b, a);
  b.assign(3, -1.f);
  self.alltoallv(a.data(), {2}, b.data(), {2}, kF32);
  EXPECT_EQ(b, (std::vector<float>{1, 2, -1}));
  EXPECT_THROW(self.alltoallv(a.data(), {2}, b.data(), {3}, kF32), std::invalid_argument);
  double d = 2.5;
  self.allreduce_double(&d, 1);
  EXPECT_EQ(d, 2.5);
  self.barrier();
}

TEST(SelfComm, MessagesToItselfMatchByTagInPostingOrder) {
  SelfCommunicator self;
  std::vector<float> x{1, 2}, y{3, 4}, z{5, 6}, got(2, 0.f), got2(2, 0.f), got3(2, 0.f);
  self.isend(x.data(), 2, kF32, 0, 7).wait();  // buffered: complete before any receive
  self.isend(y.data(), 2, kF32, 0, 8).wait();
  self.isend(z.data(), 2, kF32, 0, 7).wait();
  self.recv(got.data(), 2, kF32, 0, 8);
  EXPECT_EQ(got, y);
  self.recv(got.data(), 2, kF32, 0, 7);
  EXPECT_EQ(got, x);  // the first send of tag 7
  // A receive posted first completes when its send comes.
  Request r = self.irecv(got2.data(), 2, kF32, 0, 9);
  EXPECT_FALSE(r.test());
  self.send(y.data(), 2, kF32, 0, 9);
  EXPECT_TRUE(r.test());
  EXPECT_EQ(got2, y);
  self.recv(got3.data(), 2, kF32, 0, 7);
  EXPECT_EQ(got3, z);
  // Nothing else can post the send a lone receive waits for: waiting fails at once, naming it.
  Request lone = self.irecv(got.data(), 2, kF32, 0, 10);
  try {
    lone.wait();
    ADD_FAILURE() << "waited on a receive nobody can complete";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("tag 10"), std::string::npos) << e.what();
  }
  self.send(x.data(), 2, kF32, 0, 10);  // and completes once the send comes after all
  EXPECT_TRUE(lone.test());
  EXPECT_EQ(got, x);
  EXPECT_THROW(self.isend(x.data(), 2, kF32, 1, 0), std::invalid_argument);  // no peer 1
  const std::vector<float> four{1, 2, 3, 4};
  Request small = self.irecv(got.data(), 2, kF32, 0, 11);
  EXPECT_THROW(self.send(four.data(), 4, kF32, 0, 11), CommError);  // longer than the posted receive
  self.send(four.data(), 2, kF32, 0, 11);
  EXPECT_TRUE(small.test());
}

// A message's length counts elements of its storage type: three bf16 are six bytes.
TEST(SelfComm, MessagesOfBf16CountTheirElements) {
  SelfCommunicator self;
  const std::vector<uint16_t> bits{0x3f80, 0x4000, 0x4040};
  std::vector<uint16_t> got(4, 0);
  self.send(bits.data(), 3, backend::DType::DTYPE_BF16, 0, 1);
  self.recv(got.data(), 4, backend::DType::DTYPE_BF16, 0, 1);
  EXPECT_EQ(got, (std::vector<uint16_t>{0x3f80, 0x4000, 0x4040, 0}));
  Request r = self.irecv(got.data(), 2, backend::DType::DTYPE_BF16, 0, 2);
  try {
    self.send(bits.data(), 3, backend::DType::DTYPE_BF16, 0, 2);
    ADD_FAILURE() << "three bf16 went into a receive of two";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("3 bf16"), std::string::npos) << e.what();
  }
  self.send(bits.data(), 2, backend::DType::DTYPE_BF16, 0, 2);
  EXPECT_TRUE(r.test());
}

TEST(SelfComm, SplitsIntoItselfOnly) {
  SelfCommunicator self;
  std::unique_ptr<Communicator> dp = self.split({0}, "dp");
  ASSERT_NE(dp, nullptr);
  EXPECT_EQ(dp->name(), "dp [0]");
  EXPECT_EQ(dp->size(), 1);
  EXPECT_THROW(self.split({0, 1}, "tp"), std::invalid_argument);
}

}  // namespace
}  // namespace piper::comm
