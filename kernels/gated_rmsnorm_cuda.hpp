// gated_rmsnorm_cuda.hpp — out = grouped_rmsnorm(y * silu(z)) * w on CUDA (the twin of
// gated_rmsnorm.hpp)
// Conventions: see cuda_common.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace piper::kernels::cuda {

// y[M,Di], z[M,Di], w[Di]; G contiguous groups of Di/G channels -> out[M,Di], rstd[M,G] (f32).
// Throws std::invalid_argument unless G > 0 divides Di.
template <class T>
void gated_rmsnorm_fwd(const T* y, const T* z, const T* w, T* out, float* rstd, int64_t M,
                       int64_t Di, int64_t G, float eps, cudaStream_t s);
// Scratch of gated_rmsnorm_bwd: the dw partials of each kPartialRows rows.
int64_t gated_rmsnorm_bwd_workspace_bytes(int64_t M, int64_t Di);
// dy, dz [M,Di] overwritten; dw[Di] (f32) accumulated
template <class T>
void gated_rmsnorm_bwd(const T* dout, const T* y, const T* z, const T* w, const float* rstd, T* dy,
                       T* dz, float* dw, int64_t M, int64_t Di, int64_t G, void* work, cudaStream_t s);

}  // namespace piper::kernels::cuda
