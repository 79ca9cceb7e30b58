// rmsnorm_cuda.hpp — RMSNorm on CUDA (the twin of rmsnorm.hpp)
// Conventions: see cuda_common.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace piper::kernels::cuda {

// x[M,D], w[D] (T) -> y[M,D] (T), rstd[M] (f32)
template <class T>
void rmsnorm_fwd(const T* x, const T* w, T* y, float* rstd, int64_t M, int64_t D, float eps,
                 cudaStream_t s);
// Scratch of rmsnorm_bwd: the dw partials of each block of rows.
int64_t rmsnorm_bwd_workspace_bytes(int64_t M, int64_t D);
// dx[M,D] (T) overwritten, dw[D] (f32) accumulated; work of rmsnorm_bwd_workspace_bytes
template <class T>
void rmsnorm_bwd(const T* dy, const T* x, const T* w, const float* rstd, T* dx, float* dw, int64_t M,
                 int64_t D, void* work, cudaStream_t s);

}  // namespace piper::kernels::cuda
