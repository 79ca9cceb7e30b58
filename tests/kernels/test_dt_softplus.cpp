// test_dt_softplus.cpp — dt = softplus(dt_raw + dt_bias): fwd/bwd, both branches, bias grad.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "dt_softplus.hpp"
#include "kernels/gradcheck.hpp"

namespace {

using namespace piper::testing;
namespace k = piper::kernels;

// Naive reference: dt = log(1 + exp(v)) (exact, no threshold), ddt_raw = ddt * sigmoid(v),
// ddt_bias = column sums of ddt_raw.
struct Ref {
  std::vector<double> dt, draw, dbias;
};
Ref reference(const std::vector<double>& raw, const std::vector<double>& bias,
              const std::vector<double>& ddt, int64_t M, int64_t Hm) {
  Ref r{std::vector<double>(M * Hm), std::vector<double>(M * Hm), std::vector<double>(Hm, 0.0)};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < Hm; ++h) {
      const double v = raw[m * Hm + h] + bias[h];
      // log(1+e^v) = max(v,0) + log1p(e^-|v|): exact in double for every v
      r.dt[m * Hm + h] = std::max(v, 0.0) + std::log1p(std::exp(-std::fabs(v)));
      r.draw[m * Hm + h] = ddt[m * Hm + h] / (1.0 + std::exp(-v));
      r.dbias[h] += r.draw[m * Hm + h];
    }
  return r;
}

}  // namespace

TEST(DtSoftplus, GradcheckDouble) {
  const int64_t M = 6, Hm = 5;
  // raw spans both sides of the v > 20 linear branch and the far negative tail
  auto raw = random_vec<double>(M * Hm, 1, -30, 30);
  auto bias = random_vec<double>(Hm, 2, -3, 3);
  const auto wt = random_vec<double>(M * Hm, 3);  // L = sum(wt * dt)
  auto loss = [&] {
    std::vector<double> dt(M * Hm);
    k::dt_softplus_fwd<double>(raw.data(), bias.data(), dt.data(), M, Hm);
    return weighted_sum(dt, wt);
  };
  std::vector<double> draw(M * Hm, NAN), dbias(Hm, 0.0);
  k::dt_softplus_bwd<double>(wt.data(), raw.data(), bias.data(), draw.data(), dbias.data(), M, Hm);
  EXPECT_ERR("dt_softplus ddt_raw vs finite diff (double)",
             max_rel_err(draw, finite_diff(raw, loss, kFdStep)), 1e-6);
  EXPECT_ERR("dt_softplus ddt_bias vs finite diff (double)",
             max_rel_err(dbias, finite_diff(bias, loss, kFdStep)), 1e-6);
}

TEST(DtSoftplus, FloatMatchesNaiveReference) {
  const int64_t M = 7, Hm = 6;
  auto raw = random_f(M * Hm, 4, -8, 8);
  // last row: both branches and the extremes (softplus(-90) ~ 8e-40 is a float denormal)
  const double extremes[Hm] = {19.5, 20.5, 45.0, -45.0, 90.0, -90.0};
  for (int64_t h = 0; h < Hm; ++h) raw[(M - 1) * Hm + h] = extremes[h];
  const auto bias = std::vector<double>(Hm, 0.0);
  const auto ddt = random_f(M * Hm, 5, -1, 1);
  const Ref r = reference(raw, bias, ddt, M, Hm);
  auto rawf = cast<float>(raw), biasf = cast<float>(bias), ddtf = cast<float>(ddt);
  std::vector<float> dt(M * Hm, NAN), draw(M * Hm, NAN), dbias(Hm, 0.f);
  k::dt_softplus_fwd<float>(rawf.data(), biasf.data(), dt.data(), M, Hm);
  k::dt_softplus_bwd<float>(ddtf.data(), rawf.data(), biasf.data(), draw.data(), dbias.data(), M,
                            Hm);
  EXPECT_ERR("dt_softplus dt (float vs naive double)", max_rel_err(dt, r.dt), 1e-5);
  EXPECT_ERR("dt_softplus ddt_raw (float vs naive double)", max_rel_err(draw, r.draw), 1e-5);
  EXPECT_ERR("dt_softplus ddt_bias (float vs naive double)", max_rel_err(dbias, r.dbias), 1e-5);
  // random bias too
  const auto bias2 = random_f(Hm, 6, -4, 4);
  const Ref r2 = reference(raw, bias2, ddt, M, Hm);
  auto bias2f = cast<float>(bias2);
  std::vector<float> dbias2(Hm, 0.f);
  k::dt_softplus_fwd<float>(rawf.data(), bias2f.data(), dt.data(), M, Hm);
  k::dt_softplus_bwd<float>(ddtf.data(), rawf.data(), bias2f.data(), draw.data(), dbias2.data(), M,
                            Hm);
  EXPECT_ERR("dt_softplus dt, bias (float vs naive double)", max_rel_err(dt, r2.dt), 1e-5);
  EXPECT_ERR("dt_softplus ddt_raw, bias (float vs naive double)", max_rel_err(draw, r2.draw), 1e-5);
  EXPECT_ERR("dt_softplus ddt_bias, bias (float vs naive double)", max_rel_err(dbias2, r2.dbias),
             1e-5);
}

