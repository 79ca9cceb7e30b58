// rope.cu — rotate-half RoPE on CUDA: one thread per (row, head, pair); the angle, its cosine and
// sine in double, as on the CPU, then rounded to f32.
#include <stdexcept>
#include <string>

#include "cuda_common.cuh"
#include "rope_cuda.hpp"

namespace piper::kernels::cuda {
namespace {

// sign +1: the rotation R; -1: R^T (the backward).
template <class T>
__global__ void rope_kernel(const T* x, T* y, int64_t BT, int64_t Tn, int64_t H, int64_t hd, double theta,
                            float sign) {
  const int64_t half = hd / 2, total = BT * H * half;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % half, row = i / half;  // row = bt * H + h
    const int64_t t = (row / H) % Tn;
    const double ang = static_cast<double>(t) * pow(theta, -2.0 * static_cast<double>(j) / static_cast<double>(hd));
    const float c = static_cast<float>(cos(ang)), sn = sign * static_cast<float>(sin(ang));
    const T* xr = x + row * hd;
    T* yr = y + row * hd;
    const float a = to_f32(xr[j]), b = to_f32(xr[j + half]);  // both read before either is written
    yr[j] = from_f32<T>(a * c - b * sn);
    yr[j + half] = from_f32<T>(b * c + a * sn);
  }
}

template <class T>
void rope_apply(const T* x, T* y, int64_t B, int64_t Tn, int64_t H, int64_t hd, double theta, float sign,
                cudaStream_t s, const char* op) {
  if (hd % 2 != 0)
    throw std::invalid_argument(std::string(op) + ": head dim " + std::to_string(hd) + " must be even");
  const int64_t total = B * Tn * H * (hd / 2);
  if (total == 0) return;
  rope_kernel<T><<<blocks_for(total), kThreads, 0, s>>>(x, y, B * Tn, Tn, H, hd, theta, sign);
  PIPER_CUDA_LAUNCHED("rope");
}

}  // namespace

template <class T>
void rope_fwd(const T* x, T* y, int64_t B, int64_t Tn, int64_t H, int64_t hd, double theta, cudaStream_t s) {
  rope_apply(x, y, B, Tn, H, hd, theta, 1.0f, s, "rope_fwd");
}

template <class T>
void rope_bwd(const T* dy, T* dx, int64_t B, int64_t Tn, int64_t H, int64_t hd, double theta, cudaStream_t s) {
  rope_apply(dy, dx, B, Tn, H, hd, theta, -1.0f, s, "rope_bwd");
}

#define PIPER_INSTANTIATE(T)                                                                             \
  template void rope_fwd<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, double, cudaStream_t); \
  template void rope_bwd<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, double, cudaStream_t);
PIPER_INSTANTIATE(float)
PIPER_INSTANTIATE(__nv_bfloat16)
#undef PIPER_INSTANTIATE

}  // namespace piper::kernels::cuda
