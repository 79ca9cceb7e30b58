// embedding.cpp — token embedding lookup (row gather) and its deterministic scatter-add backward.
#include "embedding.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>

namespace piper::kernels {

namespace {
// Below this many copied/added values a parallel region costs more than it saves.
constexpr int64_t kParallelMin = int64_t(1) << 15;
// Column chunks handed to threads in embedding_bwd are multiples of this many values
// (a 64-byte cache line of floats), so threads never share a line of dtable.
constexpr int64_t kColAlign = 16;
}  // namespace

// ids[M], table[V,D] holding ids offset..offset+V-1 -> out[M,D]
template <class T>
void embedding_fwd(const int32_t* ids, const T* table, T* out, int64_t M, int64_t D, int64_t V,
                   int64_t offset) {
  const size_t bytes = static_cast<size_t>(D) * sizeof(T);
#pragma omp parallel for schedule(static) if (M * D >= kParallelMin)
  for (int64_t m = 0; m < M; ++m) {
    const int64_t row = static_cast<int64_t>(ids[m]) - offset;
    if (row >= 0 && row < V)
      std::memcpy(out + m * D, table + row * D, bytes);
    else
      std::memset(out + m * D, 0, bytes);
  }
}

// dtable[V,D] += scatter of dout[M,D] by ids[M].
// Each thread owns a contiguous range of columns and walks the rows m = 0..M-1 in order,
// so every dtable element is summed in the same order whatever the thread count.
template <class T>
void embedding_bwd(const int32_t* ids, const T* dout, T* dtable, int64_t M, int64_t D, int64_t V,
                   int64_t offset) {
  if (M <= 0 || D <= 0) return;
  auto add_cols = [&](int64_t d0, int64_t d1) {
    for (int64_t m = 0; m < M; ++m) {
      const int64_t row = static_cast<int64_t>(ids[m]) - offset;
      if (row < 0 || row >= V) continue;
      const T* src = dout + m * D;
      T* dst = dtable + row * D;
#pragma omp simd
      for (int64_t d = d0; d < d1; ++d) dst[d] += src[d];
    }
  };
  if (M * D < kParallelMin || D < 2 * kColAlign) {
    add_cols(0, D);
    return;
  }
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads();
    const int64_t t = omp_get_thread_num();
    const int64_t chunk = ((D + nt - 1) / nt + kColAlign - 1) / kColAlign * kColAlign;
    const int64_t d0 = std::min(D, t * chunk);
    const int64_t d1 = std::min(D, d0 + chunk);
    if (d0 < d1) add_cols(d0, d1);
  }
}

#define PIPER_INSTANTIATE(T)                                                      \
  template void embedding_fwd<T>(const int32_t*, const T*, T*, int64_t, int64_t, int64_t, int64_t); \
  template void embedding_bwd<T>(const int32_t*, const T*, T*, int64_t, int64_t, int64_t, int64_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(double)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels
