// adamw.hpp — what AdamW's step needs beyond the update itself (which is the
// backend's adamw_update op, torch.optim.AdamW's semantics): global-norm
// gradient clipping as torch.nn.utils.clip_grad_norm_, and the warmup + cosine
// learning-rate schedule.
#pragma once

#include <cstdint>

#include "config/config.hpp"

namespace piper::optim {

// The learning rate step `step` (counting from 0) applies: linear warmup
// lr * (step + 1) / warmup_steps, then cosine from lr down to lr * min_lr_ratio
// at the last step.
double lr_at(const config::TrainConfig& t, int64_t step);

// clip_grad_norm_'s multiplier: min(1, max_norm / (total_norm + 1e-6)); 1 when max_norm <= 0.
float clip_coefficient(double total_norm, double max_norm);

}  // namespace piper::optim
