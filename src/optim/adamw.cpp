// adamw.cpp — AdamW, clipping and learning-rate schedule.
#include "optim/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <vector>


namespace piper::optim {

double lr_at(const config::TrainConfig& t, int64_t step) {
  if (step < t.warmup_steps)
    return t.lr * static_cast<double>(step + 1) / static_cast<double>(t.warmup_steps);
  const double min_lr = t.lr * t.min_lr_ratio;
  // The last step (steps - 1) lands exactly on the floor.
  const double span = static_cast<double>(std::max<int64_t>(1, t.steps - t.warmup_steps - 1));
  const double progress = std::min(1.0, static_cast<double>(step - t.warmup_steps) / span);
  return min_lr + (t.lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, int64_t t,
                  const AdamWHyper& h, bool decay, float grad_scale) {
  const float b1 = static_cast<float>(h.beta1), b2 = static_cast<float>(h.beta2);
  const float eps = static_cast<float>(h.eps);
  // As torch: the coefficients are rounded from double, not formed in float.
  const float one_minus_b1 = static_cast<float>(1.0 - h.beta1);
  const float one_minus_b2 = static_cast<float>(1.0 - h.beta2);
  const float decay_mul = decay ? 1.0f - static_cast<float>(h.lr * h.weight_decay) : 1.0f;
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(t));
  const float step_size = static_cast<float>(h.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * grad_scale;
    const float pi = p[i] * decay_mul;
    const float mi = b1 * m[i] + one_minus_b1 * gi;
    const float vi = b2 * v[i] + one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
  }
}

double sum_squares(const float* g, int64_t n) {
  // Fixed-size blocks summed in order: the result does not depend on the thread count.
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> part(static_cast<size_t>(blocks), 0.0);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t b = 0; b < blocks; ++b) {
    double s = 0.0;
    const int64_t end = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < end; ++i) s += static_cast<double>(g[i]) * g[i];
    part[static_cast<size_t>(b)] = s;
  }
  double total = 0.0;
  for (double s : part) total += s;
  return total;
}

float clip_coefficient(double total_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0f;
  return static_cast<float>(std::min(1.0, max_norm / (total_norm + 1e-6)));
}

}  // namespace piper::optim
