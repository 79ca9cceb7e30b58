// rmsnorm.hpp — y = x / sqrt(mean(x^2) + eps) * w
// Conventions: see kernels.hpp.
#pragma once

#include <cstdint>

namespace piper::kernels {

// x[M,D], w[D] -> y[M,D], rstd[M] (saved for backward)
template <class T>
void rmsnorm_fwd(const T* x, const T* w, T* y, T* rstd, int64_t M, int64_t D, T eps);
// dx[M,D] overwritten, dw[D] accumulated
template <class T>
void rmsnorm_bwd(const T* dy, const T* x, const T* w, const T* rstd, T* dx, T* dw, int64_t M,
                 int64_t D);

}  // namespace piper::kernels
