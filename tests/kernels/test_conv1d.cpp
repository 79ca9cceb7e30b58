// test_conv1d.cpp — causal depthwise conv1d: finite-difference gradcheck, naive reference,
// accumulation of dw/dbias.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "conv1d.hpp"
#include "kernels/gradcheck.hpp"

using namespace piper::kernels;
using namespace piper::testing;

namespace {

struct Shape {
  int64_t B, Tn, C, K;
};

// Float results are compared normwise (normwise_err): error relative to the largest reference
// magnitude. Elementwise relative error (floor 1e-3) on thousands of O(1) outputs is dominated by
// the few entries that happen to lie near zero, where float rounding alone gives ~1e-5.

// y[b,t,c] = bias[c] + sum_{k<K} w[c,k] * x[b, t-(K-1)+k, c], x[b,<0,c] = 0
std::vector<double> ref_fwd(const std::vector<double>& x, const std::vector<double>& w,
                            const std::vector<double>& bias, const Shape& s) {
  std::vector<double> y(s.B * s.Tn * s.C);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 0; t < s.Tn; ++t)
      for (int64_t c = 0; c < s.C; ++c) {
        double acc = bias[c];
        for (int64_t k = 0; k < s.K; ++k) {
          const int64_t src = t - (s.K - 1) + k;
          if (src >= 0) acc += w[c * s.K + k] * x[(b * s.Tn + src) * s.C + c];
        }
        y[(b * s.Tn + t) * s.C + c] = acc;
      }
  return y;
}

// Reference gradients by the chain rule applied term by term to the formula above.
void ref_bwd(const std::vector<double>& dy, const std::vector<double>& x,
             const std::vector<double>& w, const Shape& s, std::vector<double>& dx,
             std::vector<double>& dw, std::vector<double>& db) {
  dx.assign(x.size(), 0.0);
  dw.assign(s.C * s.K, 0.0);
  db.assign(s.C, 0.0);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 0; t < s.Tn; ++t)
      for (int64_t c = 0; c < s.C; ++c) {
        const double g = dy[(b * s.Tn + t) * s.C + c];
        db[c] += g;
        for (int64_t k = 0; k < s.K; ++k) {
          const int64_t src = t - (s.K - 1) + k;
          if (src < 0) continue;
          dw[c * s.K + k] += g * x[(b * s.Tn + src) * s.C + c];
          dx[(b * s.Tn + src) * s.C + c] += g * w[c * s.K + k];
        }
      }
}

// Small shapes (K > Tn in the second; C > 64 crosses the kernel's channel blocks in the last).
const Shape kShapes[] = {{2, 6, 5, 4}, {2, 3, 5, 5}, {1, 7, 3, 1}, {2, 5, 131, 4}};
// Large enough for the kernel's multi-threaded path (too big for finite differences).
const Shape kLarge = {2, 70, 200, 4};

}  // namespace

TEST(Conv1d, GradcheckDouble) {
  for (const Shape& s : kShapes) {
    const size_t nx = s.B * s.Tn * s.C;
    auto x = random_vec<double>(nx, 10);
    auto w = random_vec<double>(s.C * s.K, 11);
    auto bias = random_vec<double>(s.C, 12);
    auto wt = random_vec<double>(nx, 13);  // loss weights
    std::vector<double> y(nx);
    auto loss = [&] {
      conv1d_fwd<double>(x.data(), w.data(), bias.data(), y.data(), s.B, s.Tn, s.C, s.K);
      return weighted_sum(y, wt);
    };
    const auto [fdx, fdw, fdb] = finite_diffs(loss, 1e-5, x, w, bias);
    std::vector<double> dx(nx, std::numeric_limits<double>::quiet_NaN());
    std::vector<double> dw(s.C * s.K, 0.0), db(s.C, 0.0);
    conv1d_bwd<double>(wt.data(), x.data(), w.data(), dx.data(), dw.data(), db.data(), s.B, s.Tn,
                       s.C, s.K);
    std::printf("shape B=%ld Tn=%ld C=%ld K=%ld\n", long(s.B), long(s.Tn), long(s.C), long(s.K));
    EXPECT_LT(report("conv1d dx vs finite diff", max_rel_err(dx, fdx), 1e-6), 1e-6);
    EXPECT_LT(report("conv1d dw vs finite diff", max_rel_err(dw, fdw), 1e-6), 1e-6);
    EXPECT_LT(report("conv1d dbias vs finite diff", max_rel_err(db, fdb), 1e-6), 1e-6);
  }
}

TEST(Conv1d, FloatMatchesNaiveReference) {
  std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.push_back(kLarge);
  for (const Shape& s : shapes) {
    const size_t nx = s.B * s.Tn * s.C;
    // float-representable inputs: the reference sees the float kernel's inputs
    const auto x = random_f(nx, 20);
    const auto w = random_f(s.C * s.K, 21);
    const auto bias = random_f(s.C, 22);
    const auto dy = random_f(nx, 23);
    const auto xf = cast<float>(x), wf = cast<float>(w), bf = cast<float>(bias),
               dyf = cast<float>(dy);
    std::vector<float> yf(nx), dxf(nx), dwf(s.C * s.K, 0.0f), dbf(s.C, 0.0f);
    conv1d_fwd<float>(xf.data(), wf.data(), bf.data(), yf.data(), s.B, s.Tn, s.C, s.K);
    conv1d_bwd<float>(dyf.data(), xf.data(), wf.data(), dxf.data(), dwf.data(), dbf.data(), s.B,
                      s.Tn, s.C, s.K);
    std::vector<double> dxr, dwr, dbr;
    ref_bwd(dy, x, w, s, dxr, dwr, dbr);
    std::printf("shape B=%ld Tn=%ld C=%ld K=%ld\n", long(s.B), long(s.Tn), long(s.C), long(s.K));
    EXPECT_LT(report("conv1d float y vs naive (normwise)", normwise_err(yf, ref_fwd(x, w, bias, s)),
                     1e-5),
              1e-5);
    EXPECT_LT(report("conv1d float dx vs naive (normwise)", normwise_err(dxf, dxr), 1e-5), 1e-5);
    EXPECT_LT(report("conv1d float dw vs naive (normwise)", normwise_err(dwf, dwr), 1e-5), 1e-5);
    EXPECT_LT(report("conv1d float dbias vs naive (normwise)", normwise_err(dbf, dbr), 1e-5), 1e-5);
  }
}

TEST(Conv1d, ParamGradsAccumulateInputGradOverwritten) {
  const Shape s{2, 6, 5, 4};
  const size_t nx = s.B * s.Tn * s.C;
  auto x = random_vec<float>(nx, 30);
  auto w = random_vec<float>(s.C * s.K, 31);
  auto dy = random_vec<float>(nx, 32);
  std::vector<float> dx1(nx), dw1(s.C * s.K, 0.0f), db1(s.C, 0.0f);
  conv1d_bwd<float>(dy.data(), x.data(), w.data(), dx1.data(), dw1.data(), db1.data(), s.B, s.Tn,
                    s.C, s.K);
  // Start from non-zero parameter grads and garbage in dx.
  auto dw0 = random_vec<float>(s.C * s.K, 33);
  auto db0 = random_vec<float>(s.C, 34);
  std::vector<float> dx2(nx, std::numeric_limits<float>::quiet_NaN()), dw2 = dw0, db2 = db0;
  conv1d_bwd<float>(dy.data(), x.data(), w.data(), dx2.data(), dw2.data(), db2.data(), s.B, s.Tn,
                    s.C, s.K);
  EXPECT_EQ(dx2, dx1);
  for (size_t i = 0; i < dw2.size(); ++i) EXPECT_FLOAT_EQ(dw2[i], dw0[i] + dw1[i]) << i;
  for (size_t i = 0; i < db2.size(); ++i) EXPECT_FLOAT_EQ(db2[i], db0[i] + db1[i]) << i;
  // A second call on the same buffers adds the gradient once more.
  conv1d_bwd<float>(dy.data(), x.data(), w.data(), dx2.data(), dw2.data(), db2.data(), s.B, s.Tn,
                    s.C, s.K);
  for (size_t i = 0; i < dw2.size(); ++i) EXPECT_NEAR(dw2[i], dw0[i] + 2 * dw1[i], 1e-5) << i;
  for (size_t i = 0; i < db2.size(); ++i) EXPECT_NEAR(db2[i], db0[i] + 2 * db1[i], 1e-5) << i;
}

TEST(Conv1d, ThreadCountDoesNotChangeResults) {
  const Shape s = kLarge;
  const size_t nx = s.B * s.Tn * s.C;
  auto x = random_vec<float>(nx, 40);
  auto w = random_vec<float>(s.C * s.K, 41);
  auto bias = random_vec<float>(s.C, 42);
  auto dy = random_vec<float>(nx, 43);
  auto run = [&](int threads, std::vector<float>& y, std::vector<float>& dx, std::vector<float>& dw,
                 std::vector<float>& db) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    y.assign(nx, 0.f);
    dx.assign(nx, 0.f);
    dw.assign(s.C * s.K, 0.f);
    db.assign(s.C, 0.f);
    conv1d_fwd<float>(x.data(), w.data(), bias.data(), y.data(), s.B, s.Tn, s.C, s.K);
    conv1d_bwd<float>(dy.data(), x.data(), w.data(), dx.data(), dw.data(), db.data(), s.B, s.Tn,
                      s.C, s.K);
    omp_set_num_threads(saved);
  };
  std::vector<float> y1, dx1, dw1, db1, y3, dx3, dw3, db3;
  run(1, y1, dx1, dw1, db1);
  run(3, y3, dx3, dw3, db3);
  EXPECT_EQ(y1, y3);
  EXPECT_EQ(dx1, dx3);
  EXPECT_EQ(dw1, dw3);
  EXPECT_EQ(db1, db3);
}
