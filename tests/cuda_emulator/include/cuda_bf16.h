// cuda_bf16.h — CUDA's bfloat16 type on the emulated device (cuda_runtime.h): the upper 16 bits
// of an IEEE f32, converted as CUDA's host code converts it (to nearest even, a NaN to the
// canonical NaN 0x7fff).
#pragma once

#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  unsigned short __x;
};

inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t u = static_cast<uint32_t>(h.__x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {0x7fffu};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<unsigned short>(u >> 16)};
}

inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
