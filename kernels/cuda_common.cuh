// cuda_common.cuh — what every CUDA kernel of kernels/*.cu shares: launch checks, bf16 <-> f32
// conversion, grid sizing and warp/block reductions.
//
// Conventions (all CUDA kernels; the CPU conventions of kernels.hpp hold as well):
//   * a launcher in namespace piper::kernels::cuda takes device pointers, the extents and the
//     stream it runs on, and returns once the work is queued (asynchronous);
//   * templates over the storage type T in {float, __nv_bfloat16}; every value is computed in
//     f32 (bf16 storage with f32 accumulation); statistics saved for a backward (rstd, lse, the
//     scan's state) and gradients of parameters are always f32;
//   * gradients of inputs are overwritten, gradients of parameters accumulated (+=);
//   * reductions run in a fixed order within a block and combine blocks in a fixed order (no
//     atomics on floats), so a kernel's results do not change from run to run.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_check.hpp"

namespace piper::kernels::cuda {

constexpr int kThreads = 256;  // threads of a one-dimensional block
constexpr int kWarp = 32;
constexpr int kScratch = kThreads / kWarp;  // the scratch values of block_sum at kThreads

// Blocks to cover n elements at `threads` per block, at most 65535 * 16 (grid-stride loops do
// the rest).
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 1048560 ? 1048560 : b));
}

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The sum (or max) of v over the block, returned to every thread; `scratch` holds blockDim.x /
// 32 values. blockDim.x must be a multiple of 32. The order is fixed for a fixed block size.
template <class F>
__device__ __forceinline__ F block_sum(F v, F* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  F s = lane < warps ? scratch[lane] : F(0);
  return warp_sum(s);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(m);
}

// The sum of x[0, n) in double over one block, returned to every thread: each thread sums its
// strided share in order, then block_sum; the order is fixed for a fixed block size.
__device__ __forceinline__ double block_sum_of(const double* x, int64_t n, double* scratch) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  return block_sum(s, scratch);
}

}  // namespace piper::kernels::cuda
