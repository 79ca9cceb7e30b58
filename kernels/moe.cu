// moe.cu — mixture-of-experts routing on CUDA: the softmax top-k router and its backward (one
// thread per row, the CPU's arithmetic in the CPU's order), the sequence-wise balance loss (one
// block per sequence), the expert-major permutation (a stable counting sort over chunks of the
// assignments: per-chunk counts, a scan over the chunks in order, then each chunk placed in
// order), row gathers and the weighted combine (grid-stride loops, sums in double, k ascending).
#include "cuda_common.cuh"
#include "tensor_ops_cuda.hpp"
#include "moe_cuda.hpp"

#include <stdexcept>
#include <string>

namespace piper::kernels::cuda {
namespace {

constexpr int64_t kMaxBalanceExperts = 4096;  // moe_balance keeps two [E] arrays in shared memory
constexpr int kChunk = 1024;                  // assignments per chunk of moe_permute_index

__device__ __forceinline__ int64_t thread_index() { return blockIdx.x * int64_t(blockDim.x) + threadIdx.x; }
__device__ __forceinline__ int64_t thread_count() { return int64_t(gridDim.x) * blockDim.x; }

// One router row: p[E] = softmax(x[E]) (the exponentials summed in double); idx[K] the K largest
// of p in descending order, ties to the lower index (pick k is the lowest e not yet picked that
// no other unpicked value exceeds); w[K] = p[idx] / sum of p[idx].
__global__ void moe_route_fwd_kernel(const float* logits, float* probs, int32_t* experts,
                                     float* weights, int64_t M, int64_t E, int64_t K) {
  for (int64_t m = thread_index(); m < M; m += thread_count()) {
    const float* x = logits + m * E;
    float* p = probs + m * E;
    int32_t* idx = experts + m * K;
    float mx = x[0];
    for (int64_t e = 1; e < E; ++e) mx = mx < x[e] ? x[e] : mx;
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) {
      p[e] = expf(x[e] - mx);
      sum += p[e];
    }
    const double inv = 1.0 / sum;
    for (int64_t e = 0; e < E; ++e) p[e] = static_cast<float>(p[e] * inv);
    for (int64_t k = 0; k < K; ++k) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool picked = false;
        for (int64_t j = 0; j < k; ++j) picked = picked || idx[j] == e;
        if (!picked && (best < 0 || p[e] > p[best])) best = e;
      }
      idx[k] = static_cast<int32_t>(best);
    }
    double S = 0;
    for (int64_t k = 0; k < K; ++k) S += p[idx[k]];
    for (int64_t k = 0; k < K; ++k) weights[m * K + k] = static_cast<float>(p[idx[k]] / S);
  }
}

// One router row's gradient: dl[E] holds dp = dprobs plus the renormalisation's gradient at the
// picked experts, then becomes the softmax backward of it.
__global__ void moe_route_bwd_kernel(const float* dweights, const float* dprobs,
                                     const float* probs, const int32_t* experts,
                                     const float* weights, float* dlogits, int64_t M, int64_t E,
                                     int64_t K) {
  for (int64_t m = thread_index(); m < M; m += thread_count()) {
    const float* dw = dweights + m * K;
    const float* p = probs + m * E;
    const int32_t* idx = experts + m * K;
    const float* w = weights + m * K;
    float* dl = dlogits + m * E;
    double S = 0, dww = 0;
    for (int64_t k = 0; k < K; ++k) {
      S += p[idx[k]];
      dww += double(dw[k]) * w[k];
    }
    for (int64_t e = 0; e < E; ++e) dl[e] = dprobs[m * E + e];
    for (int64_t k = 0; k < K; ++k) dl[idx[k]] = static_cast<float>(dl[idx[k]] + (dw[k] - dww) / S);
    double dpp = 0;
    for (int64_t e = 0; e < E; ++e) dpp += double(dl[e]) * p[e];
    for (int64_t e = 0; e < E; ++e) dl[e] = static_cast<float>(p[e] * (dl[e] - dpp));
  }
}

