// conv1d.hpp — causal depthwise conv, left zero padding
// Conventions: see kernels.hpp.
#pragma once

#include <cstdint>

namespace piper::kernels {

// x[B,Tn,C], w[C,K], bias[C] -> y[B,Tn,C];
// y[b,t,c] = bias[c] + sum_{k<K} w[c,k] * x[b, t-(K-1)+k, c]  (x[b,<0,c] = 0)
template <class T>
void conv1d_fwd(const T* x, const T* w, const T* bias, T* y, int64_t B, int64_t Tn, int64_t C,
                int64_t K);
// dx overwritten; dw, dbias accumulated
template <class T>
void conv1d_bwd(const T* dy, const T* x, const T* w, T* dx, T* dw, T* dbias, int64_t B,
                int64_t Tn, int64_t C, int64_t K);

}  // namespace piper::kernels
