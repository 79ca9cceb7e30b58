// adamw_cuda.hpp — the fused AdamW step on CUDA (the twin of adamw.hpp)
// Conventions: see cuda_common.cuh. f32 only: master weights, gradients and moments.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace piper::kernels::cuda {

// p, m, v [n] updated in place from g [n] * grad_scale: the CPU's arithmetic, coefficients
// rounded from double on the host.
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, double lr, double beta1,
                  double beta2, double eps, double weight_decay, int64_t t, bool decay, float grad_scale,
                  cudaStream_t s);

}  // namespace piper::kernels::cuda