// One sequence s (rows s*seq .. s*seq + seq - 1) of the balance loss: part[s] = E * sum_e f_e P_e
// and the sequence's dprobs. Assignments are counted with integer atomics (exact); the column
// sums of probs are split over the warps by rows and the warp parts added in warp order.
// Shared memory: count[E] (int) and coef[E] (float), dynamic.
__global__ void moe_balance_kernel(const float* probs, const int32_t* experts, float* dprobs,
                                   double* part, int64_t E, int64_t K, int64_t seq, float scale) {
  extern __shared__ int count[];
  float* coef = reinterpret_cast<float*>(count + E);
  __shared__ double colpart[kThreads / kWarp][kWarp];
  __shared__ double scratch[kScratch];
  const int64_t r0 = blockIdx.x * seq;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, warps = blockDim.x / kWarp;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) count[e] = 0;
  __syncthreads();
  const int32_t* ex = experts + r0 * K;
  for (int64_t i = threadIdx.x; i < seq * K; i += blockDim.x)
    if (ex[i] >= 0 && ex[i] < E) atomicAdd(&count[ex[i]], 1);
  __syncthreads();
  double aux = 0.0;  // on the lanes of warp 0
  for (int64_t e0 = 0; e0 < E; e0 += kWarp) {
    const int64_t e = e0 + lane;
    double col = 0.0;
    if (e < E)
      for (int64_t r = warp; r < seq; r += warps) col += probs[(r0 + r) * E + e];
    colpart[warp][lane] = col;
    __syncthreads();
    if (warp == 0 && e < E) {
      double c = 0.0;
      for (int w = 0; w < warps; ++w) c += colpart[w][lane];
      const double f = double(count[e]) / double(seq * K);
      aux += f * (c / double(seq));
      coef[e] = static_cast<float>(double(scale) * double(E) * f / double(seq));
    }
    __syncthreads();  // colpart is read; coef is written
  }
  aux = block_sum(aux, scratch);
  if (threadIdx.x == 0) part[blockIdx.x] = double(E) * aux;
  for (int64_t i = threadIdx.x; i < seq * E; i += blockDim.x) dprobs[r0 * E + i] = coef[i % E];
}


// ex[0, n) = the chunk's experts; n = its length
__device__ int load_chunk(const int32_t* experts, int64_t P, int32_t* ex) {
  const int64_t i0 = blockIdx.x * int64_t(kChunk);
  const int n = static_cast<int>(P - i0 < kChunk ? P - i0 : kChunk);
  for (int i = threadIdx.x; i < n; i += blockDim.x) ex[i] = experts[i0 + i];
  __syncthreads();
  return n;
}

// chunk_counts[c][e] = assignments to e in chunk c
__global__ void permute_count_kernel(const int32_t* experts, int32_t* chunk_counts, int64_t P,
                                     int64_t E) {
  __shared__ int32_t ex[kChunk];
  const int n = load_chunk(experts, P, ex);
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t c = 0;
    for (int i = 0; i < n; ++i) c += ex[i] == e;
    chunk_counts[blockIdx.x * E + e] = c;
  }
}

// One block: chunk_counts[c][e] becomes the assignments to e in chunks before c; counts[e] the
// total; base[e] the first permuted row of expert e.
__global__ void permute_scan_kernel(int32_t* chunk_counts, int32_t* counts, int32_t* base,
                                    int64_t chunks, int64_t E) {
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t run = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const int32_t n = chunk_counts[c * E + e];
      chunk_counts[c * E + e] = run;
      run += n;
    }
    counts[e] = run;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t off = 0;
    for (int64_t e = 0; e < E; ++e) {
      base[e] = off;
      off += counts[e];
    }
  }
}

// Each expert's assignments in the chunk, in order, go to its next permuted rows.
__global__ void permute_place_kernel(const int32_t* experts, const int32_t* chunk_offsets,
                                     const int32_t* base, int32_t* rows, int32_t* pos, int64_t P,
                                     int64_t E, int64_t K) {
  __shared__ int32_t ex[kChunk];
  const int n = load_chunk(experts, P, ex);
  const int64_t i0 = blockIdx.x * int64_t(kChunk);
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t p = base[e] + chunk_offsets[blockIdx.x * E + e];
    for (int i = 0; i < n; ++i)
      if (ex[i] == e) {
        rows[p] = static_cast<int32_t>((i0 + i) / K);
        pos[i0 + i] = p++;
      }
  }
}

template <class T>
__global__ void gather_rows_kernel(const T* src, const int32_t* rows, T* dst, int64_t P, int64_t D) {
  for (int64_t i = thread_index(); i < P * D; i += thread_count())
    dst[i] = src[int64_t(rows[i / D]) * D + i % D];
}

template <class T, class U>
__global__ void moe_combine_kernel(const T* y, const int32_t* pos, const float* weights, U* out,
                                   int64_t M, int64_t K, int64_t D) {
  for (int64_t i = thread_index(); i < M * D; i += thread_count()) {
    const int64_t m = i / D, d = i % D;
    double acc = 0.0;
    for (int64_t k = 0; k < K; ++k)
      acc += double(weights[m * K + k]) * double(to_f32(y[int64_t(pos[m * K + k]) * D + d]));
    out[i] = from_f32<U>(static_cast<float>(acc));
  }
}