TEST(DtSoftplus, BiasGradAccumulatesInputGradOverwritten) {
  const int64_t M = 5, Hm = 7;
  const auto raw = cast<float>(random_f(M * Hm, 7, -5, 5));
  const auto bias = cast<float>(random_f(Hm, 8, -2, 2));
  const auto ddt = cast<float>(random_f(M * Hm, 9, -1, 1));
  std::vector<float> draw1(M * Hm, NAN), draw2(M * Hm, 42.f), dbias(Hm, 0.f);
  k::dt_softplus_bwd<float>(ddt.data(), raw.data(), bias.data(), draw1.data(), dbias.data(), M, Hm);
  const std::vector<float> once = dbias;
  k::dt_softplus_bwd<float>(ddt.data(), raw.data(), bias.data(), draw2.data(), dbias.data(), M, Hm);
  std::vector<float> expect(Hm);
  for (int64_t h = 0; h < Hm; ++h) expect[h] = 2 * once[h];
  EXPECT_ERR("dt_softplus ddt_bias after two calls vs 2x one call", max_rel_err(dbias, expect),
             1e-6);
  EXPECT_EQ(draw1, draw2) << "ddt_raw must be overwritten, whatever it held";
}

TEST(DtSoftplus, LargeMatchesReferenceAndIsThreadCountIndependent) {
  const int64_t M = 2049, Hm = 17;  // above the threading threshold
  const auto raw = random_f(M * Hm, 10, -10, 10);
  const auto bias = random_f(Hm, 11, -4, 4);
  const auto ddt = random_f(M * Hm, 12, -1, 1);
  const Ref r = reference(raw, bias, ddt, M, Hm);
  auto rawf = cast<float>(raw), biasf = cast<float>(bias), ddtf = cast<float>(ddt);
  const int saved = omp_get_max_threads();
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    std::vector<float> dt(M * Hm), draw(M * Hm), dbias(Hm, 0.f);
    k::dt_softplus_fwd<float>(rawf.data(), biasf.data(), dt.data(), M, Hm);
    k::dt_softplus_bwd<float>(ddtf.data(), rawf.data(), biasf.data(), draw.data(), dbias.data(), M,
                              Hm);
    return std::vector<std::vector<float>>{dt, draw, dbias};
  };
  const auto o1 = run(1), o3 = run(3);
  omp_set_num_threads(saved);
  EXPECT_ERR("dt_softplus large dt (float vs naive double)", max_rel_err(o3[0], r.dt), 1e-5);
  EXPECT_ERR("dt_softplus large ddt_raw (float vs naive double)", max_rel_err(o3[1], r.draw), 1e-5);
  // ~2000 O(1) terms per bias grad: relative to max(|ref|, 1)
  EXPECT_ERR("dt_softplus large ddt_bias (float vs naive double)", max_rel_err(o3[2], r.dbias, 1.0),
             1e-5);
  EXPECT_EQ(o1, o3);
}
