// attention.cu — causal grouped-query softmax attention on CUDA, forward and backward, in the
// manner of FlashAttention-2: tiles of queries and keys in shared memory, an online softmax, no
// [Tn, Tn] matrix in memory.
//
// A block is 256 threads seen as a 16 x 16 grid (ty, tx) = (tid / 16, tid % 16). A score tile
// S[BQ, BK] is held in registers, thread (ty, tx) owning rows ty + 16a and columns tx + 16c; an
// output tile [R, hd] likewise rows ty + 16a and dims tx + 16e. The 16 threads of a row are the
// half of one warp, so row maxima and sums are half-warp shuffles. Tiles sit in shared memory in
// f32 with rows of hd + 1 floats (no bank conflicts down a column).
//
// Forward, one block per (query tile, head, batch): Q stays; key tiles 0 .. the diagonal stream
// through; m (running max, log2 units), l (running sum) and O are rescaled as the max grows.
// Backward, recomputing P = exp(S - lse) from the saved lse:
//   1. D[b,h,t] = rowsum(dout * out), one warp per row;
//   2. dk, dv: one block per (key tile, kv head, batch), its K and V staying; it walks the query
//      heads of its group in ascending order and, for each, the query tiles from the diagonal on;
//      dV += P^T dO, dK += dS^T Q with dS = P (dP - D), dP = dO V^T;
//   3. dq: one block per (query tile, head, batch) over key tiles 0 .. the diagonal: dQ += dS K.
// Every sum runs in a fixed order: the results do not change from run to run.
#include "attention_cuda.hpp"
#include "cuda_common.cuh"
#include "tensor_core.cuh"

#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace piper::kernels::cuda {
namespace {

constexpr int kGrid = 16;                      // the thread grid is kGrid x kGrid
constexpr int kAttnThreads = kGrid * kGrid;    // 256
constexpr float kLog2e = 1.4426950408889634f;  // scores are kept in log2 units: exp(x) = exp2(x log2 e)
constexpr float kLn2 = 0.6931471805599453f;
// Tile heights: the forward and dq hold 64 query rows and stream 32 keys; dk/dv hold 64 keys and
// stream 32 query rows.
constexpr int kRowsHeld = 64;
constexpr int kRowsStreamed = 32;

// The element of a tile in shared memory: f32 for the SIMT products, bf16 for the tensor cores'.
template <class S, class T>
__device__ __forceinline__ S tile_value(T x) {
  if constexpr (std::is_same_v<S, T>)
    return x;
  else
    return from_f32<S>(to_f32(x));
}

// dst[R][LD] = rows r0 .. r0+R-1 of one head's [Tn, HD] slice (row t at base + t * stride), zero
// for rows t >= Tn.
template <class T, int HD, int LD, class S>
__device__ void load_rows(const T* base, int64_t stride, int r0, int R, int Tn, S* dst) {
  for (int i = threadIdx.x; i < R * HD; i += blockDim.x) {
    const int r = i / HD, d = i % HD, t = r0 + r;
    dst[r * LD + d] = tile_value<S>(t < Tn ? base[int64_t(t) * stride + d] : T(from_f32<T>(0.0f)));
  }
}

// acc[a][c] = sum over d of A[ty + 16a][d] * B[tx + 16c][d]   (A, B rows of HD + 1 floats)
template <int RA, int RC, int HD>
__device__ __forceinline__ void dot_rows(const float* A, const float* B, int ty, int tx,
                                         float (&acc)[RA][RC]) {
  constexpr int LD = HD + 1;
#pragma unroll
  for (int a = 0; a < RA; ++a)
#pragma unroll
    for (int c = 0; c < RC; ++c) acc[a][c] = 0.0f;
#pragma unroll 4
  for (int d = 0; d < HD; ++d) {
    float av[RA], bv[RC];
#pragma unroll
    for (int a = 0; a < RA; ++a) av[a] = A[(ty + kGrid * a) * LD + d];
#pragma unroll
    for (int c = 0; c < RC; ++c) bv[c] = B[(tx + kGrid * c) * LD + d];
#pragma unroll
    for (int a = 0; a < RA; ++a)
#pragma unroll
      for (int c = 0; c < RC; ++c) acc[a][c] = fmaf(av[a], bv[c], acc[a][c]);
  }
}

// acc[a][e] += sum over k < K of A(ty + 16a, k) * B[k][tx + 16e], where A(r, k) = A[r * ar + k * ak]
// (a row or, transposed, a column of a score tile) and B has rows of HD + 1 floats.
template <int RA, int HD, int K>
__device__ __forceinline__ void acc_rows(const float* A, int ar, int ak, const float* B, int ty,
                                         int tx, float (&acc)[RA][HD / kGrid]) {
  constexpr int LD = HD + 1, RE = HD / kGrid;
#pragma unroll 4
  for (int k = 0; k < K; ++k) {
    float av[RA], bv[RE];
#pragma unroll
    for (int a = 0; a < RA; ++a) av[a] = A[(ty + kGrid * a) * ar + k * ak];
#pragma unroll
    for (int e = 0; e < RE; ++e) bv[e] = B[k * LD + tx + kGrid * e];
#pragma unroll
    for (int a = 0; a < RA; ++a)
#pragma unroll
      for (int e = 0; e < RE; ++e) acc[a][e] = fmaf(av[a], bv[e], acc[a][e]);
  }
}

// r[a][c] = St[(ty + 16a) * LDS + tx + 16c] (or +=): a product the tensor cores stored, read into
// the SIMT layout.
template <bool kAdd, int LDS, int RA, int RC>
__device__ __forceinline__ void from_staged(const float* St, int ty, int tx, float (&r)[RA][RC]) {
#pragma unroll
  for (int a = 0; a < RA; ++a)
#pragma unroll
    for (int c = 0; c < RC; ++c) {
      const float v = St[(ty + kGrid * a) * LDS + tx + kGrid * c];
      r[a][c] = kAdd ? r[a][c] + v : v;
    }
}

// Max and sum over the 16 threads of a row (a half warp; every lane gets the same value).
__device__ __forceinline__ float row_group_max(float v) {
  for (int o = kGrid / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float row_group_sum(float v) {
  for (int o = kGrid / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// y[R][HD] rows r0 + ty + 16a (< Tn) of a head slice (row t at base + t * stride) = acc * scale
template <class T, int RA, int HD>
__device__ void store_rows(const float (&acc)[RA][HD / kGrid], float scale, T* base,
                           int64_t stride, int r0, int Tn, int ty, int tx) {
#pragma unroll
  for (int a = 0; a < RA; ++a) {
    const int t = r0 + ty + kGrid * a;
    if (t >= Tn) continue;
#pragma unroll
    for (int e = 0; e < HD / kGrid; ++e)
      base[int64_t(t) * stride + tx + kGrid * e] = from_f32<T>(acc[a][e] * scale);
  }
}

// Where the blocks of one (batch, head) find their rows: the [Tn, HD] slices of q-like tensors
// ([B,Tn,H,HD]) and k-like ones ([B,Tn,KV,HD]), and the [Tn] rows of lse-like ones ([B,H,Tn]).
struct Heads {
  int Tn, H, KV;
  __device__ int64_t q_off(int b, int h, int HD) const { return (int64_t(b) * Tn * H + h) * HD; }
  __device__ int64_t k_off(int b, int kvh, int HD) const { return (int64_t(b) * Tn * KV + kvh) * HD; }
  __device__ int64_t row_off(int b, int h) const { return (int64_t(b) * H + h) * Tn; }
  __device__ int group() const { return H / KV; }
};

// ---- the forward's softmax and the backward's score gradients, shared by both kinds of kernel

// One key tile (keys k0 ..) of the online softmax for the thread's rows ty + 16a (query rows q0 +
// ...): the scores s are masked (keys past the row) and scaled to log2 units; P = exp2(s - m) goes
// to Ps[i * LDP + j]; the running max m and sum l grow and the output o is rescaled to them.
template <int RA, int RC, int RE, int LDP, class S>
__device__ __forceinline__ void softmax_tile(float (&s)[RA][RC], float (&m)[RA], float (&l)[RA],
                                             float (&o)[RA][RE], S* Ps, int q0, int k0, float scale_log2,
                                             int ty, int tx) {
#pragma unroll
  for (int a = 0; a < RA; ++a) {
    const int i = ty + kGrid * a;
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < RC; ++c) {
      s[a][c] = k0 + tx + kGrid * c <= q0 + i ? s[a][c] * scale_log2 : -INFINITY;
      mx = fmaxf(mx, s[a][c]);
    }
    const float mn = fmaxf(m[a], row_group_max(mx));
    const float base = mn == -INFINITY ? 0.0f : mn;  // a row with no key yet stays at 0
    const float alpha = exp2f(m[a] - base);
    float rs = 0.0f;
#pragma unroll
    for (int c = 0; c < RC; ++c) {
      const float p = exp2f(s[a][c] - base);
      Ps[i * LDP + tx + kGrid * c] = tile_value<S>(p);
      rs += p;
    }
    l[a] = l[a] * alpha + row_group_sum(rs);
    m[a] = mn;
#pragma unroll
    for (int e = 0; e < RE; ++e) o[a][e] *= alpha;
  }
}

// The forward's rows q0 + ty + 16a (< Tn): out = o / l, lse = ln(sum of exp(score)).
template <class T, int RA, int RE>
__device__ __forceinline__ void finish_rows(const float (&o)[RA][RE], const float (&m)[RA], const float (&l)[RA],
                                            T* O, int64_t ldq, float* lse_row, int q0, int Tn, int ty, int tx) {
#pragma unroll
  for (int a = 0; a < RA; ++a) {
    const int t = q0 + ty + kGrid * a;
    if (t >= Tn) continue;
    const float inv = 1.0f / l[a];
#pragma unroll
    for (int e = 0; e < RE; ++e) O[int64_t(t) * ldq + tx + kGrid * e] = from_f32<T>(o[a][e] * inv);
    if (tx == 0) lse_row[t] = (m[a] + log2f(l[a])) * kLn2;
  }
}

// Of a score tile, rows ty + 16a (query rows q0 + i) and columns tx + 16c (keys k0 + j), with the
// rows' lse (log2 units) in Ls and their D in Ds: P = exp2(s scale_log2 - L), 0 for keys past the
// row and rows past Tn, into Ps[i * LDP + j] unless Ps is null; dS = P (dP - D) into dSs.
template <int RQ, int RC, int LDP, class S>
__device__ __forceinline__ void score_grads(const float (&s)[RQ][RC], const float (&dp)[RQ][RC], const float* Ls,
                                            const float* Ds, S* Ps, S* dSs, int q0, int k0, int Tn,
                                            float scale_log2, int ty, int tx) {
#pragma unroll
  for (int a = 0; a < RQ; ++a) {
    const int i = ty + kGrid * a, row = q0 + i;
#pragma unroll
    for (int c = 0; c < RC; ++c) {
      const int j = tx + kGrid * c;
      const float p = k0 + j <= row && row < Tn ? exp2f(s[a][c] * scale_log2 - Ls[i]) : 0.0f;
      if (Ps) Ps[i * LDP + j] = tile_value<S>(p);
      dSs[i * LDP + j] = tile_value<S>(p * (dp[a][c] - Ds[i]));
    }
  }
}

// The rows' lse (in log2 units) and D of query rows q0 .. q0 + R - 1, 0 past Tn.
__device__ __forceinline__ void load_row_terms(const float* lse_row, const float* D_row, int q0, int R, int Tn,
                                               float* Ls, float* Ds) {
  for (int i = threadIdx.x; i < R; i += blockDim.x) {
    const bool in = q0 + i < Tn;
    Ls[i] = in ? lse_row[q0 + i] * kLog2e : 0.0f;
    Ds[i] = in ? D_row[q0 + i] : 0.0f;
  }
}

// ---- f32 storage: products in f32 on the SIMT cores, tiles of f32 with rows of HD + 1 floats

template <int HD>
constexpr size_t fwd_smem_bytes() {
  return sizeof(float) * (size_t(kRowsHeld) * (HD + 1) + 2 * size_t(kRowsStreamed) * (HD + 1) +
                          size_t(kRowsHeld) * (kRowsStreamed + 1));
}

template <class T, int HD>
__global__ void __launch_bounds__(kAttnThreads)
    attention_fwd_kernel(const T* q, const T* k, const T* v, T* out, float* lse, Heads g,
                         float scale_log2) {
  constexpr int BQ = kRowsHeld, BK = kRowsStreamed, LD = HD + 1, LDP = BK + 1;
  constexpr int RA = BQ / kGrid, RC = BK / kGrid, RE = HD / kGrid;
  extern __shared__ float smem[];
  float* Qs = smem;           // [BQ][LD]
  float* Ks = Qs + BQ * LD;   // [BK][LD]
  float* Vs = Ks + BK * LD;   // [BK][LD]
  float* Ps = Vs + BK * LD;   // [BQ][LDP]
  const int ty = threadIdx.x / kGrid, tx = threadIdx.x % kGrid;
  const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * BQ;  // the longest rows first
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / g.group();
  const int64_t ldq = int64_t(g.H) * HD, ldk = int64_t(g.KV) * HD;
  const T* K = k + g.k_off(b, kvh, HD);
  const T* V = v + g.k_off(b, kvh, HD);
  load_rows<T, HD, LD>(q + g.q_off(b, h, HD), ldq, q0, BQ, g.Tn, Qs);

  float o[RA][RE], m[RA], l[RA];
#pragma unroll
  for (int a = 0; a < RA; ++a) {
    m[a] = -INFINITY;
    l[a] = 0.0f;
#pragma unroll
    for (int e = 0; e < RE; ++e) o[a][e] = 0.0f;
  }
  const int kend = min(q0 + BQ, g.Tn);  // keys [0, kend) reach some row of the tile
  for (int k0 = 0; k0 < kend; k0 += BK) {
    __syncthreads();  // the previous tile's Ks, Vs and Ps are read
    load_rows<T, HD, LD>(K, ldk, k0, BK, g.Tn, Ks);
    load_rows<T, HD, LD>(V, ldk, k0, BK, g.Tn, Vs);
    __syncthreads();
    float s[RA][RC];
    dot_rows<RA, RC, HD>(Qs, Ks, ty, tx, s);
    softmax_tile<RA, RC, RE, LDP>(s, m, l, o, Ps, q0, k0, scale_log2, ty, tx);
    __syncthreads();  // Ps is written
    acc_rows<RA, HD, BK>(Ps, LDP, 1, Vs, ty, tx, o);
  }
  finish_rows<T>(o, m, l, out + g.q_off(b, h, HD), ldq, lse + g.row_off(b, h), q0, g.Tn, ty, tx);
}

// D[b,h,t] = sum over d of dout[b,t,h,d] * out[b,t,h,d]: one warp per (b, t, h) row.
template <class T>
__global__ void attention_delta_kernel(const T* dout, const T* out, float* D, int64_t rows,
                                       int Tn, int H, int hd) {
  const int warps = blockDim.x / kWarp, lane = threadIdx.x % kWarp;
  for (int64_t row = blockIdx.x * int64_t(warps) + threadIdx.x / kWarp; row < rows;
       row += int64_t(gridDim.x) * warps) {  // the same row for a whole warp
    float acc = 0.0f;
    for (int d = lane; d < hd; d += kWarp)
      acc += to_f32(dout[row * hd + d]) * to_f32(out[row * hd + d]);
    acc = warp_sum(acc);
    const int64_t h = row % H, bt = row / H;  // row = (b * Tn + t) * H + h
    if (lane == 0) D[((bt / Tn) * H + h) * Tn + bt % Tn] = acc;
  }
}

template <int HD>
constexpr size_t dkdv_smem_bytes() {
  return sizeof(float) * (2 * size_t(kRowsHeld) * (HD + 1) + 2 * size_t(kRowsStreamed) * (HD + 1) +
                          2 * size_t(kRowsStreamed) * (kRowsHeld + 1) + 2 * size_t(kRowsStreamed));
}

template <class T, int HD>
__global__ void __launch_bounds__(kAttnThreads)
    attention_dkdv_kernel(const T* dout, const T* q, const T* k, const T* v, const float* lse,
                          const float* D, T* dk, T* dv, Heads g, float scale_log2, float scale) {
  constexpr int BK = kRowsHeld, BQ = kRowsStreamed, LD = HD + 1, LDP = BK + 1;
  constexpr int RQ = BQ / kGrid, RC = BK / kGrid, RJ = BK / kGrid, RE = HD / kGrid;
  extern __shared__ float smem[];
  float* Ks = smem;            // [BK][LD]
  float* Vs = Ks + BK * LD;    // [BK][LD]
  float* Qs = Vs + BK * LD;    // [BQ][LD]
  float* dOs = Qs + BQ * LD;   // [BQ][LD]
  float* Ps = dOs + BQ * LD;   // [BQ][LDP]
  float* dSs = Ps + BQ * LDP;  // [BQ][LDP]
  float* Ls = dSs + BQ * LDP;  // [BQ] lse in log2 units
  float* Ds = Ls + BQ;         // [BQ]
  const int ty = threadIdx.x / kGrid, tx = threadIdx.x % kGrid;
  const int k0 = blockIdx.x * BK, kvh = blockIdx.y, b = blockIdx.z;
  const int64_t ldq = int64_t(g.H) * HD, ldk = int64_t(g.KV) * HD;
  load_rows<T, HD, LD>(k + g.k_off(b, kvh, HD), ldk, k0, BK, g.Tn, Ks);
  load_rows<T, HD, LD>(v + g.k_off(b, kvh, HD), ldk, k0, BK, g.Tn, Vs);

  float dK[RJ][RE], dV[RJ][RE];
#pragma unroll
  for (int a = 0; a < RJ; ++a)
#pragma unroll
    for (int e = 0; e < RE; ++e) dK[a][e] = dV[a][e] = 0.0f;
  for (int h = kvh * g.group(); h < (kvh + 1) * g.group(); ++h) {
    const T* Q = q + g.q_off(b, h, HD);
    const T* dO = dout + g.q_off(b, h, HD);
    for (int q0 = k0 / BQ * BQ; q0 < g.Tn; q0 += BQ) {  // rows below k0 see none of these keys
      __syncthreads();  // the previous tile's Qs, dOs, Ps, dSs, Ls, Ds are read
      load_rows<T, HD, LD>(Q, ldq, q0, BQ, g.Tn, Qs);
      load_rows<T, HD, LD>(dO, ldq, q0, BQ, g.Tn, dOs);
      load_row_terms(lse + g.row_off(b, h), D + g.row_off(b, h), q0, BQ, g.Tn, Ls, Ds);
      __syncthreads();
      float s[RQ][RC], dp[RQ][RC];
      dot_rows<RQ, RC, HD>(Qs, Ks, ty, tx, s);
      dot_rows<RQ, RC, HD>(dOs, Vs, ty, tx, dp);
      score_grads<RQ, RC, LDP>(s, dp, Ls, Ds, Ps, dSs, q0, k0, g.Tn, scale_log2, ty, tx);
      __syncthreads();
      acc_rows<RJ, HD, BQ>(Ps, 1, LDP, dOs, ty, tx, dV);   // dV[j] += sum_i P[i][j] dO[i]
      acc_rows<RJ, HD, BQ>(dSs, 1, LDP, Qs, ty, tx, dK);   // dK[j] += sum_i dS[i][j] Q[i]
    }
  }
  store_rows<T, RJ, HD>(dK, scale, dk + g.k_off(b, kvh, HD), ldk, k0, g.Tn, ty, tx);
  store_rows<T, RJ, HD>(dV, 1.0f, dv + g.k_off(b, kvh, HD), ldk, k0, g.Tn, ty, tx);
}

template <int HD>
constexpr size_t dq_smem_bytes() {
  return sizeof(float) * (2 * size_t(kRowsHeld) * (HD + 1) + 2 * size_t(kRowsStreamed) * (HD + 1) +
                          size_t(kRowsHeld) * (kRowsStreamed + 1) + 2 * size_t(kRowsHeld));
}

template <class T, int HD>
__global__ void __launch_bounds__(kAttnThreads)
    attention_dq_kernel(const T* dout, const T* q, const T* k, const T* v, const float* lse,
                        const float* D, T* dq, Heads g, float scale_log2, float scale) {
  constexpr int BQ = kRowsHeld, BK = kRowsStreamed, LD = HD + 1, LDP = BK + 1;
  constexpr int RA = BQ / kGrid, RC = BK / kGrid, RE = HD / kGrid;
  extern __shared__ float smem[];
  float* Qs = smem;            // [BQ][LD]
  float* dOs = Qs + BQ * LD;   // [BQ][LD]
  float* Ks = dOs + BQ * LD;   // [BK][LD]
  float* Vs = Ks + BK * LD;    // [BK][LD]
  float* dSs = Vs + BK * LD;   // [BQ][LDP]
  float* Ls = dSs + BQ * LDP;  // [BQ] lse in log2 units
  float* Ds = Ls + BQ;         // [BQ]
  const int ty = threadIdx.x / kGrid, tx = threadIdx.x % kGrid;
  const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * BQ;  // the longest rows first
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / g.group();
  const int64_t ldq = int64_t(g.H) * HD, ldk = int64_t(g.KV) * HD;
  const T* K = k + g.k_off(b, kvh, HD);
  const T* V = v + g.k_off(b, kvh, HD);
  load_rows<T, HD, LD>(q + g.q_off(b, h, HD), ldq, q0, BQ, g.Tn, Qs);
  load_rows<T, HD, LD>(dout + g.q_off(b, h, HD), ldq, q0, BQ, g.Tn, dOs);
  load_row_terms(lse + g.row_off(b, h), D + g.row_off(b, h), q0, BQ, g.Tn, Ls, Ds);

  float dQ[RA][RE];
#pragma unroll
  for (int a = 0; a < RA; ++a)
#pragma unroll
    for (int e = 0; e < RE; ++e) dQ[a][e] = 0.0f;
  const int kend = min(q0 + BQ, g.Tn);
  for (int k0 = 0; k0 < kend; k0 += BK) {
    __syncthreads();  // the previous tile's Ks, Vs, dSs are read (and Qs, dOs, Ls, Ds written)
    load_rows<T, HD, LD>(K, ldk, k0, BK, g.Tn, Ks);
    load_rows<T, HD, LD>(V, ldk, k0, BK, g.Tn, Vs);
    __syncthreads();
    float s[RA][RC], dp[RA][RC];
    dot_rows<RA, RC, HD>(Qs, Ks, ty, tx, s);
    dot_rows<RA, RC, HD>(dOs, Vs, ty, tx, dp);
    score_grads<RA, RC, LDP, float>(s, dp, Ls, Ds, nullptr, dSs, q0, k0, g.Tn, scale_log2, ty, tx);
    __syncthreads();
    acc_rows<RA, HD, BK>(dSs, LDP, 1, Ks, ty, tx, dQ);  // dQ[i] += sum_j dS[i][j] K[j]
  }
  store_rows<T, RA, HD>(dQ, scale, dq + g.q_off(b, h, HD), ldq, q0, g.Tn, ty, tx);
}

// ---- bf16 storage: products on the tensor cores (tensor_core.cuh), the same tiles and the same
// order of blocks and sums. Operand tiles are bf16 with rows of HD + 8 (16-byte multiples, as wmma
// wants them), score tiles bf16 with rows of their width + 8 (P and dS rounded to bf16 before their
// products, as FlashAttention-2 rounds P), and each product the SIMT code reads back is stored to
// an f32 tile; the softmax, the row statistics and the outputs' running sums stay f32.

// A bf16 kernel's dynamic shared memory, carved in order; every region a multiple of 32 bytes.
struct Carve {
  unsigned char* at;
  template <class E>
  __device__ E* take(size_t n) {
    E* p = reinterpret_cast<E*>(at);
    at += (n * sizeof(E) + 31) / 32 * 32;
    return p;
  }
};
constexpr size_t carved(size_t n, size_t elem) { return (n * elem + 31) / 32 * 32; }

template <int HD>
struct TcTiles {
  static constexpr int LD = HD + 8;  // bf16 operand rows
  static constexpr size_t rows(int r) { return carved(size_t(r) * LD, sizeof(bf16)); }
  static constexpr size_t scores(int r, int c) { return carved(size_t(r) * (c + 8), sizeof(bf16)); }
  static constexpr size_t staged(int r, int c) { return carved(size_t(r) * (c + 4), sizeof(float)); }
  static constexpr size_t terms(int r) { return carved(size_t(r), sizeof(float)); }
};

template <int HD>
constexpr size_t fwd_tc_smem_bytes() {
  using L = TcTiles<HD>;
  return L::rows(kRowsHeld) + 2 * L::rows(kRowsStreamed) + L::scores(kRowsHeld, kRowsStreamed) +
         L::staged(kRowsHeld, HD > kRowsStreamed ? HD : kRowsStreamed);
}

template <int HD>
__global__ void __launch_bounds__(kAttnThreads)
    attention_fwd_tc_kernel(const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse, Heads g,
                            float scale_log2) {
  constexpr int BQ = kRowsHeld, BK = kRowsStreamed, LD = TcTiles<HD>::LD, LDP = BK + 8;
  constexpr int LDS = (HD > BK ? HD : BK) + 4;  // S [BQ][BK], then P V [BQ][HD]
  constexpr int RA = BQ / kGrid, RC = BK / kGrid, RE = HD / kGrid;
  extern __shared__ __align__(32) float smem[];
  Carve carve{reinterpret_cast<unsigned char*>(smem)};
  bf16* Qs = carve.take<bf16>(BQ * LD);   // [BQ][LD]
  bf16* Ks = carve.take<bf16>(BK * LD);   // [BK][LD]
  bf16* Vs = carve.take<bf16>(BK * LD);   // [BK][LD]
  bf16* Ps = carve.take<bf16>(BQ * LDP);  // [BQ][LDP]
  float* St = carve.take<float>(BQ * LDS);  // [BQ][LDS]
  const int ty = threadIdx.x / kGrid, tx = threadIdx.x % kGrid;
  const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * BQ;  // the longest rows first
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / g.group();
  const int64_t ldq = int64_t(g.H) * HD, ldk = int64_t(g.KV) * HD;
  const bf16* K = k + g.k_off(b, kvh, HD);
  const bf16* V = v + g.k_off(b, kvh, HD);
  load_rows<bf16, HD, LD>(q + g.q_off(b, h, HD), ldq, q0, BQ, g.Tn, Qs);

  float o[RA][RE], m[RA], l[RA];
#pragma unroll
  for (int a = 0; a < RA; ++a) {
    m[a] = -INFINITY;
    l[a] = 0.0f;
#pragma unroll
    for (int e = 0; e < RE; ++e) o[a][e] = 0.0f;
  }
  const int kend = min(q0 + BQ, g.Tn);
  for (int k0 = 0; k0 < kend; k0 += BK) {
    __syncthreads();  // the previous tile's Ks, Vs, Ps and St are read
    load_rows<bf16, HD, LD>(K, ldk, k0, BK, g.Tn, Ks);
    load_rows<bf16, HD, LD>(V, ldk, k0, BK, g.Tn, Vs);
    __syncthreads();
    BlockMma<BQ / kMma, BK / kMma> qk;  // S = Q K^T
    qk.zero();
    qk.template add<wmma::row_major, wmma::col_major, HD / kMma>(Qs, LD, Ks, LD);
    qk.store(St, LDS);
    __syncthreads();
    float s[RA][RC];
    from_staged<false, LDS>(St, ty, tx, s);
    softmax_tile<RA, RC, RE, LDP>(s, m, l, o, Ps, q0, k0, scale_log2, ty, tx);
    __syncthreads();  // Ps is written, St read
    BlockMma<BQ / kMma, HD / kMma> pv;
    pv.zero();
    pv.template add<wmma::row_major, wmma::row_major, BK / kMma>(Ps, LDP, Vs, LD);
    pv.store(St, LDS);
    __syncthreads();
    from_staged<true, LDS>(St, ty, tx, o);
  }
  finish_rows<bf16>(o, m, l, out + g.q_off(b, h, HD), ldq, lse + g.row_off(b, h), q0, g.Tn, ty, tx);
}

// The backward's score tile on the tensor cores: s = Q K^T and dp = dO V^T of R query rows (Qs, dOs) and
// C keys (Ks, Vs), bf16 rows of LD, stored through Ss and dPs (rows of C + 4) and read back in the
// SIMT layout. Every thread of the block calls it; the tiles are in shared memory and written.
template <int HD, int R, int C>
__device__ __forceinline__ void backward_scores_tc(const bf16* Qs, const bf16* dOs, const bf16* Ks, const bf16* Vs,
                                                   float* Ss, float* dPs, int ty, int tx,
                                                   float (&s)[R / kGrid][C / kGrid], float (&dp)[R / kGrid][C / kGrid]) {
  constexpr unsigned LD = TcTiles<HD>::LD, LDS = C + 4;
  BlockMma<R / kMma, C / kMma> qk, dov;
  qk.zero();
  dov.zero();
  qk.template add<wmma::row_major, wmma::col_major, HD / kMma>(Qs, LD, Ks, LD);
  dov.template add<wmma::row_major, wmma::col_major, HD / kMma>(dOs, LD, Vs, LD);
  qk.store(Ss, LDS);
  dov.store(dPs, LDS);
  __syncthreads();
  from_staged<false, LDS>(Ss, ty, tx, s);
  from_staged<false, LDS>(dPs, ty, tx, dp);
}

// Rows r0 + ty + 16a of a head slice (row t at base + t * stride) = a gradient the warps accumulated
// (R x HD) * scale, stored through Os (rows of HD + 4) into the SIMT layout. Os is free on entry and
// again on return.
template <int HD, int R, class Acc>
__device__ __forceinline__ void store_accumulated(const Acc& acc, float* Os, float scale, bf16* base, int64_t stride,
                                                  int r0, int Tn, int ty, int tx) {
  constexpr int LDO = HD + 4;
  float r[R / kGrid][HD / kGrid];
  acc.store(Os, LDO);
  __syncthreads();
  from_staged<false, LDO>(Os, ty, tx, r);
  store_rows<bf16, R / kGrid, HD>(r, scale, base, stride, r0, Tn, ty, tx);
  __syncthreads();
}

template <int HD>
constexpr size_t dkdv_tc_smem_bytes() {
  using L = TcTiles<HD>;
  return 2 * L::rows(kRowsHeld) + 2 * L::rows(kRowsStreamed) + 2 * L::scores(kRowsStreamed, kRowsHeld) +
         2 * L::terms(kRowsStreamed) + 2 * L::staged(kRowsStreamed, kRowsHeld) + L::staged(kRowsHeld, HD);
}

template <int HD>
__global__ void __launch_bounds__(kAttnThreads)
    attention_dkdv_tc_kernel(const bf16* dout, const bf16* q, const bf16* k, const bf16* v, const float* lse,
                             const float* D, bf16* dk, bf16* dv, Heads g, float scale_log2, float scale) {
  constexpr int BK = kRowsHeld, BQ = kRowsStreamed, LD = TcTiles<HD>::LD, LDP = BK + 8;
  constexpr int LDS = BK + 4, LDO = HD + 4;
  constexpr int RQ = BQ / kGrid, RC = BK / kGrid;
  extern __shared__ __align__(32) float smem[];
  Carve carve{reinterpret_cast<unsigned char*>(smem)};
  bf16* Ks = carve.take<bf16>(BK * LD);     // [BK][LD]
  bf16* Vs = carve.take<bf16>(BK * LD);     // [BK][LD]
  bf16* Qs = carve.take<bf16>(BQ * LD);     // [BQ][LD]
  bf16* dOs = carve.take<bf16>(BQ * LD);    // [BQ][LD]
  bf16* Ps = carve.take<bf16>(BQ * LDP);    // [BQ][LDP]
  bf16* dSs = carve.take<bf16>(BQ * LDP);   // [BQ][LDP]
  float* Ls = carve.take<float>(BQ);        // [BQ] lse in log2 units
  float* Ds = carve.take<float>(BQ);        // [BQ]
  float* Ss = carve.take<float>(BQ * LDS);  // [BQ][LDS] S
  float* dPs = carve.take<float>(BQ * LDS); // [BQ][LDS] dP
  float* Os = carve.take<float>(BK * LDO);  // [BK][LDO] dK, then dV
  const int ty = threadIdx.x / kGrid, tx = threadIdx.x % kGrid;
  const int k0 = blockIdx.x * BK, kvh = blockIdx.y, b = blockIdx.z;
  const int64_t ldq = int64_t(g.H) * HD, ldk = int64_t(g.KV) * HD;
  load_rows<bf16, HD, LD>(k + g.k_off(b, kvh, HD), ldk, k0, BK, g.Tn, Ks);
  load_rows<bf16, HD, LD>(v + g.k_off(b, kvh, HD), ldk, k0, BK, g.Tn, Vs);

  BlockMma<BK / kMma, HD / kMma> dK, dV;  // held by the warps across every query tile
  dK.zero();
  dV.zero();
  for (int h = kvh * g.group(); h < (kvh + 1) * g.group(); ++h) {
    const bf16* Q = q + g.q_off(b, h, HD);
    const bf16* dO = dout + g.q_off(b, h, HD);
    for (int q0 = k0 / BQ * BQ; q0 < g.Tn; q0 += BQ) {
      __syncthreads();  // the previous tile's Qs, dOs, Ps, dSs, Ls, Ds are read
      load_rows<bf16, HD, LD>(Q, ldq, q0, BQ, g.Tn, Qs);
      load_rows<bf16, HD, LD>(dO, ldq, q0, BQ, g.Tn, dOs);
      load_row_terms(lse + g.row_off(b, h), D + g.row_off(b, h), q0, BQ, g.Tn, Ls, Ds);
      __syncthreads();
      float s[RQ][RC], dp[RQ][RC];
      backward_scores_tc<HD, BQ, BK>(Qs, dOs, Ks, Vs, Ss, dPs, ty, tx, s, dp);
      score_grads<RQ, RC, LDP>(s, dp, Ls, Ds, Ps, dSs, q0, k0, g.Tn, scale_log2, ty, tx);
      __syncthreads();
      dV.template add<wmma::col_major, wmma::row_major, BQ / kMma>(Ps, LDP, dOs, LD);   // dV += P^T dO
      dK.template add<wmma::col_major, wmma::row_major, BQ / kMma>(dSs, LDP, Qs, LD);   // dK += dS^T Q
    }
  }
  store_accumulated<HD, BK>(dK, Os, scale, dk + g.k_off(b, kvh, HD), ldk, k0, g.Tn, ty, tx);
  store_accumulated<HD, BK>(dV, Os, 1.0f, dv + g.k_off(b, kvh, HD), ldk, k0, g.Tn, ty, tx);
}

template <int HD>
constexpr size_t dq_tc_smem_bytes() {
  using L = TcTiles<HD>;
  return 2 * L::rows(kRowsHeld) + 2 * L::rows(kRowsStreamed) + L::scores(kRowsHeld, kRowsStreamed) +
         2 * L::terms(kRowsHeld) + 2 * L::staged(kRowsHeld, kRowsStreamed) + L::staged(kRowsHeld, HD);
}

template <int HD>
__global__ void __launch_bounds__(kAttnThreads)
    attention_dq_tc_kernel(const bf16* dout, const bf16* q, const bf16* k, const bf16* v, const float* lse,
                           const float* D, bf16* dq, Heads g, float scale_log2, float scale) {
  constexpr int BQ = kRowsHeld, BK = kRowsStreamed, LD = TcTiles<HD>::LD, LDP = BK + 8;
  constexpr int LDS = BK + 4, LDO = HD + 4;
  constexpr int RA = BQ / kGrid, RC = BK / kGrid;
  extern __shared__ __align__(32) float smem[];
  Carve carve{reinterpret_cast<unsigned char*>(smem)};
  bf16* Qs = carve.take<bf16>(BQ * LD);     // [BQ][LD]
  bf16* dOs = carve.take<bf16>(BQ * LD);    // [BQ][LD]
  bf16* Ks = carve.take<bf16>(BK * LD);     // [BK][LD]
  bf16* Vs = carve.take<bf16>(BK * LD);     // [BK][LD]
  bf16* dSs = carve.take<bf16>(BQ * LDP);   // [BQ][LDP]
  float* Ls = carve.take<float>(BQ);        // [BQ] lse in log2 units
  float* Ds = carve.take<float>(BQ);        // [BQ]
  float* Ss = carve.take<float>(BQ * LDS);  // [BQ][LDS] S
  float* dPs = carve.take<float>(BQ * LDS); // [BQ][LDS] dP
  float* Os = carve.take<float>(BQ * LDO);  // [BQ][LDO] dQ
  const int ty = threadIdx.x / kGrid, tx = threadIdx.x % kGrid;
  const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * BQ;  // the longest rows first
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / g.group();
  const int64_t ldq = int64_t(g.H) * HD, ldk = int64_t(g.KV) * HD;
  const bf16* K = k + g.k_off(b, kvh, HD);
  const bf16* V = v + g.k_off(b, kvh, HD);
  load_rows<bf16, HD, LD>(q + g.q_off(b, h, HD), ldq, q0, BQ, g.Tn, Qs);
  load_rows<bf16, HD, LD>(dout + g.q_off(b, h, HD), ldq, q0, BQ, g.Tn, dOs);
  load_row_terms(lse + g.row_off(b, h), D + g.row_off(b, h), q0, BQ, g.Tn, Ls, Ds);

  BlockMma<BQ / kMma, HD / kMma> dQ;  // held by the warps across every key tile
  dQ.zero();
  const int kend = min(q0 + BQ, g.Tn);
  for (int k0 = 0; k0 < kend; k0 += BK) {
    __syncthreads();  // the previous tile's Ks, Vs, dSs are read (and Qs, dOs, Ls, Ds written)
    load_rows<bf16, HD, LD>(K, ldk, k0, BK, g.Tn, Ks);
    load_rows<bf16, HD, LD>(V, ldk, k0, BK, g.Tn, Vs);
    __syncthreads();
    float s[RA][RC], dp[RA][RC];
    backward_scores_tc<HD, BQ, BK>(Qs, dOs, Ks, Vs, Ss, dPs, ty, tx, s, dp);
    score_grads<RA, RC, LDP, bf16>(s, dp, Ls, Ds, nullptr, dSs, q0, k0, g.Tn, scale_log2, ty, tx);
    __syncthreads();
    dQ.template add<wmma::row_major, wmma::row_major, BK / kMma>(dSs, LDP, Ks, LD);  // dQ += dS K
  }
  store_accumulated<HD, BQ>(dQ, Os, scale, dq + g.q_off(b, h, HD), ldq, q0, g.Tn, ty, tx);
}

// The launch limits, checked on the host: std::invalid_argument naming the op and the limit.
void check_args(const char* op, int64_t B, int64_t Tn, int64_t H, int64_t KV, int64_t hd) {
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument(std::string("piper::kernels::cuda::") + op + ": " + what);
  };
  if (KV <= 0 || H % KV != 0)
    fail("H = " + std::to_string(H) + " is not a multiple of KV = " + std::to_string(KV));
  bool known = false;
  std::string dims;
  for (int64_t d : kAttentionHeadDims) {
    known |= d == hd;
    dims += (dims.empty() ? "" : ", ") + std::to_string(d);
  }
  if (!known) fail("head dim " + std::to_string(hd) + " is not supported (" + dims + ")");
  if (Tn > (int64_t(1) << 30)) fail("Tn = " + std::to_string(Tn) + " exceeds 2^30");
  if (B > 65535 || H > 65535)
    fail("B = " + std::to_string(B) + ", H = " + std::to_string(H) + ": each must be at most 65535");
}

// Calls f(std::integral_constant<int, hd>) for a head dim of kAttentionHeadDims (check_args ran
// first).
template <class F, size_t... I>
void with_head_dim(int64_t hd, F&& f, std::index_sequence<I...>) {
  (void)((hd == kAttentionHeadDims[I] &&
          (f(std::integral_constant<int, static_cast<int>(kAttentionHeadDims[I])>{}), true)) ||
         ...);
}
template <class F>
void with_head_dim(int64_t hd, F&& f) {
  with_head_dim(hd, f, std::make_index_sequence<kAttentionHeadDims.size()>{});
}

// Allows `kernel` the dynamic shared memory it is launched with (past the default 48 KiB).
template <class K>
void allow_smem(K kernel, size_t bytes) {
  PIPER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
}

unsigned tiles(int64_t n, int rows) { return static_cast<unsigned>((n + rows - 1) / rows); }

float scale_of(int64_t hd) { return static_cast<float>(1.0 / std::sqrt(double(hd))); }

}  // namespace

template <class T>
void attention_fwd(const T* q, const T* k, const T* v, T* out, float* lse, int64_t B, int64_t Tn,
                   int64_t H, int64_t KV, int64_t hd, cudaStream_t s) {
  check_args("attention_fwd", B, Tn, H, KV, hd);
  if (B == 0 || Tn == 0 || H == 0) return;
  const Heads g{int(Tn), int(H), int(KV)};
  const float scale_log2 = scale_of(hd) * kLog2e;
  with_head_dim(hd, [&](auto hd_c) {
    constexpr int HD = decltype(hd_c)::value;
    const dim3 grid(tiles(Tn, kRowsHeld), unsigned(H), unsigned(B));
    if constexpr (std::is_same_v<T, bf16>) {
      constexpr size_t smem = fwd_tc_smem_bytes<HD>();
      allow_smem(attention_fwd_tc_kernel<HD>, smem);
      attention_fwd_tc_kernel<HD><<<grid, kAttnThreads, smem, s>>>(q, k, v, out, lse, g, scale_log2);
    } else {
      constexpr size_t smem = fwd_smem_bytes<HD>();
      allow_smem(attention_fwd_kernel<T, HD>, smem);
      attention_fwd_kernel<T, HD><<<grid, kAttnThreads, smem, s>>>(q, k, v, out, lse, g, scale_log2);
    }
    PIPER_CUDA_LAUNCHED("attention_fwd");
  });
}

int64_t attention_bwd_workspace_bytes(int64_t B, int64_t Tn, int64_t H) {
  return B * H * Tn * int64_t(sizeof(float));
}

template <class T>
void attention_bwd(const T* dout, const T* q, const T* k, const T* v, const T* out,
                   const float* lse, T* dq, T* dk, T* dv, int64_t B, int64_t Tn, int64_t H,
                   int64_t KV, int64_t hd, void* work, cudaStream_t s) {
  check_args("attention_bwd", B, Tn, H, KV, hd);
  if (B == 0 || Tn == 0 || H == 0) return;
  const Heads g{int(Tn), int(H), int(KV)};
  const float scale = scale_of(hd), scale_log2 = scale * kLog2e;
  float* D = static_cast<float*>(work);
  const int64_t rows = B * Tn * H;
  constexpr int warps = kThreads / kWarp;
  attention_delta_kernel<T><<<blocks_for(rows, warps), kThreads, 0, s>>>(dout, out, D, rows, int(Tn),
                                                                         int(H), int(hd));
  PIPER_CUDA_LAUNCHED("attention_bwd (row terms)");
  with_head_dim(hd, [&](auto hd_c) {
    constexpr int HD = decltype(hd_c)::value;
    const dim3 grid_kv(tiles(Tn, kRowsHeld), unsigned(KV), unsigned(B));
    const dim3 grid_q(tiles(Tn, kRowsHeld), unsigned(H), unsigned(B));
    if constexpr (std::is_same_v<T, bf16>) {
      constexpr size_t smem_kv = dkdv_tc_smem_bytes<HD>(), smem_q = dq_tc_smem_bytes<HD>();
      allow_smem(attention_dkdv_tc_kernel<HD>, smem_kv);
      allow_smem(attention_dq_tc_kernel<HD>, smem_q);
      attention_dkdv_tc_kernel<HD><<<grid_kv, kAttnThreads, smem_kv, s>>>(dout, q, k, v, lse, D, dk, dv, g, scale_log2, scale);
      PIPER_CUDA_LAUNCHED("attention_bwd (dk, dv)");
      attention_dq_tc_kernel<HD><<<grid_q, kAttnThreads, smem_q, s>>>(dout, q, k, v, lse, D, dq, g, scale_log2, scale);
      PIPER_CUDA_LAUNCHED("attention_bwd (dq)");
    } else {
      constexpr size_t smem_kv = dkdv_smem_bytes<HD>(), smem_q = dq_smem_bytes<HD>();
      allow_smem(attention_dkdv_kernel<T, HD>, smem_kv);
      allow_smem(attention_dq_kernel<T, HD>, smem_q);
      attention_dkdv_kernel<T, HD><<<grid_kv, kAttnThreads, smem_kv, s>>>(dout, q, k, v, lse, D, dk, dv, g, scale_log2, scale);
      PIPER_CUDA_LAUNCHED("attention_bwd (dk, dv)");
      attention_dq_kernel<T, HD><<<grid_q, kAttnThreads, smem_q, s>>>(dout, q, k, v, lse, D, dq, g, scale_log2, scale);
      PIPER_CUDA_LAUNCHED("attention_bwd (dq)");
    }
  });
}

#define PIPER_INSTANTIATE(T)                                                                      \
  template void attention_fwd<T>(const T*, const T*, const T*, T*, float*, int64_t, int64_t,     \
                                 int64_t, int64_t, int64_t, cudaStream_t);                        \
  template void attention_bwd<T>(const T*, const T*, const T*, const T*, const T*, const float*, \
                                 T*, T*, T*, int64_t, int64_t, int64_t, int64_t, int64_t, void*,  \
                                 cudaStream_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(__nv_bfloat16)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels::cuda
