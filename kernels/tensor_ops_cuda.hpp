// tensor_ops_cuda.hpp — column slices, in-place add, sum of squares, and the fixed-order column
// sums the parameter-gradient reductions end with, on CUDA (the twin of tensor_ops.hpp; row_max
// is with the cross-entropy twin)
// Conventions: see cuda_common.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace piper::kernels::cuda {

// dst[M,n] = src[M,S][:, col : col + n]
template <class T>
void gather_cols(const T* src, int64_t S, int64_t col, T* dst, int64_t n, int64_t M, cudaStream_t s);
// dst[M,S][:, col : col + n] = src[M,n]
template <class T>
void scatter_cols(const T* src, int64_t n, T* dst, int64_t S, int64_t col, int64_t M, cudaStream_t s);
// dst[n] = src[n] in D (float or bf16; to bf16 rounded to nearest even): the inputs of a bf16 product
// from f32 tensors, and the convert op
template <class S, class D>
void convert(const S* src, D* dst, int64_t n, cudaStream_t s);
// y[n] += x[n]
template <class T>
void add_inplace(T* y, const T* x, int64_t n, cudaStream_t s);
// Scratch of sum_squares: one double per block of kSumBlock elements.
int64_t sum_squares_workspace_bytes(int64_t n);
// *out (device) = sum of x[i]^2 in double, in fixed blocks summed in order
template <class T>
void sum_squares(const T* x, int64_t n, double* out, void* work, cudaStream_t s);
// *out (device) = sum of x[0, n) (device), one block in a fixed order: the total of per-block partials
void sum_doubles(const double* x, int64_t n, double* out, cudaStream_t s);
// dst[D] += sum over r of part[r, D], r ascending, in double, rounded once
void add_column_sums(const float* part, int64_t R, int64_t D, float* dst, cudaStream_t s);
// Rows of one block of a column-partial reduction (the R of add_column_sums is ceil(M / this)).
constexpr int64_t kPartialRows = 64;

}  // namespace piper::kernels::cuda
