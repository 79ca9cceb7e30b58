// gradcheck.hpp — shared helpers for the kernel tests: deterministic random
// inputs, finite-difference gradients in double precision, and error measures.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

namespace piper::testing {

// ---- inputs ---------------------------------------------------------------------------------

// n values uniform in [lo, hi), reproducible from seed.
template <class T>
std::vector<T> random_vec(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(rng));
  return v;
}

// random_vec<double> rounded to float: values exactly representable in float, so a double
// reference computed from them sees the very inputs the float kernel sees.
inline std::vector<double> random_f(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  auto v = random_vec<float>(n, seed, lo, hi);
  return std::vector<double>(v.begin(), v.end());
}

// M ids (token ids, targets) uniform in [0, V), reproducible from seed; with M > V some repeat.
inline std::vector<int32_t> random_ids(int64_t M, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(V - 1));
  std::vector<int32_t> ids(M);
  for (auto& i : ids) i = dist(rng);
  return ids;
}

// Element-wise conversion between precisions, e.g. cast<float>(double_vec) for a float kernel's
// inputs or cast<double>(float_vec) for comparing float results.
template <class T, class U>
std::vector<T> cast(const std::vector<U>& v) {
  return std::vector<T>(v.begin(), v.end());
}

// ---- error measures -------------------------------------------------------------------------

// Worst relative error max_i |a_i - b_i| / max(|b_i|, floor): b is the reference.
// A size mismatch or a non-finite value (NaN or +-inf) anywhere, in a or in b, is an
// infinite error.
template <class A, class B>
double max_rel_err(const std::vector<A>& a, const std::vector<B>& b, double floor = 1e-3) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(double(a[i])) || !std::isfinite(double(b[i]))) return INFINITY;
    double d = std::fabs(double(a[i]) - double(b[i]));
    double s = std::max(std::fabs(double(b[i])), floor);
    worst = std::max(worst, d / s);
  }
  return worst;
}

// max_rel_err with a floor that scales with the reference: max(rel_floor * max_i |b_i|,
// abs_floor), so near-zero entries of b are judged against b's own magnitude rather than their
// own (they are often rounding noise after cancellation).
template <class A, class B>
double scaled_rel_err(const std::vector<A>& a, const std::vector<B>& b, double rel_floor,
                      double abs_floor) {
  double m = 0;
  for (auto v : b) m = std::max(m, std::fabs(double(v)));
  return max_rel_err(a, b, std::max(m * rel_floor, abs_floor));
}

// Normwise error: relative to the largest reference magnitude, max(max_i |b_i|, 1e-3).
template <class A, class B>
double normwise_err(const std::vector<A>& a, const std::vector<B>& b) {
  return scaled_rel_err(a, b, 1.0, 1e-3);
}

// ---- finite differences ---------------------------------------------------------------------

// The central-difference step of most kernel tests: ~cbrt(machine eps) balances truncation
// (~h^2) against rounding in the loss (~eps |L| / h).
constexpr double kFdStep = 1e-5;

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

// finite_diff of one loss w.r.t. several inputs, one after the other in argument order:
//   const auto [fdq, fdk, fdv] = finite_diffs(loss, h, q, k, v);
template <class... Xs>
std::array<std::vector<double>, sizeof...(Xs)> finite_diffs(const std::function<double()>& loss,
                                                            double h, Xs&... xs) {
  return {finite_diff(xs, loss, h)...};  // braced list: evaluated left to right
}

// Loss used by gradient checks: L = sum_i w_i * out_i with fixed random w,
// so dL/dout = w.
inline double weighted_sum(const std::vector<double>& out, const std::vector<double>& w) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += out[i] * w[i];
  return s;
}

// ---- reporting ------------------------------------------------------------------------------

// Prints and returns the error so every test reports what it saw.
inline double report(const char* what, double err, double tol) {
  std::printf("[ error ] %-40s worst rel err %.3e (tol %.1e)\n", what, err, tol);
  return err;
}

}  // namespace piper::testing

// Reports `err` and expects err <= tol (gtest; include <gtest/gtest.h> before use).
#define EXPECT_ERR(what, err, tol) EXPECT_LE(::piper::testing::report(what, err, tol), tol)
