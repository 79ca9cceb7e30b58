// conv1d_cuda.hpp — causal depthwise conv1d on CUDA (the twin of conv1d.hpp)
// Conventions: see cuda_common.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace piper::kernels::cuda {

// x[B,Tn,C], w[C,K], bias[C] -> y[B,Tn,C];
// y[b,t,c] = bias[c] + sum_{k<K} w[c,k] * x[b, t-(K-1)+k, c]  (x[b,<0,c] = 0)
template <class T>
void conv1d_fwd(const T* x, const T* w, const T* bias, T* y, int64_t B, int64_t Tn, int64_t C,
                int64_t K, cudaStream_t s);
// Scratch of conv1d_bwd: the dw and dbias partials of each kPartialRows rows.
int64_t conv1d_bwd_workspace_bytes(int64_t B, int64_t Tn, int64_t C, int64_t K);
// dx[B,Tn,C] overwritten; dw[C,K], dbias[C] (f32) accumulated
template <class T>
void conv1d_bwd(const T* dy, const T* x, const T* w, T* dx, float* dw, float* dbias, int64_t B,
                int64_t Tn, int64_t C, int64_t K, void* work, cudaStream_t s);

}  // namespace piper::kernels::cuda
