// test_dispatch_mpi.cpp — the MoE token dispatcher over real ep groups (every ep that divides the world):
// rows reach the ranks of their experts in expert-major order, and with identity experts and uniform
// weights 1/top_k, dispatch then combine returns the input exactly, and its gradient the output's, with
// the rows in f32 or in bf16 from the block's xn to the experts and back, or in bf16 to the experts and
// f32 back (as under tp, whose experts give partial sums); every value below has a bf16 form, so bf16
// rounds nothing. The outputs combine into f32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <utility>
#include <vector>

#include "comm/comm.hpp"
#include "model/moe_dispatch.hpp"

namespace piper::comm {
Communicator& test_world();  // test_comm_mpi.cpp
}  // namespace piper::comm

namespace piper::model {
namespace {

constexpr int64_t kExperts = 8, kRows = 10, kWidth = 6;

// Rank r's routing: top_k distinct experts per row, from a generator seeded by the rank.
std::vector<int32_t> routing(int rank, int64_t k) {
  std::mt19937_64 rng(static_cast<uint64_t>(1000 * k + rank));
  std::vector<int32_t> out;
  for (int64_t m = 0; m < kRows; ++m) {
    std::vector<int32_t> all(kExperts);
    for (int32_t e = 0; e < kExperts; ++e) all[static_cast<size_t>(e)] = e;
    std::shuffle(all.begin(), all.end(), rng);
    out.insert(out.end(), all.begin(), all.begin() + k);
  }
  return out;
}

// Values with few mantissa bits, so that every sum of top_k of them weighted 1/top_k is exact.
float value(int rank, int64_t row, int64_t col) { return static_cast<float>((rank * 37 + row * 5 + col) % 64) / 8.0f; }

void run(comm::Communicator& c, const CommBuffer& b) {
  if (b.send_counts.empty())
    c.alltoall(b.send, b.recv, static_cast<size_t>(b.count) / static_cast<size_t>(c.size()), b.dtype);
  else
    c.alltoallv(b.send, b.send_counts, b.recv, b.recv_counts, b.dtype);
}

TEST(Dispatcher, RoundTripIsExactAtEveryEp) {
  comm::Communicator& world = comm::test_world();
  backend::Backend& be = backend::cpu();
  const int W = world.size(), r = world.rank();
  const auto f32 = backend::DType::DTYPE_F32, bf16 = backend::DType::DTYPE_BF16;
  const auto buffers = backend::MemCategory::MEM_BUFFERS;
  const std::pair<backend::DType, backend::DType> types[] = {{f32, f32}, {bf16, bf16}, {bf16, f32}};
  for (const auto& [rows, outputs] : types)
  for (int ep = 1; ep <= W; ++ep) {
    if (W % ep != 0 || kExperts % ep != 0) continue;
    std::vector<int> members;  // the ep group of this rank: ep consecutive ranks
    for (int i = 0; i < ep; ++i) members.push_back(r / ep * ep + i);
    auto group = world.split(members, "ep");
    const int g = group->rank();
    for (int64_t k : {1, 2, 4}) {
      const std::vector<int32_t> experts = routing(r, k);
      std::vector<float> x(static_cast<size_t>(kRows * kWidth)), dout(x.size());
      for (int64_t m = 0; m < kRows; ++m)
        for (int64_t c = 0; c < kWidth; ++c) {
          x[static_cast<size_t>(m * kWidth + c)] = c == 0 ? static_cast<float>(r * kRows + m) : value(r, m, c);
          dout[static_cast<size_t>(m * kWidth + c)] = value(r + 3, m, c);
        }
      std::vector<float> weights(static_cast<size_t>(kRows * k), 1.0f / static_cast<float>(k));
      const backend::ConstTensorView ev = backend::view(be, experts.data(), {kRows, k});
      const backend::ConstTensorView wv = backend::view(be, weights.data(), {kRows, k});

      const backend::Tensor xt = backend::converted(backend::view(be, x.data(), {kRows, kWidth}), rows, buffers);
      const backend::Tensor dt = backend::converted(backend::view(be, dout.data(), {kRows, kWidth}), rows, buffers);
      Dispatcher d(be, kExperts, kWidth, ep, rows, outputs);
      d.route(ev, xt.view());
      if (ep > 1) {
        run(*group, d.counts());
        d.size();
        run(*group, d.dispatch());
      }
      d.sort();
      // Expert-major, then by source rank, then by row: the rows routed to each local expert.
      std::vector<float> expect;
      const int64_t local = kExperts / ep;
      for (int64_t l = 0; l < local; ++l)
        for (int src = 0; src < ep; ++src) {
          const int world_src = members[static_cast<size_t>(src)];
          const std::vector<int32_t> theirs = routing(world_src, k);
          for (int64_t m = 0; m < kRows; ++m)
            for (int64_t s = 0; s < k; ++s)
              if (theirs[static_cast<size_t>(m * k + s)] == g * local + l) expect.push_back(static_cast<float>(world_src * kRows + m));
        }
      ASSERT_EQ(d.rows(), static_cast<int64_t>(expect.size())) << "ep " << ep << " k " << k;
      const int64_t R = d.rows();
      EXPECT_EQ(d.expert_input(0, R).dtype, rows);
      const backend::Tensor in = backend::converted(d.expert_input(0, R), f32, buffers);
      int misplaced = 0;
      for (int64_t i = 0; i < R; ++i) misplaced += in.data()[i * kWidth] != expect[static_cast<size_t>(i)];
      EXPECT_EQ(misplaced, 0) << "ep " << ep << " k " << k << ": rows away from their experts";
      EXPECT_EQ(d.expert_output(0, R).dtype, outputs);
      be.convert(d.expert_input(0, R), d.expert_output(0, R));  // identity experts
      d.unsort();
      if (ep > 1) run(*group, d.give_back());
      std::vector<float> out(x.size(), -1.0f);
      d.combine(wv, backend::view(be, out.data(), {kRows, kWidth}));

      std::vector<float> dweights(weights.size()), dx(x.size(), 0.0f);
      d.combine_backward(dt.view(), wv, backend::view(be, dweights.data(), {kRows, k}));
      if (ep > 1) run(*group, d.dispatch_grad());
      d.sort_grad();
      EXPECT_EQ(d.expert_grad_output(0, R).dtype, outputs);
      EXPECT_EQ(d.expert_grad_input(0, R).dtype, f32);
      be.convert(d.expert_grad_output(0, R), d.expert_grad_input(0, R));
      d.unsort_grad();
      if (ep > 1) run(*group, d.return_grad());
      d.dispatch_backward(backend::view(be, dx.data(), {kRows, kWidth}));

      int out_wrong = 0, dx_wrong = 0, dw_wrong = 0;
      for (size_t i = 0; i < x.size(); ++i) out_wrong += out[i] != x[i], dx_wrong += dx[i] != dout[i];
      for (int64_t m = 0; m < kRows; ++m) {
        double dot = 0;  // dweights = dout . (the expert's output for the slot) = dout . x
        for (int64_t c = 0; c < kWidth; ++c) dot += double(dout[static_cast<size_t>(m * kWidth + c)]) * x[static_cast<size_t>(m * kWidth + c)];
        for (int64_t s = 0; s < k; ++s) dw_wrong += dweights[static_cast<size_t>(m * k + s)] != static_cast<float>(dot);
      }
      if (r == 0)
        std::printf("[ dispatch ] rows in %s, out %s, ep %d top_k %lld: %lld rows on rank 0's experts; combine(dispatch(x)) "
                    "differs from x in %d of %zu values, the input gradient from dout in %d (tolerance: exact)\n",
                    backend::dtype_name(rows), backend::dtype_name(outputs), ep, static_cast<long long>(k), static_cast<long long>(d.rows()),
                    out_wrong, x.size(), dx_wrong);
      EXPECT_EQ(out_wrong, 0) << "ep " << ep << " k " << k;
      EXPECT_EQ(dx_wrong, 0) << "ep " << ep << " k " << k;
      EXPECT_EQ(dw_wrong, 0) << "ep " << ep << " k " << k;
    }
  }
}

}  // namespace
}  // namespace piper::model
