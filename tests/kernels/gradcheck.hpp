// gradcheck.hpp — shared helpers for the kernel tests: deterministic random
// inputs, finite-difference gradients in double precision, and error measures.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

namespace piper::testing {

// n values uniform in [lo, hi), reproducible from seed.
template <class T>
std::vector<T> random_vec(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(rng));
  return v;
}

// Worst relative error max_i |a_i - b_i| / max(|b_i|, floor): b is the reference.
// A size mismatch or a NaN anywhere is an infinite error.
template <class A, class B>
double max_rel_err(const std::vector<A>& a, const std::vector<B>& b, double floor = 1e-3) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = std::fabs(double(a[i]) - double(b[i]));
    if (std::isnan(d)) return INFINITY;
    double s = std::max(std::fabs(double(b[i])), floor);
    worst = std::max(worst, d / s);
  }
  return worst;
}

// Central finite differences of a scalar loss w.r.t. every element of `x`
// (perturbed in place and restored): returns dL/dx.
inline std::vector<double> finite_diff(std::vector<double>& x, const std::function<double()>& loss,
                                       double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double saved = x[i];
    x[i] = saved + h;
    double lp = loss();
    x[i] = saved - h;
    double lm = loss();
    x[i] = saved;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

// Loss used by gradient checks: L = sum_i w_i * out_i with fixed random w,
// so dL/dout = w.
inline double weighted_sum(const std::vector<double>& out, const std::vector<double>& w) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += out[i] * w[i];
  return s;
}

// Prints and returns the error so every test reports what it saw.
inline double report(const char* what, double err, double tol) {
  std::printf("[ error ] %-40s worst rel err %.3e (tol %.1e)\n", what, err, tol);
  return err;
}

}  // namespace piper::testing
