// rmsnorm.cu — RMSNorm on CUDA: one block per row; the backward's dw from per-block-of-rows
// partials summed in order (add_column_sums), so it is the same from run to run.
#include "cuda_common.cuh"
#include "rmsnorm_cuda.hpp"
#include "tensor_ops_cuda.hpp"

namespace piper::kernels::cuda {
namespace {

template <class T>
__global__ void rmsnorm_fwd_kernel(const T* x, const T* w, T* y, float* rstd, int64_t D, float eps) {
  __shared__ float scratch[kThreads / kWarp];
  const int64_t m = blockIdx.x;
  const T* xr = x + m * D;
  T* yr = y + m * D;
  float ss = 0;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    const float v = to_f32(xr[d]);
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float r = rsqrtf(ss / static_cast<float>(D) + eps);
  if (threadIdx.x == 0) rstd[m] = r;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) yr[d] = from_f32<T>(to_f32(xr[d]) * r * to_f32(w[d]));
}

// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w, xhat = x * rstd
template <class T>
__global__ void rmsnorm_dx_kernel(const T* dy, const T* x, const T* w, const float* rstd, T* dx, int64_t D) {
  __shared__ float scratch[kThreads / kWarp];
  const int64_t m = blockIdx.x;
  const T* dyr = dy + m * D;
  const T* xr = x + m * D;
  const float r = rstd[m];
  float dot = 0;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dot += to_f32(dyr[d]) * to_f32(w[d]) * to_f32(xr[d]);
  dot = block_sum(dot, scratch);
  const float c = dot * r / static_cast<float>(D);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    const float xhat = to_f32(xr[d]) * r;
    dx[m * D + d] = from_f32<T>(r * (to_f32(dyr[d]) * to_f32(w[d]) - xhat * c));
  }
}

// part[b, d] = sum over the kPartialRows rows of block b of dy * xhat (rows in order).
template <class T>
__global__ void rmsnorm_dw_partial(const T* dy, const T* x, const float* rstd, float* part, int64_t M, int64_t D) {
  const int64_t d = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (d >= D) return;
  const int64_t m0 = blockIdx.y * kPartialRows, m1 = min(M, m0 + kPartialRows);
  float s = 0;
  for (int64_t m = m0; m < m1; ++m) s += to_f32(dy[m * D + d]) * to_f32(x[m * D + d]) * rstd[m];
  part[blockIdx.y * D + d] = s;
}

}  // namespace

template <class T>
void rmsnorm_fwd(const T* x, const T* w, T* y, float* rstd, int64_t M, int64_t D, float eps, cudaStream_t s) {
  if (M == 0) return;
  rmsnorm_fwd_kernel<T><<<static_cast<unsigned>(M), kThreads, 0, s>>>(x, w, y, rstd, D, eps);
  PIPER_CUDA_LAUNCHED("rmsnorm_fwd");
}

int64_t rmsnorm_bwd_workspace_bytes(int64_t M, int64_t D) {
  return ((M + kPartialRows - 1) / kPartialRows) * D * static_cast<int64_t>(sizeof(float));
}

template <class T>
void rmsnorm_bwd(const T* dy, const T* x, const T* w, const float* rstd, T* dx, float* dw, int64_t M,
                 int64_t D, void* work, cudaStream_t s) {
  if (M == 0 || D == 0) return;
  rmsnorm_dx_kernel<T><<<static_cast<unsigned>(M), kThreads, 0, s>>>(dy, x, w, rstd, dx, D);
  PIPER_CUDA_LAUNCHED("rmsnorm_bwd (dx)");
  const int64_t R = (M + kPartialRows - 1) / kPartialRows;
  auto* part = static_cast<float*>(work);
  rmsnorm_dw_partial<T><<<dim3(blocks_for(D), static_cast<unsigned>(R)), kThreads, 0, s>>>(dy, x, rstd, part, M, D);
  PIPER_CUDA_LAUNCHED("rmsnorm_bwd (dw partials)");
  add_column_sums(part, R, D, dw, s);
}

#define PIPER_INSTANTIATE(T)                                                                          \
  template void rmsnorm_fwd<T>(const T*, const T*, T*, float*, int64_t, int64_t, float, cudaStream_t); \
  template void rmsnorm_bwd<T>(const T*, const T*, const T*, const float*, T*, float*, int64_t, int64_t, \
                               void*, cudaStream_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(__nv_bfloat16)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels::cuda
