// dt_softplus.cu — Mamba-2 step size dt = softplus(dt_raw + dt_bias) (per head) on CUDA, and its
// backward. Elementwise kernels; ddt_bias sums over the M rows in a fixed order (column_sum).
#include "cuda_common.cuh"
#include "dt_softplus.hpp"
#include "dt_softplus_cuda.hpp"

namespace piper::kernels::cuda {
namespace {

__device__ __forceinline__ float softplus(float v) {
  return v > float(kSoftplusLinearAbove) ? v : log1pf(expf(v));
}

template <class T>
__global__ void dt_softplus_fwd_kernel(const T* dt_raw, const float* dt_bias, T* dt, int64_t Hm, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dt[i] = from_f32<T>(softplus(to_f32(dt_raw[i]) + dt_bias[i % Hm]));
}

// ddt_raw = ddt * sigmoid(dt_raw + dt_bias)   (d softplus / dv = sigmoid(v))
template <class T>
__global__ void dt_softplus_bwd_kernel(const T* ddt, const T* dt_raw, const float* dt_bias, T* ddt_raw,
                                       int64_t Hm, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    ddt_raw[i] = from_f32<T>(to_f32(ddt[i]) * sigmoid(to_f32(dt_raw[i]) + dt_bias[i % Hm]));
}

// ddt_bias[h] += sum over the rows of ddt * sigmoid(dt_raw + dt_bias); 32 heads per block.
template <class T>
__global__ void dt_bias_grad_kernel(const T* ddt, const T* dt_raw, const float* dt_bias, float* ddt_bias,
                                    int64_t M, int64_t Hm) {
  __shared__ float scratch[kThreads];
  const int64_t h = blockIdx.x * int64_t(kWarp) + threadIdx.x % kWarp;
  const float bias = h < Hm ? dt_bias[h] : 0.0f;
  const float sum = column_sum(
      M,
      [&](int64_t m) {
        if (h >= Hm) return 0.0f;
        const int64_t i = m * Hm + h;
        return to_f32(ddt[i]) * sigmoid(to_f32(dt_raw[i]) + bias);
      },
      scratch);
  if (threadIdx.x < kWarp && h < Hm) ddt_bias[h] += sum;
}

}  // namespace

template <class T>
void dt_softplus_fwd(const T* dt_raw, const float* dt_bias, T* dt, int64_t M, int64_t Hm,
                     cudaStream_t s) {
  const int64_t n = M * Hm;
  if (n == 0) return;
  dt_softplus_fwd_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(dt_raw, dt_bias, dt, Hm, n);
  PIPER_CUDA_LAUNCHED("dt_softplus_fwd");
}

template <class T>
void dt_softplus_bwd(const T* ddt, const T* dt_raw, const float* dt_bias, T* ddt_raw,
                     float* ddt_bias, int64_t M, int64_t Hm, cudaStream_t s) {
  const int64_t n = M * Hm;
  if (n == 0) return;
  dt_softplus_bwd_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(ddt, dt_raw, dt_bias, ddt_raw, Hm, n);
  PIPER_CUDA_LAUNCHED("dt_softplus_bwd (ddt_raw)");
  const unsigned grid = static_cast<unsigned>((Hm + kWarp - 1) / kWarp);
  dt_bias_grad_kernel<T><<<grid, kThreads, 0, s>>>(ddt, dt_raw, dt_bias, ddt_bias, M, Hm);
  PIPER_CUDA_LAUNCHED("dt_softplus_bwd (ddt_bias)");
}

#define PIPER_INSTANTIATE(T)                                                                  \
  template void dt_softplus_fwd<T>(const T*, const float*, T*, int64_t, int64_t, cudaStream_t); \
  template void dt_softplus_bwd<T>(const T*, const T*, const float*, T*, float*, int64_t, int64_t, \
                                   cudaStream_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(__nv_bfloat16)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels::cuda