// dy[pos[m,k]] = weights[m,k] * dout[m]
template <class T>
__global__ void moe_combine_dy_kernel(const T* dout, const int32_t* pos, const float* weights,
                                      T* dy, int64_t M, int64_t K, int64_t D) {
  for (int64_t i = thread_index(); i < M * K * D; i += thread_count()) {
    const int64_t mk = i / D, d = i % D;
    dy[int64_t(pos[mk]) * D + d] = from_f32<T>(weights[mk] * to_f32(dout[(mk / K) * D + d]));
  }
}

// dweights[m,k] = dot(dout[m], y[pos[m,k]]) in double: one warp per (m, k)
template <class T>
__global__ void moe_combine_dw_kernel(const T* dout, const T* y, const int32_t* pos,
                                      float* dweights, int64_t M, int64_t K, int64_t D) {
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarp);
  const int lane = threadIdx.x % kWarp;
  for (int64_t mk = blockIdx.x * int64_t(blockDim.x / kWarp) + threadIdx.x / kWarp; mk < M * K;
       mk += warps) {  // the same (m, k) for a whole warp
    const T* g = dout + (mk / K) * D;
    const T* yr = y + int64_t(pos[mk]) * D;
    double dot = 0.0;
    for (int64_t d = lane; d < D; d += kWarp) dot += double(to_f32(g[d])) * double(to_f32(yr[d]));
    dot = warp_sum(dot);
    if (lane == 0) dweights[mk] = static_cast<float>(dot);
  }
}

template <class T, class U>
__global__ void moe_dispatch_bwd_kernel(const T* dxp, const int32_t* pos, U* dx, int64_t M,
                                        int64_t K, int64_t D) {
  for (int64_t i = thread_index(); i < M * D; i += thread_count()) {
    const int64_t m = i / D, d = i % D;
    double acc = to_f32(dx[i]);
    for (int64_t k = 0; k < K; ++k) acc += double(to_f32(dxp[int64_t(pos[m * K + k]) * D + d]));
    dx[i] = from_f32<U>(static_cast<float>(acc));
  }
}

[[noreturn]] void refuse(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string("piper::kernels::cuda::") + op + ": " + what);
}

}  // namespace

void moe_route_fwd(const float* logits, float* probs, int32_t* experts, float* weights, int64_t M,
                   int64_t E, int64_t K, cudaStream_t s) {
  if (K < 1 || K > E) refuse("moe_route_fwd", "top_k " + std::to_string(K) + " outside [1, E = " + std::to_string(E) + "]");
  if (M == 0) return;
  moe_route_fwd_kernel<<<blocks_for(M), kThreads, 0, s>>>(logits, probs, experts, weights, M, E, K);
  PIPER_CUDA_LAUNCHED("moe_route_fwd");
}

void moe_route_bwd(const float* dweights, const float* dprobs, const float* probs,
                   const int32_t* experts, const float* weights, float* dlogits, int64_t M,
                   int64_t E, int64_t K, cudaStream_t s) {
  if (M == 0) return;
  moe_route_bwd_kernel<<<blocks_for(M), kThreads, 0, s>>>(dweights, dprobs, probs, experts, weights,
                                                          dlogits, M, E, K);
  PIPER_CUDA_LAUNCHED("moe_route_bwd");
}

int64_t moe_balance_workspace_bytes(int64_t M, int64_t seq) {
  return (seq > 0 ? M / seq : 0) * int64_t(sizeof(double));
}

void moe_balance(const float* probs, const int32_t* experts, float* dprobs, double* loss,
                 int64_t M, int64_t E, int64_t K, int64_t seq, float scale, void* work,
                 cudaStream_t s) {
  if (seq <= 0 || M % seq != 0)
    refuse("moe_balance", "seq = " + std::to_string(seq) + " does not divide M = " + std::to_string(M));
  if (E > kMaxBalanceExperts)
    refuse("moe_balance", "E = " + std::to_string(E) + " experts exceed " + std::to_string(kMaxBalanceExperts));
  const int64_t nseq = M / seq;
  if (nseq > 0x7fffffff) refuse("moe_balance", std::to_string(nseq) + " sequences exceed 2^31 - 1");
  double* part = static_cast<double*>(work);
  if (nseq > 0) {
    const size_t smem = size_t(E) * (sizeof(int) + sizeof(float));
    moe_balance_kernel<<<unsigned(nseq), kThreads, smem, s>>>(probs, experts, dprobs, part, E, K, seq, scale);
    PIPER_CUDA_LAUNCHED("moe_balance");
  }
  sum_doubles(part, nseq, loss, s);
}

namespace {
int64_t permute_chunks(int64_t M, int64_t K) { return (M * K + kChunk - 1) / kChunk; }
}  // namespace

int64_t moe_permute_index_workspace_bytes(int64_t M, int64_t E, int64_t K) {
  return (permute_chunks(M, K) + 1) * E * int64_t(sizeof(int32_t));
}

