// dt_softplus.cpp — Mamba-2 step size dt = softplus(dt_raw + dt_bias) (per head), and backward.
#include "dt_softplus.hpp"

#include <cmath>
#include <vector>

namespace piper::kernels {

namespace {
// Below this many elements a parallel region costs more than it saves (log1p/exp are scalar).
constexpr int64_t kParallelMin = int64_t(1) << 13;
template <class T>
inline T softplus(T v) {
  return v > T(kSoftplusLinearAbove) ? v : std::log1p(std::exp(v));
}
// d softplus / dv; exp(-v) -> inf for very negative v gives 0, never NaN.
template <class T>
inline T sigmoid(T v) {
  return T(1) / (T(1) + std::exp(-v));
}
}  // namespace

// dt_raw[M,Hm], dt_bias[Hm] -> dt[M,Hm]
template <class T>
void dt_softplus_fwd(const T* dt_raw, const T* dt_bias, T* dt, int64_t M, int64_t Hm) {
#pragma omp parallel for schedule(static) if (M * Hm >= kParallelMin)
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < Hm; ++h) dt[m * Hm + h] = softplus(dt_raw[m * Hm + h] + dt_bias[h]);
}

// ddt[M,Hm] -> ddt_raw[M,Hm] = ddt * sigmoid(dt_raw + dt_bias) (overwritten),
//              ddt_bias[Hm] += sum over rows of ddt_raw (rows in order: thread-count independent)
template <class T>
void dt_softplus_bwd(const T* ddt, const T* dt_raw, const T* dt_bias, T* ddt_raw, T* ddt_bias,
                     int64_t M, int64_t Hm) {
#pragma omp parallel for schedule(static) if (M * Hm >= kParallelMin)
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < Hm; ++h)
      ddt_raw[m * Hm + h] = ddt[m * Hm + h] * sigmoid(dt_raw[m * Hm + h] + dt_bias[h]);
  // Column sums: M*Hm is small (Hm = heads), one serial pass in row order is cheap.
  // Summed in double (M ~ 2048 terms) apart from ddt_bias, then added once.
  std::vector<double> acc(static_cast<size_t>(Hm), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    const T* g = ddt_raw + m * Hm;
#pragma omp simd
    for (int64_t h = 0; h < Hm; ++h) acc[h] += g[h];
  }
  for (int64_t h = 0; h < Hm; ++h) ddt_bias[h] += static_cast<T>(acc[h]);
}

#define PIPER_INSTANTIATE(T)                                                  \
  template void dt_softplus_fwd<T>(const T*, const T*, T*, int64_t, int64_t); \
  template void dt_softplus_bwd<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(double)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels
