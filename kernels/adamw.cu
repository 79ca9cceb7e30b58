// adamw.cu — the fused AdamW step on CUDA: one pass over p, g, m and v, the coefficients formed
// once in double on the host (as torch and the CPU kernel round them).
#include <cmath>

#include "adamw_cuda.hpp"
#include "cuda_common.cuh"

namespace piper::kernels::cuda {
namespace {

struct Coefficients {
  float b1, b2, one_minus_b1, one_minus_b2, eps, decay_mul, step_size, bc2_sqrt, grad_scale;
};

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, Coefficients c) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = g[i] * c.grad_scale;
    const float pi = p[i] * c.decay_mul;
    const float mi = c.b1 * m[i] + c.one_minus_b1 * gi;
    const float vi = c.b2 * v[i] + c.one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - c.step_size * mi / (sqrtf(vi) / c.bc2_sqrt + c.eps);
  }
}

}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, double lr, double beta1,
                  double beta2, double eps, double weight_decay, int64_t t, bool decay, float grad_scale,
                  cudaStream_t s) {
  if (n == 0) return;
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(t));
  const Coefficients c{static_cast<float>(beta1),
                       static_cast<float>(beta2),
                       static_cast<float>(1.0 - beta1),
                       static_cast<float>(1.0 - beta2),
                       static_cast<float>(eps),
                       decay ? 1.0f - static_cast<float>(lr * weight_decay) : 1.0f,
                       static_cast<float>(lr / bc1),
                       static_cast<float>(std::sqrt(bc2)),
                       grad_scale};
  adamw_kernel<<<blocks_for(n), kThreads, 0, s>>>(p, g, m, v, n, c);
  PIPER_CUDA_LAUNCHED("adamw_update");
}

}  // namespace piper::kernels::cuda
