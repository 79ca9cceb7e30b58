// gated_rmsnorm.hpp — out = grouped_rmsnorm(y * silu(z)) * w
// Conventions: see kernels.hpp.
#pragma once

#include <cstdint>

namespace piper::kernels {

// y[M,Di], z[M,Di], w[Di]; G contiguous groups of Di/G channels -> out[M,Di], rstd[M*G]
template <class T>
void gated_rmsnorm_fwd(const T* y, const T* z, const T* w, T* out, T* rstd, int64_t M, int64_t Di,
                       int64_t G, T eps);
// dy, dz overwritten; dw accumulated
template <class T>
void gated_rmsnorm_bwd(const T* dout, const T* y, const T* z, const T* w, const T* rstd, T* dy,
                       T* dz, T* dw, int64_t M, int64_t Di, int64_t G);

}  // namespace piper::kernels
