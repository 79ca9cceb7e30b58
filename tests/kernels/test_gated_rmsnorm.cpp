// test_gated_rmsnorm.cpp — gated grouped RMSNorm: finite-difference gradcheck, naive
// reference, accumulation of dw.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "gated_rmsnorm.hpp"
#include "kernels/gradcheck.hpp"

using namespace piper::kernels;
using namespace piper::testing;

namespace {

struct Shape {
  int64_t M, Di, G;
};
// Small shapes (one channel per group in the third; several dw row chunks in the last).
const Shape kShapes[] = {{7, 12, 3}, {5, 9, 1}, {3, 10, 10}, {70, 16, 4}};
// Large enough for the kernel's multi-threaded path (too big for finite differences).
const Shape kLarge = {130, 256, 4};
constexpr double kEps = 1e-5;
constexpr double kH = 1e-5;  // finite-difference step: rounding and truncation both < 1e-9

// Float results are compared normwise (normwise_err): error relative to the largest reference
// magnitude. Elementwise relative error is dominated by entries near zero: with few channels per
// group, dg = r * (dn - n * mean(dn * n)) cancels, and those entries are float rounding noise.

double silu(double v) { return v / (1.0 + std::exp(-v)); }

// out = grouped_rmsnorm(y * silu(z)) * w, written straight from the definition.
std::vector<double> ref_fwd(const std::vector<double>& y, const std::vector<double>& z,
                            const std::vector<double>& w, const Shape& s,
                            std::vector<double>* rstd = nullptr) {
  const int64_t Dg = s.Di / s.G;
  std::vector<double> out(s.M * s.Di);
  if (rstd) rstd->assign(s.M * s.G, 0.0);
  for (int64_t m = 0; m < s.M; ++m)
    for (int64_t g = 0; g < s.G; ++g) {
      double ms = 0;
      for (int64_t i = g * Dg; i < (g + 1) * Dg; ++i) {
        const double v = y[m * s.Di + i] * silu(z[m * s.Di + i]);
        ms += v * v / double(Dg);
      }
      const double r = 1.0 / std::sqrt(ms + kEps);
      if (rstd) (*rstd)[m * s.G + g] = r;
      for (int64_t i = g * Dg; i < (g + 1) * Dg; ++i)
        out[m * s.Di + i] = y[m * s.Di + i] * silu(z[m * s.Di + i]) * r * w[i];
    }
  return out;
}

// Reference gradients by the chain rule on the unsimplified formula, per row and group:
//   g = y*silu(z), r = (mean g^2 + eps)^(-1/2), out = g*r*w
//   dL/dg_i = dout_i*w_i*r + (sum_j dout_j*w_j*g_j) * dr/dg_i,  dr/dg_i = -r^3 g_i / Dg
//   dy = dL/dg * silu(z),  dz = dL/dg * y * silu'(z),  dw_i = sum_rows dout_i*g_i*r
void ref_bwd(const std::vector<double>& dout, const std::vector<double>& y,
             const std::vector<double>& z, const std::vector<double>& w, const Shape& s,
             std::vector<double>& dy, std::vector<double>& dz, std::vector<double>& dw) {
  const int64_t Dg = s.Di / s.G;
  dy.assign(s.M * s.Di, 0.0);
  dz.assign(s.M * s.Di, 0.0);
  dw.assign(s.Di, 0.0);
  for (int64_t m = 0; m < s.M; ++m)
    for (int64_t g = 0; g < s.G; ++g) {
      const int64_t i0 = m * s.Di + g * Dg;
      double ms = 0, dot = 0;
      for (int64_t i = 0; i < Dg; ++i) {
        const double gi = y[i0 + i] * silu(z[i0 + i]);
        ms += gi * gi / double(Dg);
        dot += dout[i0 + i] * w[g * Dg + i] * gi;
      }
      const double r = 1.0 / std::sqrt(ms + kEps);
      for (int64_t i = 0; i < Dg; ++i) {
        const double zi = z[i0 + i], sig = 1.0 / (1.0 + std::exp(-zi));
        const double gi = y[i0 + i] * silu(zi);
        const double dg = dout[i0 + i] * w[g * Dg + i] * r + dot * (-r * r * r * gi / double(Dg));
        dy[i0 + i] = dg * silu(zi);
        dz[i0 + i] = dg * y[i0 + i] * (sig + zi * sig * (1.0 - sig));
        dw[g * Dg + i] += dout[i0 + i] * gi * r;
      }
    }
}

}  // namespace

