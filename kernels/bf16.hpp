// bf16.hpp — bfloat16 on the CPU: the upper 16 bits of an IEEE f32, rounded to nearest even. The CPU
// backend stores bf16 tensors this way and computes on f32 copies (docs/backend.md, "bf16 storage"),
// the contract the CUDA backend's __nv_bfloat16 keeps.
#pragma once

#include <cstdint>
#include <cstring>

namespace piper::kernels {

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN stays a quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f = 0;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// dst[i] = bf16_to_f32(src[i]), i < n
void bf16_to_f32(const uint16_t* src, float* dst, int64_t n);
// dst[i] = f32_to_bf16(src[i]), i < n
void f32_to_bf16(const float* src, uint16_t* dst, int64_t n);
// dst[i] = src[i] rounded to the nearest bf16 (even on ties), kept as f32: a bf16 product's inputs.
void round_to_bf16(const float* src, float* dst, int64_t n);

}  // namespace piper::kernels
