// conv1d.cu — causal depthwise 1-D convolution (left zero padding) on CUDA, forward and backward.
//
// x[B,Tn,C], w[C,K], bias[C] -> y[B,Tn,C]
//   y[b,t,c] = bias[c] + sum_{k<K} w[c,k] * x[b, t-(K-1)+k, c]   (x[b,<0,c] = 0)
// y and dx: one thread per element. dw and dbias: one block per 32 channels and tap (the bias is
// tap K), summing over all B*Tn rows in a fixed order (column_sum), so no partial buffers and no
// atomics.
#include "conv1d_cuda.hpp"
#include "cuda_common.cuh"

namespace piper::kernels::cuda {
namespace {

template <class T>
__global__ void conv1d_fwd_kernel(const T* x, const T* w, const T* bias, T* y, int64_t Tn, int64_t C,
                                  int64_t K, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % C, t = (i / C) % Tn;
    float acc = to_f32(bias[c]);
    // tap k reads time t-(K-1)+k; taps in the zero padding are skipped
    for (int64_t k = K - 1 - t > 0 ? K - 1 - t : 0; k < K; ++k)
      acc += to_f32(w[c * K + k]) * to_f32(x[i + (k - (K - 1)) * C]);
    y[i] = from_f32<T>(acc);
  }
}

// dx[b,s,c] = sum_k w[c,k] * dy[b, s+(K-1)-k, c] over the taps with s+(K-1)-k < Tn
template <class T>
__global__ void conv1d_dx_kernel(const T* dy, const T* w, T* dx, int64_t Tn, int64_t C, int64_t K,
                                 int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % C, s = (i / C) % Tn;
    float acc = 0;
    for (int64_t k = s + K - Tn > 0 ? s + K - Tn : 0; k < K; ++k)
      acc += to_f32(w[c * K + k]) * to_f32(dy[i + ((K - 1) - k) * C]);
    dx[i] = from_f32<T>(acc);
  }
}

// Block (channel tile blockIdx.x, tap k = blockIdx.y): dw[c,k] += sum_rows dy * x(shifted), or for
// k == K, dbias[c] += sum_rows dy.
template <class T>
__global__ void conv1d_dw_kernel(const T* dy, const T* x, float* dw, float* dbias, int64_t rows,
                                 int64_t Tn, int64_t C, int64_t K) {
  __shared__ float scratch[kThreads];
  const int64_t c = blockIdx.x * int64_t(kWarp) + threadIdx.x % kWarp, k = blockIdx.y;
  const int64_t shift = K - 1 - k;  // tap k of row (b,t) reads x at t - shift
  const float sum = column_sum(
      rows,
      [&](int64_t r) {
        if (c >= C) return 0.0f;
        const float g = to_f32(dy[r * C + c]);
        if (k == K) return g;
        return r % Tn >= shift ? g * to_f32(x[(r - shift) * C + c]) : 0.0f;
      },
      scratch);
  if (threadIdx.x < kWarp && c < C) {
    if (k == K)
      dbias[c] += sum;
    else
      dw[c * K + k] += sum;
  }
}

}  // namespace

template <class T>
void conv1d_fwd(const T* x, const T* w, const T* bias, T* y, int64_t B, int64_t Tn, int64_t C,
                int64_t K, cudaStream_t s) {
  const int64_t n = B * Tn * C;
  if (n == 0) return;
  conv1d_fwd_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(x, w, bias, y, Tn, C, K, n);
  PIPER_CUDA_LAUNCHED("conv1d_fwd");
}

template <class T>
void conv1d_bwd(const T* dy, const T* x, const T* w, T* dx, float* dw, float* dbias, int64_t B,
                int64_t Tn, int64_t C, int64_t K, cudaStream_t s) {
  const int64_t n = B * Tn * C;
  if (n == 0) return;
  conv1d_dx_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(dy, w, dx, Tn, C, K, n);
  PIPER_CUDA_LAUNCHED("conv1d_bwd (dx)");
  const dim3 grid(static_cast<unsigned>((C + kWarp - 1) / kWarp), static_cast<unsigned>(K + 1));
  conv1d_dw_kernel<T><<<grid, kThreads, 0, s>>>(dy, x, dw, dbias, B * Tn, Tn, C, K);
  PIPER_CUDA_LAUNCHED("conv1d_bwd (dw, dbias)");
}

#define PIPER_INSTANTIATE(T)                                                                       \
  template void conv1d_fwd<T>(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t, int64_t, \
                              cudaStream_t);                                                       \
  template void conv1d_bwd<T>(const T*, const T*, const T*, T*, float*, float*, int64_t, int64_t,   \
                              int64_t, int64_t, cudaStream_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(__nv_bfloat16)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels::cuda
