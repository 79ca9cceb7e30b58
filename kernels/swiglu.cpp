// swiglu.cpp — elementwise SwiGLU gate, h = silu(gate) * up, and its backward.
#include "swiglu.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>

namespace piper::kernels {

namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMin = int64_t(1) << 14;

// exp(x) in float that GCC vectorises inside `omp simd` loops (std::exp does not without
// -ffast-math): Cody-Waite range reduction x = n*ln2 + r, |r| <= ln2/2, then the Cephes
// degree-7 polynomial; worst relative error 8.6e-8 (< 1 ulp) over [-87.3, 88.4].
// Saturates to 2.4e38 above 88.4, returns 0 below -87.3, propagates NaN.
// (Same function as in silu.cpp / cross_entropy.cpp; kept file-local.)
inline float exp_vec(float x) {
  const float xc = std::min(std::max(x, -87.33654f), 88.37626f);
  const float n = std::nearbyint(xc * 1.44269504088896341f);
  float r = xc - n * 0.693359375f;  // ln2 split in a high part exact in float ...
  r = r - n * -2.12194440e-4f;      // ... and the remainder
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);  // 2^n
  const float e = p * scale;
  return x < -87.33654f ? 0.0f : e;
}
// float: the vectorisable exp above; double (the gradient-check path): std::exp.
template <class T>
inline T exp_t(T x) {
  if constexpr (std::is_same_v<T, float>)
    return exp_vec(x);
  else
    return std::exp(x);
}
template <class T>
inline T sigmoid(T x) {
  return T(1) / (T(1) + exp_t(-x));
}

}  // namespace

// gate[n], up[n] -> h[n] = gate * sigmoid(gate) * up
template <class T>
void swiglu_fwd(const T* gate, const T* up, T* h, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) h[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

// dgate = dh * up * s * (1 + gate * (1 - s)),  dup = dh * gate * s   (both overwritten)
template <class T>
void swiglu_bwd(const T* dh, const T* gate, const T* up, T* dgate, T* dup, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T g = gate[i];
    const T s = sigmoid(g);
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
