// cross_entropy.cu — fused softmax cross-entropy over rows of logits on CUDA, and the pieces of the
// vocab-parallel loss (row_max, partials, finish). One block per row; every sum runs in a fixed
// order for the fixed block size, and the row losses are summed in double by one block, so the
// loss does not change from run to run.
#include "cross_entropy_cuda.hpp"
#include "cuda_common.cuh"
#include "tensor_ops_cuda.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace piper::kernels::cuda {
namespace {


// mx = the max of a row x[V], sum = the sum of exp(x - mx), for every thread of the block. Each
// thread keeps a running max and a sum rescaled when that max grows (one pass over the row),
// then the block merges them. A NaN anywhere in the row makes the sum NaN, as on the CPU (the
// running max would skip one met before any number).
template <class T>
__device__ void row_max_sum(const T* x, int64_t V, float* scratch, float& mx, float& sum) {
  float m = -INFINITY, s = 0.0f;
  int nan_seen = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float xv = to_f32(x[v]);
    nan_seen |= isnan(xv);
    if (xv > m) {
      s = s * expf(m - xv) + 1.0f;  // the first value: 0 * 0 + 1
      m = xv;
    } else if (m > -INFINITY) {
      s += expf(xv - m);
    }
  }
  mx = block_max(m, scratch);
  sum = block_sum(m > -INFINITY ? s * expf(m - mx) : 0.0f, scratch);
  if (__syncthreads_or(nan_seen)) sum = NAN;
}

// row_loss[m] = logsumexp(logits[m]) - logits[m, t]; dlogits[m] (optional) = (softmax - onehot) * scale
template <class T>
__global__ void cross_entropy_kernel(const T* logits, const int32_t* targets, T* dlogits,
                                     double* row_loss, int64_t V, float scale) {
  __shared__ float scratch[kScratch];
  const int64_t m = blockIdx.x;
  const T* x = logits + m * V;
  float mx, sum;
  row_max_sum(x, V, scratch, mx, sum);
  const int64_t t = targets[m];
  if (dlogits) {
    T* d = dlogits + m * V;
    const float k = scale / sum;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
      d[v] = from_f32<T>(expf(to_f32(x[v]) - mx) * k - (v == t ? scale : 0.0f));
  }
  if (threadIdx.x == 0)
    row_loss[m] = t >= 0 && t < V ? double(mx) + log(double(sum)) - double(to_f32(x[t]))
                                  : static_cast<double>(NAN);
}


template <class T>
__global__ void row_max_kernel(const T* x, float* out, int64_t N) {
  __shared__ float scratch[kScratch];
  const T* row = x + int64_t(blockIdx.x) * N;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < N; v += blockDim.x) m = fmaxf(m, to_f32(row[v]));
  m = block_max(m, scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = m;
}

template <class T>
__global__ void vocab_ce_partials_kernel(const T* logits, const float* row_max,
                                         const int32_t* targets, int64_t offset, T* exps,
                                         float* sums, int64_t M, int64_t V) {
  __shared__ float scratch[kScratch];
  const int64_t m = blockIdx.x;
  const T* l = logits + m * V;
  T* e = exps + m * V;
  const float mx = row_max[m];
  float s = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float ev = expf(to_f32(l[v]) - mx);
    e[v] = from_f32<T>(ev);
    s += ev;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) {
    const int64_t t = targets[m] - offset;
    sums[m] = s;
    sums[M + m] = t >= 0 && t < V ? to_f32(l[t]) : 0.0f;
  }
}

// dlogits[m] (holding exps) *= scale / sums[m], minus scale at the target when it is in this shard
template <class T>
__global__ void vocab_ce_scale_kernel(const float* sums, const int32_t* targets, int64_t offset,
                                      T* dlogits, int64_t V, float scale) {
  const int64_t m = blockIdx.x;
  T* d = dlogits + m * V;
  const float k = (1.0f / sums[m]) * scale;
  const int64_t t = targets[m] - offset;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    d[v] = from_f32<T>(to_f32(d[v]) * k - (v == t ? scale : 0.0f));
}

