// linear.hpp — y = x @ W^T (torch.nn.Linear, no bias)
// Conventions: see kernels.hpp.
#pragma once

#include <cstdint>

namespace piper::kernels {

// x[M,K], w[N,K] -> y[M,N]
template <class T>
void linear_fwd(const T* x, const T* w, T* y, int64_t M, int64_t K, int64_t N);
// dx[M,K] = dy[M,N] @ w[N,K]  (overwrite, or += when accumulate)
template <class T>
void linear_bwd_input(const T* dy, const T* w, T* dx, int64_t M, int64_t K, int64_t N,
                      bool accumulate);
// dw[N,K] += dy[M,N]^T @ x[M,K]
template <class T>
void linear_bwd_weight(const T* dy, const T* x, T* dw, int64_t M, int64_t K, int64_t N);

}  // namespace piper::kernels
