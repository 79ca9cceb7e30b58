// rope.cpp — rotate-half RoPE (GPT-NeoX / HF LLaMA convention) forward and backward.
//
// For position t and pair j < hd/2 (a = u[j], b = u[j + hd/2]):
//   y[j]        = a*cos(t*f_j) - b*sin(t*f_j)
//   y[j + hd/2] = b*cos(t*f_j) + a*sin(t*f_j),   f_j = theta^(-2j/hd)
// Angles, cos and sin are computed in double and then cast to T.
#include "rope.hpp"

#include <cmath>
#include <stdexcept>
#include <vector>

namespace piper::kernels {

namespace {

constexpr int64_t kParallelWork = int64_t(1) << 15;  // elements below which one thread runs

// cos/sin tables [Tn, hd/2] in T.
template <class T>
void rope_tables(int64_t Tn, int64_t hd, double theta, std::vector<T>& cs, std::vector<T>& sn) {
  const int64_t half = hd / 2;
  std::vector<double> inv_freq(half);
  for (int64_t j = 0; j < half; ++j) inv_freq[j] = std::pow(theta, -2.0 * double(j) / double(hd));
  cs.resize(Tn * half);
  sn.resize(Tn * half);
#pragma omp parallel for schedule(static) if (Tn * half >= 4096)
  for (int64_t t = 0; t < Tn; ++t)
    for (int64_t j = 0; j < half; ++j) {
      const double ang = double(t) * inv_freq[j];
      cs[t * half + j] = static_cast<T>(std::cos(ang));
      sn[t * half + j] = static_cast<T>(std::sin(ang));
    }
}

// sign = +1: forward rotation R; sign = -1: transpose R^T (the backward).
template <class T>
void rope_apply(const T* x, T* y, int64_t B, int64_t Tn, int64_t H, int64_t hd, double theta,
                T sign) {
  if (hd % 2 != 0) throw std::invalid_argument("rope: head dim must be even");
  const int64_t half = hd / 2;
  std::vector<T> cs, sn;
  rope_tables<T>(Tn, hd, theta, cs, sn);
  const T* cp = cs.data();
  const T* sp = sn.data();
#pragma omp parallel for schedule(static) if (B * Tn * H * hd >= kParallelWork)
  for (int64_t bt = 0; bt < B * Tn; ++bt) {
    const int64_t t = bt % Tn;
    const T* c = cp + t * half;
    const T* s = sp + t * half;
    for (int64_t h = 0; h < H; ++h) {
      const T* xr = x + (bt * H + h) * hd;  // x[b, t, h, :]
      T* yr = y + (bt * H + h) * hd;
      // Iteration j touches only elements j and j + half, so the loop has no carried
      // dependence even when y == x (the only aliasing the interface allows).
#pragma omp simd
      for (int64_t j = 0; j < half; ++j) {
        const T a = xr[j], b = xr[j + half];  // read both before writing (y may alias x)
        const T sj = sign * s[j];
        yr[j] = a * c[j] - b * sj;
        yr[j + half] = b * c[j] + a * sj;
      }
    }
  }
}

}  // namespace

template <class T>
void rope_fwd(const T* x, T* y, int64_t B, int64_t Tn, int64_t H, int64_t hd, double theta) {
  rope_apply<T>(x, y, B, Tn, H, hd, theta, T(1));
}

template <class T>
void rope_bwd(const T* dy, T* dx, int64_t B, int64_t Tn, int64_t H, int64_t hd, double theta) {
  // R^T: dx[j] = dy[j]*c + dy[j+half]*s ; dx[j+half] = dy[j+half]*c - dy[j]*s
  rope_apply<T>(dy, dx, B, Tn, H, hd, theta, T(-1));
}

template void rope_fwd<float>(const float*, float*, int64_t, int64_t, int64_t, int64_t, double);
template void rope_fwd<double>(const double*, double*, int64_t, int64_t, int64_t, int64_t, double);
template void rope_bwd<float>(const float*, float*, int64_t, int64_t, int64_t, int64_t, double);
template void rope_bwd<double>(const double*, double*, int64_t, int64_t, int64_t, int64_t, double);

}  // namespace piper::kernels
