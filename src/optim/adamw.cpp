// adamw.cpp — gradient clipping and the learning-rate schedule.
#include "optim/adamw.hpp"

#include <algorithm>
#include <cmath>

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

float clip_coefficient(double total_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0f;
  return static_cast<float>(std::min(1.0, max_norm / (total_norm + 1e-6)));
}

}  // namespace piper::optim
