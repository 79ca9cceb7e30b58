// tensor_ops.hpp — column slices, in-place add, row maxima, sum of squares
// Conventions: see kernels.hpp.
#pragma once

#include <cstdint>

namespace piper::kernels {

// dst[M,n] = src[M,S][:, col : col + n]
template <class T>
void gather_cols(const T* src, int64_t S, int64_t col, T* dst, int64_t n, int64_t M);
// dst[M,S][:, col : col + n] = src[M,n]
template <class T>
void scatter_cols(const T* src, int64_t n, T* dst, int64_t S, int64_t col, int64_t M);
// y[n] += x[n]
template <class T>
void add_inplace(T* y, const T* x, int64_t n);
// out[M] = max_v x[m, v] over x[M,N]
template <class T>
void row_max(const T* x, T* out, int64_t M, int64_t N);
// sum of x[i]^2 in double, summed in fixed blocks: independent of the thread count
template <class T>
double sum_squares(const T* x, int64_t n);

}  // namespace piper::kernels
