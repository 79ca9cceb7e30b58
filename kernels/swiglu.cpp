// swiglu.cpp — elementwise SwiGLU gate, h = silu(gate) * up, and its backward.
#include "swiglu.hpp"
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

// gate[n], up[n] -> h[n] = gate * vmath::sigmoid(gate) * up
template <class T>
void swiglu_fwd(const T* gate, const T* up, T* h, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) h[i] = gate[i] * vmath::sigmoid(gate[i]) * up[i];
}

// dgate = dh * up * s * (1 + gate * (1 - s)),  dup = dh * gate * s   (both overwritten)
template <class T>
void swiglu_bwd(const T* dh, const T* gate, const T* up, T* dgate, T* dup, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T g = gate[i];
    const T s = vmath::sigmoid(g);
    dgate[i] = dh[i] * up[i] * s * (T(1) + g * (T(1) - s));
    dup[i] = dh[i] * g * s;
  }
}

#define PIPER_INSTANTIATE(T)                                    \
  template void swiglu_fwd<T>(const T*, const T*, T*, int64_t); \
  template void swiglu_bwd<T>(const T*, const T*, const T*, T*, T*, int64_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(double)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels
