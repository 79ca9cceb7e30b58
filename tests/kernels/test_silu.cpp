// test_silu.cpp — SiLU forward/backward, including saturated inputs and the threaded path.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/gradcheck.hpp"
#include "silu.hpp"

namespace {

using namespace piper::testing;
namespace k = piper::kernels;

double ref_silu(double x) { return x / (1.0 + std::exp(-x)); }
double ref_dsilu(double x) {  // d/dx x*s(x) = s + x*s*(1-s)
  const double s = 1.0 / (1.0 + std::exp(-x));
  return s + x * s * (1.0 - s);
}

// Float fwd/bwd of n values against the double formulas above.
void check_float(const std::vector<double>& x, const std::vector<double>& dy, const char* tag) {
  const size_t n = x.size();
  std::vector<double> ry(n), rdx(n);
  for (size_t i = 0; i < n; ++i) {
    ry[i] = ref_silu(x[i]);
    rdx[i] = dy[i] * ref_dsilu(x[i]);
  }
  auto xf = cast<float>(x), dyf = cast<float>(dy);
  std::vector<float> y(n, NAN), dx(n, NAN);
  k::silu_fwd<float>(xf.data(), y.data(), n);
  k::silu_bwd<float>(dyf.data(), xf.data(), dx.data(), n);
  EXPECT_ERR((std::string("silu y (float vs naive double) ") + tag).c_str(), max_rel_err(y, ry),
             1e-5);
  // silu' = s*(1 + x*(1-s)) crosses zero at x ~ -1.28 (cancellation): floor 1e-2
  EXPECT_ERR((std::string("silu dx (float vs naive double) ") + tag).c_str(),
             max_rel_err(dx, rdx, 1e-2), 1e-5);
}

}  // namespace

TEST(Silu, GradcheckDouble) {
  const int64_t n = 37;
  auto x = random_vec<double>(n, 1, -6, 6);
  const auto wt = random_vec<double>(n, 2);  // L = sum(wt * y)
  auto loss = [&] {
    std::vector<double> y(n);
    k::silu_fwd<double>(x.data(), y.data(), n);
    return weighted_sum(y, wt);
  };
  std::vector<double> dx(n, NAN);
  k::silu_bwd<double>(wt.data(), x.data(), dx.data(), n);
  EXPECT_ERR("silu dx vs finite diff (double)", max_rel_err(dx, finite_diff(x, loss, kFdStep)),
             1e-6);
}

TEST(Silu, FloatMatchesNaiveReference) {
  auto x = random_f(29, 3, -8, 8);
  // saturated and special inputs: exp overflow/underflow must give 0 / x, never NaN
  for (double v :
       {0.0, -0.0, 1e-6, -1e-6, 20.0, -20.0, 87.0, -87.0, 88.5, -88.5, 100.0, -100.0, 1e4, -1e4})
    x.push_back(v);
  check_float(x, random_f(x.size(), 4, -1, 1), "(mixed)");
}

TEST(Silu, InputGradOverwritten) {
  // no parameters: dx must not depend on what the buffer held
  const int64_t n = 13;
  const auto x = cast<float>(random_f(n, 5, -4, 4));
  const auto dy = cast<float>(random_f(n, 6, -1, 1));
  std::vector<float> a(n, NAN), b(n, 7.f);
  k::silu_bwd<float>(dy.data(), x.data(), a.data(), n);
  k::silu_bwd<float>(dy.data(), x.data(), b.data(), n);
  EXPECT_EQ(a, b);
  EXPECT_ERR("silu dx overwrite check (all finite)", max_rel_err(a, cast<double>(b)), 0.0);
}

TEST(Silu, LargeThreadedMatchesReference) {
  // above the threading threshold, length not a multiple of the SIMD width
  const size_t n = 100003;
  check_float(random_f(n, 7, -12, 12), random_f(n, 8, -1, 1), "(large)");
}
