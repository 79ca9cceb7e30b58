// test_optim.cpp — unit tests of the optimiser: AdamW against a double reference of torch.optim.AdamW, the learning-rate schedule, clipping and the deterministic sum of squares.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/backend.hpp"
#include "config/config.hpp"
#include "optim/adamw.hpp"

namespace piper::optim {
namespace {

// The update is the backend's adamw_update op (the runtime's optimiser calls it); these tests
// hold the CPU backend's to torch.optim.AdamW, with the hyperparameters torch names.
struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, int64_t t, const AdamWHyper& h,
                  bool decay, float grad_scale) {
  backend::Backend& be = backend::cpu();
  const backend::Shape s{n};
  be.adamw_update(backend::view(be, p, s), backend::view(be, g, s), backend::view(be, m, s), backend::view(be, v, s),
                  {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, t, decay, grad_scale});
}

double sum_squares(const float* g, int64_t n) {
  backend::Backend& be = backend::cpu();
  return be.sum_squares(backend::view(be, g, {n}));
}

std::vector<float> random_floats(size_t n, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(d(rng));
  return v;
}

// torch.optim.AdamW, one step, in double (torch/optim/adamw.py, single-tensor path):
//   p *= 1 - lr * wd
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps
//   p -= lr / (1 - b1^t) * m / denom
struct RefAdamW {
  std::vector<double> p, m, v;
  void step(const std::vector<float>& g, int t, const AdamWHyper& h, bool decay, double grad_scale) {
    for (size_t i = 0; i < p.size(); ++i) {
      const double gi = double(g[i]) * grad_scale;
      if (decay) p[i] *= 1.0 - h.lr * h.weight_decay;
      m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * gi;
      v[i] = h.beta2 * v[i] + (1.0 - h.beta2) * gi * gi;
      const double bc1 = 1.0 - std::pow(h.beta1, t), bc2 = 1.0 - std::pow(h.beta2, t);
      const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + h.eps;
      p[i] -= h.lr / bc1 * m[i] / denom;
    }
  }
};

// Errors of 5 steps of adamw_update against the reference, with fresh
// gradients each step: p absolute (p is O(1)); m and v relative to the largest
// reference moment of the step (per-element relative errors blow up where m
// passes through zero by cancellation).
struct AdamErr {
  double p = 0, m = 0, v = 0;
};

AdamErr run_adamw(size_t n, const AdamWHyper& h, bool decay, float grad_scale) {
  std::vector<float> p = random_floats(n, 1, -1.0, 1.0), m(n, 0.0f), v(n, 0.0f);
  RefAdamW ref{std::vector<double>(p.begin(), p.end()), std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  AdamErr e;
  for (int t = 1; t <= 5; ++t) {
    // gradients of mixed magnitude, some tiny so that eps matters
    std::vector<float> g = random_floats(n, 100 + static_cast<uint64_t>(t), -2.0, 2.0);
    for (size_t i = 0; i < n; i += 7) g[i] *= 1e-7f;
    adamw_update(p.data(), g.data(), m.data(), v.data(), static_cast<int64_t>(n), t, h, decay, grad_scale);
    ref.step(g, t, h, decay, grad_scale);
    double m_scale = 0, v_scale = 0;
    for (size_t i = 0; i < n; ++i) {
      m_scale = std::max(m_scale, std::fabs(ref.m[i]));
      v_scale = std::max(v_scale, std::fabs(ref.v[i]));
    }
    for (size_t i = 0; i < n; ++i) {
      e.p = std::max(e.p, std::fabs(p[i] - ref.p[i]));
      e.m = std::max(e.m, std::fabs(m[i] - ref.m[i]) / m_scale);
      e.v = std::max(e.v, std::fabs(v[i] - ref.v[i]) / v_scale);
    }
  }
  return e;
}

TEST(AdamW, MatchesTorchReferenceForFiveSteps) {
  struct Case {
    const char* what;
    size_t n;
    AdamWHyper h;
    bool decay;
    float grad_scale;
  };
  // lr * wd is large in the decay cases so that decaying before vs after the
  // update differs by far more than the tolerance (~lr^2 * wd = 1.25e-3).
  const std::vector<Case> cases = {
      {"no decay", 1000, {1e-2, 0.9, 0.999, 1e-8, 0.0}, false, 1.0f},
      {"decay flag off ignores wd", 1000, {1e-2, 0.9, 0.999, 1e-8, 0.5}, false, 1.0f},
      {"decay", 1000, {5e-2, 0.9, 0.95, 1e-8, 0.5}, true, 1.0f},
      {"decay + grad_scale 0.3", 1000, {5e-2, 0.9, 0.95, 1e-8, 0.5}, true, 0.3f},
      {"grad_scale 1e-3, big eps", 1000, {1e-3, 0.8, 0.99, 1e-3, 0.1}, true, 1e-3f},
      {"large tensor (OpenMP path)", 100000, {1e-2, 0.9, 0.95, 1e-8, 0.1}, true, 0.7f},
  };
  // Float arithmetic on O(1) parameters over 5 steps: a few ulp.
  const double tol_p = 1e-6, tol_m = 1e-6, tol_v = 1e-6;
  for (const Case& c : cases) {
    const AdamErr e = run_adamw(c.n, c.h, c.decay, c.grad_scale);
    std::printf("[ adamw ] %-28s max |p - ref| %.2e (tol %.0e), m err %.2e (tol %.0e), v err %.2e (tol %.0e)\n",
                c.what, e.p, tol_p, e.m, tol_m, e.v, tol_v);
    EXPECT_LE(e.p, tol_p) << c.what;
    EXPECT_LE(e.m, tol_m) << c.what;
    EXPECT_LE(e.v, tol_v) << c.what;
  }
}

// torch forms the moment coefficients as float(1 - beta) from double, not
// 1.0f - float(beta): for beta2 = 0.999 the two differ by 1.3e-5 relative.
TEST(AdamW, SecondMomentCoefficientAsTorch) {
  const size_t n = 256;
  const AdamWHyper h{1e-3, 0.9, 0.999, 1e-8, 0.0};
  std::vector<float> p(n, 0.5f), m(n, 0.0f), v(n, 0.0f);
  const std::vector<float> g = random_floats(n, 9, 0.5, 2.0);
  adamw_update(p.data(), g.data(), m.data(), v.data(), static_cast<int64_t>(n), 1, h, false, 1.0f);
  double worst_v = 0, worst_m = 0;
  for (size_t i = 0; i < n; ++i) {
    // torch, fp32: v = 0 * float(b2) + float(1 - b2) * g * g;  m = lerp(0, g, float(1 - b1))
    const double want_v = double(static_cast<float>(1.0 - h.beta2)) * g[i] * g[i];
    const double want_m = double(static_cast<float>(1.0 - h.beta1)) * g[i];
    worst_v = std::max(worst_v, std::fabs(v[i] - want_v) / want_v);
    worst_m = std::max(worst_m, std::fabs(m[i] - want_m) / want_m);
  }
  std::printf("[ adamw ] after one step: v rel err %.2e, m rel err %.2e (tol 1e-6: a few float ulp)\n", worst_v,
              worst_m);
  EXPECT_LE(worst_m, 1e-6);
  EXPECT_LE(worst_v, 1e-6);
}

// The reference itself must tell the two decay orders and the scale apart,
// or the comparison above would prove little.
TEST(AdamW, ReferenceDistinguishesDecayOrderAndScale) {
  const size_t n = 64;
  const AdamWHyper h{5e-2, 0.9, 0.95, 1e-8, 0.5};
  std::vector<float> p = random_floats(n, 1, -1.0, 1.0), m(n, 0.0f), v(n, 0.0f);
  const std::vector<float> g = random_floats(n, 2, -2.0, 2.0);
  std::vector<float> p0 = p;
  adamw_update(p.data(), g.data(), m.data(), v.data(), static_cast<int64_t>(n), 1, h, true, 1.0f);
  double diff_after = 0, diff_scale = 0;
  for (size_t i = 0; i < n; ++i) {
    // decay after the update: (p - lr * sign-ish step) * (1 - lr wd)
    const double upd = h.lr * (double(g[i]) / (std::fabs(double(g[i])) + h.eps));
    const double after = (p0[i] - upd) * (1 - h.lr * h.weight_decay);
    diff_after = std::max(diff_after, std::fabs(p[i] - after));
  }
  std::vector<float> q = p0, m2(n, 0.0f), v2(n, 0.0f);
  adamw_update(q.data(), g.data(), m2.data(), v2.data(), static_cast<int64_t>(n), 1, h, true, 0.5f);
  for (size_t i = 0; i < n; ++i) diff_scale = std::max(diff_scale, std::fabs(double(m2[i]) - 0.5 * m[i]));
  std::printf("[ adamw ] decay-after-update would differ by %.3e; grad_scale 0.5 moment error %.3e\n", diff_after,
              diff_scale);
  EXPECT_GT(diff_after, 1e-3);
  EXPECT_LT(diff_scale, 1e-7);
  // step 1 with zero moments is lr * sign(g) (bias corrections cancel), minus the decay
  for (size_t i = 0; i < n; ++i) {
    const double want = p0[i] * (1 - h.lr * h.weight_decay) - h.lr * (g[i] > 0 ? 1 : -1);
    EXPECT_NEAR(p[i], want, 1e-6) << i;
  }
}

// ---- learning rate ---------------------------------------------------------------------

config::TrainConfig schedule(int64_t steps, int64_t warmup, double lr = 3e-3, double min_ratio = 0.1) {
  config::TrainConfig t;
  t.steps = steps;
  t.warmup_steps = warmup;
  t.lr = lr;
  t.min_lr_ratio = min_ratio;
  return t;
}

TEST(LrSchedule, LinearWarmupThenPeak) {
  for (auto [steps, warmup] : std::vector<std::pair<int64_t, int64_t>>{{100, 10}, {20, 5}, {50, 1}}) {
    const auto t = schedule(steps, warmup);
    SCOPED_TRACE("steps " + std::to_string(steps) + " warmup " + std::to_string(warmup));
    EXPECT_NEAR(lr_at(t, 0), t.lr / double(warmup), 1e-15);
    for (int64_t s = 0; s < warmup; ++s) EXPECT_NEAR(lr_at(t, s), t.lr * double(s + 1) / double(warmup), 1e-15);
    // linear: equal increments
    for (int64_t s = 1; s < warmup; ++s)
      EXPECT_NEAR(lr_at(t, s) - lr_at(t, s - 1), t.lr / double(warmup), 1e-15);
    EXPECT_NEAR(lr_at(t, warmup), t.lr, 1e-15);
    // non-increasing after warmup, never below the floor
    for (int64_t s = warmup; s < steps; ++s) {
      EXPECT_LE(lr_at(t, s + 1), lr_at(t, s) + 1e-18) << s;
      EXPECT_GE(lr_at(t, s), t.lr * t.min_lr_ratio - 1e-15) << s;
    }
  }
}

// The cosine ends exactly at lr * min_lr_ratio on the last step that runs (steps - 1).
TEST(LrSchedule, LastStepReachesTheFloor) {
  for (auto [steps, warmup] : std::vector<std::pair<int64_t, int64_t>>{{100, 10}, {20, 5}, {50, 1}, {10, 0}}) {
    const auto t = schedule(steps, warmup);
    const double last = lr_at(t, steps - 1), want = t.lr * t.min_lr_ratio;
    std::printf("[ lr ] steps %lld warmup %lld: lr at last step %.12e, want %.12e, |diff| %.3e (tol 1e-12)\n",
                static_cast<long long>(steps), static_cast<long long>(warmup), last, want, std::fabs(last - want));
    EXPECT_NEAR(last, want, 1e-12);
  }
}

// ---- clipping and norms -------------------------------------------------------------------

TEST(Clip, CoefficientAsClipGradNorm) {
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0f);
  EXPECT_EQ(clip_coefficient(0.0, 1.0), 1.0f);
  EXPECT_EQ(clip_coefficient(1.0 - 1e-3, 1.0), 1.0f);
  for (double norm : {1.5, 4.0, 1e3, 1e8}) {
    const float c = clip_coefficient(norm, 1.0);
    const double want = 1.0 / (norm + 1e-6);
    std::printf("[ clip ] norm %g -> %.9g, want %.9g, rel err %.2e (tol 1e-7)\n", norm, c, want, std::fabs(c - want) / want);
    EXPECT_NEAR(c, want, 1e-7 * want);
  }
  EXPECT_NEAR(clip_coefficient(10.0, 2.5), 2.5 / (10.0 + 1e-6), 1e-7);
  // clipping off
  EXPECT_EQ(clip_coefficient(1e6, 0.0), 1.0f);
  EXPECT_EQ(clip_coefficient(1e6, -1.0), 1.0f);
}

TEST(SumSquares, MatchesADoubleLoopAndIgnoresThreadCount) {
  const int saved_threads = omp_get_max_threads();
  for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{4097}, size_t{65537}, size_t{300001}}) {
    const auto g = random_floats(n, n + 3, -3.0, 3.0);
    double ref = 0;
    for (float x : g) ref += double(x) * double(x);
    omp_set_num_threads(1);
    const double one = sum_squares(g.data(), static_cast<int64_t>(n));
    omp_set_num_threads(2);
    const double two = sum_squares(g.data(), static_cast<int64_t>(n));
    omp_set_num_threads(saved_threads);
    const double rel = n ? std::fabs(one - ref) / ref : std::fabs(one);
    std::printf("[ sumsq ] n %6zu: %.17g vs loop %.17g, rel err %.2e (tol 1e-12); 1 vs 2 threads equal: %s\n", n, one,
                ref, rel, one == two ? "yes" : "NO");
    EXPECT_LE(rel, 1e-12) << n;
    EXPECT_EQ(one, two) << n;  // bit-identical
  }
}

}  // namespace
}  // namespace piper::optim