// *loss = sum over m of log(sums[m]) + row_max[m] - sums[M + m], one block
__global__ void vocab_ce_loss_kernel(const float* sums, const float* row_max, double* loss,
                                     int64_t M) {
  __shared__ double scratch[kScratch];
  double s = 0.0;
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x)
    s += log(double(sums[m])) + double(row_max[m]) - double(sums[M + m]);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) *loss = s;
}

// One block per row: M must fit the grid.
void check_rows(const char* op, int64_t M) {
  if (M > 0x7fffffff)
    throw std::invalid_argument(std::string("piper::kernels::cuda::") + op + ": M = " +
                                std::to_string(M) + " rows exceed 2^31 - 1");
}

}  // namespace

int64_t cross_entropy_workspace_bytes(int64_t M) { return M * int64_t(sizeof(double)); }

template <class T>
void cross_entropy(const T* logits, const int32_t* targets, T* dlogits, double* loss, int64_t M,
                   int64_t V, float scale, void* work, cudaStream_t s) {
  check_rows("cross_entropy", M);
  double* row_loss = static_cast<double*>(work);
  if (M > 0) {
    cross_entropy_kernel<T><<<unsigned(M), kThreads, 0, s>>>(logits, targets, dlogits, row_loss, V, scale);
    PIPER_CUDA_LAUNCHED("cross_entropy");
  }
  sum_doubles(row_loss, M, loss, s);
}

template <class T>
void row_max(const T* x, float* out, int64_t M, int64_t N, cudaStream_t s) {
  check_rows("row_max", M);
  if (M == 0) return;
  row_max_kernel<T><<<unsigned(M), kThreads, 0, s>>>(x, out, N);
  PIPER_CUDA_LAUNCHED("row_max");
}

template <class T>
void vocab_ce_partials(const T* logits, const float* row_max, const int32_t* targets,
                       int64_t offset, T* exps, float* sums, int64_t M, int64_t V,
                       cudaStream_t s) {
  check_rows("vocab_ce_partials", M);
  if (M == 0) return;
  vocab_ce_partials_kernel<T><<<unsigned(M), kThreads, 0, s>>>(logits, row_max, targets, offset,
                                                               exps, sums, M, V);
  PIPER_CUDA_LAUNCHED("vocab_ce_partials");
}

template <class T>
void vocab_ce_finish(const float* sums, const float* row_max, const int32_t* targets,
                     int64_t offset, T* dlogits, double* loss, int64_t M, int64_t V, float scale,
                     cudaStream_t s) {
  check_rows("vocab_ce_finish", M);
  if (M > 0) {
    vocab_ce_scale_kernel<T><<<unsigned(M), kThreads, 0, s>>>(sums, targets, offset, dlogits, V, scale);
    PIPER_CUDA_LAUNCHED("vocab_ce_finish");
  }
  vocab_ce_loss_kernel<<<1, kThreads, 0, s>>>(sums, row_max, loss, M);
  PIPER_CUDA_LAUNCHED("vocab_ce_finish (loss)");
}

#define PIPER_INSTANTIATE(T)                                                                     \
  template void cross_entropy<T>(const T*, const int32_t*, T*, double*, int64_t, int64_t, float, \
                                 void*, cudaStream_t);                                           \
  template void row_max<T>(const T*, float*, int64_t, int64_t, cudaStream_t);                    \
  template void vocab_ce_partials<T>(const T*, const float*, const int32_t*, int64_t, T*, float*, \
                                     int64_t, int64_t, cudaStream_t);                            \
  template void vocab_ce_finish<T>(const float*, const float*, const int32_t*, int64_t, T*,      \
                                   double*, int64_t, int64_t, float, cudaStream_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(__nv_bfloat16)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels::cuda
