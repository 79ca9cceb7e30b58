// tensor_ops.cpp — column slices of row-major matrices, in-place add, row maxima and the
// sum of squares behind the gradient norm.
#include "tensor_ops.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

namespace piper::kernels {

namespace {
// Below this many values a parallel region costs more than it saves.
constexpr int64_t kParallelMin = int64_t(1) << 15;
}  // namespace

template <class T>
void gather_cols(const T* src, int64_t S, int64_t col, T* dst, int64_t n, int64_t M) {
#pragma omp parallel for schedule(static) if (M * n > kParallelMin)
  for (int64_t r = 0; r < M; ++r)
    std::memcpy(dst + r * n, src + r * S + col, static_cast<size_t>(n) * sizeof(T));
}

template <class T>
void scatter_cols(const T* src, int64_t n, T* dst, int64_t S, int64_t col, int64_t M) {
#pragma omp parallel for schedule(static) if (M * n > kParallelMin)
  for (int64_t r = 0; r < M; ++r)
    std::memcpy(dst + r * S + col, src + r * n, static_cast<size_t>(n) * sizeof(T));
}

template <class T>
void add_inplace(T* y, const T* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

template <class T>
void row_max(const T* x, T* out, int64_t M, int64_t N) {
#pragma omp parallel for schedule(static) if (M * N > kParallelMin)
  for (int64_t m = 0; m < M; ++m) {
    const T* row = x + m * N;
    T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t v = 0; v < N; ++v) mx = std::max(mx, row[v]);
    out[m] = mx;
  }
}

template <class T>
double sum_squares(const T* x, int64_t n) {
  // Fixed-size blocks summed in order: the result does not depend on the thread count.
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> part(static_cast<size_t>(blocks), 0.0);
#pragma omp parallel for schedule(static) if (n > 2 * kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    double s = 0.0;
    const int64_t end = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < end; ++i) s += static_cast<double>(x[i]) * x[i];
    part[static_cast<size_t>(b)] = s;
  }
  double total = 0.0;
  for (double s : part) total += s;
  return total;
}

#define PIPER_INSTANTIATE(T)                                                         \
  template void gather_cols<T>(const T*, int64_t, int64_t, T*, int64_t, int64_t);    \
  template void scatter_cols<T>(const T*, int64_t, T*, int64_t, int64_t, int64_t);   \
  template void add_inplace<T>(T*, const T*, int64_t);                               \
  template void row_max<T>(const T*, T*, int64_t, int64_t);                          \
  template double sum_squares<T>(const T*, int64_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(double)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels
