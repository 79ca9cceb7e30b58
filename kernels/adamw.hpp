// adamw.hpp — one AdamW step over a parameter tensor (torch.optim.AdamW semantics)
// Conventions: see kernels.hpp. fp32 only: the optimiser state is kept in float.
#pragma once

#include <cstdint>

namespace piper::kernels {

// p, m, v [n] updated in place from g [n] * grad_scale; t is the 1-based step; weight decay
// (decoupled, lr * weight_decay) only when decay.
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, double lr,
                  double beta1, double beta2, double eps, double weight_decay, int64_t t,
                  bool decay, float grad_scale);

}  // namespace piper::kernels
