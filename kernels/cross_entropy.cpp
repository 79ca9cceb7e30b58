// cross_entropy.cpp — fused, numerically stable softmax cross-entropy over rows of logits.
#include "cross_entropy.hpp"
#include "vmath.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace piper::kernels {

namespace {

// Below this many logits a parallel region costs more than it saves.
constexpr int64_t kParallelMin = int64_t(1) << 14;


// Loss of one row x[V] with target t; when d != nullptr writes d[V] = (softmax - onehot) * scale.
template <class T>
double row_loss(const T* x, int32_t t, T* d, int64_t V, T scale) {
  T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t v = 0; v < V; ++v) mx = std::max(mx, x[v]);
  T sum = 0;  // sum_v exp(x_v - max) in [1, V]: no overflow, no total underflow
  if (d) {
#pragma omp simd reduction(+ : sum)
    for (int64_t v = 0; v < V; ++v) {
      const T e = vmath::exp(x[v] - mx);
      d[v] = e;
      sum += e;
    }
    const T k = scale / sum;
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) d[v] *= k;
    d[t] -= scale;
  } else {
#pragma omp simd reduction(+ : sum)
    for (int64_t v = 0; v < V; ++v) sum += vmath::exp(x[v] - mx);
  }
  // loss = logsumexp(x) - x_t = max + log(sum) - x_t, formed in double
  return double(mx) + std::log(double(sum)) - double(x[t]);
}

}  // namespace

// logits[M,V], targets[M] (each in [0, V)) -> sum of the M row losses;
// dlogits[M,V] (optional, overwritten) = (softmax(logits) - onehot(targets)) * scale.
template <class T>
double cross_entropy(const T* logits, const int32_t* targets, T* dlogits, int64_t M, int64_t V,
                     T scale) {
  if (M <= 0) return 0.0;
  for (int64_t m = 0; m < M; ++m)
    if (targets[m] < 0 || targets[m] >= V)
      throw std::out_of_range("piper::kernels::cross_entropy: target " +
                              std::to_string(targets[m]) + " at row " + std::to_string(m) +
                              " outside [0, " + std::to_string(V) + ")");
  // Per-row losses, then a serial sum in row order: the total is bit-identical for any
  // thread count.
  std::vector<double> loss(static_cast<size_t>(M));
#pragma omp parallel for schedule(static) if (M * V >= kParallelMin)
  for (int64_t m = 0; m < M; ++m)
    loss[m] = row_loss(logits + m * V, targets[m], dlogits ? dlogits + m * V : nullptr, V, scale);
  double total = 0.0;
  for (int64_t m = 0; m < M; ++m) total += loss[m];
  return total;
}

// Megatron's vocab-parallel loss, one shard logits[M,V] of the vocabulary at `offset`; the
// group's row maxima and the sums below are reduced over the shards by the caller.
template <class T>
void vocab_ce_partials(const T* logits, const T* row_max, const int32_t* targets, int64_t offset,
                       T* exps, T* sums, int64_t M, int64_t V) {
#pragma omp parallel for schedule(static) if (M * V >= kParallelMin)
  for (int64_t m = 0; m < M; ++m) {
    const T* l = logits + m * V;
    T* e = exps + m * V;
    T sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += (e[v] = std::exp(l[v] - row_max[m]));
    sums[m] = sum;
    const int64_t t = targets[m] - offset;
    sums[M + m] = t >= 0 && t < V ? l[t] : T(0);
  }
}

template <class T>
double vocab_ce_finish(const T* sums, const T* row_max, const int32_t* targets, int64_t offset,
                       T* dlogits, int64_t M, int64_t V, T scale) {
  double loss = 0.0;
  for (int64_t m = 0; m < M; ++m) {
    const T total = sums[m];
    loss += std::log(static_cast<double>(total)) + row_max[m] - sums[M + m];
    T* d = dlogits + m * V;
    const T inv = T(1) / total;
    for (int64_t v = 0; v < V; ++v) d[v] *= inv * scale;
    const int64_t t = targets[m] - offset;
    if (t >= 0 && t < V) d[t] -= scale;
  }
  return loss;
}

#define PIPER_INSTANTIATE(T)                                                                  \
  template void vocab_ce_partials<T>(const T*, const T*, const int32_t*, int64_t, T*, T*,     \
                                     int64_t, int64_t);                                       \
  template double vocab_ce_finish<T>(const T*, const T*, const int32_t*, int64_t, T*, int64_t, \
                                     int64_t, T);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(double)
#undef PIPER_INSTANTIATE

template double cross_entropy<float>(const float*, const int32_t*, float*, int64_t, int64_t, float);
template double cross_entropy<double>(const double*, const int32_t*, double*, int64_t, int64_t,
                                      double);

}  // namespace piper::kernels
