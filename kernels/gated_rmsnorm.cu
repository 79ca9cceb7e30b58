// gated_rmsnorm.cu — Mamba-2 gated grouped RMSNorm on CUDA: out = grouped_rmsnorm(y * silu(z)) * w.
//
// y[M,Di], z[M,Di], w[Di]; G contiguous groups of Dg = Di/G channels per row.
//   g = y * silu(z);  rstd[m,grp] = 1/sqrt(mean_{i in grp} g_i^2 + eps);  out = g * rstd * w
// One block per (row, group) for the forward and the dy/dz backward (block_sum over the group);
// dw from partials per kPartialRows rows summed in order (add_column_sums).
#include <stdexcept>
#include <string>

#include "cuda_common.cuh"
#include "gated_rmsnorm_cuda.hpp"
#include "tensor_ops_cuda.hpp"

namespace piper::kernels::cuda {
namespace {

__device__ __forceinline__ float gated(float y, float z) { return y * z * sigmoid(z); }

// One block per row (m, grp) of rstd [M*G], grid-stride over them.
template <class T>
__global__ void gated_rmsnorm_fwd_kernel(const T* y, const T* z, const T* w, T* out, float* rstd,
                                         int64_t rows, int64_t Di, int64_t G, float eps) {
  __shared__ float scratch[kThreads / kWarp];
  const int64_t Dg = Di / G;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t grp = row % G, base = row * Dg;  // row = m * G + grp
    float ss = 0;
    for (int64_t i = threadIdx.x; i < Dg; i += blockDim.x) {
      const float g = gated(to_f32(y[base + i]), to_f32(z[base + i]));
      ss += g * g;
    }
    ss = block_sum(ss, scratch);
    const float r = 1.0f / sqrtf(ss / float(Dg) + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int64_t i = threadIdx.x; i < Dg; i += blockDim.x) {
      const float g = gated(to_f32(y[base + i]), to_f32(z[base + i]));
      out[base + i] = from_f32<T>(g * r * to_f32(w[grp * Dg + i]));
    }
  }
}

// n = g * rstd, dn = dout * w:  dg = rstd * (dn - n * mean(dn * n)),
// dy = dg * silu(z),  dz = dg * y * silu'(z),  silu'(z) = s (1 + z (1 - s)).
template <class T>
__global__ void gated_rmsnorm_bwd_kernel(const T* dout, const T* y, const T* z, const T* w,
                                         const float* rstd, T* dy, T* dz, int64_t rows, int64_t Di,
                                         int64_t G) {
  __shared__ float scratch[kThreads / kWarp];
  const int64_t Dg = Di / G;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t grp = row % G, base = row * Dg;  // row = m * G + grp
    const float r = rstd[row];
    float dot = 0;
    for (int64_t i = threadIdx.x; i < Dg; i += blockDim.x) {
      const float n = gated(to_f32(y[base + i]), to_f32(z[base + i])) * r;
      dot += to_f32(dout[base + i]) * to_f32(w[grp * Dg + i]) * n;
    }
    const float mean_dot = block_sum(dot, scratch) / float(Dg);
    for (int64_t i = threadIdx.x; i < Dg; i += blockDim.x) {
      const float yv = to_f32(y[base + i]), zv = to_f32(z[base + i]), s = sigmoid(zv);
      const float n = yv * zv * s * r;
      const float dg = r * (to_f32(dout[base + i]) * to_f32(w[grp * Dg + i]) - n * mean_dot);
      dy[base + i] = from_f32<T>(dg * zv * s);
      dz[base + i] = from_f32<T>(dg * yv * s * (1.0f + zv * (1.0f - s)));
    }
  }
}

// part[r, i] = sum over the rows m of block r = blockIdx.y of dout[m,i] * n[m,i]
template <class T>
__global__ void gated_rmsnorm_dw_partial(const T* dout, const T* y, const T* z, const float* rstd,
                                         float* part, int64_t M, int64_t Di, int64_t G) {
  const int64_t m0 = blockIdx.y * kPartialRows, m1 = M < m0 + kPartialRows ? M : m0 + kPartialRows;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < Di; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t grp = i / (Di / G);
    float s = 0;
    for (int64_t m = m0; m < m1; ++m) {
      const int64_t e = m * Di + i;
      s += to_f32(dout[e]) * gated(to_f32(y[e]), to_f32(z[e])) * rstd[m * G + grp];
    }
    part[blockIdx.y * Di + i] = s;
  }
}

int64_t partial_blocks(int64_t M) { return (M + kPartialRows - 1) / kPartialRows; }

void check_groups(const char* op, int64_t Di, int64_t G) {
  if (G <= 0 || Di % G != 0)
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(G) +
                                " groups do not divide the " + std::to_string(Di) +
                                " channels (G must be positive and divide Di)");
}

}  // namespace

template <class T>
void gated_rmsnorm_fwd(const T* y, const T* z, const T* w, T* out, float* rstd, int64_t M,
                       int64_t Di, int64_t G, float eps, cudaStream_t s) {
  check_groups("gated_rmsnorm_fwd", Di, G);
  if (M == 0 || Di == 0) return;
  gated_rmsnorm_fwd_kernel<T><<<blocks_for(M * G, 1), kThreads, 0, s>>>(y, z, w, out, rstd, M * G, Di, G, eps);
  PIPER_CUDA_LAUNCHED("gated_rmsnorm_fwd");
}

int64_t gated_rmsnorm_bwd_workspace_bytes(int64_t M, int64_t Di) {
  return partial_blocks(M) * Di * static_cast<int64_t>(sizeof(float));
}

template <class T>
void gated_rmsnorm_bwd(const T* dout, const T* y, const T* z, const T* w, const float* rstd, T* dy,
                       T* dz, float* dw, int64_t M, int64_t Di, int64_t G, void* work, cudaStream_t s) {
  check_groups("gated_rmsnorm_bwd", Di, G);
  if (M == 0 || Di == 0) return;
  gated_rmsnorm_bwd_kernel<T><<<blocks_for(M * G, 1), kThreads, 0, s>>>(dout, y, z, w, rstd, dy, dz, M * G, Di, G);
  PIPER_CUDA_LAUNCHED("gated_rmsnorm_bwd (dy, dz)");
  const int64_t R = partial_blocks(M);
  auto* part = static_cast<float*>(work);
  gated_rmsnorm_dw_partial<T><<<dim3(blocks_for(Di), static_cast<unsigned>(R)), kThreads, 0, s>>>(dout, y, z, rstd, part, M, Di, G);
  PIPER_CUDA_LAUNCHED("gated_rmsnorm_bwd (dw partials)");
  add_column_sums(part, R, Di, dw, s);
}

#define PIPER_INSTANTIATE(T)                                                                     \
  template void gated_rmsnorm_fwd<T>(const T*, const T*, const T*, T*, float*, int64_t, int64_t,  \
                                     int64_t, float, cudaStream_t);                              \
  template void gated_rmsnorm_bwd<T>(const T*, const T*, const T*, const T*, const float*, T*, T*, \
                                     float*, int64_t, int64_t, int64_t, void*, cudaStream_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(__nv_bfloat16)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels::cuda
