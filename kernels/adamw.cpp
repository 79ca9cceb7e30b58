// adamw.cpp — the AdamW update loop: coefficients formed once from double, then one fused,
// vectorised pass over p, m and v.
#include "adamw.hpp"

#include <cmath>

namespace piper::kernels {

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, double lr,
                  double beta1, double beta2, double eps, double weight_decay, int64_t t,
                  bool decay, float grad_scale) {
  const float b1 = static_cast<float>(beta1), b2 = static_cast<float>(beta2);
  const float e = static_cast<float>(eps);
  // As torch: the coefficients are rounded from double, not formed in float.
  const float one_minus_b1 = static_cast<float>(1.0 - beta1);
  const float one_minus_b2 = static_cast<float>(1.0 - beta2);
  const float decay_mul = decay ? 1.0f - static_cast<float>(lr * weight_decay) : 1.0f;
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(t));
  const float step_size = static_cast<float>(lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * grad_scale;
    const float pi = p[i] * decay_mul;
    const float mi = b1 * m[i] + one_minus_b1 * gi;
    const float vi = b2 * v[i] + one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step_size * mi / (std::sqrt(vi) / bc2_sqrt + e);
  }
}

}  // namespace piper::kernels
