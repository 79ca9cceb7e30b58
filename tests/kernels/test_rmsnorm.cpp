// test_rmsnorm.cpp — RMSNorm forward (y, rstd) and backward (dx, dw) checks.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/gradcheck.hpp"
#include "rmsnorm.hpp"

namespace {

using namespace piper::testing;
namespace k = piper::kernels;

constexpr double kEps = 1e-5;  // the model's rmsnorm eps

// Naive double reference: y, rstd, dx, dw (dw from zero), straight from the formula
//   y = x * r * w, r = 1/sqrt(mean(x^2) + eps);  dx = r*(g - xhat*mean(g*xhat)), g = dy*w
struct Ref {
  std::vector<double> y, rstd, dx, dw;
};
Ref reference(const std::vector<double>& x, const std::vector<double>& w,
              const std::vector<double>& dy, int64_t M, int64_t D) {
  Ref r{std::vector<double>(M * D), std::vector<double>(M), std::vector<double>(M * D),
        std::vector<double>(D, 0.0)};
  for (int64_t m = 0; m < M; ++m) {
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += x[m * D + d] * x[m * D + d];
    const double rs = 1.0 / std::sqrt(ss / D + kEps);
    r.rstd[m] = rs;
    double dot = 0;
    for (int64_t d = 0; d < D; ++d) {
      r.y[m * D + d] = x[m * D + d] * rs * w[d];
      dot += dy[m * D + d] * w[d] * x[m * D + d] * rs;
    }
    for (int64_t d = 0; d < D; ++d) {
      const double xhat = x[m * D + d] * rs;
      r.dx[m * D + d] = rs * (dy[m * D + d] * w[d] - xhat * dot / D);
      r.dw[d] += dy[m * D + d] * xhat;
    }
  }
  return r;
}

// ---- fp32 error bounds (Rmsnorm.LargeMatches...) -----------------------------------------------
// Each float operation rounds: fl(a op b) = (a op b)(1 + d), |d| <= u = 2^-24. A result's error is, to first
// order, sum_k d_k c_k over its roundings k, c_k the magnitude that rounding scales (for a recursive sum of
// n terms t_i, the i-th addition scales the partial sum, |s_i| <= sum|t|, so the worst case is
// n u sum|t|). Rounding errors are independent and of mean zero, so (Higham and Mary, SIAM J. Sci. Comput.
// 41(5), 2019, by the Azuma-Hoeffding inequality) with probability at least 1 - 2 exp(-lambda^2 / 2)
//     |error| <= lambda u sqrt(sum_k c_k^2),
// which for a sum of n terms is lambda sqrt(n) u sum|t|: the sqrt(n) growth, not the n of the worst case.
// lambda = 7: below 5e-11 per value, so the ~500k values checked fail together with probability < 3e-5.
// The c_k come from the double reference of the same inputs, not from a measured run.
constexpr double kU = 0x1p-24;     // unit roundoff of float
constexpr double kLambda = 7.0;
inline double bound(double sum_c2) { return kLambda * kU * std::sqrt(sum_c2); }

struct Bounds {
  std::vector<double> y, dx, dw;  // the bound of each value's absolute error
};
// rstd = 1/sqrt(ss inv_d + eps), ss a sum of D squares: D additions and D squarings scaled by <= ss, halved
// by the square root (relative c = 1/2 each), then inv_d = fl(1/D), x inv_d, + eps (1/2 each) and sqrt,
// 1/x (1 each): relative sum_k c_k^2 = 2D/4 + 3/4 + 2 for rstd. Every quantity that uses rstd adds that
// many roundings, scaled by its own magnitude.
Bounds rmsnorm_bounds(const Ref& r, const std::vector<double>& x, const std::vector<double>& w,
                      const std::vector<double>& dy, int64_t M, int64_t D, int64_t row_block) {
  const double rstd_c2 = 2.0 * D / 4 + 0.75 + 2;
  Bounds b{std::vector<double>(M * D), std::vector<double>(M * D), std::vector<double>(D)};
  std::vector<double> dw_block(D, 0.0), dw_c2(D, 0.0), dw_abs(D, 0.0);
  for (int64_t m = 0; m < M; ++m) {
    const double rs = r.rstd[m];
    // c = dot r inv_d, dot = sum_j (dy_j w_j) x_j: per term 2 products; D additions scaled by <= sum|t|.
    double sum_t = 0, sum_t2 = 0;
    for (int64_t j = 0; j < D; ++j) {
      const double t = std::fabs(dy[m * D + j] * w[j] * x[m * D + j]) * rs / D;  // |term j of c|
      sum_t += t;
      sum_t2 += t * t;
    }
    for (int64_t d = 0; d < D; ++d) {
      const int64_t i = m * D + d;
      const double xhat = x[i] * rs, g = dy[i] * w[d];
      // y = x r w: rstd's roundings and two products, all scaled by |y|.
      b.y[i] = bound((rstd_c2 + 2) * r.y[i] * r.y[i]);
      // dx = r (g - xhat c): A = |r g| (one product g, one r g), B = |r xhat| sum|t| (the c part).
      const double A = rs * std::fabs(g), B = rs * std::fabs(xhat) * sum_t;
      const double c2 = A * A                                        // g = dy w
                        + 2 * rs * rs * xhat * xhat * sum_t2         // the two products of each term of c
                        + D * B * B + 3 * B * B                      // D additions; x r, x inv_d, fl(1/D)
                        + rstd_c2 * (A + 2 * B) * (A + 2 * B)        // rstd in r g, in xhat and in c
                        + 2 * B * B + 2 * r.dx[i] * r.dx[i];         // xhat = x r, xhat c; g - .., r (..)
      b.dx[i] = bound(c2);
      // dw_d = sum over blocks of row_block rows (float), blocks added in double: term t = dy xhat carries
      // rstd's roundings and two products (x r, dy xhat); each float addition in a block scales <= sum|t|.
      const double t = std::fabs(dy[i] * xhat);
      dw_c2[d] += (rstd_c2 + 2) * t * t;
      dw_block[d] += t;
      if ((m + 1) % row_block == 0 || m + 1 == M) {
        dw_c2[d] += static_cast<double>(row_block) * dw_block[d] * dw_block[d];
        dw_block[d] = 0;
      }
    }
  }
  for (int64_t d = 0; d < D; ++d) {
    const double c2 = dw_c2[d] + r.dw[d] * r.dw[d];  // + the final cast to float
    b.dw[d] = bound(c2);
  }
  return b;
}

// The largest |a_i - b_i| / bound_i: at most 1 when every value is within its rounding bound.
template <class A>
double worst_over_bound(const std::vector<A>& a, const std::vector<double>& b, const std::vector<double>& bound) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]) / bound[i]);
  return worst;
}

}  // namespace

TEST(Rmsnorm, GradcheckDouble) {
  const int64_t M = 5, D = 11;
  auto x = random_vec<double>(M * D, 1);
  auto w = random_vec<double>(D, 2, 0.5, 1.5);
  const auto wt = random_vec<double>(M * D, 3);  // L = sum(wt * y)
  auto loss = [&] {
    std::vector<double> y(M * D), rstd(M);
    k::rmsnorm_fwd<double>(x.data(), w.data(), y.data(), rstd.data(), M, D, kEps);
    return weighted_sum(y, wt);
  };
  std::vector<double> y(M * D), rstd(M), dx(M * D, NAN), dw(D, 0.0);
  k::rmsnorm_fwd<double>(x.data(), w.data(), y.data(), rstd.data(), M, D, kEps);
  k::rmsnorm_bwd<double>(wt.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), M, D);
  EXPECT_ERR("rmsnorm dx vs finite diff (double)", max_rel_err(dx, finite_diff(x, loss, kFdStep)),
             1e-6);
  EXPECT_ERR("rmsnorm dw vs finite diff (double)", max_rel_err(dw, finite_diff(w, loss, kFdStep)),
             1e-6);
}

TEST(Rmsnorm, FloatMatchesNaiveReference) {
  const int64_t M = 7, D = 10;
  const auto x = random_f(M * D, 4, -2, 2);
  const auto w = random_f(D, 5, 0.5, 1.5);
  const auto dy = random_f(M * D, 6);
  const Ref r = reference(x, w, dy, M, D);
  auto xf = cast<float>(x), wf = cast<float>(w), dyf = cast<float>(dy);
  std::vector<float> y(M * D, NAN), rstd(M, NAN), dx(M * D, NAN), dw(D, 0.f);
  k::rmsnorm_fwd<float>(xf.data(), wf.data(), y.data(), rstd.data(), M, D, float(kEps));
  k::rmsnorm_bwd<float>(dyf.data(), xf.data(), wf.data(), rstd.data(), dx.data(), dw.data(), M, D);
  EXPECT_ERR("rmsnorm y (float vs naive double)", max_rel_err(y, r.y), 1e-5);
  EXPECT_ERR("rmsnorm rstd (float vs naive double)", max_rel_err(rstd, r.rstd), 1e-5);
  // dx = r*(g - xhat*c) cancels to ~0 in places: compared relative to max(|ref|, 1e-2)
  EXPECT_ERR("rmsnorm dx (float vs naive double)", max_rel_err(dx, r.dx, 1e-2), 1e-5);
  EXPECT_ERR("rmsnorm dw (float vs naive double)", max_rel_err(dw, r.dw), 1e-5);
}

TEST(Rmsnorm, WeightGradAccumulatesInputGradOverwritten) {
  const int64_t M = 6, D = 9;
  const auto x = cast<float>(random_f(M * D, 7));
  const auto w = cast<float>(random_f(D, 8, 0.5, 1.5));
  const auto dy = cast<float>(random_f(M * D, 9));
  std::vector<float> y(M * D), rstd(M), dx1(M * D, NAN), dx2(M * D, 123.f), dw(D, 0.f);
  k::rmsnorm_fwd<float>(x.data(), w.data(), y.data(), rstd.data(), M, D, float(kEps));
  k::rmsnorm_bwd<float>(dy.data(), x.data(), w.data(), rstd.data(), dx1.data(), dw.data(), M, D);
  const std::vector<float> once = dw;
  k::rmsnorm_bwd<float>(dy.data(), x.data(), w.data(), rstd.data(), dx2.data(), dw.data(), M, D);
  std::vector<float> expect(D);
  for (int64_t d = 0; d < D; ++d) expect[d] = 2 * once[d];
  EXPECT_ERR("rmsnorm dw after two calls vs 2x one call", max_rel_err(dw, expect), 1e-6);
  EXPECT_EQ(dx1, dx2) << "dx must be overwritten, whatever it held";
}

TEST(Rmsnorm, LargeMatchesReferenceAndIsThreadCountIndependent) {
  // M*D above the threading threshold; M not a multiple of the 32-row dw block
  const int64_t M = 1005, D = 260;
  const auto x = random_f(M * D, 10, -2, 2);
  const auto w = random_f(D, 11, 0.5, 1.5);
  const auto dy = random_f(M * D, 12);
  const Ref r = reference(x, w, dy, M, D);
  auto xf = cast<float>(x), wf = cast<float>(w), dyf = cast<float>(dy);
  const int saved = omp_get_max_threads();
  struct Out {
    std::vector<float> y, dx, dw;
  };
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    Out o{std::vector<float>(M * D), std::vector<float>(M * D), std::vector<float>(D, 0.f)};
    std::vector<float> rstd(M);
    k::rmsnorm_fwd<float>(xf.data(), wf.data(), o.y.data(), rstd.data(), M, D, float(kEps));
    k::rmsnorm_bwd<float>(dyf.data(), xf.data(), wf.data(), rstd.data(), o.dx.data(), o.dw.data(),
                          M, D);
    return o;
  };
  const Out o1 = run(1), o3 = run(3);
  omp_set_num_threads(saved);
  // Every value within its fp32 rounding bound (rmsnorm_bounds: lambda sqrt(n) u growth, from the
  // inputs), and the relative errors the test has always printed, against the largest bound.
  const Bounds b = rmsnorm_bounds(r, x, w, dy, M, D, 32);
  auto largest = [](const std::vector<double>& bound, const std::vector<double>& ref, double floor) {
    double t = 0;
    for (size_t i = 0; i < bound.size(); ++i) t = std::max(t, bound[i] / std::max(std::fabs(ref[i]), floor));
    return t;
  };
  EXPECT_ERR("rmsnorm large y / its rounding bound", worst_over_bound(o3.y, r.y, b.y), 1.0);
  EXPECT_ERR("rmsnorm large dx / its rounding bound", worst_over_bound(o3.dx, r.dx, b.dx), 1.0);
  EXPECT_ERR("rmsnorm large dw / its rounding bound", worst_over_bound(o3.dw, r.dw, b.dw), 1.0);
  EXPECT_ERR("rmsnorm large y (float vs naive double)", max_rel_err(o3.y, r.y), largest(b.y, r.y, 1e-3));
  EXPECT_ERR("rmsnorm large dx (float vs naive double)", max_rel_err(o3.dx, r.dx, 1e-2), largest(b.dx, r.dx, 1e-2));
  // dw sums ~1000 O(1) terms: relative to max(|ref|, 1)
  EXPECT_ERR("rmsnorm large dw (float vs naive double)", max_rel_err(o3.dw, r.dw, 1.0), largest(b.dw, r.dw, 1.0));
  EXPECT_EQ(o1.y, o3.y);
  EXPECT_EQ(o1.dx, o3.dx);
  EXPECT_EQ(o1.dw, o3.dw) << "dw is reduced over fixed row blocks: thread count must not matter";
}
