// test_embedding.cpp — embedding lookup and its scatter-add backward (duplicate ids, determinism).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

#include "embedding.hpp"
#include "kernels/gradcheck.hpp"

namespace {

using namespace piper::testing;
namespace k = piper::kernels;

std::vector<double> ref_fwd(const std::vector<int32_t>& ids, const std::vector<double>& table,
                            int64_t D) {
  std::vector<double> out(ids.size() * D);
  for (size_t m = 0; m < ids.size(); ++m)
    for (int64_t d = 0; d < D; ++d) out[m * D + d] = table[ids[m] * D + d];
  return out;
}
std::vector<double> ref_bwd(const std::vector<int32_t>& ids, const std::vector<double>& dout,
                            int64_t V, int64_t D) {
  std::vector<double> dtable(V * D, 0.0);
  for (size_t m = 0; m < ids.size(); ++m)
    for (int64_t d = 0; d < D; ++d) dtable[ids[m] * D + d] += dout[m * D + d];
  return dtable;
}

}  // namespace

TEST(Embedding, GradcheckDouble) {
  const int64_t M = 7, V = 5, D = 10;  // M > V: repeated ids must sum
  const auto ids = random_ids(M, V, 1);
  auto table = random_vec<double>(V * D, 2);
  const auto wt = random_vec<double>(M * D, 3);  // L = sum(wt * out)
  auto loss = [&] {
    std::vector<double> out(M * D);
    k::embedding_fwd<double>(ids.data(), table.data(), out.data(), M, D, V, 0);
    return weighted_sum(out, wt);
  };
  std::vector<double> dtable(V * D, 0.0);
  k::embedding_bwd<double>(ids.data(), wt.data(), dtable.data(), M, D, V, 0);
  EXPECT_ERR("embedding dtable vs finite diff (double)",
             max_rel_err(dtable, finite_diff(table, loss, kFdStep)), 1e-6);
}

TEST(Embedding, FloatMatchesNaiveReference) {
  const int64_t M = 6, V = 4, D = 9;
  const auto ids = random_ids(M, V, 4);
  const auto table = random_f(V * D, 5);
  const auto dout = random_f(M * D, 6);
  auto tf = cast<float>(table), df = cast<float>(dout);
  std::vector<float> out(M * D, NAN), dtable(V * D, 0.f);
  k::embedding_fwd<float>(ids.data(), tf.data(), out.data(), M, D, V, 0);
  k::embedding_bwd<float>(ids.data(), df.data(), dtable.data(), M, D, V, 0);
  EXPECT_ERR("embedding out (float vs naive double)", max_rel_err(out, ref_fwd(ids, table, D)),
             1e-5);
  EXPECT_ERR("embedding dtable (float vs naive double)",
             max_rel_err(dtable, ref_bwd(ids, dout, V, D)), 1e-5);
}

TEST(Embedding, TableGradAccumulates) {
  const int64_t M = 7, V = 6, D = 11;
  const auto ids = random_ids(M, V, 7);
  const auto dout = cast<float>(random_f(M * D, 8));
  std::vector<float> once(V * D, 0.f);
  k::embedding_bwd<float>(ids.data(), dout.data(), once.data(), M, D, V, 0);
  std::vector<float> twice = once;
  k::embedding_bwd<float>(ids.data(), dout.data(), twice.data(), M, D, V, 0);
  std::vector<float> expect(once.size());
  for (size_t i = 0; i < once.size(); ++i) expect[i] = 2 * once[i];
  EXPECT_ERR("embedding dtable after two calls vs 2x one call", max_rel_err(twice, expect), 1e-6);
  // rows never looked up stay exactly zero
  for (int64_t v = 0; v < V; ++v) {
    bool used = false;
    for (auto i : ids) used |= (i == v);
    if (!used) {
      for (int64_t d = 0; d < D; ++d) EXPECT_EQ(twice[v * D + d], 0.f) << "row " << v;
    }
  }
}

TEST(Embedding, LargeMatchesReferenceAndIsThreadCountIndependent) {
  // M*D above the kernels' threading threshold; D not a multiple of the column chunk
  const int64_t M = 2051, V = 257, D = 264;
  const auto ids = random_ids(M, V, 9);
  const auto table = random_f(V * D, 10);
  const auto dout = random_f(M * D, 11);
  auto tf = cast<float>(table), df = cast<float>(dout);
  const int saved = omp_get_max_threads();
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    std::vector<float> out(M * D, NAN), dtable(V * D, 0.f);
    k::embedding_fwd<float>(ids.data(), tf.data(), out.data(), M, D, V, 0);
    k::embedding_bwd<float>(ids.data(), df.data(), dtable.data(), M, D, V, 0);
    return std::make_pair(out, dtable);
  };
  const auto [out1, dt1] = run(1);
  const auto [out3, dt3] = run(3);
  omp_set_num_threads(saved);
  EXPECT_ERR("embedding large out (float vs naive double)",
             max_rel_err(out3, ref_fwd(ids, table, D)), 1e-5);
  // ~8 O(1) terms per dtable entry, float accumulation: relative to max(|ref|, 1)
  EXPECT_ERR("embedding large dtable (float vs naive double)",
             max_rel_err(dt3, ref_bwd(ids, dout, V, D), 1.0), 1e-5);
  EXPECT_EQ(out1, out3);
  EXPECT_EQ(dt1, dt3) << "embedding_bwd must sum rows in order whatever the thread count";
}

// A vocab-parallel shard holds ids offset..offset+Vs-1: its rows are looked up, other ids give
// zero rows forward and no gradient backward.
TEST(Embedding, ShardLooksUpOnlyItsIds) {
  const int64_t M = 9, V = 8, D = 5, Vs = 3, offset = 4;
  const auto ids = random_ids(M, V, 12);
  const auto table = random_f(V * D, 13);
  const auto dout = random_f(M * D, 14);
  auto shard = cast<float>(std::vector<double>(table.begin() + offset * D,
                                               table.begin() + (offset + Vs) * D));
  auto df = cast<float>(dout);
  std::vector<float> out(M * D, NAN), dshard(Vs * D, 0.f);
  k::embedding_fwd<float>(ids.data(), shard.data(), out.data(), M, D, Vs, offset);
  k::embedding_bwd<float>(ids.data(), df.data(), dshard.data(), M, D, Vs, offset);
  auto expect_out = ref_fwd(ids, table, D);
  for (int64_t m = 0; m < M; ++m)
    if (ids[m] < offset || ids[m] >= offset + Vs)
      std::fill(expect_out.begin() + m * D, expect_out.begin() + (m + 1) * D, 0.0);
  const auto full = ref_bwd(ids, dout, V, D);
  const std::vector<double> expect_d(full.begin() + offset * D, full.begin() + (offset + Vs) * D);
  EXPECT_ERR("embedding shard out (float vs naive double)", max_rel_err(out, expect_out), 1e-6);
  EXPECT_ERR("embedding shard dtable (float vs naive double)", max_rel_err(dshard, expect_d), 1e-6);
}
