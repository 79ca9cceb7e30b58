// rope.hpp — rotate-half RoPE, position t = 0..Tn-1 within each sequence
// Conventions: see kernels.hpp.
#pragma once

#include <cstdint>

namespace piper::kernels {

// x[B,Tn,H,hd] -> y (y may equal x); inv_freq[j] = theta^(-2j/hd)
template <class T>
void rope_fwd(const T* x, T* y, int64_t B, int64_t Tn, int64_t H, int64_t hd, double theta);
// dx = R^T dy (dx may equal dy)
template <class T>
void rope_bwd(const T* dy, T* dx, int64_t B, int64_t Tn, int64_t H, int64_t hd, double theta);

}  // namespace piper::kernels
