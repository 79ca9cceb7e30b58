// vmath.hpp — vectorisable elementwise math shared by the CPU kernels.
// GCC does not vectorise std::exp without -ffast-math; these are written so
// that plain and `omp simd` loops do. Double versions (the gradient-check
// path) use the standard library.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace piper::kernels::vmath {

// Cephes expf: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2 (ln2 split in
// a part exact in float and the remainder), degree-7 polynomial for exp(r),
// scaled by 2^n built from the exponent bits. Within 1 ulp over [-87.3, 88.4];
// saturates above, 0 below -87.3, NaN propagates.
[[gnu::always_inline]] inline float exp(float x) {
  const float xc = std::min(std::max(x, -87.33654f), 88.37626f);
  const float t = xc * 1.44269504088896341f + 12582912.0f;  // + 1.5 * 2^23 rounds x / ln2
  const float fn = t - 12582912.0f;                         // n as float ...
  const int32_t n = std::bit_cast<int32_t>(t) - 0x4B400000;  // ... and as int
  float r = xc - fn * 0.693359375f;
  r = r + fn * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const float e = p * std::bit_cast<float>((n + 127) << 23);
  return x < -87.33654f ? 0.0f : e;
}
inline double exp(double x) { return std::exp(x); }

// sigmoid from e = exp(-|v|) in (0, 1]: no overflow for either sign.
template <class T>
[[gnu::always_inline]] inline T sigmoid(T v) {
  const T e = vmath::exp(v < T(0) ? v : -v);
  const T r = T(1) / (T(1) + e);
  return v >= T(0) ? r : e * r;
}

}  // namespace piper::kernels::vmath