void moe_permute_index(const int32_t* experts, int32_t* counts, int32_t* rows, int32_t* pos,
                       int64_t M, int64_t E, int64_t K, void* work, cudaStream_t s) {
  const int64_t P = M * K, chunks = permute_chunks(M, K);
  if (P > 0x7fffffff) refuse("moe_permute_index", "M*K = " + std::to_string(P) + " exceeds 2^31 - 1");
  if (E == 0) return;
  int32_t* chunk_counts = static_cast<int32_t*>(work);  // [chunks][E]
  int32_t* base = chunk_counts + chunks * E;            // [E]
  if (chunks > 0) {
    permute_count_kernel<<<unsigned(chunks), kThreads, 0, s>>>(experts, chunk_counts, P, E);
    PIPER_CUDA_LAUNCHED("moe_permute_index (count)");
  }
  permute_scan_kernel<<<1, kThreads, 0, s>>>(chunk_counts, counts, base, chunks, E);
  PIPER_CUDA_LAUNCHED("moe_permute_index (scan)");
  if (chunks > 0) {
    permute_place_kernel<<<unsigned(chunks), kThreads, 0, s>>>(experts, chunk_counts, base, rows, pos, P, E, K);
    PIPER_CUDA_LAUNCHED("moe_permute_index (place)");
  }
}

template <class T>
void gather_rows(const T* src, const int32_t* rows, T* dst, int64_t P, int64_t D, cudaStream_t s) {
  if (P * D == 0) return;
  gather_rows_kernel<T><<<blocks_for(P * D), kThreads, 0, s>>>(src, rows, dst, P, D);
  PIPER_CUDA_LAUNCHED("gather_rows");
}

template <class T, class U>
void moe_combine(const T* y, const int32_t* pos, const float* weights, U* out, int64_t M,
                 int64_t K, int64_t D, cudaStream_t s) {
  if (M * D == 0) return;
  moe_combine_kernel<T, U><<<blocks_for(M * D), kThreads, 0, s>>>(y, pos, weights, out, M, K, D);
  PIPER_CUDA_LAUNCHED("moe_combine");
}

template <class T>
void moe_combine_bwd(const T* dout, const T* y, const int32_t* pos, const float* weights, T* dy,
                     float* dweights, int64_t M, int64_t K, int64_t D, cudaStream_t s) {
  if (M * K == 0) return;
  if (D > 0) {
    moe_combine_dy_kernel<T><<<blocks_for(M * K * D), kThreads, 0, s>>>(dout, pos, weights, dy, M, K, D);
    PIPER_CUDA_LAUNCHED("moe_combine_bwd (dy)");
  }
  moe_combine_dw_kernel<T><<<blocks_for(M * K, kThreads / kWarp), kThreads, 0, s>>>(dout, y, pos, dweights, M, K, D);
  PIPER_CUDA_LAUNCHED("moe_combine_bwd (dweights)");
}

template <class T, class U>
void moe_dispatch_bwd(const T* dxp, const int32_t* pos, U* dx, int64_t M, int64_t K, int64_t D,
                      cudaStream_t s) {
  if (M * D == 0) return;
  moe_dispatch_bwd_kernel<T, U><<<blocks_for(M * D), kThreads, 0, s>>>(dxp, pos, dx, M, K, D);
  PIPER_CUDA_LAUNCHED("moe_dispatch_bwd");
}

#define PIPER_INSTANTIATE(T)                                                                      \
  template void gather_rows<T>(const T*, const int32_t*, T*, int64_t, int64_t, cudaStream_t);     \
  template void moe_combine_bwd<T>(const T*, const T*, const int32_t*, const float*, T*, float*, \
                                   int64_t, int64_t, int64_t, cudaStream_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(__nv_bfloat16)
#undef PIPER_INSTANTIATE
// The rows' type, then the output's.
#define PIPER_INSTANTIATE_MIXED(T, U)                                                             \
  template void moe_combine<T, U>(const T*, const int32_t*, const float*, U*, int64_t, int64_t,   \
                                  int64_t, cudaStream_t);                                         \
  template void moe_dispatch_bwd<T, U>(const T*, const int32_t*, U*, int64_t, int64_t, int64_t,   \
                                       cudaStream_t);
PIPER_INSTANTIATE_MIXED(float, float)
PIPER_INSTANTIATE_MIXED(__nv_bfloat16, __nv_bfloat16)
PIPER_INSTANTIATE_MIXED(__nv_bfloat16, float)
PIPER_INSTANTIATE_MIXED(float, __nv_bfloat16)
#undef PIPER_INSTANTIATE_MIXED

}  // namespace piper::kernels::cuda
