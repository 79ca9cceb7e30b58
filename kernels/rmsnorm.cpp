// rmsnorm.cpp — RMSNorm over the last dimension, y = x / sqrt(mean(x^2) + eps) * w, and backward.
#include "rmsnorm.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace piper::kernels {

namespace {
// Below this many values a parallel region costs more than it saves.
constexpr int64_t kParallelMin = int64_t(1) << 14;
// dw is reduced over fixed blocks of rows (partial sums per block, then the blocks in order),
// so its value does not depend on the thread count at all.
constexpr int64_t kRowBlock = 32;
}  // namespace

// x[M,D], w[D] -> y[M,D], rstd[M]
template <class T>
void rmsnorm_fwd(const T* x, const T* w, T* y, T* rstd, int64_t M, int64_t D, T eps) {
  const T inv_d = T(1) / static_cast<T>(D);
#pragma omp parallel for schedule(static) if (M * D >= kParallelMin)
  for (int64_t m = 0; m < M; ++m) {
    const T* xr = x + m * D;
    T* yr = y + m * D;
    T ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t d = 0; d < D; ++d) ss += xr[d] * xr[d];
    const T r = T(1) / std::sqrt(ss * inv_d + eps);
    rstd[m] = r;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) yr[d] = xr[d] * r * w[d];
  }
}

// dy[M,D], x[M,D], w[D], rstd[M] -> dx[M,D] (overwritten), dw[D] (accumulated)
//   xhat = x * rstd, g = dy * w
//   dx = rstd * (g - xhat * mean(g * xhat)),  dw += sum_rows dy * xhat
template <class T>
void rmsnorm_bwd(const T* dy, const T* x, const T* w, const T* rstd, T* dx, T* dw, int64_t M,
                 int64_t D) {
  if (M <= 0 || D <= 0) return;
  const T inv_d = T(1) / static_cast<T>(D);
  const int64_t nb = (M + kRowBlock - 1) / kRowBlock;
  std::vector<T> part(static_cast<size_t>(nb * D), T(0));  // [nb, D] per-block dw partials
#pragma omp parallel for schedule(static) if (M * D >= kParallelMin)
  for (int64_t b = 0; b < nb; ++b) {
    T* pb = part.data() + b * D;
    const int64_t m1 = std::min(M, (b + 1) * kRowBlock);
    for (int64_t m = b * kRowBlock; m < m1; ++m) {
      const T* dyr = dy + m * D;
      const T* xr = x + m * D;
      T* dxr = dx + m * D;
      const T r = rstd[m];
      T dot = 0;  // sum_d g_d * xhat_d
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < D; ++d) dot += dyr[d] * w[d] * xr[d];
      const T c = dot * r * inv_d;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) {
        const T xhat = xr[d] * r;
        dxr[d] = r * (dyr[d] * w[d] - xhat * c);
        pb[d] += dyr[d] * xhat;
      }
    }
  }
  // Blocks summed in order, in double (nb*D adds: negligible), then added to dw once.
  std::vector<double> acc(static_cast<size_t>(D), 0.0);
  for (int64_t b = 0; b < nb; ++b) {
    const T* pb = part.data() + b * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) acc[d] += pb[d];
  }
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) dw[d] += static_cast<T>(acc[d]);
}

#define PIPER_INSTANTIATE(T)                                                     \
  template void rmsnorm_fwd<T>(const T*, const T*, T*, T*, int64_t, int64_t, T); \
  template void rmsnorm_bwd<T>(const T*, const T*, const T*, const T*, T*, T*, int64_t, int64_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(double)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels
