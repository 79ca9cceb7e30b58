// linear.cpp — y = x @ W^T (torch.nn.Linear without bias) and its two backward products, via gemm.
#include "linear.hpp"

#include "gemm.hpp"

namespace piper::kernels {

// x[M,K], w[N,K] -> y[M,N] = x @ w^T
template <class T>
void linear_fwd(const T* x, const T* w, T* y, int64_t M, int64_t K, int64_t N) {
  gemm<T>(false, true, M, N, K, T(1), x, K, w, K, T(0), y, N);
}

// dx[M,K] (=, or += when accumulate) dy[M,N] @ w[N,K]
template <class T>
void linear_bwd_input(const T* dy, const T* w, T* dx, int64_t M, int64_t K, int64_t N,
                      bool accumulate) {
  gemm<T>(false, false, M, K, N, T(1), dy, N, w, K, accumulate ? T(1) : T(0), dx, K);
}

// dw[N,K] += dy[M,N]^T @ x[M,K]
template <class T>
void linear_bwd_weight(const T* dy, const T* x, T* dw, int64_t M, int64_t K, int64_t N) {
  gemm<T>(true, false, N, K, M, T(1), dy, N, x, K, T(1), dw, K);
}

#define PIPER_INSTANTIATE(T)                                                                  \
  template void linear_fwd<T>(const T*, const T*, T*, int64_t, int64_t, int64_t);             \
  template void linear_bwd_input<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, bool); \
  template void linear_bwd_weight<T>(const T*, const T*, T*, int64_t, int64_t, int64_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(double)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels
