// test_rope.cpp — rotate-half RoPE: finite-difference gradcheck, naive reference, aliasing.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/gradcheck.hpp"
#include "rope.hpp"

using namespace piper::kernels;
using namespace piper::testing;

namespace {

// Float results are compared normwise (normwise_err): error relative to the largest reference
// magnitude. Elementwise relative error (floor 1e-3) on thousands of O(1) outputs is dominated by
// the few entries that happen to lie near zero, where float rounding alone gives ~1e-5.

// Naive reference in the HF LLaMA form for one head vector u[hd] at position t:
// emb = cat(freqs, freqs), y = u * cos(t*emb) + rotate_half(u) * sin(t*emb),
// rotate_half([a, b]) = [-b, a].
std::vector<double> ref_rope_vec(const double* u, int64_t t, int64_t hd, double theta) {
  std::vector<double> o(hd);
  const int64_t half = hd / 2;
  for (int64_t d = 0; d < hd; ++d) {
    const int64_t j = d % half;
    const double ang = double(t) / std::pow(theta, double(2 * j) / double(hd));
    const double rot = d < half ? -u[d + half] : u[d - half];
    o[d] = u[d] * std::cos(ang) + rot * std::sin(ang);
  }
  return o;
}

std::vector<double> ref_rope(const std::vector<double>& x, int64_t B, int64_t Tn, int64_t H,
                             int64_t hd, double theta) {
  std::vector<double> y(x.size());
  for (int64_t row = 0; row < B * Tn * H; ++row) {
    auto o = ref_rope_vec(&x[row * hd], (row / H) % Tn, hd, theta);
    std::copy(o.begin(), o.end(), y.begin() + row * hd);
  }
  return y;
}

// dx = R^T dy with R the reference's own Jacobian, built column by column per head vector:
// dx_i = <dy, R e_i>.
std::vector<double> ref_rope_bwd(const std::vector<double>& dy, int64_t B, int64_t Tn, int64_t H,
                                 int64_t hd, double theta) {
  std::vector<double> dx(dy.size()), e(hd, 0.0);
  for (int64_t row = 0; row < B * Tn * H; ++row)
    for (int64_t i = 0; i < hd; ++i) {
      e[i] = 1.0;
      auto col = ref_rope_vec(e.data(), (row / H) % Tn, hd, theta);
      e[i] = 0.0;
      double s = 0;
      for (int64_t d = 0; d < hd; ++d) s += dy[row * hd + d] * col[d];
      dx[row * hd + i] = s;
    }
  return dx;
}

}  // namespace

TEST(Rope, GradcheckDouble) {
  const int64_t B = 2, Tn = 5, H = 3, hd = 6;
  const double theta = 10000.0;
  const size_t n = B * Tn * H * hd;
  auto x = random_vec<double>(n, 1);
  auto w = random_vec<double>(n, 2);
  std::vector<double> y(n), dx(n, 123.0);
  auto loss = [&] {
    rope_fwd<double>(x.data(), y.data(), B, Tn, H, hd, theta);
    return weighted_sum(y, w);
  };
  auto fd = finite_diff(x, loss, 1e-5);
  rope_bwd<double>(w.data(), dx.data(), B, Tn, H, hd, theta);
  EXPECT_LT(report("rope dx vs finite diff", max_rel_err(dx, fd), 1e-6), 1e-6);
}

TEST(Rope, FloatMatchesNaiveReference) {
  struct Case {
    int64_t B, Tn, H, hd;
    double theta;
  };
  // The last case is large enough for the kernel's multi-threaded path.
  const Case cases[] = {
      {2, 7, 4, 8, 10000.0}, {2, 7, 4, 8, 500000.0}, {1, 5, 3, 6, 3.0}, {2, 300, 4, 32, 10000.0}};
  for (const auto& [B, Tn, H, hd, theta] : cases) {
    const size_t n = B * Tn * H * hd;
    // float-representable inputs: the reference sees the float kernel's inputs
    const auto xd = random_f(n, 3);
    const auto dyd = random_f(n, 4);
    const auto xf = cast<float>(xd), dyf = cast<float>(dyd);
    std::vector<float> yf(n), dxf(n);
    rope_fwd<float>(xf.data(), yf.data(), B, Tn, H, hd, theta);
    rope_bwd<float>(dyf.data(), dxf.data(), B, Tn, H, hd, theta);
    auto yr = ref_rope(xd, B, Tn, H, hd, theta);
    auto dxr = ref_rope_bwd(dyd, B, Tn, H, hd, theta);
    EXPECT_LT(report("rope float fwd vs naive (normwise)", normwise_err(yf, yr), 1e-5), 1e-5);
    EXPECT_LT(report("rope float bwd vs naive (normwise)", normwise_err(dxf, dxr), 1e-5), 1e-5);
  }
}

TEST(Rope, KnownValuesAndPositionZeroIsIdentity) {
  // hd = 2: a plain 2-D rotation by angle t (inv_freq[0] = 1).
  const int64_t B = 1, Tn = 3, H = 1, hd = 2;
  std::vector<double> x = {1, 2, 1, 2, 1, 2}, y(6);
  rope_fwd<double>(x.data(), y.data(), B, Tn, H, hd, 10000.0);
  for (int64_t t = 0; t < Tn; ++t) {
    const double c = std::cos(double(t)), s = std::sin(double(t));
    EXPECT_NEAR(y[2 * t + 0], 1 * c - 2 * s, 1e-15);
    EXPECT_NEAR(y[2 * t + 1], 2 * c + 1 * s, 1e-15);
  }
  EXPECT_EQ(y[0], 1.0);
  EXPECT_EQ(y[1], 2.0);
}

TEST(Rope, InPlaceMatchesOutOfPlaceAndBwdInvertsFwd) {
  // hd = 10 runs the pair loop in scalar/partial vectors, hd = 64 in full vectors.
  for (int64_t hd : {10, 64}) {
    const int64_t B = 2, Tn = 6, H = 2;
    const size_t n = B * Tn * H * hd;
    auto x = random_vec<float>(n, 5);
    std::vector<float> y(n), dx(n);
    rope_fwd<float>(x.data(), y.data(), B, Tn, H, hd, 10000.0);
    auto inplace = x;
    rope_fwd<float>(inplace.data(), inplace.data(), B, Tn, H, hd, 10000.0);
    EXPECT_EQ(inplace, y);
    rope_bwd<float>(y.data(), dx.data(), B, Tn, H, hd, 10000.0);
    auto back = y;
    rope_bwd<float>(back.data(), back.data(), B, Tn, H, hd, 10000.0);
    EXPECT_EQ(back, dx);
    // R is orthogonal, so R^T R x = x.
    EXPECT_LT(report("rope R^T R x vs x (float)", max_rel_err(dx, x), 1e-5), 1e-5);
  }
  // RoPE has no parameters: there is nothing to accumulate.
}

TEST(Rope, ThreadCountDoesNotChangeResults) {
  const int64_t B = 2, Tn = 300, H = 4, hd = 32;
  const size_t n = B * Tn * H * hd;
  auto x = random_vec<float>(n, 6);
  std::vector<float> y1(n), y3(n), d1(n), d3(n);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  rope_fwd<float>(x.data(), y1.data(), B, Tn, H, hd, 10000.0);
  rope_bwd<float>(x.data(), d1.data(), B, Tn, H, hd, 10000.0);
  omp_set_num_threads(3);
  rope_fwd<float>(x.data(), y3.data(), B, Tn, H, hd, 10000.0);
  rope_bwd<float>(x.data(), d3.data(), B, Tn, H, hd, 10000.0);
  omp_set_num_threads(saved);
  EXPECT_EQ(y1, y3);
  EXPECT_EQ(d1, d3);
}
