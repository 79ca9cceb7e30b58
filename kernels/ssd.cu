// ssd.cu — the Mamba-2 chunked SSD scan on CUDA, forward and backward, split as Mamba-2's
// reference kernels split it. The algebra is ssd.cpp's (read its header first); per (batch b,
// head h, chunk c) with a(i) = dt(i) A, acum its cumulative sum inside the chunk, Lc <= L steps:
//   E(i,j) = exp(acum(i) - acum(j)) (j <= i),  M(i,j) = (C_i . B_j) E(i,j) dt(j)
//   Y      = (M + D I) X + diag(exp(acum)) C S_in^T
//   S_out  = exp(acum(Lc-1)) S_in + X^T diag(w) B,   w(j) = E(Lc-1,j) dt(j)
//
// Forward:  cumsum (acum per chunk) -> cb (C B^T per group and chunk) -> chunk_state (X^T diag(w) B
//           of every chunk but the last) -> state_fwd (the scan across chunks: S_in, saved) ->
//           scan_fwd (Y).
// Backward: cumsum, cb -> chunk_state (dY^T diag(exp(acum)) C) -> state_bwd (dS_out of every
//           chunk, and <dS_out, S_in>) -> dx (per head and column tile: dX, the direct ddt
//           terms, the pieces of d a(k)) -> finish (ddt, dA per chunk) -> dc, db (per group:
//           the heads of the group summed in head order) -> params (dA_log, dD).
// d a(k), the gradient of the log-decay a(k), is summed over the pairs (i, j) with j < k <= i
// that straddle k (as ssd.cpp does), never as differences of cumulative sums.
//
// Products run on 64 x (16 PC) output tiles, 256 threads, each thread a 4 x PC register block,
// k in steps of 16 through shared memory (tile_mma); operands are read through loaders, so masks
// and decays are applied as they are loaded. Every sum has a fixed order: no atomics.
#include <stdexcept>
#include <string>

#include "cuda_common.cuh"
#include "ssd_cuda.hpp"
#include "tensor_core.cuh"

namespace piper::kernels::cuda {
namespace {

constexpr int kTile = 64;  // rows of an output tile; also the tile of the chunk's steps
constexpr int kStep = 16;  // k extent of one shared-memory step of tile_mma
constexpr int kSub = 16;   // threads along a tile's columns (and rows): 16 x 16 = kThreads
static_assert(kSub * kSub == kThreads, "tile_mma maps 16 x 16 threads");

struct Dims {
  int64_t B, T, Hm, P, G, N;
  int64_t L;    // chunk length
  int64_t nc;   // chunks
  int64_t nt;   // 64-step tiles of a full chunk
  int64_t hpg;  // heads per group
  int64_t xs;   // time-step stride of x, y, dx, dy: Hm * P
  int64_t bs;   // time-step stride of Bm, Cm, dBm, dCm: G * N
  int64_t PN;   // state size P * N
};

Dims dims_of(const SsdShape& s) {
  Dims d{};
  d.B = s.B, d.T = s.Tn, d.Hm = s.Hm, d.P = s.P, d.G = s.G, d.N = s.N;
  d.L = ssd_chunk_length(s);
  d.nc = (s.Tn + d.L - 1) / d.L;
  d.nt = (d.L + kTile - 1) / kTile;
  d.hpg = s.G > 0 ? s.Hm / s.G : 1;
  d.xs = s.Hm * s.P;
  d.bs = s.G * s.N;
  d.PN = s.P * s.N;
  return d;
}

// The shape checks of both launchers (the host side, before anything is queued).
void check_shape(const SsdShape& s, const char* op) {
  const std::string at = std::string(op) + ": ";
  if (s.G <= 0 || s.Hm % s.G != 0)
    throw std::invalid_argument(at + std::to_string(s.Hm) + " heads are not a multiple of the " +
                                std::to_string(s.G) + " groups of Bm/Cm (G must be positive and divide Hm)");
  if (s.P < 1 || s.P > kSsdMaxHeadDim)
    throw std::invalid_argument(at + "head dim P = " + std::to_string(s.P) + " is outside [1, " +
                                std::to_string(kSsdMaxHeadDim) + "], the head dims the CUDA scan takes");
  if (s.N < 1)
    throw std::invalid_argument(at + "state size N = " + std::to_string(s.N) + " must be at least 1");
}

// Grid size of a one-dimensional launch; refuses what a grid cannot hold.
unsigned grid_of(int64_t blocks, const char* op) {
  if (blocks > 0x7fffffff)
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(blocks) +
                                " blocks exceed the 2^31 - 1 a CUDA grid holds; use fewer batch rows or a longer chunk");
  return static_cast<unsigned>(blocks);
}

__device__ __forceinline__ int64_t chunk_len(const Dims& d, int64_t c) {
  return d.T - c * d.L < d.L ? d.T - c * d.L : d.L;
}
// Element (p, n) of a state [B, nc, Hm, P, N] (saved S_in, dS_out).
__device__ __forceinline__ int64_t state_at(const Dims& d, int64_t b, int64_t c, int64_t h) {
  return ((b * d.nc + c) * d.Hm + h) * d.PN;
}

// Where a bf16 tile_mma stores its tensor-core product for the threads to read back: 64 x (16 PC)
// floats, rows of 16 PC, 32-byte aligned; a kernel's own array, one per kernel and PC, for bf16
// storage (an f32 kernel holds none: nullptr).
template <class T, int PC>
__device__ __forceinline__ float* staging() {
  if constexpr (std::is_same_v<T, bf16>) {
    __shared__ __align__(32) float staged[kTile * kSub * PC];
    return staged;
  } else {
    return nullptr;
  }
}

// acc[a][j] += sum_{k < K} A(ty + 16a, k) * Bop(k, tx + 16j), (ty, tx) = (tid / 16, tid % 16):
// the 64 x (16 PC) output tile of the block. fa(r, k) is A's element (row r < 64 of the tile, k
// < K), fb(k, col) Bop's (col < 16 PC); each returns 0 outside its operand. AK / BK: consecutive
// threads load consecutive k (for operands contiguous in k) rather than consecutive rows or
// columns. As holds kStep * 65 floats, Bs kStep * (16 PC + 1), both 32-byte aligned. Every thread
// of the block calls it.
// For bf16 storage (T = bf16) the product runs on the tensor cores: each k slice of both operands
// is rounded to bf16 as it is loaded (with its masks and decays applied, as Mamba-2's kernels cast
// their operands before tl.dot), the warps accumulate in f32, and the tile comes back through
// `staged` (staging(), or 64 x 16 PC floats of the kernel's own that are free by then); for f32
// storage it is f32 arithmetic in registers, and `staged` is unused.
template <class T, int PC, bool AK, bool BK, class FA, class FB>
__device__ __forceinline__ void tile_mma(float (&acc)[4][PC], int64_t K, FA fa, FB fb, float* As,
                                         float* Bs, float* staged) {
  constexpr int W = kSub * PC;
  const int tid = threadIdx.x, ty = tid / kSub, tx = tid % kSub;
  if constexpr (std::is_same_v<T, bf16>) {
    constexpr unsigned lda = kTile + 8, ldb = W + 8;
    static_assert(kStep == kMma && kStep * lda * sizeof(bf16) <= kStep * (kTile + 1) * sizeof(float) &&
                      kStep * ldb * sizeof(bf16) <= kStep * (W + 1) * sizeof(float),
                  "the bf16 k slices fit in As and Bs");
    bf16* A16 = reinterpret_cast<bf16*>(As);  // A(r, k) at A16[k * lda + r]: column-major
    bf16* B16 = reinterpret_cast<bf16*>(Bs);  // B(k, col) at B16[k * ldb + col]: row-major
    BlockMma<kTile / kMma, PC> mma;
    mma.zero();
    for (int64_t k0 = 0; k0 < K; k0 += kStep) {
      for (int e = tid; e < kTile * kStep; e += kThreads) {
        const int r = AK ? e / kStep : e % kTile, k = AK ? e % kStep : e / kTile;
        A16[k * lda + r] = __float2bfloat16_rn(k0 + k < K ? fa(r, k0 + k) : 0.0f);
      }
      for (int e = tid; e < W * kStep; e += kThreads) {
        const int col = BK ? e / kStep : e % W, k = BK ? e % kStep : e / W;
        B16[k * ldb + col] = __float2bfloat16_rn(k0 + k < K ? fb(k0 + k, col) : 0.0f);
      }
      __syncthreads();
      mma.template add<wmma::col_major, wmma::row_major, 1>(A16, lda, B16, ldb);
      __syncthreads();
    }
    mma.store(staged, W);
    __syncthreads();
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int j = 0; j < PC; ++j) acc[a][j] += staged[(ty + kSub * a) * W + tx + kSub * j];
    __syncthreads();  // read before another product stores there
  } else {
    for (int64_t k0 = 0; k0 < K; k0 += kStep) {
      for (int e = tid; e < kTile * kStep; e += kThreads) {
        const int r = AK ? e / kStep : e % kTile, k = AK ? e % kStep : e / kTile;
        As[k * (kTile + 1) + r] = k0 + k < K ? fa(r, k0 + k) : 0.0f;
      }
      for (int e = tid; e < W * kStep; e += kThreads) {
        const int col = BK ? e / kStep : e % W, k = BK ? e % kStep : e / W;
        Bs[k * (W + 1) + col] = k0 + k < K ? fb(k0 + k, col) : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kStep; ++k) {
        float av[4], bv[PC];
#pragma unroll
        for (int a = 0; a < 4; ++a) av[a] = As[k * (kTile + 1) + ty + kSub * a];
#pragma unroll
        for (int j = 0; j < PC; ++j) bv[j] = Bs[k * (W + 1) + tx + kSub * j];
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int j = 0; j < PC; ++j) acc[a][j] += av[a] * bv[j];
      }
      __syncthreads();
    }
  }
}

template <int PC>
__device__ __forceinline__ void zero(float (&acc)[4][PC]) {
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int j = 0; j < PC; ++j) acc[a][j] = 0.0f;
}

// The sum over the 16 threads of a tile row (tx = 0..15, adjacent lanes of one warp).
__device__ __forceinline__ float row_sum16(float v) {
  for (int o = kSub / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---------------------------------------------------------------------------------------------
// Shared by forward and backward
// ---------------------------------------------------------------------------------------------

// cs[b,h,c,i] = acum(i) = sum_{k<=i} dt(k) A of chunk c, A = -exp(A_log[h]). One thread per (b,h,c).
template <class T>
__global__ void ssd_cumsum_kernel(const T* dt, const float* A_log, float* cs, Dims d) {
  for (int64_t bhc = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; bhc < d.B * d.Hm * d.nc;
       bhc += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = bhc % d.nc, h = (bhc / d.nc) % d.Hm, b = bhc / (d.nc * d.Hm);
    const float A = -expf(A_log[h]);
    const int64_t Lc = chunk_len(d, c);
    const T* dtc = dt + (b * d.T + c * d.L) * d.Hm + h;
    float acc = 0;
    for (int64_t i = 0; i < Lc; ++i) {
      acc += to_f32(dtc[i * d.Hm]) * A;
      cs[bhc * d.L + i] = acc;
    }
  }
}

// cb[b,g,c] = C B^T [Lc, Lc] (row stride L), the tiles on and below the diagonal.
// Block: ((b,g,c), I, J).
template <class T>
__global__ void ssd_cb_kernel(const T* Bm, const T* Cm, float* cb, Dims d) {
  __shared__ __align__(32) float As[kStep * (kTile + 1)];
  __shared__ __align__(32) float Bs[kStep * (kTile + 1)];
  const int64_t J = blockIdx.x % d.nt, I = (blockIdx.x / d.nt) % d.nt, bgc = blockIdx.x / (d.nt * d.nt);
  const int64_t c = bgc % d.nc, g = (bgc / d.nc) % d.G, b = bgc / (d.nc * d.G);
  const int64_t Lc = chunk_len(d, c), i0 = I * kTile, j0 = J * kTile;
  if (J > I || i0 >= Lc) return;
  const T* B0 = Bm + (b * d.T + c * d.L) * d.bs + g * d.N;
  const T* C0 = Cm + (b * d.T + c * d.L) * d.bs + g * d.N;
  float acc[4][4];
  zero(acc);
  tile_mma<T, 4, true, true>(
      acc, d.N, [&](int r, int64_t n) { return i0 + r < Lc ? to_f32(C0[(i0 + r) * d.bs + n]) : 0.0f; },
      [&](int64_t n, int col) { return j0 + col < Lc ? to_f32(B0[(j0 + col) * d.bs + n]) : 0.0f; }, As, Bs, staging<T, 4>());
  float* out = cb + bgc * d.L * d.L;
  const int ty = threadIdx.x / kSub, tx = threadIdx.x % kSub;
  for (int a = 0; a < 4; ++a)
    for (int j = 0; j < 4; ++j) {
      const int64_t i = i0 + ty + kSub * a, jj = j0 + tx + kSub * j;
      if (i < Lc && jj < Lc) out[i * d.L + jj] = acc[a][j];
    }
}

// One chunk's state product [P, N], tiles of 64 x 64: out[p,n] = sum_j U_j[p] s(j) V_j[n].
//   kFwd:  U = x, V = Bm, s(j) = w(j) = exp(acum(Lc-1) - acum(j)) dt(j), chunks 0..nc-2, written
//          to saved slot c+1 (the scan across chunks adds the rest there);
//   !kFwd: U = dy, V = Cm, s(j) = exp(acum(j)), chunks 1..nc-1, written to dso slot c-1.
// Block: ((b,h,chunk), p tile, n tile).
template <class T, bool kFwd>
__global__ void ssd_chunk_state_kernel(const T* U, const T* dt, const T* V, const float* cs,
                                       float* out, Dims d) {
  __shared__ __align__(32) float As[kStep * (kTile + 1)];
  __shared__ __align__(32) float Bs[kStep * (kTile + 1)];
  const int64_t npt = (d.P + kTile - 1) / kTile, nnt = (d.N + kTile - 1) / kTile;
  const int64_t tile = blockIdx.x % (npt * nnt), rest = blockIdx.x / (npt * nnt);
  const int64_t p0 = tile / nnt * kTile, n0 = tile % nnt * kTile;
  const int64_t c = rest % (d.nc - 1) + (kFwd ? 0 : 1), h = (rest / (d.nc - 1)) % d.Hm,
                b = rest / ((d.nc - 1) * d.Hm), g = h / d.hpg;
  const int64_t Lc = chunk_len(d, c), t0 = c * d.L;
  const float* csc = cs + ((b * d.Hm + h) * d.nc + c) * d.L;
  const float last = csc[Lc - 1];
  const T* U0 = U + (b * d.T + t0) * d.xs + h * d.P;
  const T* V0 = V + (b * d.T + t0) * d.bs + g * d.N;
  const T* dt0 = dt + (b * d.T + t0) * d.Hm + h;
  float acc[4][4];
  zero(acc);
  tile_mma<T, 4, false, false>(
      acc, Lc, [&](int r, int64_t j) { return p0 + r < d.P ? to_f32(U0[j * d.xs + p0 + r]) : 0.0f; },
      [&](int64_t j, int col) {
        if (n0 + col >= d.N) return 0.0f;
        const float sj = kFwd ? expf(last - csc[j]) * to_f32(dt0[j * d.Hm]) : expf(csc[j]);
        return sj * to_f32(V0[j * d.bs + n0 + col]);
      },
      As, Bs, staging<T, 4>());
  float* o = out + state_at(d, b, kFwd ? c + 1 : c - 1, h);
  const int ty = threadIdx.x / kSub, tx = threadIdx.x % kSub;
  for (int a = 0; a < 4; ++a)
    for (int j = 0; j < 4; ++j) {
      const int64_t p = p0 + ty + kSub * a, n = n0 + tx + kSub * j;
      if (p < d.P && n < d.N) o[p * d.N + n] = acc[a][j];
    }
}

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------

// The scan across chunks, one thread per state element of (b, h): slot c of saved holds the
// chunk product of chunk c-1 and becomes S_in(c) = exp(acum_{c-1}(L-1)) S_in(c-1) + that product;
// S_in(0) = 0. (Every chunk but the last is full, so acum_{c-1} ends at L-1.)
__global__ void ssd_state_fwd_kernel(const float* cs, float* saved, Dims d) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < d.B * d.Hm * d.PN;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = e % d.PN, h = (e / d.PN) % d.Hm, b = e / (d.PN * d.Hm);
    float s = 0;
    saved[state_at(d, b, 0, h) + k] = 0.0f;
    for (int64_t c = 1; c < d.nc; ++c) {
      const float el = expf(cs[((b * d.Hm + h) * d.nc + c - 1) * d.L + d.L - 1]);
      float& slot = saved[state_at(d, b, c, h) + k];
      s = el * s + slot;
      slot = s;
    }
  }
}

// Y rows of one (b, h, c) and row tile I: Y = (M + D I) X + diag(exp(acum)) C S_in^T.
template <class T, int PC>
__global__ void ssd_scan_fwd_kernel(const T* x, const T* dt, const T* Cm, const float* D,
                                    const float* cs, const float* cb, const float* saved, T* y, Dims d) {
  __shared__ __align__(32) float As[kStep * (kTile + 1)];
  __shared__ __align__(32) float Bs[kStep * (kSub * PC + 1)];
  const int64_t I = blockIdx.x % d.nt, bhc = blockIdx.x / d.nt;
  const int64_t c = bhc % d.nc, h = (bhc / d.nc) % d.Hm, b = bhc / (d.nc * d.Hm), g = h / d.hpg;
  const int64_t Lc = chunk_len(d, c), t0 = c * d.L, i0 = I * kTile;
  if (i0 >= Lc) return;
  const float* csc = cs + bhc * d.L;
  const float* cbc = cb + ((b * d.G + g) * d.nc + c) * d.L * d.L;
  const T* X0 = x + (b * d.T + t0) * d.xs + h * d.P;
  const T* dt0 = dt + (b * d.T + t0) * d.Hm + h;
  const T* C0 = Cm + (b * d.T + t0) * d.bs + g * d.N;
  const float* Sin = saved + state_at(d, b, c, h);
  float acc[4][PC];
  zero(acc);
  // intra-chunk: sum_{j <= i} M(i,j) X_j
  const int64_t K = Lc < i0 + kTile ? Lc : i0 + kTile;
  tile_mma<T, PC, true, false>(
      acc, K,
      [&](int r, int64_t j) {
        const int64_t i = i0 + r;
        if (i >= Lc || j > i) return 0.0f;
        return cbc[i * d.L + j] * expf(csc[i] - csc[j]) * to_f32(dt0[j * d.Hm]);
      },
      [&](int64_t j, int col) { return col < d.P ? to_f32(X0[j * d.xs + col]) : 0.0f; }, As, Bs, staging<T, PC>());
  // inter-chunk: exp(acum(i)) C_i S_in^T (S_in = 0 for the first chunk)
  if (c > 0)
    tile_mma<T, PC, true, true>(
        acc, d.N,
        [&](int r, int64_t n) {
          const int64_t i = i0 + r;
          return i < Lc ? expf(csc[i]) * to_f32(C0[i * d.bs + n]) : 0.0f;
        },
        [&](int64_t n, int col) { return col < d.P ? Sin[col * d.N + n] : 0.0f; }, As, Bs, staging<T, PC>());
  const float Dh = D[h];
  const int ty = threadIdx.x / kSub, tx = threadIdx.x % kSub;
  for (int a = 0; a < 4; ++a) {
    const int64_t i = i0 + ty + kSub * a;
    if (i >= Lc) continue;
    for (int j = 0; j < PC; ++j) {
      const int64_t p = tx + kSub * j;
      if (p < d.P) y[(b * d.T + t0 + i) * d.xs + h * d.P + p] = from_f32<T>(acc[a][j] + Dh * to_f32(X0[i * d.xs + p]));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------

// Workspace of the backward beyond the forward's (cs, cb): float arrays per (b, h, c) = bhc.
struct BwdWork {
  float* dso;   // [B, nc, Hm, P, N] dS_out of each chunk (zero for the last)
  float* part;  // [bhc, nt, L]: of column tile J, row sums of Q over J at rows i past J, and at
                //   k inside J the straddling sum over J's columns (see ssd_dx_kernel)
  float* vddt;  // [bhc, L] the direct ddt terms (through M and w)
  float* vrw;   // [bhc, L] r_j w_j of the chunk-final state
  float* vdin;  // [bhc, L] dinter(i): the gradient of acum(i) through the inter-chunk output
  float* sd;    // [bhc] <dS_out, S_in>
  float* dA;    // [bhc] sum_k dt(k) d a(k)
  float* dD;    // [bhc, nt] sum <X, dY> over a row tile
};

// dS_out per chunk, in place in dso, one block per (b, h): slot c holds dY^T diag(exp(acum)) C
// of chunk c+1 (ssd_chunk_state_kernel) and becomes dS_out(c) = exp(acum_{c+1}(end)) dS_out(c+1)
// + that, dS_out(nc-1) = 0; and sd[c] = <dS_out(c), S_in(c)>, a block sum.
__global__ void ssd_state_bwd_kernel(const float* cs, const float* saved, BwdWork w, Dims d) {
  __shared__ float scratch[kThreads / kWarp];
  for (int64_t bh = blockIdx.x; bh < d.B * d.Hm; bh += gridDim.x) {
    const int64_t h = bh % d.Hm, b = bh / d.Hm;
    float* last = w.dso + state_at(d, b, d.nc - 1, h);
    for (int64_t k = threadIdx.x; k < d.PN; k += blockDim.x) last[k] = 0.0f;
    if (threadIdx.x == 0) w.sd[bh * d.nc + d.nc - 1] = 0.0f;
    for (int64_t c = d.nc - 2; c >= 0; --c) {
      const float el = expf(cs[(bh * d.nc + c + 1) * d.L + chunk_len(d, c + 1) - 1]);
      const float* next = w.dso + state_at(d, b, c + 1, h);
      float* cur = w.dso + state_at(d, b, c, h);
      const float* Sin = saved + state_at(d, b, c, h);
      float dot = 0;
      for (int64_t k = threadIdx.x; k < d.PN; k += blockDim.x) {
        const float v = el * next[k] + cur[k];  // next[k] was written by this thread
        cur[k] = v;
        dot += v * Sin[k];
      }
      dot = block_sum(dot, scratch);
      if (threadIdx.x == 0) w.sd[bh * d.nc + c] = dot;
    }
  }
}

// The per-head backward of one (b, h, c) and column tile J (steps j of J), over the row tiles
// I >= J: with dM = dY X^T, q(i,j) = dM E CB (= d M(i,j) / d dt(j)), Q(i,j) = q dt(j):
//   dX_J    = sum_I M(I,J)^T dY_I + D dY_J + diag(w) B_J dS_out^T
//   vddt(j) = sum_i q(i,j) + r_j E(Lc-1,j),  r_j = <X_j, dS_out B_j>;  vrw(j) = r_j w_j
//   vdin(j) = exp(acum(j)) <dY_j, S_in C_j>
//   part[J][i] = sum_{j in J} Q(i,j) for i past J;   part[J][k] = sum_{i>=k} sum_{j in J, j<k} Q(i,j)
//   for k in J;  dD partial sum_{j in J} <X_j, dY_j>.
template <class T, int PC>
__global__ void ssd_dx_kernel(const T* dy, const T* x, const T* dt, const T* Bm, const T* Cm,
                              const float* D, const float* cs, const float* cb, const float* saved,
                              T* dx, BwdWork w, Dims d) {
  __shared__ __align__(32) float As[kStep * (kTile + 1)];
  __shared__ __align__(32) float Bs[kStep * (kSub * PC + 1)];
  // M(I,J) and q(I,J) (on the diagonal tile then its column suffix sums of Q); between the uses of
  // one tile and the next, where a bf16 product stores its tile (64 x 16 PC <= 2 x 64 x 65 floats).
  __shared__ __align__(32) float MQ[2][kTile][kTile + 1];
  float(&Mt)[kTile][kTile + 1] = MQ[0];
  float(&Qt)[kTile][kTile + 1] = MQ[1];
  float* const staged = &MQ[0][0][0];
  __shared__ float dtj[kTile];            // dt of the columns (0 past the chunk)
  __shared__ float colq[kTile];           // sum over all rows of q, per column
  __shared__ float colq_off[kTile];       // the same over the rows past J
  __shared__ float own[kTile];            // straddling sums inside the diagonal tile
  __shared__ float scratch[kThreads / kWarp];
  const int64_t J = blockIdx.x % d.nt, bhc = blockIdx.x / d.nt;
  const int64_t c = bhc % d.nc, h = (bhc / d.nc) % d.Hm, b = bhc / (d.nc * d.Hm), g = h / d.hpg;
  const int64_t Lc = chunk_len(d, c), t0 = c * d.L, j0 = J * kTile;
  if (j0 >= Lc) return;
  const int tid = threadIdx.x, ty = tid / kSub, tx = tid % kSub;
  const int64_t ntc = (Lc + kTile - 1) / kTile;
  const float* csc = cs + bhc * d.L;
  const float* cbc = cb + ((b * d.G + g) * d.nc + c) * d.L * d.L;
  const T* X0 = x + (b * d.T + t0) * d.xs + h * d.P;
  const T* dY0 = dy + (b * d.T + t0) * d.xs + h * d.P;
  const T* dt0 = dt + (b * d.T + t0) * d.Hm + h;
  float* part = w.part + bhc * d.nt * d.L + J * d.L;
  if (tid < kTile) {
    dtj[tid] = j0 + tid < Lc ? to_f32(dt0[(j0 + tid) * d.Hm]) : 0.0f;
    colq[tid] = colq_off[tid] = 0.0f;
  }
  __syncthreads();

  float acc[4][PC];
  zero(acc);
  for (int64_t I = J; I < ntc; ++I) {
    const int64_t i0 = I * kTile;
    float dm[4][4];
    zero(dm);
    tile_mma<T, 4, true, true>(
        dm, d.P, [&](int r, int64_t p) { return i0 + r < Lc ? to_f32(dY0[(i0 + r) * d.xs + p]) : 0.0f; },
        [&](int64_t p, int col) { return j0 + col < Lc ? to_f32(X0[(j0 + col) * d.xs + p]) : 0.0f; }, As, Bs, staged);
    for (int a = 0; a < 4; ++a)
      for (int j = 0; j < 4; ++j) {
        const int rl = ty + kSub * a, cl = tx + kSub * j;
        const int64_t i = i0 + rl, jj = j0 + cl;
        float m = 0, q = 0;
        if (i < Lc && jj <= i) {
          const float e = expf(csc[i] - csc[jj]), cbv = cbc[i * d.L + jj];
          m = cbv * e * dtj[cl];
          q = dm[a][j] * e * cbv;
        }
        Mt[rl][cl] = m;
        Qt[rl][cl] = q;
      }
    __syncthreads();
    if (tid < kTile) {  // column sums of q
      float s = 0;
      for (int r = 0; r < kTile; ++r) s += Qt[r][tid];
      colq[tid] += s;
      if (I > J) colq_off[tid] += s;
    } else if (I > J && tid < 2 * kTile) {  // row sums of Q: rows i past J
      const int rl = tid - kTile;
      float s = 0;
      for (int cl = 0; cl < kTile; ++cl) s += Qt[rl][cl] * dtj[cl];
      if (i0 + rl < Lc) part[i0 + rl] = s;
    }
    __syncthreads();
    if (I == J) {  // the diagonal tile: sum_{i>=k, i in J} sum_{j<k, j in J} Q(i,j) for k in J
      if (tid < kTile) {
        float run = 0;
        for (int r = kTile - 1; r >= 0; --r) {
          run += Qt[r][tid] * dtj[tid];
          Qt[r][tid] = run;  // sum_{i >= r} Q(i, tid)
        }
      }
      __syncthreads();
      if (tid < kTile) {
        float s = 0;
        for (int cl = 0; cl < tid; ++cl) s += Qt[tid][cl];
        own[tid] = s;
      }
    }
    // dX_J += M(I,J)^T dY_I
    tile_mma<T, PC, false, false>(
        acc, kTile, [&](int r, int64_t k) { return Mt[k][r]; },
        [&](int64_t k, int col) {
          return i0 + k < Lc && col < d.P ? to_f32(dY0[(i0 + k) * d.xs + col]) : 0.0f;
        },
        As, Bs, staged);
  }
  __syncthreads();
  if (tid < kTile && j0 + tid < Lc) {  // add the rows past J: sum_{j in J, j<k} sum_{i past J} Q(i,j)
    float s = own[tid];
    for (int cl = 0; cl < tid; ++cl) s += colq_off[cl] * dtj[cl];
    part[j0 + tid] = s;
  }

  // Row terms of the tile's steps j (this thread: rows ty + 16a, columns tx + 16j').
  const float last = csc[Lc - 1], Dh = D[h];
  float r_j[4] = {0, 0, 0, 0}, din[4] = {0, 0, 0, 0}, xdy = 0;
  for (int a = 0; a < 4; ++a) {
    const int64_t jj = j0 + ty + kSub * a;
    if (jj >= Lc) continue;
    for (int j = 0; j < PC; ++j) {
      const int64_t p = tx + kSub * j;
      if (p >= d.P) continue;
      const float g_ = to_f32(dY0[jj * d.xs + p]);
      acc[a][j] += Dh * g_;
      xdy += to_f32(X0[jj * d.xs + p]) * g_;
    }
  }
  const T* B0 = Bm + (b * d.T + t0) * d.bs + g * d.N;
  const T* C0 = Cm + (b * d.T + t0) * d.bs + g * d.N;
  if (c + 1 < d.nc) {  // chunk-final state: V = B_J dS_out^T; dX += diag(w) V, r_j = <X_j, V_j>
    const float* dSo = w.dso + state_at(d, b, c, h);
    float v[4][PC];
    zero(v);
    tile_mma<T, PC, true, true>(
        v, d.N, [&](int r, int64_t n) { return j0 + r < Lc ? to_f32(B0[(j0 + r) * d.bs + n]) : 0.0f; },
        [&](int64_t n, int col) { return col < d.P ? dSo[col * d.N + n] : 0.0f; }, As, Bs, staged);
    for (int a = 0; a < 4; ++a) {
      const int64_t jj = j0 + ty + kSub * a;
      const float wj = jj < Lc ? expf(last - csc[jj]) * dtj[ty + kSub * a] : 0.0f;
      float s = 0;
      for (int j = 0; j < PC; ++j) {
        const int64_t p = tx + kSub * j;
        if (jj < Lc && p < d.P) s += to_f32(X0[jj * d.xs + p]) * v[a][j];
        acc[a][j] += wj * v[a][j];
      }
      r_j[a] = row_sum16(s);
    }
  }
  if (c > 0) {  // inter-chunk output: U = C_J S_in^T; vdin(j) = exp(acum(j)) <dY_j, U_j>
    const float* Sin = saved + state_at(d, b, c, h);
    float u[4][PC];
    zero(u);
    tile_mma<T, PC, true, true>(
        u, d.N, [&](int r, int64_t n) { return j0 + r < Lc ? to_f32(C0[(j0 + r) * d.bs + n]) : 0.0f; },
        [&](int64_t n, int col) { return col < d.P ? Sin[col * d.N + n] : 0.0f; }, As, Bs, staged);
    for (int a = 0; a < 4; ++a) {
      const int64_t jj = j0 + ty + kSub * a;
      float s = 0;
      for (int j = 0; j < PC; ++j) {
        const int64_t p = tx + kSub * j;
        if (jj < Lc && p < d.P) s += to_f32(dY0[jj * d.xs + p]) * u[a][j];
      }
      const float dot = row_sum16(s);  // every lane of the warp takes part
      din[a] = jj < Lc ? expf(csc[jj]) * dot : 0.0f;
    }
  }
  xdy = block_sum(xdy, scratch);  // also orders colq's writes before the reads below
  if (tid == 0) w.dD[bhc * d.nt + J] = xdy;
  for (int a = 0; a < 4; ++a) {
    const int rl = ty + kSub * a;
    const int64_t jj = j0 + rl;
    if (jj >= Lc) continue;
    for (int j = 0; j < PC; ++j) {
      const int64_t p = tx + kSub * j;
      if (p < d.P) dx[(b * d.T + t0 + jj) * d.xs + h * d.P + p] = from_f32<T>(acc[a][j]);
    }
    if (tx == 0) {
      const float erow = expf(last - csc[jj]);
      w.vddt[bhc * d.L + jj] = colq[rl] + r_j[a] * erow;
      w.vrw[bhc * d.L + jj] = r_j[a] * erow * dtj[rl];
      w.vdin[bhc * d.L + jj] = din[a];
    }
  }
}

// ddt and the dA partial of one (b, h, c), a thread per step k:
//   d a(k) = sum_{j<k<=i} Q(i,j) + sum_{i>=k} vdin(i) + exp(acum(Lc-1)) sd + sum_{j<k} vrw(j)
//   ddt(k) = vddt(k) + A d a(k);   dA partial = sum_k dt(k) d a(k)
template <class T>
__global__ void ssd_finish_kernel(const T* dt, const float* A_log, const float* cs, T* ddt, BwdWork w,
                                  Dims d) {
  __shared__ float scratch[kThreads / kWarp];
  for (int64_t bhc = blockIdx.x; bhc < d.B * d.Hm * d.nc; bhc += gridDim.x) {
    const int64_t c = bhc % d.nc, h = (bhc / d.nc) % d.Hm, b = bhc / (d.nc * d.Hm);
    const int64_t Lc = chunk_len(d, c), t0 = c * d.L;
    const float A = -expf(A_log[h]);
    const float* csc = cs + bhc * d.L;
    const float* part = w.part + bhc * d.nt * d.L;
    const float* vdin = w.vdin + bhc * d.L;
    const float* vrw = w.vrw + bhc * d.L;
    const float state = expf(csc[Lc - 1]) * w.sd[bhc];
    float dA = 0;
    for (int64_t k = threadIdx.x; k < Lc; k += blockDim.x) {
      const int64_t K = k / kTile;
      float da = part[K * d.L + k];
      for (int64_t J = 0; J < K; ++J)
        for (int64_t i = k; i < Lc; ++i) da += part[J * d.L + i];
      for (int64_t i = k; i < Lc; ++i) da += vdin[i];
      da += state;
      for (int64_t j = 0; j < k; ++j) da += vrw[j];
      const int64_t at = (b * d.T + t0 + k) * d.Hm + h;
      ddt[at] = from_f32<T>(w.vddt[bhc * d.L + k] + A * da);
      dA += to_f32(dt[at]) * da;
    }
    dA = block_sum(dA, scratch);
    if (threadIdx.x == 0) w.dA[bhc] = dA;
  }
}

// dCB(i,j) = dM(i,j) E(i,j) dt(j) (j <= i) of head h for the tile (I, J), into Dt.
template <class T>
__device__ __forceinline__ void dcb_tile(const T* dY0, const T* X0, const T* dt0, const float* csc,
                                         int64_t i0, int64_t j0, int64_t Lc, const Dims& d,
                                         float (*Dt)[kTile + 1], float* As, float* Bs) {
  float dm[4][4];
  zero(dm);
  tile_mma<T, 4, true, true>(
      dm, d.P, [&](int r, int64_t p) { return i0 + r < Lc ? to_f32(dY0[(i0 + r) * d.xs + p]) : 0.0f; },
      [&](int64_t p, int col) { return j0 + col < Lc ? to_f32(X0[(j0 + col) * d.xs + p]) : 0.0f; }, As, Bs, staging<T, 4>());
  const int ty = threadIdx.x / kSub, tx = threadIdx.x % kSub;
  for (int a = 0; a < 4; ++a)
    for (int j = 0; j < 4; ++j) {
      const int rl = ty + kSub * a, cl = tx + kSub * j;
      const int64_t i = i0 + rl, jj = j0 + cl;
      Dt[rl][cl] = i < Lc && jj <= i ? dm[a][j] * expf(csc[i] - csc[jj]) * to_f32(dt0[jj * d.Hm]) : 0.0f;
    }
  __syncthreads();
}

// dC rows of one (b, g, c), row tile I and 64 columns n:
//   dC_i = sum_{h in g} [ exp(acum_h(i)) (dY_h S_in,h)_i + sum_{j <= i} dCB_h(i,j) B_j ]
template <class T>
__global__ void ssd_dc_kernel(const T* dy, const T* x, const T* dt, const T* Bm, const float* cs,
                              const float* saved, T* dCm, Dims d) {
  __shared__ __align__(32) float As[kStep * (kTile + 1)];
  __shared__ __align__(32) float Bs[kStep * (kTile + 1)];
  __shared__ float Dt[kTile][kTile + 1];
  const int64_t nnt = (d.N + kTile - 1) / kTile;
  const int64_t n0 = blockIdx.x % nnt * kTile, I = blockIdx.x / nnt % d.nt, bgc = blockIdx.x / (nnt * d.nt);
  const int64_t c = bgc % d.nc, g = (bgc / d.nc) % d.G, b = bgc / (d.nc * d.G);
  const int64_t Lc = chunk_len(d, c), t0 = c * d.L, i0 = I * kTile;
  if (i0 >= Lc) return;
  const T* B0 = Bm + (b * d.T + t0) * d.bs + g * d.N;
  float acc[4][4];
  zero(acc);
  for (int64_t h = g * d.hpg; h < (g + 1) * d.hpg; ++h) {
    const float* csc = cs + ((b * d.Hm + h) * d.nc + c) * d.L;
    const T* X0 = x + (b * d.T + t0) * d.xs + h * d.P;
    const T* dY0 = dy + (b * d.T + t0) * d.xs + h * d.P;
    const T* dt0 = dt + (b * d.T + t0) * d.Hm + h;
    if (c > 0) {
      const float* Sin = saved + state_at(d, b, c, h);
      tile_mma<T, 4, true, false>(
          acc, d.P,
          [&](int r, int64_t p) {
            const int64_t i = i0 + r;
            return i < Lc ? expf(csc[i]) * to_f32(dY0[i * d.xs + p]) : 0.0f;
          },
          [&](int64_t p, int col) { return n0 + col < d.N ? Sin[p * d.N + n0 + col] : 0.0f; }, As, Bs, staging<T, 4>());
    }
    for (int64_t J = 0; J <= I; ++J) {
      const int64_t j0 = J * kTile;
      dcb_tile(dY0, X0, dt0, csc, i0, j0, Lc, d, Dt, As, Bs);
      tile_mma<T, 4, true, false>(
          acc, kTile, [&](int r, int64_t k) { return Dt[r][k]; },
          [&](int64_t k, int col) {
            return j0 + k < Lc && n0 + col < d.N ? to_f32(B0[(j0 + k) * d.bs + n0 + col]) : 0.0f;
          },
          As, Bs, staging<T, 4>());
    }
  }
  const int ty = threadIdx.x / kSub, tx = threadIdx.x % kSub;
  for (int a = 0; a < 4; ++a)
    for (int j = 0; j < 4; ++j) {
      const int64_t i = i0 + ty + kSub * a, n = n0 + tx + kSub * j;
      if (i < Lc && n < d.N) dCm[(b * d.T + t0 + i) * d.bs + g * d.N + n] = from_f32<T>(acc[a][j]);
    }
}

// dB rows of one (b, g, c), row tile J and 64 columns n:
//   dB_j = sum_{h in g} [ w_h(j) (X_h dS_out,h)_j + sum_{i >= j} dCB_h(i,j) C_i ]
template <class T>
__global__ void ssd_db_kernel(const T* dy, const T* x, const T* dt, const T* Cm, const float* cs,
                              BwdWork w, T* dBm, Dims d) {
  __shared__ __align__(32) float As[kStep * (kTile + 1)];
  __shared__ __align__(32) float Bs[kStep * (kTile + 1)];
  __shared__ float Dt[kTile][kTile + 1];
  const int64_t nnt = (d.N + kTile - 1) / kTile;
  const int64_t n0 = blockIdx.x % nnt * kTile, J = blockIdx.x / nnt % d.nt, bgc = blockIdx.x / (nnt * d.nt);
  const int64_t c = bgc % d.nc, g = (bgc / d.nc) % d.G, b = bgc / (d.nc * d.G);
  const int64_t Lc = chunk_len(d, c), t0 = c * d.L, j0 = J * kTile;
  if (j0 >= Lc) return;
  const int64_t ntc = (Lc + kTile - 1) / kTile;
  const T* C0 = Cm + (b * d.T + t0) * d.bs + g * d.N;
  float acc[4][4];
  zero(acc);
  for (int64_t h = g * d.hpg; h < (g + 1) * d.hpg; ++h) {
    const float* csc = cs + ((b * d.Hm + h) * d.nc + c) * d.L;
    const float last = csc[Lc - 1];
    const T* X0 = x + (b * d.T + t0) * d.xs + h * d.P;
    const T* dY0 = dy + (b * d.T + t0) * d.xs + h * d.P;
    const T* dt0 = dt + (b * d.T + t0) * d.Hm + h;
    if (c + 1 < d.nc) {
      const float* dSo = w.dso + state_at(d, b, c, h);
      tile_mma<T, 4, true, false>(
          acc, d.P,
          [&](int r, int64_t p) {
            const int64_t j = j0 + r;
            return j < Lc ? expf(last - csc[j]) * to_f32(dt0[j * d.Hm]) * to_f32(X0[j * d.xs + p]) : 0.0f;
          },
          [&](int64_t p, int col) { return n0 + col < d.N ? dSo[p * d.N + n0 + col] : 0.0f; }, As, Bs, staging<T, 4>());
    }
    for (int64_t I = J; I < ntc; ++I) {
      const int64_t i0 = I * kTile;
      dcb_tile(dY0, X0, dt0, csc, i0, j0, Lc, d, Dt, As, Bs);
      tile_mma<T, 4, false, false>(
          acc, kTile, [&](int r, int64_t k) { return Dt[k][r]; },
          [&](int64_t k, int col) {
            return i0 + k < Lc && n0 + col < d.N ? to_f32(C0[(i0 + k) * d.bs + n0 + col]) : 0.0f;
          },
          As, Bs, staging<T, 4>());
    }
  }
  const int ty = threadIdx.x / kSub, tx = threadIdx.x % kSub;
  for (int a = 0; a < 4; ++a)
    for (int j = 0; j < 4; ++j) {
      const int64_t jj = j0 + ty + kSub * a, n = n0 + tx + kSub * j;
      if (jj < Lc && n < d.N) dBm[(b * d.T + t0 + jj) * d.bs + g * d.N + n] = from_f32<T>(acc[a][j]);
    }
}

// dA_log[h] += A sum_{b,c} dA partial (A = -exp(A_log)),  dD[h] += sum_{b,c,J} dD partial.
// One block per head, block sums in a fixed order.
__global__ void ssd_params_kernel(const float* A_log, BwdWork w, float* dA_log, float* dD, Dims d) {
  __shared__ float scratch[kThreads / kWarp];
  const int64_t h = blockIdx.x;
  float sa = 0, sd = 0;
  for (int64_t bc = threadIdx.x; bc < d.B * d.nc; bc += blockDim.x) {
    const int64_t b = bc / d.nc, c = bc % d.nc, bhc = (b * d.Hm + h) * d.nc + c;
    sa += w.dA[bhc];
    const int64_t ntc = (chunk_len(d, c) + kTile - 1) / kTile;
    for (int64_t J = 0; J < ntc; ++J) sd += w.dD[bhc * d.nt + J];
  }
  sa = block_sum(sa, scratch);
  sd = block_sum(sd, scratch);
  if (threadIdx.x == 0) {
    dA_log[h] += sa * -expf(A_log[h]);
    dD[h] += sd;
  }
}

// Workspace carving: the forward's cs [bhc, L] and cb [b, g, c, L, L], then the backward's.
int64_t n_cs(const Dims& d) { return d.B * d.Hm * d.nc * d.L; }
int64_t n_cb(const Dims& d) { return d.B * d.G * d.nc * d.L * d.L; }
int64_t n_bwd_extra(const Dims& d) {
  const int64_t bhc = d.B * d.Hm * d.nc;
  return d.B * d.nc * d.Hm * d.PN + bhc * d.nt * d.L + 3 * bhc * d.L + 2 * bhc + bhc * d.nt;
}

BwdWork carve_bwd(const Dims& d, float* p) {
  const int64_t bhc = d.B * d.Hm * d.nc;
  BwdWork w{};
  w.dso = p, p += d.B * d.nc * d.Hm * d.PN;
  w.part = p, p += bhc * d.nt * d.L;
  w.vddt = p, p += bhc * d.L;
  w.vrw = p, p += bhc * d.L;
  w.vdin = p, p += bhc * d.L;
  w.sd = p, p += bhc;
  w.dA = p, p += bhc;
  w.dD = p;
  return w;
}

// cs and cb, the first two kernels of both passes.
template <class T>
void decay_and_cb(const Dims& d, const T* dt, const float* A_log, const T* Bm, const T* Cm, float* cs,
                  float* cb, cudaStream_t st, const char* op) {
  ssd_cumsum_kernel<T><<<blocks_for(d.B * d.Hm * d.nc), kThreads, 0, st>>>(dt, A_log, cs, d);
  PIPER_CUDA_LAUNCHED("ssd cumsum");
  ssd_cb_kernel<T><<<grid_of(d.B * d.G * d.nc * d.nt * d.nt, op), kThreads, 0, st>>>(Bm, Cm, cb, d);
  PIPER_CUDA_LAUNCHED("ssd cb");
}

int64_t chunk_state_blocks(const Dims& d) {
  return d.B * d.Hm * (d.nc - 1) * ((d.P + kTile - 1) / kTile) * ((d.N + kTile - 1) / kTile);
}

template <class T, int PC>
void scan_fwd(const Dims& d, const T* x, const T* dt, const T* Cm, const float* D, const float* cs,
              const float* cb, const float* saved, T* y, cudaStream_t st) {
  ssd_scan_fwd_kernel<T, PC><<<grid_of(d.B * d.Hm * d.nc * d.nt, "ssd_fwd"), kThreads, 0, st>>>(x, dt, Cm, D, cs, cb, saved, y, d);
  PIPER_CUDA_LAUNCHED("ssd scan_fwd");
}

template <class T, int PC>
void dx_pass(const Dims& d, const T* dy, const T* x, const T* dt, const T* Bm, const T* Cm, const float* D,
             const float* cs, const float* cb, const float* saved, T* dx, const BwdWork& w, cudaStream_t st) {
  ssd_dx_kernel<T, PC><<<grid_of(d.B * d.Hm * d.nc * d.nt, "ssd_bwd"), kThreads, 0, st>>>(dy, x, dt, Bm, Cm, D, cs, cb, saved, dx, w, d);
  PIPER_CUDA_LAUNCHED("ssd dx");
}

}  // namespace

int64_t ssd_saved_numel(const SsdShape& s) {
  const Dims d = dims_of(s);
  return d.B * d.nc * d.Hm * d.PN;
}

int64_t ssd_fwd_workspace_bytes(const SsdShape& s) {
  const Dims d = dims_of(s);
  return (n_cs(d) + n_cb(d)) * static_cast<int64_t>(sizeof(float));
}

int64_t ssd_bwd_workspace_bytes(const SsdShape& s) {
  const Dims d = dims_of(s);
  return (n_cs(d) + n_cb(d) + n_bwd_extra(d)) * static_cast<int64_t>(sizeof(float));
}

template <class T>
void ssd_fwd(const SsdShape& s, const T* x, const T* dt, const float* A_log, const T* Bm,
             const T* Cm, const float* D, T* y, float* saved, void* work, cudaStream_t st) {
  check_shape(s, "ssd_fwd");
  const Dims d = dims_of(s);
  if (d.B <= 0 || d.T <= 0 || d.Hm <= 0) return;
  float* cs = static_cast<float*>(work);
  float* cb = cs + n_cs(d);
  decay_and_cb(d, dt, A_log, Bm, Cm, cs, cb, st, "ssd_fwd");
  if (d.nc > 1) {
    ssd_chunk_state_kernel<T, true><<<grid_of(chunk_state_blocks(d), "ssd_fwd"), kThreads, 0, st>>>(x, dt, Bm, cs, saved, d);
    PIPER_CUDA_LAUNCHED("ssd chunk_state (forward)");
  }
  ssd_state_fwd_kernel<<<blocks_for(d.B * d.Hm * d.PN), kThreads, 0, st>>>(cs, saved, d);
  PIPER_CUDA_LAUNCHED("ssd state_fwd");
  if (d.P <= 4 * kSub)
    scan_fwd<T, 4>(d, x, dt, Cm, D, cs, cb, saved, y, st);
  else
    scan_fwd<T, 8>(d, x, dt, Cm, D, cs, cb, saved, y, st);
}

template <class T>
void ssd_bwd(const SsdShape& s, const T* dy, const T* x, const T* dt, const float* A_log,
             const T* Bm, const T* Cm, const float* D, const float* saved, T* dx, T* ddt,
             float* dA_log, T* dBm, T* dCm, float* dD, void* work, cudaStream_t st) {
  check_shape(s, "ssd_bwd");
  const Dims d = dims_of(s);
  if (d.B <= 0 || d.T <= 0 || d.Hm <= 0) return;
  float* cs = static_cast<float*>(work);
  float* cb = cs + n_cs(d);
  const BwdWork w = carve_bwd(d, cb + n_cb(d));
  decay_and_cb(d, dt, A_log, Bm, Cm, cs, cb, st, "ssd_bwd");
  if (d.nc > 1) {
    ssd_chunk_state_kernel<T, false><<<grid_of(chunk_state_blocks(d), "ssd_bwd"), kThreads, 0, st>>>(dy, dt, Cm, cs, w.dso, d);
    PIPER_CUDA_LAUNCHED("ssd chunk_state (backward)");
  }
  ssd_state_bwd_kernel<<<blocks_for(d.B * d.Hm, 1), kThreads, 0, st>>>(cs, saved, w, d);
  PIPER_CUDA_LAUNCHED("ssd state_bwd");
  if (d.P <= 4 * kSub)
    dx_pass<T, 4>(d, dy, x, dt, Bm, Cm, D, cs, cb, saved, dx, w, st);
  else
    dx_pass<T, 8>(d, dy, x, dt, Bm, Cm, D, cs, cb, saved, dx, w, st);
  ssd_finish_kernel<T><<<blocks_for(d.B * d.Hm * d.nc, 1), kThreads, 0, st>>>(dt, A_log, cs, ddt, w, d);
  PIPER_CUDA_LAUNCHED("ssd finish");
  const int64_t group_blocks = d.B * d.G * d.nc * d.nt * ((d.N + kTile - 1) / kTile);
  ssd_dc_kernel<T><<<grid_of(group_blocks, "ssd_bwd"), kThreads, 0, st>>>(dy, x, dt, Bm, cs, saved, dCm, d);
  PIPER_CUDA_LAUNCHED("ssd dc");
  ssd_db_kernel<T><<<grid_of(group_blocks, "ssd_bwd"), kThreads, 0, st>>>(dy, x, dt, Cm, cs, w, dBm, d);
  PIPER_CUDA_LAUNCHED("ssd db");
  ssd_params_kernel<<<grid_of(d.Hm, "ssd_bwd"), kThreads, 0, st>>>(A_log, w, dA_log, dD, d);
  PIPER_CUDA_LAUNCHED("ssd params");
}

#define PIPER_INSTANTIATE(T)                                                                        \
  template void ssd_fwd<T>(const SsdShape&, const T*, const T*, const float*, const T*, const T*,     \
                           const float*, T*, float*, void*, cudaStream_t);                           \
  template void ssd_bwd<T>(const SsdShape&, const T*, const T*, const T*, const float*, const T*,     \
                           const T*, const float*, const float*, T*, T*, float*, T*, T*, float*, void*, \
                           cudaStream_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(__nv_bfloat16)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels::cuda
