// gemm.hpp — the BLAS wrapper every matrix product goes through
// Conventions: see kernels.hpp.
#pragma once

#include <cstdint>

namespace piper::kernels {

// C[M,N] = alpha * op(A) @ op(B) + beta * C, op = transpose when trans_* is true.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);
// Name of the BLAS library linked in ("openblas", "blis", ...).
const char* blas_name();

}  // namespace piper::kernels
