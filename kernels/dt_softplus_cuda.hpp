// dt_softplus_cuda.hpp — dt = softplus(dt_raw + dt_bias) on CUDA (the twin of dt_softplus.hpp)
// Conventions: see cuda_common.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace piper::kernels::cuda {

// dt_raw[M,Hm], dt_bias[Hm] (f32) -> dt[M,Hm]
template <class T>
void dt_softplus_fwd(const T* dt_raw, const float* dt_bias, T* dt, int64_t M, int64_t Hm,
                     cudaStream_t s);
// Scratch of dt_softplus_bwd: the ddt_bias partials of each kPartialRows rows.
int64_t dt_softplus_bwd_workspace_bytes(int64_t M, int64_t Hm);
// ddt_raw[M,Hm] overwritten, ddt_bias[Hm] (f32) accumulated
template <class T>
void dt_softplus_bwd(const T* ddt, const T* dt_raw, const float* dt_bias, T* ddt_raw,
                     float* ddt_bias, int64_t M, int64_t Hm, void* work, cudaStream_t s);

}  // namespace piper::kernels::cuda
