// gemm.cpp — the wrapper every matrix product goes through (row-major):
// float through oneDNN's sgemm when built with it (the fastest measured on
// this model's shapes, docs/blas.md), double (gradient checks) through CBLAS.
#include "gemm.hpp"

#include <cblas.h>
#ifdef PIPER_USE_DNNL
#include <dnnl.h>
#endif

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <type_traits>

#ifndef PIPER_BLAS_NAME
#define PIPER_BLAS_NAME "unknown"
#endif

namespace piper::kernels {

namespace {

// CBLAS takes blasint (32-bit in the LP64 builds we link); refuse sizes it cannot hold.
blasint to_blasint(int64_t v) {
  if (v < 0 || v > static_cast<int64_t>(std::numeric_limits<blasint>::max()))
    throw std::invalid_argument("piper::kernels::gemm: dimension out of BLAS range");
  return static_cast<blasint>(v);
}

// C[M,N] = beta * C, without reading C when beta == 0 (so NaN garbage is overwritten).
template <class T>
void scale_c(int64_t M, int64_t N, T beta, T* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    T* c = C + i * ldc;
    if (beta == T(0)) {
      std::fill(c, c + N, T(0));
    } else if (beta != T(1)) {
#pragma omp simd
      for (int64_t j = 0; j < N; ++j) c[j] *= beta;
    }
  }
}

}  // namespace

// A is [M,K] (or [K,M] when trans_a), B is [K,N] (or [N,K] when trans_b), C is [M,N].
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0 || alpha == T(0)) {  // BLAS rejects lda < 1 when K == 0; do it by hand
    scale_c(M, N, beta, C, ldc);
    return;
  }
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
#ifdef PIPER_USE_DNNL
    if (dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) !=
        dnnl_success)
      throw std::runtime_error("piper::kernels::gemm: dnnl_sgemm failed");
    return;
#endif
    cblas_sgemm(CblasRowMajor, ta, tb, to_blasint(M), to_blasint(N), to_blasint(K), alpha, A,
                to_blasint(lda), B, to_blasint(ldb), beta, C, to_blasint(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, to_blasint(M), to_blasint(N), to_blasint(K), alpha, A,
                to_blasint(lda), B, to_blasint(ldb), beta, C, to_blasint(ldc));
  }
}

const char* blas_name() { return PIPER_BLAS_NAME; }

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t);

}  // namespace piper::kernels
