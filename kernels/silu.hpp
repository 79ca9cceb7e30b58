// silu.hpp — silu
// Conventions: see kernels.hpp.
#pragma once

#include <cstdint>

namespace piper::kernels {

template <class T>
void silu_fwd(const T* x, T* y, int64_t n);
template <class T>
void silu_bwd(const T* dy, const T* x, T* dx, int64_t n);

}  // namespace piper::kernels
