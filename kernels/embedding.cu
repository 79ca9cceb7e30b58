// embedding.cu — token embedding lookup (a row gather) and its deterministic backward on CUDA.
// The backward sorts the rows m by table row (cub's stable radix sort: rows of one id stay in
// ascending m), then the first sorted position of each table row sums that row's dout rows in
// that order onto dtable: no atomics, the CPU's order of additions.
#include "cuda_common.cuh"
#include "embedding_cuda.hpp"

#include <cub/device/device_radix_sort.cuh>

#include <stdexcept>
#include <string>

namespace piper::kernels::cuda {
namespace {

template <class Tt, class T>
__global__ void embedding_fwd_kernel(const int32_t* ids, const Tt* table, T* out, int64_t M,
                                     int64_t D, int64_t V, int64_t offset) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < M * D;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = int64_t(ids[i / D]) - offset;
    out[i] = from_f32<T>(row >= 0 && row < V ? to_f32(table[row * D + i % D]) : 0.0f);
  }
}

// keys[m] = the table row of ids[m], V when outside the table; order[m] = m
__global__ void embedding_keys_kernel(const int32_t* ids, int32_t* keys, int32_t* order, int64_t M,
                                      int64_t V, int64_t offset) {
  for (int64_t m = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; m < M;
       m += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = int64_t(ids[m]) - offset;
    keys[m] = static_cast<int32_t>(row >= 0 && row < V ? row : V);
    order[m] = static_cast<int32_t>(m);
  }
}

// One block per sorted position i that starts a run of equal keys inside the table: dtable[key]
// += the dout rows of the run, in sorted (= ascending m) order.
template <class T>
__global__ void embedding_bwd_runs_kernel(const int32_t* keys, const int32_t* order, const T* dout,
                                          float* dtable, int64_t M, int64_t D, int32_t V) {
  for (int64_t i = blockIdx.x; i < M; i += gridDim.x) {
    const int32_t row = keys[i];
    if (row == V || (i > 0 && keys[i - 1] == row)) continue;  // the whole block skips
    int64_t end = i + 1;
    while (end < M && keys[end] == row) ++end;
    float* dst = dtable + int64_t(row) * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      float acc = dst[d];
      for (int64_t j = i; j < end; ++j) acc += to_f32(dout[int64_t(order[j]) * D + d]);
      dst[d] = acc;
    }
  }
}

// The bits the radix sort looks at: enough for keys 0..V.
int key_bits(int64_t V) {
  int bits = 1;
  while ((int64_t(1) << bits) <= V) ++bits;
  return bits;
}

int64_t align256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// The parts of embedding_bwd's workspace: four [M] int32 arrays, then cub's scratch.
struct SortSpace {
  int32_t *keys_in, *keys_out, *order_in, *order_out;
  void* temp;
  size_t temp_bytes;
};

size_t sort_temp_bytes(int64_t M, int64_t V) {
  size_t bytes = 0;
  PIPER_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                                   static_cast<int32_t*>(nullptr),
                                                   static_cast<const int32_t*>(nullptr),
                                                   static_cast<int32_t*>(nullptr), int(M), 0,
                                                   key_bits(V)));
  return bytes;
}

SortSpace sort_space(void* work, int64_t M, int64_t V) {
  char* p = static_cast<char*>(work);
  const int64_t arr = align256(M * int64_t(sizeof(int32_t)));
  return {reinterpret_cast<int32_t*>(p), reinterpret_cast<int32_t*>(p + arr),
          reinterpret_cast<int32_t*>(p + 2 * arr), reinterpret_cast<int32_t*>(p + 3 * arr),
          p + 4 * arr, sort_temp_bytes(M, V)};
}

void check_sizes(int64_t M, int64_t V) {
  if (M > 0x7ffffffe || V > 0x7ffffffe)
    throw std::invalid_argument("piper::kernels::cuda::embedding_bwd: M = " + std::to_string(M) +
                                ", V = " + std::to_string(V) + ": each must be at most 2^31 - 2");
}

}  // namespace

template <class Tt, class T>
void embedding_fwd(const int32_t* ids, const Tt* table, T* out, int64_t M, int64_t D, int64_t V,
                   int64_t offset, cudaStream_t s) {
  if (M * D == 0) return;
  embedding_fwd_kernel<Tt, T><<<blocks_for(M * D), kThreads, 0, s>>>(ids, table, out, M, D, V, offset);
  PIPER_CUDA_LAUNCHED("embedding_fwd");
}

int64_t embedding_bwd_workspace_bytes(int64_t M, int64_t V) {
  check_sizes(M, V);
  return 4 * align256(M * int64_t(sizeof(int32_t))) + int64_t(sort_temp_bytes(M, V));
}

template <class T>
void embedding_bwd(const int32_t* ids, const T* dout, float* dtable, int64_t M, int64_t D,
                   int64_t V, int64_t offset, void* work, cudaStream_t s) {
  check_sizes(M, V);
  if (M == 0 || D == 0) return;
  SortSpace w = sort_space(work, M, V);
  embedding_keys_kernel<<<blocks_for(M), kThreads, 0, s>>>(ids, w.keys_in, w.order_in, M, V, offset);
  PIPER_CUDA_LAUNCHED("embedding_bwd (keys)");
  PIPER_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(w.temp, w.temp_bytes, w.keys_in, w.keys_out,
                                                   w.order_in, w.order_out, int(M), 0,
                                                   key_bits(V), s));
  embedding_bwd_runs_kernel<T><<<blocks_for(M, 1), kThreads, 0, s>>>(w.keys_out, w.order_out, dout,
                                                                     dtable, M, D, int32_t(V));
  PIPER_CUDA_LAUNCHED("embedding_bwd");
}

#define PIPER_INSTANTIATE_FWD(Tt, T)                                                              \
  template void embedding_fwd<Tt, T>(const int32_t*, const Tt*, T*, int64_t, int64_t, int64_t,    \
                                     int64_t, cudaStream_t);
PIPER_INSTANTIATE_FWD(float, float)
PIPER_INSTANTIATE_FWD(__nv_bfloat16, float)
PIPER_INSTANTIATE_FWD(__nv_bfloat16, __nv_bfloat16)
#undef PIPER_INSTANTIATE_FWD
#define PIPER_INSTANTIATE_BWD(T)                                                                  \
  template void embedding_bwd<T>(const int32_t*, const T*, float*, int64_t, int64_t, int64_t,     \
                                 int64_t, void*, cudaStream_t);
PIPER_INSTANTIATE_BWD(float)
PIPER_INSTANTIATE_BWD(__nv_bfloat16)
#undef PIPER_INSTANTIATE_BWD

}  // namespace piper::kernels::cuda