TEST(GatedRmsnorm, GradcheckDouble) {
  for (const Shape& s : kShapes) {
    const size_t n = s.M * s.Di;
    auto y = random_vec<double>(n, 40, -2, 2);
    auto z = random_vec<double>(n, 41, -3, 3);
    auto w = random_vec<double>(s.Di, 42, 0.5, 1.5);
    auto wt = random_vec<double>(n, 43);
    std::vector<double> out(n), rstd(s.M * s.G);
    auto loss = [&] {
      gated_rmsnorm_fwd<double>(y.data(), z.data(), w.data(), out.data(), rstd.data(), s.M, s.Di,
                                s.G, kEps);
      return weighted_sum(out, wt);
    };
    const auto [fdy, fdz, fdw] = finite_diffs(loss, kH, y, z, w);
    loss();  // rstd for the unperturbed inputs
    std::vector<double> dy(n, std::numeric_limits<double>::quiet_NaN()), dz = dy, dw(s.Di, 0.0);
    gated_rmsnorm_bwd<double>(wt.data(), y.data(), z.data(), w.data(), rstd.data(), dy.data(),
                              dz.data(), dw.data(), s.M, s.Di, s.G);
    std::printf("shape M=%ld Di=%ld G=%ld\n", long(s.M), long(s.Di), long(s.G));
    EXPECT_LT(report("gated_rmsnorm dy vs finite diff", max_rel_err(dy, fdy), 1e-6), 1e-6);
    EXPECT_LT(report("gated_rmsnorm dz vs finite diff", max_rel_err(dz, fdz), 1e-6), 1e-6);
    EXPECT_LT(report("gated_rmsnorm dw vs finite diff", max_rel_err(dw, fdw), 1e-6), 1e-6);
  }
}

TEST(GatedRmsnorm, NaiveReferenceMatchesFiniteDiff) {
  // The reference backward used below is itself checked against finite differences.
  for (const Shape& s : kShapes) {
    const size_t n = s.M * s.Di;
    auto y = random_vec<double>(n, 45, -2, 2);
    auto z = random_vec<double>(n, 46, -3, 3);
    auto w = random_vec<double>(s.Di, 47, 0.5, 1.5);
    auto dout = random_vec<double>(n, 48);
    auto L = [&] { return weighted_sum(ref_fwd(y, z, w, s), dout); };
    const auto [fdy, fdz, fdw] = finite_diffs(L, kH, y, z, w);
    std::vector<double> dy, dz, dw;
    ref_bwd(dout, y, z, w, s, dy, dz, dw);
    EXPECT_LT(report("gated_rmsnorm reference dy vs finite diff", max_rel_err(dy, fdy), 1e-6),
              1e-6);
    EXPECT_LT(report("gated_rmsnorm reference dz vs finite diff", max_rel_err(dz, fdz), 1e-6),
              1e-6);
    EXPECT_LT(report("gated_rmsnorm reference dw vs finite diff", max_rel_err(dw, fdw), 1e-6),
              1e-6);
  }
}

TEST(GatedRmsnorm, FloatMatchesNaiveReference) {
  std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.push_back(kLarge);
  for (const Shape& s : shapes) {
    const size_t n = s.M * s.Di;
    // float-representable inputs: the reference sees the float kernel's inputs
    const auto y = random_f(n, 50, -2, 2);
    const auto z = random_f(n, 51, -3, 3);
    const auto w = random_f(s.Di, 52, 0.5, 1.5);
    const auto dout = random_f(n, 53);
    std::vector<double> rstd_ref, dy_ref, dz_ref, dw_ref;
    auto out_ref = ref_fwd(y, z, w, s, &rstd_ref);
    ref_bwd(dout, y, z, w, s, dy_ref, dz_ref, dw_ref);

    const auto yf = cast<float>(y), zf = cast<float>(z), wf = cast<float>(w),
               df = cast<float>(dout);
    std::vector<float> of(n), rf(s.M * s.G), dyf(n), dzf(n), dwf(s.Di, 0.0f);
    gated_rmsnorm_fwd<float>(yf.data(), zf.data(), wf.data(), of.data(), rf.data(), s.M, s.Di, s.G,
                             float(kEps));
    gated_rmsnorm_bwd<float>(df.data(), yf.data(), zf.data(), wf.data(), rf.data(), dyf.data(),
                             dzf.data(), dwf.data(), s.M, s.Di, s.G);
    std::printf("shape M=%ld Di=%ld G=%ld\n", long(s.M), long(s.Di), long(s.G));
    EXPECT_LT(
        report("gated_rmsnorm float out vs naive (normwise)", normwise_err(of, out_ref), 1e-5),
        1e-5);
    EXPECT_LT(
        report("gated_rmsnorm float rstd vs naive (normwise)", normwise_err(rf, rstd_ref), 1e-5),
        1e-5);
    EXPECT_LT(report("gated_rmsnorm float dy vs naive (normwise)", normwise_err(dyf, dy_ref), 1e-5),
              1e-5);
    EXPECT_LT(report("gated_rmsnorm float dz vs naive (normwise)", normwise_err(dzf, dz_ref), 1e-5),
              1e-5);
    EXPECT_LT(report("gated_rmsnorm float dw vs naive (normwise)", normwise_err(dwf, dw_ref), 1e-5),
              1e-5);
  }
}

TEST(GatedRmsnorm, WeightGradAccumulatesInputGradsOverwritten) {
  const Shape s{9, 12, 3};
  const size_t n = s.M * s.Di;
  auto y = random_vec<float>(n, 60);
  auto z = random_vec<float>(n, 61);
  auto w = random_vec<float>(s.Di, 62);
  auto dout = random_vec<float>(n, 63);
  std::vector<float> out(n), rstd(s.M * s.G);
  gated_rmsnorm_fwd<float>(y.data(), z.data(), w.data(), out.data(), rstd.data(), s.M, s.Di, s.G,
                           1e-5f);
  std::vector<float> dy1(n), dz1(n), dw1(s.Di, 0.0f);
  gated_rmsnorm_bwd<float>(dout.data(), y.data(), z.data(), w.data(), rstd.data(), dy1.data(),
                           dz1.data(), dw1.data(), s.M, s.Di, s.G);
  auto dw0 = random_vec<float>(s.Di, 64);
  std::vector<float> dy2(n, std::numeric_limits<float>::quiet_NaN()), dz2 = dy2, dw2 = dw0;
  gated_rmsnorm_bwd<float>(dout.data(), y.data(), z.data(), w.data(), rstd.data(), dy2.data(),
                           dz2.data(), dw2.data(), s.M, s.Di, s.G);
  EXPECT_EQ(dy2, dy1);
  EXPECT_EQ(dz2, dz1);
  for (size_t i = 0; i < dw2.size(); ++i) EXPECT_FLOAT_EQ(dw2[i], dw0[i] + dw1[i]) << i;
  gated_rmsnorm_bwd<float>(dout.data(), y.data(), z.data(), w.data(), rstd.data(), dy2.data(),
                           dz2.data(), dw2.data(), s.M, s.Di, s.G);
  for (size_t i = 0; i < dw2.size(); ++i) EXPECT_NEAR(dw2[i], dw0[i] + 2 * dw1[i], 1e-5) << i;
}

TEST(GatedRmsnorm, ThreadCountDoesNotChangeResults) {
  const Shape s = kLarge;
  const size_t n = s.M * s.Di;
  auto y = random_vec<float>(n, 70);
  auto z = random_vec<float>(n, 71);
  auto w = random_vec<float>(s.Di, 72);
  auto dout = random_vec<float>(n, 73);
  auto run = [&](int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<float> out(n), rstd(s.M * s.G), dy(n), dz(n), dw(s.Di, 0.f);
    gated_rmsnorm_fwd<float>(y.data(), z.data(), w.data(), out.data(), rstd.data(), s.M, s.Di, s.G,
                             1e-5f);
    gated_rmsnorm_bwd<float>(dout.data(), y.data(), z.data(), w.data(), rstd.data(), dy.data(),
                             dz.data(), dw.data(), s.M, s.Di, s.G);
    omp_set_num_threads(saved);
    out.insert(out.end(), rstd.begin(), rstd.end());
    out.insert(out.end(), dy.begin(), dy.end());
    out.insert(out.end(), dz.begin(), dz.end());
    out.insert(out.end(), dw.begin(), dw.end());
    return out;
  };
  EXPECT_EQ(run(1), run(3));
}
