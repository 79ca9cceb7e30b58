// tensor_ops.cu — column slices, in-place add, the sum of squares and fixed-order column sums on
// CUDA.
#include "cuda_common.cuh"
#include "tensor_ops_cuda.hpp"

namespace piper::kernels::cuda {
namespace {

constexpr int64_t kSumBlock = 4096;  // elements of one sum_squares partial

template <class T>
__global__ void copy_cols_kernel(const T* src, int64_t src_ld, int64_t src_col, T* dst, int64_t dst_ld,
                                 int64_t dst_col, int64_t n, int64_t M) {
  const int64_t total = M * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, j = i % n;
    dst[r * dst_ld + dst_col + j] = src[r * src_ld + src_col + j];
  }
}

template <class T>
__global__ void add_kernel(T* y, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_f32<T>(to_f32(y[i]) + to_f32(x[i]));
}

template <class S, class D>
__global__ void convert_kernel(const S* src, D* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = from_f32<D>(to_f32(src[i]));
}

// One block per kSumBlock elements: part[b] = sum of their squares (fixed order within the block).
template <class T>
__global__ void sum_squares_partial(const T* x, int64_t n, double* part) {
  __shared__ double scratch[kThreads / kWarp];
  const int64_t begin = blockIdx.x * kSumBlock, end = min(n, begin + kSumBlock);
  double s = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = to_f32(x[i]);
    s += v * v;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// *out = sum of x[0, n), one block
__global__ void sum_kernel(const double* x, int64_t n, double* out) {
  __shared__ double scratch[kScratch];
  const double s = block_sum_of(x, n, scratch);
  if (threadIdx.x == 0) *out = s;
}

__global__ void column_sums_kernel(const float* part, int64_t R, int64_t D, float* dst) {
  const int64_t d = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (d >= D) return;
  double s = 0;
  for (int64_t r = 0; r < R; ++r) s += part[r * D + d];
  dst[d] += static_cast<float>(s);
}

}  // namespace

template <class T>
void gather_cols(const T* src, int64_t S, int64_t col, T* dst, int64_t n, int64_t M, cudaStream_t s) {
  if (M * n == 0) return;
  copy_cols_kernel<T><<<blocks_for(M * n), kThreads, 0, s>>>(src, S, col, dst, n, 0, n, M);
  PIPER_CUDA_LAUNCHED("gather_cols");
}

template <class T>
void scatter_cols(const T* src, int64_t n, T* dst, int64_t S, int64_t col, int64_t M, cudaStream_t s) {
  if (M * n == 0) return;
  copy_cols_kernel<T><<<blocks_for(M * n), kThreads, 0, s>>>(src, n, 0, dst, S, col, n, M);
  PIPER_CUDA_LAUNCHED("scatter_cols");
}

template <class S, class D>
void convert(const S* src, D* dst, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  convert_kernel<S, D><<<blocks_for(n), kThreads, 0, s>>>(src, dst, n);
  PIPER_CUDA_LAUNCHED("convert");
}

template <class T>
void add_inplace(T* y, const T* x, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  add_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(y, x, n);
  PIPER_CUDA_LAUNCHED("add_inplace");
}

int64_t sum_squares_workspace_bytes(int64_t n) {
  return ((n + kSumBlock - 1) / kSumBlock) * static_cast<int64_t>(sizeof(double));
}

template <class T>
void sum_squares(const T* x, int64_t n, double* out, void* work, cudaStream_t s) {
  const int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  auto* part = static_cast<double*>(work);
  if (blocks > 0) {
    sum_squares_partial<T><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(x, n, part);
    PIPER_CUDA_LAUNCHED("sum_squares (partials)");
  }
  sum_doubles(part, blocks, out, s);
}

void sum_doubles(const double* x, int64_t n, double* out, cudaStream_t s) {
  sum_kernel<<<1, kThreads, 0, s>>>(x, n, out);
  PIPER_CUDA_LAUNCHED("sum_doubles");
}

void add_column_sums(const float* part, int64_t R, int64_t D, float* dst, cudaStream_t s) {
  if (D == 0) return;
  column_sums_kernel<<<blocks_for(D), kThreads, 0, s>>>(part, R, D, dst);
  PIPER_CUDA_LAUNCHED("add_column_sums");
}

#define PIPER_INSTANTIATE(T)                                                                        \
  template void gather_cols<T>(const T*, int64_t, int64_t, T*, int64_t, int64_t, cudaStream_t);     \
  template void scatter_cols<T>(const T*, int64_t, T*, int64_t, int64_t, int64_t, cudaStream_t);    \
  template void add_inplace<T>(T*, const T*, int64_t, cudaStream_t);                                \
  template void sum_squares<T>(const T*, int64_t, double*, void*, cudaStream_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(__nv_bfloat16)
#undef PIPER_INSTANTIATE
template void convert<float, __nv_bfloat16>(const float*, __nv_bfloat16*, int64_t, cudaStream_t);
template void convert<__nv_bfloat16, float>(const __nv_bfloat16*, float*, int64_t, cudaStream_t);

}  // namespace piper::kernels::cuda
