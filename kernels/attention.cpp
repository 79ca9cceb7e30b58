// attention.cpp — causal grouped-query softmax attention, forward and backward (CPU).
//
// q[B,Tn,H,hd], k[B,Tn,KV,hd], v[B,Tn,KV,hd] -> out[B,Tn,H,hd], lse[B,H,Tn]
// Query head h reads kv head h / (H/KV). For one (b, h), with Q, K, V the [Tn, hd] strided
// slices:  S = Q K^T / sqrt(hd) (causal: key j <= query i), P = softmax_rows(S),
//          out = P V,  lse[i] = log sum_j exp(S[i, j]).
// Work is split into blocks of kBQ query rows; a block of rows [r0, r1) only needs keys
// [0, r1), so only the lower triangle (plus the diagonal blocks) is computed. The matrix
// products go through gemm<T> with leading dimensions that address q/k/v/out in place.
#include "attention.hpp"
#include "vmath.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "gemm.hpp"

namespace piper::kernels {

namespace {

constexpr int64_t kBQ = 32;  // query rows per block
// Below this many multiply-adds (B*H*Tn*Tn*hd) a call runs on one thread: the team start-up
// costs more than the work. Results do not depend on the thread count either way.
constexpr int64_t kParallelWork = int64_t(1) << 16;


// max_j s[j] for j < n. GCC vectorises neither a max loop nor `omp simd reduction(max)`
// without -ffast-math, so the lanes are spelled out with a vector extension.
template <class T>
T row_max(const T* s, int64_t n) {
  constexpr int64_t L = 64 / sizeof(T);
  typedef T V __attribute__((vector_size(64)));
  T mx = -std::numeric_limits<T>::infinity();
  int64_t j = 0;
  if (n >= L) {
    V m;
    std::memcpy(&m, s, sizeof(V));
    for (j = L; j + L <= n; j += L) {
      V x;
      std::memcpy(&x, s + j, sizeof(V));
      m = x > m ? x : m;
    }
    for (int64_t l = 0; l < L; ++l) mx = m[l] > mx ? m[l] : mx;
  }
  for (; j < n; ++j) mx = s[j] > mx ? s[j] : mx;
  return mx;
}

// Softmax of one block of score rows, in place over S[nr, nc] (row stride ldS): row i is
// global query row r0+i, whose valid keys are 0..r0+i of the nc = r0+nr columns. Valid
// entries become exp(S - rowmax) (not yet normalised), masked ones 0; inv_out[i] gets
// 1/rowsum (the caller scales P V instead of P) and lse[i] = rowmax + log(rowsum).
template <class T>
void softmax_block(T* S, int64_t ldS, int64_t nr, int64_t nc, int64_t r0, T* lse, T* inv_out) {
  for (int64_t i = 0; i < nr; ++i) {
    T* s = S + i * ldS;
    const int64_t nv = r0 + i + 1;  // valid keys
    const T mx = row_max(s, nv);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < nv; ++j) {
      const T e = vmath::exp(s[j] - mx);
      s[j] = e;
      sum += e;
    }
    inv_out[i] = T(1) / sum;
    for (int64_t j = nv; j < nc; ++j) s[j] = T(0);
    lse[i] = mx + std::log(sum);
  }
}

void check_shapes(int64_t H, int64_t KV) {
  if (KV <= 0 || H % KV != 0) throw std::invalid_argument("attention: H % KV != 0");
}

}  // namespace

template <class T>
void attention_fwd(const T* q, const T* k, const T* v, T* out, T* lse, int64_t B, int64_t Tn,
                   int64_t H, int64_t KV, int64_t hd) {
  check_shapes(H, KV);
  const int64_t grp = H / KV;
  const int64_t ldq = H * hd, ldk = KV * hd;  // row strides of the [Tn, hd] head slices
  const T scale = static_cast<T>(1.0 / std::sqrt(double(hd)));
  const int64_t bq = std::min(kBQ, Tn);
  const bool par = B * H * Tn * Tn * hd >= kParallelWork;
#pragma omp parallel if (par)
  {
    std::vector<T> S(bq * Tn), inv(bq);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H, kvh = h / grp;
      const T* Q = q + b * Tn * ldq + h * hd;
      const T* K = k + b * Tn * ldk + kvh * hd;
      const T* V = v + b * Tn * ldk + kvh * hd;
      T* O = out + b * Tn * ldq + h * hd;
      T* L = lse + bh * Tn;  // lse[b, h, :]
      for (int64_t r0 = 0; r0 < Tn; r0 += bq) {
        const int64_t nr = std::min(bq, Tn - r0), nc = r0 + nr;
        // S[nr, nc] = scale * Q[r0:r0+nr] K[0:nc]^T
        gemm<T>(false, true, nr, nc, hd, scale, Q + r0 * ldq, ldq, K, ldk, T(0), S.data(), nc);
        softmax_block<T>(S.data(), nc, nr, nc, r0, L + r0, inv.data());
        // O[r0:r0+nr] = P V[0:nc]
        gemm<T>(false, false, nr, hd, nc, T(1), S.data(), nc, V, ldk, T(0), O + r0 * ldq, ldq);
        for (int64_t i = 0; i < nr; ++i) {
          T* o = O + (r0 + i) * ldq;
          const T c = inv[i];
#pragma omp simd
          for (int64_t d = 0; d < hd; ++d) o[d] *= c;
        }
      }
    }
  }
}

template <class T>
void attention_bwd(const T* dout, const T* q, const T* k, const T* v, const T* out, const T* lse,
                   T* dq, T* dk, T* dv, int64_t B, int64_t Tn, int64_t H, int64_t KV, int64_t hd) {
  check_shapes(H, KV);
  const int64_t grp = H / KV;
  const int64_t ldq = H * hd, ldk = KV * hd;
  const T scale = static_cast<T>(1.0 / std::sqrt(double(hd)));
  const int64_t bq = std::min(kBQ, Tn);
  const bool par = B * H * Tn * Tn * hd >= kParallelWork;
  // D[b,h,t] = rowsum(dO * O) = sum_j P dP: one streaming pass over the contiguous rows
  // (reading O and dO head-strided inside the main loop costs far more in cache misses).
  std::vector<T> Dbuf(B * H * Tn);
  T* D = Dbuf.data();
#pragma omp parallel for schedule(static) if (par)
  for (int64_t row = 0; row < B * Tn * H; ++row) {  // row = (b*Tn + t)*H + h
    const T* o = out + row * hd;
    const T* g = dout + row * hd;
    T acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int64_t d = 0; d < hd; ++d) acc += g[d] * o[d];
    const int64_t h = row % H, bt = row / H;
    D[((bt / Tn) * H + h) * Tn + bt % Tn] = acc;
  }
  // One task per (b, kv head): it owns dk/dv of that kv head and dq of its grp query heads,
  // and sums the query heads (ascending) and row blocks (ascending) in a fixed order.
#pragma omp parallel if (par)
  {
    std::vector<T> P(bq * Tn), dS(bq * Tn);
#pragma omp for schedule(static)
    for (int64_t bk = 0; bk < B * KV; ++bk) {
      const int64_t b = bk / KV, kvh = bk % KV;
      const T* K = k + b * Tn * ldk + kvh * hd;
      const T* V = v + b * Tn * ldk + kvh * hd;
      T* dK = dk + b * Tn * ldk + kvh * hd;
      T* dV = dv + b * Tn * ldk + kvh * hd;
      for (int64_t t = 0; t < Tn; ++t)
        for (int64_t d = 0; d < hd; ++d) dK[t * ldk + d] = dV[t * ldk + d] = T(0);
      for (int64_t h = kvh * grp; h < (kvh + 1) * grp; ++h) {
        const int64_t off = b * Tn * ldq + h * hd;
        const T* Q = q + off;
        const T* dO = dout + off;
        T* dQ = dq + off;
        const T* L = lse + (b * H + h) * Tn;
        const T* Dr = D + (b * H + h) * Tn;
        for (int64_t r0 = 0; r0 < Tn; r0 += bq) {
          const int64_t nr = std::min(bq, Tn - r0), nc = r0 + nr;
          // P = exp(scale * Q K^T - lse), causal-masked
          gemm<T>(false, true, nr, nc, hd, scale, Q + r0 * ldq, ldq, K, ldk, T(0), P.data(), nc);
          for (int64_t i = 0; i < nr; ++i) {
            T* p = P.data() + i * nc;
            const T li = L[r0 + i];
            const int64_t nv = r0 + i + 1;
#pragma omp simd
            for (int64_t j = 0; j < nv; ++j) p[j] = vmath::exp(p[j] - li);
            for (int64_t j = nv; j < nc; ++j) p[j] = T(0);
          }
          // dP = dO V^T  (into dS)
          gemm<T>(false, true, nr, nc, hd, T(1), dO + r0 * ldq, ldq, V, ldk, T(0), dS.data(), nc);
          // dS = P * (dP - Dr)   (masked entries have P = 0)
          for (int64_t i = 0; i < nr; ++i) {
            const T* p = P.data() + i * nc;
            T* ds = dS.data() + i * nc;
            const T di = Dr[r0 + i];
#pragma omp simd
            for (int64_t j = 0; j < nc; ++j) ds[j] = p[j] * (ds[j] - di);
          }
          // dV[0:nc] += P^T dO[r0:r0+nr]
          gemm<T>(true, false, nc, hd, nr, T(1), P.data(), nc, dO + r0 * ldq, ldq, T(1), dV, ldk);
          // dQ[r0:r0+nr] = scale * dS K[0:nc]
          gemm<T>(false, false, nr, hd, nc, scale, dS.data(), nc, K, ldk, T(0), dQ + r0 * ldq, ldq);
          // dK[0:nc] += scale * dS^T Q[r0:r0+nr]
          gemm<T>(true, false, nc, hd, nr, scale, dS.data(), nc, Q + r0 * ldq, ldq, T(1), dK, ldk);
        }
      }
    }
  }
}

template void attention_fwd<float>(const float*, const float*, const float*, float*, float*,
                                   int64_t, int64_t, int64_t, int64_t, int64_t);
template void attention_fwd<double>(const double*, const double*, const double*, double*, double*,
                                    int64_t, int64_t, int64_t, int64_t, int64_t);
template void attention_bwd<float>(const float*, const float*, const float*, const float*,
                                   const float*, const float*, float*, float*, float*, int64_t,
                                   int64_t, int64_t, int64_t, int64_t);
template void attention_bwd<double>(const double*, const double*, const double*, const double*,
                                    const double*, const double*, double*, double*, double*,
                                    int64_t, int64_t, int64_t, int64_t, int64_t);

}  // namespace piper::kernels
