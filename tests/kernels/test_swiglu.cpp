// test_swiglu.cpp — SwiGLU gate h = silu(gate) * up: forward/backward, saturation, threaded path.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/gradcheck.hpp"
#include "swiglu.hpp"

namespace {

using namespace piper::testing;
namespace k = piper::kernels;

// Float fwd/bwd against h = g*s(g)*u, dg = dh*u*(s + g*s*(1-s)), du = dh*g*s in double.
void check_float(const std::vector<double>& g, const std::vector<double>& u,
                 const std::vector<double>& dh, const std::string& tag) {
  const size_t n = g.size();
  std::vector<double> rh(n), rdg(n), rdu(n);
  for (size_t i = 0; i < n; ++i) {
    const double s = 1.0 / (1.0 + std::exp(-g[i]));
    rh[i] = g[i] * s * u[i];
    rdg[i] = dh[i] * u[i] * (s + g[i] * s * (1.0 - s));
    rdu[i] = dh[i] * g[i] * s;
  }
  auto gf = cast<float>(g), uf = cast<float>(u), dhf = cast<float>(dh);
  std::vector<float> h(n, NAN), dg(n, NAN), du(n, NAN);
  k::swiglu_fwd<float>(gf.data(), uf.data(), h.data(), n);
  k::swiglu_bwd<float>(dhf.data(), gf.data(), uf.data(), dg.data(), du.data(), n);
  EXPECT_ERR(("swiglu h (float vs naive double) " + tag).c_str(), max_rel_err(h, rh), 1e-5);
  // silu' = s*(1 + g*(1-s)) crosses zero at g ~ -1.28 (cancellation): floor 1e-2
  EXPECT_ERR(("swiglu dgate (float vs naive double) " + tag).c_str(), max_rel_err(dg, rdg, 1e-2),
             1e-5);
  EXPECT_ERR(("swiglu dup (float vs naive double) " + tag).c_str(), max_rel_err(du, rdu), 1e-5);
}

}  // namespace

TEST(Swiglu, GradcheckDouble) {
  const int64_t n = 31;
  auto g = random_vec<double>(n, 1, -6, 6);
  auto u = random_vec<double>(n, 2, -2, 2);
  const auto wt = random_vec<double>(n, 3);  // L = sum(wt * h)
  auto loss = [&] {
    std::vector<double> h(n);
    k::swiglu_fwd<double>(g.data(), u.data(), h.data(), n);
    return weighted_sum(h, wt);
  };
  std::vector<double> dg(n, NAN), du(n, NAN);
  k::swiglu_bwd<double>(wt.data(), g.data(), u.data(), dg.data(), du.data(), n);
  EXPECT_ERR("swiglu dgate vs finite diff (double)", max_rel_err(dg, finite_diff(g, loss, kFdStep)),
             1e-6);
  EXPECT_ERR("swiglu dup vs finite diff (double)", max_rel_err(du, finite_diff(u, loss, kFdStep)),
             1e-6);
}

TEST(Swiglu, FloatMatchesNaiveReference) {
  auto g = random_f(23, 4, -8, 8);
  // saturated and special gates: exp overflow/underflow must give 0 / g*u, never NaN
  for (double v : {0.0, -0.0, 20.0, -20.0, 87.0, -87.0, 88.5, -88.5, 100.0, -100.0, 1e4, -1e4})
    g.push_back(v);
  check_float(g, random_f(g.size(), 5, -2, 2), random_f(g.size(), 6, -1, 1), "(mixed)");
}

TEST(Swiglu, InputGradsOverwritten) {
  // no parameters: dgate/dup must not depend on what the buffers held
  const int64_t n = 13;
  const auto g = cast<float>(random_f(n, 7, -4, 4));
  const auto u = cast<float>(random_f(n, 8, -2, 2));
  const auto dh = cast<float>(random_f(n, 9, -1, 1));
  std::vector<float> dg1(n, NAN), du1(n, NAN), dg2(n, 5.f), du2(n, -3.f);
  k::swiglu_bwd<float>(dh.data(), g.data(), u.data(), dg1.data(), du1.data(), n);
  k::swiglu_bwd<float>(dh.data(), g.data(), u.data(), dg2.data(), du2.data(), n);
  EXPECT_EQ(dg1, dg2);
  EXPECT_EQ(du1, du2);
  EXPECT_ERR("swiglu dgate overwrite check (all finite)", max_rel_err(dg1, cast<double>(dg2)), 0.0);
  EXPECT_ERR("swiglu dup overwrite check (all finite)", max_rel_err(du1, cast<double>(du2)), 0.0);
}

TEST(Swiglu, LargeThreadedMatchesReference) {
  // M*F-like length above the threading threshold, not a multiple of the SIMD width
  const size_t n = 100003;
  check_float(random_f(n, 10, -12, 12), random_f(n, 11, -2, 2), random_f(n, 12, -1, 1), "(large)");
}
