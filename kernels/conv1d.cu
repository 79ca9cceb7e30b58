// conv1d.cu — causal depthwise 1-D convolution (left zero padding) on CUDA, forward and backward.
//
// x[B,Tn,C], w[C,K], bias[C] -> y[B,Tn,C]
//   y[b,t,c] = bias[c] + sum_{k<K} w[c,k] * x[b, t-(K-1)+k, c]   (x[b,<0,c] = 0)
// y and dx: one thread per element. dw and dbias: partial sums per kPartialRows rows, then summed
// over the partials in order (add_column_sums), so they are the same from run to run.
#include "conv1d_cuda.hpp"
#include "cuda_common.cuh"
#include "tensor_ops_cuda.hpp"

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

// Partials of rows block r = blockIdx.y, one thread per element e of dw [C*K] and dbias [C]:
//   part_w[r, c*K + k] = sum_rows dy[m,c] * x[m - (K-1-k), c]   (rows with t >= K-1-k)
//   part_b[r, c]       = sum_rows dy[m,c]
template <class T>
__global__ void conv1d_dw_partial(const T* dy, const T* x, float* part_w, float* part_b, int64_t rows,
                                  int64_t Tn, int64_t C, int64_t K) {
  const int64_t m0 = blockIdx.y * kPartialRows;
  const int64_t m1 = rows < m0 + kPartialRows ? rows : m0 + kPartialRows;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < C * (K + 1); e += int64_t(gridDim.x) * blockDim.x) {
    const bool bias = e >= C * K;
    const int64_t c = bias ? e - C * K : e / K, shift = bias ? 0 : K - 1 - e % K;
    float s = 0;
    for (int64_t m = m0; m < m1; ++m) {
      const float g = to_f32(dy[m * C + c]);
      if (bias)
        s += g;
      else if (m % Tn >= shift)
        s += g * to_f32(x[(m - shift) * C + c]);
    }
    if (bias)
      part_b[blockIdx.y * C + c] = s;
    else
      part_w[blockIdx.y * C * K + e] = s;
  }
}

int64_t partial_blocks(int64_t rows) { return (rows + kPartialRows - 1) / kPartialRows; }

}  // namespace

template <class T>
void conv1d_fwd(const T* x, const T* w, const T* bias, T* y, int64_t B, int64_t Tn, int64_t C,
                int64_t K, cudaStream_t s) {
  const int64_t n = B * Tn * C;
  if (n == 0) return;
  conv1d_fwd_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(x, w, bias, y, Tn, C, K, n);
  PIPER_CUDA_LAUNCHED("conv1d_fwd");
}

int64_t conv1d_bwd_workspace_bytes(int64_t B, int64_t Tn, int64_t C, int64_t K) {
  return partial_blocks(B * Tn) * C * (K + 1) * static_cast<int64_t>(sizeof(float));
}

template <class T>
void conv1d_bwd(const T* dy, const T* x, const T* w, T* dx, float* dw, float* dbias, int64_t B,
                int64_t Tn, int64_t C, int64_t K, void* work, cudaStream_t s) {
  const int64_t n = B * Tn * C;
  if (n == 0) return;
  conv1d_dx_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(dy, w, dx, Tn, C, K, n);
  PIPER_CUDA_LAUNCHED("conv1d_bwd (dx)");
  const int64_t R = partial_blocks(B * Tn);
  float* part_w = static_cast<float*>(work);  // [R, C*K]
  float* part_b = part_w + R * C * K;         // [R, C]
  conv1d_dw_partial<T><<<dim3(blocks_for(C * (K + 1)), static_cast<unsigned>(R)), kThreads, 0, s>>>(dy, x, part_w, part_b, B * Tn, Tn, C, K);
  PIPER_CUDA_LAUNCHED("conv1d_bwd (dw, dbias partials)");
  add_column_sums(part_w, R, C * K, dw, s);
  add_column_sums(part_b, R, C, dbias, s);
}

#define PIPER_INSTANTIATE(T)                                                                       \
  template void conv1d_fwd<T>(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t, int64_t, \
                              cudaStream_t);                                                       \
  template void conv1d_bwd<T>(const T*, const T*, const T*, T*, float*, float*, int64_t, int64_t,   \
                              int64_t, int64_t, void*, cudaStream_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(__nv_bfloat16)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels::cuda
