// adamw.hpp — AdamW with torch.optim.AdamW's semantics, global-norm gradient
// clipping as torch.nn.utils.clip_grad_norm_, and the warmup + cosine
// learning-rate schedule. Operates on raw buffers; the runtime owns the state.
#pragma once

#include <cstdint>

#include "config/config.hpp"

namespace piper::optim {

struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // applied only where the caller says the tensor decays
};

// The learning rate step `step` (counting from 0) applies: linear warmup
// lr * (step + 1) / warmup_steps, then cosine from lr down to lr * min_lr_ratio
// at the last step.
double lr_at(const config::TrainConfig& t, int64_t step);

// One AdamW step on n elements: p -= lr * wd * p (when decay), then the
// bias-corrected Adam update with moments m, v. `t` is the 1-based step count
// of this tensor; g is scaled by grad_scale first (the clipping coefficient).
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, int64_t t,
                  const AdamWHyper& h, bool decay, float grad_scale);

// Sum of squares of g in double, in a fixed order (deterministic).
double sum_squares(const float* g, int64_t n);

// clip_grad_norm_'s multiplier: min(1, max_norm / (total_norm + 1e-6)); 1 when max_norm <= 0.
float clip_coefficient(double total_norm, double max_norm);

}  // namespace piper::optim
