// swiglu.hpp — h = silu(gate) * up, elementwise over n values
// Conventions: see kernels.hpp.
#pragma once

#include <cstdint>

namespace piper::kernels {

template <class T>
void swiglu_fwd(const T* gate, const T* up, T* h, int64_t n);
template <class T>
void swiglu_bwd(const T* dh, const T* gate, const T* up, T* dgate, T* dup, int64_t n);

}  // namespace piper::kernels
