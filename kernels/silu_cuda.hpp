// silu_cuda.hpp — silu and SwiGLU on CUDA (the twins of silu.hpp and swiglu.hpp)
// Conventions: see cuda_common.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace piper::kernels::cuda {

template <class T>
void silu_fwd(const T* x, T* y, int64_t n, cudaStream_t s);
template <class T>
void silu_bwd(const T* dy, const T* x, T* dx, int64_t n, cudaStream_t s);
// h = silu(gate) * up
template <class T>
void swiglu_fwd(const T* gate, const T* up, T* h, int64_t n, cudaStream_t s);
template <class T>
void swiglu_bwd(const T* dh, const T* gate, const T* up, T* dgate, T* dup, int64_t n, cudaStream_t s);

}  // namespace piper::kernels::cuda
