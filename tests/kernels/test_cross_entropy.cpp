// test_cross_entropy.cpp — fused softmax cross-entropy: loss sum, dlogits, stability, determinism.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "cross_entropy.hpp"
#include "kernels/gradcheck.hpp"

namespace {

using namespace piper::testing;
namespace k = piper::kernels;

// max_rel_err of two scalars (the loss sums).
double rel_err1(double a, double b, double floor = 1e-3) {
  return max_rel_err(std::vector<double>{a}, std::vector<double>{b}, floor);
}

// Naive reference in double: per-row log-sum-exp (max-shifted), loss sum, and
// dlogits = (softmax - onehot) * scale.
double reference(const std::vector<double>& logits, const std::vector<int32_t>& tgt,
                 std::vector<double>& dlogits, int64_t M, int64_t V, double scale) {
  dlogits.assign(M * V, 0.0);
  double total = 0;
  for (int64_t m = 0; m < M; ++m) {
    const double* x = &logits[m * V];
    double mx = x[0];
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, x[v]);
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(x[v] - mx);
    total += mx + std::log(s) - x[tgt[m]];
    for (int64_t v = 0; v < V; ++v)
      dlogits[m * V + v] = (std::exp(x[v] - mx) / s - (v == tgt[m] ? 1.0 : 0.0)) * scale;
  }
  return total;
}

}  // namespace

TEST(CrossEntropy, GradcheckDouble) {
  const int64_t M = 6, V = 11;
  auto logits = random_vec<double>(M * V, 1, -3, 3);
  const auto tgt = random_ids(M, V, 2);
  const double scale = 0.37;  // L = scale * sum of losses, so dL/dlogits = dlogits
  auto loss = [&] {
    return scale * k::cross_entropy<double>(logits.data(), tgt.data(), nullptr, M, V, scale);
  };
  std::vector<double> d(M * V, NAN);
  k::cross_entropy<double>(logits.data(), tgt.data(), d.data(), M, V, scale);
  EXPECT_ERR("cross_entropy dlogits vs finite diff (double)",
             max_rel_err(d, finite_diff(logits, loss, kFdStep)), 1e-6);
}

TEST(CrossEntropy, FloatMatchesNaiveReference) {
  const int64_t M = 7, V = 13;
  const auto logits = random_f(M * V, 3, -4, 4);
  const auto tgt = random_ids(M, V, 4);
  const double scale = 1.0 / M;  // the training loss is a mean
  std::vector<double> rd;
  const double rl = reference(logits, tgt, rd, M, V, scale);
  auto lf = cast<float>(logits);
  std::vector<float> d(M * V, NAN);
  const double l = k::cross_entropy<float>(lf.data(), tgt.data(), d.data(), M, V, float(scale));
  const double l_nograd = k::cross_entropy<float>(lf.data(), tgt.data(), nullptr, M, V, 1.f);
  EXPECT_ERR("cross_entropy loss sum (float vs naive double)", rel_err1(l, rl), 1e-5);
  EXPECT_ERR("cross_entropy dlogits (float vs naive double)", max_rel_err(d, rd), 1e-5);
  EXPECT_EQ(l, l_nograd) << "the loss must not depend on whether dlogits is requested";
}

TEST(CrossEntropy, StableForHugeLogitsAndPropagatesNaN) {
  const int64_t M = 5, V = 9;
  // |logits| up to 1e4: naive exp overflows in float and double alike
  const auto logits = random_f(M * V, 5, -1e4, 1e4);
  const auto tgt = random_ids(M, V, 6);
  std::vector<double> rd;
  const double rl = reference(logits, tgt, rd, M, V, 1.0);
  auto lf = cast<float>(logits);
  std::vector<float> d(M * V, NAN);
  const double l = k::cross_entropy<float>(lf.data(), tgt.data(), d.data(), M, V, 1.f);
  EXPECT_ERR("cross_entropy huge-logit loss (float vs naive double)", rel_err1(l, rl), 1e-5);
  EXPECT_ERR("cross_entropy huge-logit dlogits (float vs naive double)", max_rel_err(d, rd), 1e-5);
  // one NaN logit poisons the loss (so divergence is visible), other rows stay clean
  lf[2 * V + 3] = NAN;
  std::vector<float> dn(M * V);
  EXPECT_TRUE(std::isnan(k::cross_entropy<float>(lf.data(), tgt.data(), dn.data(), M, V, 1.f)));
  for (int64_t v = 0; v < V; ++v) EXPECT_EQ(dn[v], d[v]);
}

TEST(CrossEntropy, GradOverwrittenAndBadTargetRejected) {
  const int64_t M = 5, V = 7;
  const auto lf = cast<float>(random_f(M * V, 7, -2, 2));
  auto tgt = random_ids(M, V, 8);
  std::vector<float> d1(M * V, NAN), d2(M * V, 9.f);
  const double l1 = k::cross_entropy<float>(lf.data(), tgt.data(), d1.data(), M, V, 0.5f);
  const double l2 = k::cross_entropy<float>(lf.data(), tgt.data(), d2.data(), M, V, 0.5f);
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(d1, d2) << "dlogits must be overwritten, whatever it held";
  // each row of dlogits sums to 0 (softmax sums to 1, minus the one-hot)
  for (int64_t m = 0; m < M; ++m) {
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += d1[m * V + v];
    EXPECT_NEAR(s, 0.0, 1e-6) << "row " << m;
  }
  tgt[3] = static_cast<int32_t>(V);
  EXPECT_THROW(k::cross_entropy<float>(lf.data(), tgt.data(), d1.data(), M, V, 1.f),
               std::out_of_range);
  tgt[3] = -1;
  EXPECT_THROW(k::cross_entropy<float>(lf.data(), tgt.data(), nullptr, M, V, 1.f),
               std::out_of_range);
}

TEST(CrossEntropy, LargeMatchesReferenceAndIsThreadCountIndependent) {
  const int64_t M = 2051, V = 259;  // B*T x vocab-like, above the threading threshold
  const auto logits = random_f(M * V, 9, -6, 6);
  const auto tgt = random_ids(M, V, 10);
  const double scale = 1.0 / M;
  std::vector<double> rd;
  const double rl = reference(logits, tgt, rd, M, V, scale);
  auto lf = cast<float>(logits);
  const int saved = omp_get_max_threads();
  auto run = [&](int threads, std::vector<float>& d) {
    omp_set_num_threads(threads);
    d.assign(M * V, NAN);
    return k::cross_entropy<float>(lf.data(), tgt.data(), d.data(), M, V, float(scale));
  };
  std::vector<float> d1, d3;
  const double l1 = run(1, d1), l3 = run(3, d3);
  omp_set_num_threads(saved);
  EXPECT_ERR("cross_entropy large loss sum (float vs naive double)", rel_err1(l3, rl), 1e-5);
  // dlogits ~ 1/(M*V): compared relative to max(|ref|, 1e-3 * scale)
  EXPECT_ERR("cross_entropy large dlogits (float vs naive double)",
             max_rel_err(d3, rd, 1e-3 * scale), 1e-5);
  EXPECT_EQ(l1, l3) << "loss sum must be bit-identical for any thread count";
  EXPECT_EQ(d1, d3);
}
