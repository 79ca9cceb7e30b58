// rope_cuda.hpp — rotate-half RoPE on CUDA (the twin of rope.hpp)
// Conventions: see cuda_common.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace piper::kernels::cuda {

// x[B,T,H,hd] -> y (y may be x); hd even (std::invalid_argument otherwise)
template <class T>
void rope_fwd(const T* x, T* y, int64_t B, int64_t Tn, int64_t H, int64_t hd, double theta, cudaStream_t s);
// the transpose rotation
template <class T>
void rope_bwd(const T* dy, T* dx, int64_t B, int64_t Tn, int64_t H, int64_t hd, double theta, cudaStream_t s);

}  // namespace piper::kernels::cuda
