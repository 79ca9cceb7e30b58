// silu.cpp — elementwise SiLU, y = x * vmath::sigmoid(x), and its backward.
#include "silu.hpp"
#include "vmath.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>

namespace piper::kernels {

namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMin = int64_t(1) << 14;


}  // namespace

// x[n] -> y[n] = x * vmath::sigmoid(x)
template <class T>
void silu_fwd(const T* x, T* y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * vmath::sigmoid(x[i]);
}

// dx[n] = dy * s * (1 + x * (1 - s)), s = vmath::sigmoid(x)   (overwritten)
template <class T>
void silu_bwd(const T* dy, const T* x, T* dx, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T s = vmath::sigmoid(x[i]);
    dx[i] = dy[i] * s * (T(1) + x[i] * (T(1) - s));
  }
}

#define PIPER_INSTANTIATE(T)                        \
  template void silu_fwd<T>(const T*, T*, int64_t); \
  template void silu_bwd<T>(const T*, const T*, T*, int64_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(double)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels
