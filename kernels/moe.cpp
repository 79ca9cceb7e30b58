// moe.cpp — mixture-of-experts routing: softmax top-k router and its backward, the sequence-wise
// balance loss, the expert-major permutation, row gathers and the weighted combine.
#include "moe.hpp"
#include "vmath.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace piper::kernels {

namespace {

// Below this many values a parallel region costs more than it saves.
constexpr int64_t kParallelMin = int64_t(1) << 15;
// Columns of a combine row summed at once in double (a stack block).
constexpr int64_t kColBlock = 64;

// p[E] = softmax(x[E]), the exponentials summed in double.
template <class T>
void softmax_row(const T* x, T* p, int64_t E) {
  T mx = x[0];
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, x[e]);
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) {
    p[e] = vmath::exp(x[e] - mx);
    sum += p[e];
  }
  const double inv = 1.0 / sum;
  for (int64_t e = 0; e < E; ++e) p[e] = static_cast<T>(p[e] * inv);
}

// idx[K]: the K largest of p[E] in descending order, ties to the lower index. Pick k is the
// lowest e not yet picked that no other unpicked value exceeds; the indices are distinct and in
// range even for NaN probabilities.
template <class T>
void top_k(const T* p, int32_t* idx, int64_t E, int64_t K) {
  for (int64_t k = 0; k < K; ++k) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      if (std::find(idx, idx + k, static_cast<int32_t>(e)) != idx + k) continue;
      if (best < 0 || p[e] > p[best]) best = e;
    }
    idx[k] = static_cast<int32_t>(best);
  }
}

// The gradient of one router row: dl[E] = softmax backward of dp, where dp = dprobs plus the
// renormalisation's gradient at the picked experts (dl holds dp on the way).
template <class T>
void route_bwd_row(const T* dw, const T* dprobs, const T* p, const int32_t* idx, const T* w, T* dl,
                   int64_t E, int64_t K) {
  double S = 0, dww = 0;
  for (int64_t k = 0; k < K; ++k) {
    S += p[idx[k]];
    dww += double(dw[k]) * w[k];
  }
  std::memcpy(dl, dprobs, static_cast<size_t>(E) * sizeof(T));
  for (int64_t k = 0; k < K; ++k) dl[idx[k]] = static_cast<T>(dl[idx[k]] + (dw[k] - dww) / S);
  double dpp = 0;
  for (int64_t e = 0; e < E; ++e) dpp += double(dl[e]) * p[e];
  for (int64_t e = 0; e < E; ++e) dl[e] = static_cast<T>(p[e] * (dl[e] - dpp));
}

// One sequence of the balance loss, rows [seq, E] of probs and [seq, K] of experts: returns
// E * sum_e f_e P_e and writes dprobs. colsum and count are E-long scratch.
template <class T>
double balance_seq(const T* probs, const int32_t* experts, T* dprobs, int64_t E, int64_t K,
                   int64_t seq, double scale, std::vector<double>& colsum,
                   std::vector<int64_t>& count) {
  std::fill(colsum.begin(), colsum.end(), 0.0);
  std::fill(count.begin(), count.end(), 0);
  for (int64_t r = 0; r < seq; ++r) {
    for (int64_t e = 0; e < E; ++e) colsum[e] += probs[r * E + e];
    for (int64_t k = 0; k < K; ++k) ++count[experts[r * K + k]];
  }
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) {
    const double f = double(count[e]) / double(seq * K);
    aux += f * (colsum[e] / double(seq));
    colsum[e] = scale * double(E) * f / double(seq);  // now d(scale * aux) / dprobs[:, e]
  }
  for (int64_t r = 0; r < seq; ++r)
    for (int64_t e = 0; e < E; ++e) dprobs[r * E + e] = static_cast<T>(colsum[e]);
  return double(E) * aux;
}

// out[n] = acc[n] + sum over k of wk[k] * src[rows[k]][0:n] (wk null: weights 1), in double.
template <class T>
void sum_rows(const T* src, const int32_t* rows, const T* wk, int64_t K, int64_t D, int64_t d0,
              int64_t n, double* acc) {
  for (int64_t k = 0; k < K; ++k) {
    const T* s = src + static_cast<int64_t>(rows[k]) * D + d0;
    const double w = wk ? double(wk[k]) : 1.0;
    for (int64_t j = 0; j < n; ++j) acc[j] += w * s[j];
  }
}

}  // namespace

template <class T>
void moe_route_fwd(const T* logits, T* probs, int32_t* experts, T* weights, int64_t M, int64_t E,
                   int64_t K) {
#pragma omp parallel for schedule(static) if (M * E > kParallelMin)
  for (int64_t m = 0; m < M; ++m) {
    T* p = probs + m * E;
    int32_t* idx = experts + m * K;
    softmax_row(logits + m * E, p, E);
    top_k(p, idx, E, K);
    double S = 0;
    for (int64_t k = 0; k < K; ++k) S += p[idx[k]];
    for (int64_t k = 0; k < K; ++k) weights[m * K + k] = static_cast<T>(p[idx[k]] / S);
  }
}

template <class T>
void moe_route_bwd(const T* dweights, const T* dprobs, const T* probs, const int32_t* experts,
                   const T* weights, T* dlogits, int64_t M, int64_t E, int64_t K) {
#pragma omp parallel for schedule(static) if (M * E > kParallelMin)
  for (int64_t m = 0; m < M; ++m)
    route_bwd_row(dweights + m * K, dprobs + m * E, probs + m * E, experts + m * K, weights + m * K,
                  dlogits + m * E, E, K);
}

template <class T>
double moe_balance(const T* probs, const int32_t* experts, T* dprobs, int64_t M, int64_t E,
                   int64_t K, int64_t seq, T scale) {
  const int64_t nseq = M / seq;
  std::vector<double> part(static_cast<size_t>(nseq));
#pragma omp parallel if (M * E > kParallelMin)
  {
    std::vector<double> colsum(static_cast<size_t>(E));
    std::vector<int64_t> count(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t s = 0; s < nseq; ++s)
      part[static_cast<size_t>(s)] = balance_seq(probs + s * seq * E, experts + s * seq * K,
                                                 dprobs + s * seq * E, E, K, seq, double(scale),
                                                 colsum, count);
  }
  double total = 0;
  for (double a : part) total += a;
  return total;
}

void moe_permute_index(const int32_t* experts, int32_t* counts, int32_t* rows, int32_t* pos,
                       int64_t M, int64_t E, int64_t K) {
  const int64_t P = M * K;
  std::fill(counts, counts + E, 0);
  for (int64_t i = 0; i < P; ++i) ++counts[experts[i]];
  std::vector<int64_t> next(static_cast<size_t>(E));
  for (int64_t e = 1; e < E; ++e) next[e] = next[e - 1] + counts[e - 1];
  for (int64_t i = 0; i < P; ++i) {  // (row, slot) in order: stable within an expert
    const int64_t p = next[experts[i]]++;
    rows[p] = static_cast<int32_t>(i / K);
    pos[i] = static_cast<int32_t>(p);
  }
}

template <class T>
void gather_rows(const T* src, const int32_t* rows, T* dst, int64_t P, int64_t D) {
  if (P <= 0 || D <= 0) return;
  const size_t bytes = static_cast<size_t>(D) * sizeof(T);
#pragma omp parallel for schedule(static) if (P * D > kParallelMin)
  for (int64_t p = 0; p < P; ++p) std::memcpy(dst + p * D, src + static_cast<int64_t>(rows[p]) * D, bytes);
}

template <class T>
void moe_combine(const T* y, const int32_t* pos, const T* weights, T* out, int64_t M, int64_t K,
                 int64_t D) {
#pragma omp parallel for schedule(static) if (M * K * D > kParallelMin)
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t d0 = 0; d0 < D; d0 += kColBlock) {
      const int64_t n = std::min(kColBlock, D - d0);
      double acc[kColBlock] = {};
      sum_rows(y, pos + m * K, weights + m * K, K, D, d0, n, acc);
      for (int64_t j = 0; j < n; ++j) out[m * D + d0 + j] = static_cast<T>(acc[j]);
    }
  }
}

template <class T>
void moe_combine_bwd(const T* dout, const T* y, const int32_t* pos, const T* weights, T* dy,
                     T* dweights, int64_t M, int64_t K, int64_t D) {
#pragma omp parallel for schedule(static) if (M * K * D > kParallelMin)
  for (int64_t m = 0; m < M; ++m) {
    const T* g = dout + m * D;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t p = pos[m * K + k];
      const T w = weights[m * K + k];
      const T* yr = y + p * D;
      T* dr = dy + p * D;
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) {
        dr[d] = w * g[d];
        dot += double(g[d]) * yr[d];
      }
      dweights[m * K + k] = static_cast<T>(dot);
    }
  }
}

template <class T>
void moe_dispatch_bwd(const T* dxp, const int32_t* pos, T* dx, int64_t M, int64_t K, int64_t D) {
#pragma omp parallel for schedule(static) if (M * K * D > kParallelMin)
  for (int64_t m = 0; m < M; ++m) {
    T* o = dx + m * D;
    for (int64_t d0 = 0; d0 < D; d0 += kColBlock) {
      const int64_t n = std::min(kColBlock, D - d0);
      double acc[kColBlock];
      for (int64_t j = 0; j < n; ++j) acc[j] = o[d0 + j];
      sum_rows<T>(dxp, pos + m * K, nullptr, K, D, d0, n, acc);
      for (int64_t j = 0; j < n; ++j) o[d0 + j] = static_cast<T>(acc[j]);
    }
  }
}

#define PIPER_INSTANTIATE(T)                                                                        \
  template void moe_route_fwd<T>(const T*, T*, int32_t*, T*, int64_t, int64_t, int64_t);           \
  template void moe_route_bwd<T>(const T*, const T*, const T*, const int32_t*, const T*, T*,       \
                                 int64_t, int64_t, int64_t);                                        \
  template double moe_balance<T>(const T*, const int32_t*, T*, int64_t, int64_t, int64_t, int64_t, \
                                 T);                                                                \
  template void gather_rows<T>(const T*, const int32_t*, T*, int64_t, int64_t);                    \
  template void moe_combine<T>(const T*, const int32_t*, const T*, T*, int64_t, int64_t, int64_t); \
  template void moe_combine_bwd<T>(const T*, const T*, const int32_t*, const T*, T*, T*, int64_t,  \
                                   int64_t, int64_t);                                               \
  template void moe_dispatch_bwd<T>(const T*, const int32_t*, T*, int64_t, int64_t, int64_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(double)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels
