// test_linear.cpp — gemm (all transposes, leading dims, alpha/beta) and linear fwd/bwd checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gemm.hpp"
#include "kernels/gradcheck.hpp"
#include "linear.hpp"

namespace {

using namespace piper::testing;
namespace k = piper::kernels;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Dot-product outputs can cancel to ~0; their float error scales with the terms, not the
// result, so they are compared relative to max(|ref|, kDotFloor).
constexpr double kDotFloor = 1e-2;

// Naive C = alpha * op(A) @ op(B) + beta * C in double, same storage conventions as gemm.
void ref_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
              const std::vector<double>& A, int64_t lda, const std::vector<double>& B, int64_t ldb,
              double beta, std::vector<double>& C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t p = 0; p < K; ++p) {
        const double a = ta ? A[p * lda + i] : A[i * lda + p];
        const double b = tb ? B[j * ldb + p] : B[p * ldb + j];
        s += a * b;
      }
      double& c = C[i * ldc + j];
      c = alpha * s + (beta == 0 ? 0.0 : beta * c);
    }
}

// Runs gemm<T> on strided operands (lda/ldb/ldc wider than the rows) for every transpose
// pair and compares the touched entries of C with ref_gemm; the padding must stay untouched.
template <class T>
double gemm_err(double beta, double tol) {
  const int64_t M = 5, N = 7, K = 9, pad = 3;
  double worst = 0;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const int64_t ar = ta ? K : M, ac = ta ? M : K, lda = ac + pad;
      const int64_t br = tb ? N : K, bc = tb ? K : N, ldb = bc + pad;
      const int64_t ldc = N + pad;
      auto A = random_f(ar * lda, 11 + ta);
      auto B = random_f(br * ldb, 13 + tb);
      auto C = random_f(M * ldc, 17);
      if (beta == 0)  // beta == 0 must not read C: fill the live part with NaN
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = kNaN;
      auto At = cast<T>(A), Bt = cast<T>(B), Ct = cast<T>(C);
      const double alpha = 0.7;
      k::gemm<T>(ta, tb, M, N, K, T(alpha), At.data(), lda, Bt.data(), ldb, T(beta), Ct.data(),
                 ldc);
      ref_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      // padding columns keep their (finite) values, so the whole buffer is compared
      const double e = max_rel_err(Ct, C, sizeof(T) == 4 ? kDotFloor : 1e-3);
      const std::string what = std::string("gemm ") + (sizeof(T) == 4 ? "float" : "double") +
                               " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                               " beta=" + std::to_string(beta);
      EXPECT_ERR(what.c_str(), e, tol);
      worst = std::max(worst, e);
    }
  return worst;
}

// Naive references of the three linear products.
std::vector<double> ref_linear_fwd(const std::vector<double>& x, const std::vector<double>& w,
                                   int64_t M, int64_t K, int64_t N) {
  std::vector<double> y(M * N, 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t kk = 0; kk < K; ++kk) y[m * N + n] += x[m * K + kk] * w[n * K + kk];
  return y;
}
std::vector<double> ref_linear_dx(const std::vector<double>& dy, const std::vector<double>& w,
                                  int64_t M, int64_t K, int64_t N) {
  std::vector<double> dx(M * K, 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t kk = 0; kk < K; ++kk)
      for (int64_t n = 0; n < N; ++n) dx[m * K + kk] += dy[m * N + n] * w[n * K + kk];
  return dx;
}
std::vector<double> ref_linear_dw(const std::vector<double>& dy, const std::vector<double>& x,
                                  int64_t M, int64_t K, int64_t N) {
  std::vector<double> dw(N * K, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t kk = 0; kk < K; ++kk)
      for (int64_t m = 0; m < M; ++m) dw[n * K + kk] += dy[m * N + n] * x[m * K + kk];
  return dw;
}

}  // namespace

TEST(Gemm, MatchesNaiveAllTransposesStridedAlphaBeta) {
  EXPECT_LE(gemm_err<double>(-0.3, 1e-12), 1e-12);
  EXPECT_LE(gemm_err<double>(0.0, 1e-12), 1e-12);
  EXPECT_LE(gemm_err<float>(-0.3, 1e-5), 1e-5);
  EXPECT_LE(gemm_err<float>(0.0, 1e-5), 1e-5);
}

TEST(Gemm, EmptyInnerDimensionScalesC) {
  // K == 0: C = beta * C; beta == 0 overwrites even NaN.
  std::vector<float> C = {1, 2, 3, 4, 5, 6};
  k::gemm<float>(false, false, 2, 3, 0, 1.f, nullptr, 0, nullptr, 3, 0.5f, C.data(), 3);
  EXPECT_EQ(C, (std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3}));
  std::vector<double> Cd(6, kNaN);
  k::gemm<double>(true, true, 2, 3, 0, 1.0, nullptr, 2, nullptr, 0, 0.0, Cd.data(), 3);
  EXPECT_EQ(Cd, std::vector<double>(6, 0.0));
}

TEST(Gemm, BlasNameIsKnown) {
  const std::string name = k::blas_name();
  std::printf("[ info  ] BLAS: %s\n", name.c_str());
  EXPECT_TRUE(name == "onednn" || name == "openblas" || name == "blis") << name;
}

TEST(Linear, GradcheckDouble) {
  const int64_t M = 6, K = 9, N = 7;
  auto x = random_vec<double>(M * K, 1);
  auto w = random_vec<double>(N * K, 2);
  const auto wt = random_vec<double>(M * N, 3);  // L = sum(wt * y)
  auto loss = [&] {
    std::vector<double> y(M * N);
    k::linear_fwd<double>(x.data(), w.data(), y.data(), M, K, N);
    return weighted_sum(y, wt);
  };
  std::vector<double> dx(M * K, kNaN), dw(N * K, 0.0);
  k::linear_bwd_input<double>(wt.data(), w.data(), dx.data(), M, K, N, false);
  k::linear_bwd_weight<double>(wt.data(), x.data(), dw.data(), M, K, N);
  EXPECT_ERR("linear dx vs finite diff (double)", max_rel_err(dx, finite_diff(x, loss, kFdStep)),
             1e-6);
  EXPECT_ERR("linear dw vs finite diff (double)", max_rel_err(dw, finite_diff(w, loss, kFdStep)),
             1e-6);
}

TEST(Linear, FloatMatchesNaiveReference) {
  const int64_t M = 7, K = 10, N = 5;
  const auto x = random_f(M * K, 4);
  const auto w = random_f(N * K, 5);
  const auto dy = random_f(M * N, 6);
  auto xf = cast<float>(x), wf = cast<float>(w), dyf = cast<float>(dy);
  std::vector<float> y(M * N, NAN), dx(M * K, NAN), dw(N * K, 0.f);
  k::linear_fwd<float>(xf.data(), wf.data(), y.data(), M, K, N);
  k::linear_bwd_input<float>(dyf.data(), wf.data(), dx.data(), M, K, N, false);
  k::linear_bwd_weight<float>(dyf.data(), xf.data(), dw.data(), M, K, N);
  EXPECT_ERR("linear y (float vs naive double)",
             max_rel_err(y, ref_linear_fwd(x, w, M, K, N), kDotFloor), 1e-5);
  EXPECT_ERR("linear dx (float vs naive double)",
             max_rel_err(dx, ref_linear_dx(dy, w, M, K, N), kDotFloor), 1e-5);
  EXPECT_ERR("linear dw (float vs naive double)",
             max_rel_err(dw, ref_linear_dw(dy, x, M, K, N), kDotFloor), 1e-5);
}

TEST(Linear, WeightGradAccumulatesInputGradOverwritesOrAccumulates) {
  const int64_t M = 5, K = 11, N = 6;
  const auto x = cast<float>(random_f(M * K, 7));
  const auto w = cast<float>(random_f(N * K, 8));
  const auto dy = cast<float>(random_f(M * N, 9));
  // dw += twice doubles
  std::vector<float> dw1(N * K, 0.f);
  k::linear_bwd_weight<float>(dy.data(), x.data(), dw1.data(), M, K, N);
  std::vector<float> dw2 = dw1;
  k::linear_bwd_weight<float>(dy.data(), x.data(), dw2.data(), M, K, N);
  std::vector<float> twice(dw1.size());
  for (size_t i = 0; i < dw1.size(); ++i) twice[i] = 2 * dw1[i];
  EXPECT_ERR("linear dw after two calls vs 2x one call", max_rel_err(dw2, twice), 1e-6);
  // dx: accumulate=false overwrites NaN garbage, accumulate=true adds to what is there
  std::vector<float> dx(M * K, NAN);
  k::linear_bwd_input<float>(dy.data(), w.data(), dx.data(), M, K, N, false);
  const auto base = cast<float>(random_f(M * K, 10));
  std::vector<float> dxa = base;
  k::linear_bwd_input<float>(dy.data(), w.data(), dxa.data(), M, K, N, true);
  std::vector<float> expect(M * K);
  for (size_t i = 0; i < expect.size(); ++i) expect[i] = base[i] + dx[i];
  EXPECT_ERR("linear dx accumulate=true vs base + dx", max_rel_err(dxa, expect), 1e-6);
}

TEST(Linear, LargeFloatMatchesNaiveReference) {
  // big enough for OpenBLAS to block and thread; sizes not multiples of the SIMD width
  const int64_t M = 131, K = 257, N = 67;
  const auto x = random_f(M * K, 21);
  const auto w = random_f(N * K, 22);
  const auto dy = random_f(M * N, 23);
  auto xf = cast<float>(x), wf = cast<float>(w), dyf = cast<float>(dy);
  std::vector<float> y(M * N), dx(M * K), dw(N * K, 0.f);
  k::linear_fwd<float>(xf.data(), wf.data(), y.data(), M, K, N);
  k::linear_bwd_input<float>(dyf.data(), wf.data(), dx.data(), M, K, N, false);
  k::linear_bwd_weight<float>(dyf.data(), xf.data(), dw.data(), M, K, N);
  // sums of 67..257 O(1) terms, float accumulation: compared relative to max(|ref|, 1)
  EXPECT_ERR("linear large y (float vs naive double)",
             max_rel_err(y, ref_linear_fwd(x, w, M, K, N), 1.0), 1e-5);
  EXPECT_ERR("linear large dx (float vs naive double)",
             max_rel_err(dx, ref_linear_dx(dy, w, M, K, N), 1.0), 1e-5);
  EXPECT_ERR("linear large dw (float vs naive double)",
             max_rel_err(dw, ref_linear_dw(dy, x, M, K, N), 1.0), 1e-5);
}
