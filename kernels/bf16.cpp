// bf16.cpp — bf16 <-> f32 over arrays (bf16.hpp).
#include "bf16.hpp"

namespace piper::kernels {

void bf16_to_f32(const uint16_t* src, float* dst, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

void f32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void round_to_bf16(const float* src, float* dst, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(f32_to_bf16(src[i]));
}

}  // namespace piper::kernels
