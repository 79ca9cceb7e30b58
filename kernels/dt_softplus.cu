// dt_softplus.cu — Mamba-2 step size dt = softplus(dt_raw + dt_bias) (per head) on CUDA, and its
// backward. Elementwise kernels; ddt_bias from partials per kPartialRows rows summed in order
// (add_column_sums).
#include "cuda_common.cuh"
#include "dt_softplus.hpp"
#include "dt_softplus_cuda.hpp"
#include "tensor_ops_cuda.hpp"

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

// part[r, h] = sum over the rows of block r = blockIdx.y of ddt * sigmoid(dt_raw + dt_bias)
template <class T>
__global__ void dt_bias_partial(const T* ddt, const T* dt_raw, const float* dt_bias, float* part,
                                int64_t M, int64_t Hm) {
  const int64_t m0 = blockIdx.y * kPartialRows, m1 = M < m0 + kPartialRows ? M : m0 + kPartialRows;
  for (int64_t h = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; h < Hm; h += int64_t(gridDim.x) * blockDim.x) {
    float s = 0;
    for (int64_t m = m0; m < m1; ++m) s += to_f32(ddt[m * Hm + h]) * sigmoid(to_f32(dt_raw[m * Hm + h]) + dt_bias[h]);
    part[blockIdx.y * Hm + h] = s;
  }
}

int64_t partial_blocks(int64_t M) { return (M + kPartialRows - 1) / kPartialRows; }

}  // namespace

template <class T>
void dt_softplus_fwd(const T* dt_raw, const float* dt_bias, T* dt, int64_t M, int64_t Hm,
                     cudaStream_t s) {
  const int64_t n = M * Hm;
  if (n == 0) return;
  dt_softplus_fwd_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(dt_raw, dt_bias, dt, Hm, n);
  PIPER_CUDA_LAUNCHED("dt_softplus_fwd");
}

int64_t dt_softplus_bwd_workspace_bytes(int64_t M, int64_t Hm) {
  return partial_blocks(M) * Hm * static_cast<int64_t>(sizeof(float));
}

template <class T>
void dt_softplus_bwd(const T* ddt, const T* dt_raw, const float* dt_bias, T* ddt_raw,
                     float* ddt_bias, int64_t M, int64_t Hm, void* work, cudaStream_t s) {
  const int64_t n = M * Hm;
  if (n == 0) return;
  dt_softplus_bwd_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(ddt, dt_raw, dt_bias, ddt_raw, Hm, n);
  PIPER_CUDA_LAUNCHED("dt_softplus_bwd (ddt_raw)");
  const int64_t R = partial_blocks(M);
  auto* part = static_cast<float*>(work);
  dt_bias_partial<T><<<dim3(blocks_for(Hm), static_cast<unsigned>(R)), kThreads, 0, s>>>(ddt, dt_raw, dt_bias, part, M, Hm);
  PIPER_CUDA_LAUNCHED("dt_softplus_bwd (ddt_bias partials)");
  add_column_sums(part, R, Hm, ddt_bias, s);
}

#define PIPER_INSTANTIATE(T)                                                                  \
  template void dt_softplus_fwd<T>(const T*, const float*, T*, int64_t, int64_t, cudaStream_t); \
  template void dt_softplus_bwd<T>(const T*, const T*, const float*, T*, float*, int64_t, int64_t, \
                                   void*, cudaStream_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(__nv_bfloat16)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels::cuda
