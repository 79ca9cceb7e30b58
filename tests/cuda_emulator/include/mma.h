// mma.h — CUDA's warp matrix functions (nvcuda::wmma) on the emulated device (cuda_runtime.h), as
// piper's kernels use them: the 16 x 16 x 16 shape, bf16 operands, f32 accumulators.
//
// Each call is warp-wide, as on a GPU: it runs once the whole warp has reached it (a lane that has
// returned, or a warp whose lanes reach different calls, is a fault), and the rules CUDA's
// programming guide sets for it are checked there: every lane passes the same pointer, stride and
// layout; the pointer is 256-bit aligned; the stride is a multiple of 16 bytes and spans a tile's
// row (or column). A product is f32 arithmetic on the bf16 operands, k in ascending order, added
// to the accumulator. Lane l of a warp holds elements [l n, (l + 1) n) of its fragment's tile in
// row-major order, n = num_elements; a GPU spreads them otherwise, which no kernel may rely on.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace emulated {

constexpr int kLanes = 32;

template <class Use, int M, int N, int K>
struct Extent {  // the fragment's tile: A is M x K, B is K x N, the accumulator M x N
  static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
};

template <class Layout>
constexpr layout_t layout_of() {
  return std::is_same_v<Layout, col_major> ? mem_col_major : mem_row_major;
}

// One lane's part of a load or store: its fragment's elements and the memory the warp names.
struct Access {
  void* elements;
  const void* memory;
  unsigned ldm;
  layout_t layout;
};

// One lane's part of a product D = A B + C.
struct Product {
  float* d;
  const __nv_bfloat16* a;
  const __nv_bfloat16* b;
  const float* c;
};

inline float value(float v) { return v; }
inline float value(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class E>
E element_of(float v) {
  if constexpr (std::is_same_v<E, float>)
    return v;
  else
    return __float2bfloat16_rn(v);
}

// What is wrong with the warp's access to a rows x cols tile of E, or "".
template <class E, int R, int C>
std::string check_access(const char* call, void* const* lanes) {
  const Access& lead = *static_cast<const Access*>(lanes[0]);
  char b[256];
  for (int l = 1; l < kLanes; ++l) {
    const Access& a = *static_cast<const Access*>(lanes[l]);
    if (a.memory != lead.memory || a.ldm != lead.ldm || a.layout != lead.layout) {
      std::snprintf(b, sizeof b, "%s: lane %d passes pointer %p, stride %u, layout %d, lane 0 %p, %u, %d (every lane must pass the same)",
                    call, l, a.memory, a.ldm, int(a.layout), lead.memory, lead.ldm, int(lead.layout));
      return b;
    }
  }
  const unsigned span = lead.layout == mem_row_major ? C : R;
  if (reinterpret_cast<uintptr_t>(lead.memory) % 32 != 0 || (lead.ldm * sizeof(E)) % 16 != 0 || lead.ldm < span) {
    std::snprintf(b, sizeof b, "%s: pointer %p with stride %u elements of %zu bytes; the pointer must be 256-bit aligned, the "
                  "stride a multiple of 16 bytes and at least %u elements", call, lead.memory, lead.ldm, sizeof(E), span);
    return b;
  }
  return "";
}

template <class E, int R, int C>
std::string load(void* const* lanes) {
  std::string error = check_access<E, R, C>("wmma::load_matrix_sync", lanes);
  if (!error.empty()) return error;
  const Access& lead = *static_cast<const Access*>(lanes[0]);
  const E* m = static_cast<const E*>(lead.memory);
  constexpr int n = R * C / kLanes;
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const int at = r * C + c;
      const E v = m[lead.layout == mem_row_major ? size_t(r) * lead.ldm + c : size_t(c) * lead.ldm + r];
      static_cast<E*>(static_cast<const Access*>(lanes[at / n])->elements)[at % n] = v;
    }
  return "";
}

template <int R, int C>
std::string store(void* const* lanes) {
  std::string error = check_access<float, R, C>("wmma::store_matrix_sync", lanes);
  if (!error.empty()) return error;
  const Access& lead = *static_cast<const Access*>(lanes[0]);
  float* m = static_cast<float*>(const_cast<void*>(lead.memory));
  constexpr int n = R * C / kLanes;
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const int at = r * C + c;
      m[lead.layout == mem_row_major ? size_t(r) * lead.ldm + c : size_t(c) * lead.ldm + r] =
          static_cast<const float*>(static_cast<const Access*>(lanes[at / n])->elements)[at % n];
    }
  return "";
}

inline std::string product(void* const* lanes) {
  constexpr int S = 16, n = S * S / kLanes;
  float A[S][S], B[S][S], D[S][S];
  for (int at = 0; at < S * S; ++at) {
    const Product& p = *static_cast<const Product*>(lanes[at / n]);
    A[at / S][at % S] = value(p.a[at % n]);
    B[at / S][at % S] = value(p.b[at % n]);
    D[at / S][at % S] = p.c[at % n];
  }
  for (int i = 0; i < S; ++i)
    for (int j = 0; j < S; ++j) {
      float s = 0.0f;
      for (int k = 0; k < S; ++k) s += A[i][k] * B[k][j];
      D[i][j] += s;
    }
  for (int at = 0; at < S * S; ++at) static_cast<const Product*>(lanes[at / n])->d[at % n] = D[at / S][at % S];
  return "";
}

}  // namespace emulated

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulated wmma takes the m16n16k16 shape");
  static_assert(std::is_same_v<Use, accumulator> ? std::is_same_v<T, float> && std::is_void_v<Layout>
                                                 : std::is_same_v<T, __nv_bfloat16> && !std::is_void_v<Layout>,
                "the emulated wmma takes bf16 operands with a layout and f32 accumulators without one");

 public:
  using element_type = T;
  static constexpr int rows = emulated::Extent<Use, M, N, K>::rows, cols = emulated::Extent<Use, M, N, K>::cols;
  static constexpr int num_elements = rows * cols / emulated::kLanes;
  T x[num_elements];
};

template <class Use, int M, int N, int K, class T, class Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, T v) {
  for (T& e : f.x) e = v;
}

template <class Use, int M, int N, int K, class T, class Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ldm) {
  using F = fragment<Use, M, N, K, T, Layout>;
  emulated::Access a{f.x, p, ldm, emulated::layout_of<Layout>()};
  ::piper::cuda_emulator::warp_collective(&emulated::load<T, F::rows, F::cols>, &a);
}
template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm, layout_t layout) {
  emulated::Access a{f.x, p, ldm, layout};
  ::piper::cuda_emulator::warp_collective(&emulated::load<float, M, N>, &a);
}
template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t layout) {
  emulated::Access a{const_cast<float*>(f.x), p, ldm, layout};
  ::piper::cuda_emulator::warp_collective(&emulated::store<M, N>, &a);
}

template <int M, int N, int K, class LA, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, __nv_bfloat16, LA>& a,
              const fragment<matrix_b, M, N, K, __nv_bfloat16, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
  emulated::Product p{d.x, a.x, b.x, c.x};
  ::piper::cuda_emulator::warp_collective(&emulated::product, &p);
}

}  // namespace nvcuda::wmma
