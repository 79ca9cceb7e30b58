// tensor_core.cuh — block products on the tensor cores (wmma: bf16 operands from shared memory,
// f32 accumulation), for the kernels whose bf16 twins multiply tiles they stage themselves (the
// scan's chunk products, attention's scores and outputs).
//
// A block of kThreads threads computes an output of TM x TN tiles of 16 x 16; warp w owns tiles
// w, w + 8, ... (row-major order of tiles), its accumulators in registers across calls of `add`,
// so a product can run over k in slices as its operands are staged. `store` writes the output,
// f32 row-major, to shared memory, where the SIMT code reads it back in its own register layout
// (a fragment's distribution over the lanes is the hardware's and unspecified).
//
// Operands: A (rows i, k) row_major at A[i * lda + k] or col_major at A[k * lda + i]; B (k, column
// j) row_major at B[k * ldb + j] or col_major at B[j * ldb + k]. wmma's rules: every pointer to a
// tile 256-bit aligned (so the operands' bases 32-byte aligned, and their strides in elements
// multiples of 16 when a tile starts mid-row), strides multiples of 16 bytes.
#pragma once

#include <mma.h>

#include <type_traits>

#include "cuda_common.cuh"

namespace piper::kernels::cuda {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

constexpr int kMma = 16;  // the m16n16k16 shape
constexpr int kWarps = kThreads / kWarp;

template <int TM, int TN>
struct BlockMma {
  static constexpr int kTiles = TM * TN, kPerWarp = (kTiles + kWarps - 1) / kWarps;
  wmma::fragment<wmma::accumulator, kMma, kMma, kMma, float> acc[kPerWarp];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int t = 0; t < kPerWarp; ++t) wmma::fill_fragment(acc[t], 0.0f);
  }

  // acc += A[:, 0 .. 16 KS) B[0 .. 16 KS, :]. Every thread of the block calls it (a warp's calls
  // are warp-wide); the operands are in shared memory and stay unchanged until it returns.
  template <class LA, class LB, int KS>
  __device__ __forceinline__ void add(const bf16* A, unsigned lda, const bf16* B, unsigned ldb) {
    const int warp = int(threadIdx.x) / kWarp;
#pragma unroll
    for (int t = 0; t < kPerWarp; ++t) {
      const int tile = warp + kWarps * t;
      if (tile >= kTiles) break;  // whole warps: a warp's lanes agree
      const int i0 = tile / TN * kMma, j0 = tile % TN * kMma;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        const int k0 = ks * kMma;
        wmma::fragment<wmma::matrix_a, kMma, kMma, kMma, bf16, LA> a;
        wmma::fragment<wmma::matrix_b, kMma, kMma, kMma, bf16, LB> b;
        wmma::load_matrix_sync(a, A + (std::is_same_v<LA, wmma::row_major> ? i0 * lda + k0 : k0 * lda + i0), lda);
        wmma::load_matrix_sync(b, B + (std::is_same_v<LB, wmma::row_major> ? k0 * ldb + j0 : j0 * ldb + k0), ldb);
        wmma::mma_sync(acc[t], a, b, acc[t]);
      }
    }
  }

  // C[16 TM][16 TN] (f32, row-major, ldc a multiple of 4) = the accumulators.
  __device__ __forceinline__ void store(float* C, unsigned ldc) const {
    const int warp = int(threadIdx.x) / kWarp;
#pragma unroll
    for (int t = 0; t < kPerWarp; ++t) {
      const int tile = warp + kWarps * t;
      if (tile >= kTiles) break;
      wmma::store_matrix_sync(C + (tile / TN * kMma) * ldc + tile % TN * kMma, acc[t], ldc, wmma::mem_row_major);
    }
  }
};

}  // namespace piper::kernels::cuda
