// test_rmsnorm.cpp — RMSNorm forward (y, rstd) and backward (dx, dw) checks.
#include <gtest/gtest.h>
#include <omp.h>

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
  EXPECT_ERR("rmsnorm large y (float vs naive double)", max_rel_err(o3.y, r.y), 1e-5);
  EXPECT_ERR("rmsnorm large dx (float vs naive double)", max_rel_err(o3.dx, r.dx, 1e-2), 1e-5);
  // dw sums ~1000 O(1) terms: relative to max(|ref|, 1)
  EXPECT_ERR("rmsnorm large dw (float vs naive double)", max_rel_err(o3.dw, r.dw, 1.0), 1e-5);
  EXPECT_EQ(o1.y, o3.y);
  EXPECT_EQ(o1.dx, o3.dx);
  EXPECT_EQ(o1.dw, o3.dw) << "dw is reduced over fixed row blocks: thread count must not matter";
}
