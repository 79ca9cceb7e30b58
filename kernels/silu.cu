// silu.cu — SiLU and SwiGLU on CUDA: grid-stride elementwise loops, f32 arithmetic.
#include "cuda_common.cuh"
#include "silu_cuda.hpp"

namespace piper::kernels::cuda {
namespace {

template <class T>
__global__ void silu_fwd_kernel(const T* x, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = to_f32(x[i]);
    y[i] = from_f32<T>(v * sigmoid(v));
  }
}

template <class T>
__global__ void silu_bwd_kernel(const T* dy, const T* x, T* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = to_f32(x[i]), s = sigmoid(v);
    dx[i] = from_f32<T>(to_f32(dy[i]) * s * (1.0f + v * (1.0f - s)));
  }
}

template <class T>
__global__ void swiglu_fwd_kernel(const T* gate, const T* up, T* h, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = to_f32(gate[i]);
    h[i] = from_f32<T>(g * sigmoid(g) * to_f32(up[i]));
  }
}

// dgate = dh * up * silu'(gate), dup = dh * silu(gate)   (both overwritten)
template <class T>
__global__ void swiglu_bwd_kernel(const T* dh, const T* gate, const T* up, T* dgate, T* dup, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = to_f32(gate[i]), s = sigmoid(g), d = to_f32(dh[i]);
    dgate[i] = from_f32<T>(d * to_f32(up[i]) * s * (1.0f + g * (1.0f - s)));
    dup[i] = from_f32<T>(d * g * s);
  }
}

}  // namespace

template <class T>
void silu_fwd(const T* x, T* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  silu_fwd_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(x, y, n);
  PIPER_CUDA_LAUNCHED("silu_fwd");
}
template <class T>
void silu_bwd(const T* dy, const T* x, T* dx, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  silu_bwd_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(dy, x, dx, n);
  PIPER_CUDA_LAUNCHED("silu_bwd");
}
template <class T>
void swiglu_fwd(const T* gate, const T* up, T* h, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  swiglu_fwd_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(gate, up, h, n);
  PIPER_CUDA_LAUNCHED("swiglu_fwd");
}
template <class T>
void swiglu_bwd(const T* dh, const T* gate, const T* up, T* dgate, T* dup, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  swiglu_bwd_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(dh, gate, up, dgate, dup, n);
  PIPER_CUDA_LAUNCHED("swiglu_bwd");
}

#define PIPER_INSTANTIATE(T)                                                               \
  template void silu_fwd<T>(const T*, T*, int64_t, cudaStream_t);                          \
  template void silu_bwd<T>(const T*, const T*, T*, int64_t, cudaStream_t);                \
  template void swiglu_fwd<T>(const T*, const T*, T*, int64_t, cudaStream_t);              \
  template void swiglu_bwd<T>(const T*, const T*, const T*, T*, T*, int64_t, cudaStream_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(__nv_bfloat16)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels::cuda
