// gated_rmsnorm.cpp — Mamba-2 gated grouped RMSNorm: out = grouped_rmsnorm(y * silu(z)) * w.
//
// y[M,Di], z[M,Di], w[Di]; G contiguous groups of Dg = Di/G channels per row.
//   g = y * silu(z);  rstd[m,grp] = 1/sqrt(mean_{i in grp} g_i^2 + eps);  out = g * rstd * w
// Saved for backward: rstd[M*G] (row-major [M, G]).
#include "gated_rmsnorm.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace piper::kernels {

namespace {
// dw is summed per chunk of rows, then over chunks in order; the chunking is a function of the
// shape only (at least kRowChunk rows, at most kMaxChunks chunks), not of the thread count.
constexpr int64_t kRowChunk = 32;
constexpr int64_t kMaxChunks = 64;
constexpr int64_t kParallelWork = int64_t(1) << 14;  // M*Di below which one thread runs

// exp for x <= 0, written so that `omp simd` loops vectorise it (std::exp does not without
// -ffast-math): Cephes expf polynomial, within 1.5 ulp of exp on [-87, 0]; 0 below -87.
[[gnu::always_inline]] inline float exp_nonpos(float x) {
  const bool under = x < -87.0f;
  x = std::max(x, -87.0f);
  const float t = x * 1.44269504088896341f + 12582912.0f;    // + 1.5*2^23 rounds x/ln2 to int
  const float fx = t - 12582912.0f;                          // n = round(x / ln 2), as float
  const int32_t n = std::bit_cast<int32_t>(t) - 0x4B400000;  // ... and as int
  float r = x - fx * 0.693359375f;
  r = r + fx * 2.12194440e-4f;  // r = x - n ln2 (two-part ln 2), |r| <= ln2/2
  const float zz = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * zz + r + 1.0f;                                   // exp(r)
  const float p2 = std::bit_cast<float>((n + 127) << 23);  // 2^n, n in [-126, 0]
  return under ? 0.0f : p * p2;
}
inline double exp_nonpos(double x) { return std::exp(x); }

// sigmoid(v) from e = exp(-|v|) in (0, 1]: no overflow for either sign.
template <class T>
[[gnu::always_inline]] inline T sigmoid(T v) {
  const T e = exp_nonpos(v < T(0) ? v : -v);
  const T r = T(1) / (T(1) + e);
  return v >= T(0) ? r : e * r;
}
}  // namespace

template <class T>
void gated_rmsnorm_fwd(const T* y, const T* z, const T* w, T* out, T* rstd, int64_t M, int64_t Di,
                       int64_t G, T eps) {
  if (G <= 0 || Di % G != 0) throw std::invalid_argument("gated_rmsnorm: Di % G != 0");
  const int64_t Dg = Di / G;
#pragma omp parallel if (M * Di >= kParallelWork)
  {
    std::vector<T> g(Di);
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      const T* yr = y + m * Di;
      const T* zr = z + m * Di;
      T* orow = out + m * Di;
#pragma omp simd
      for (int64_t i = 0; i < Di; ++i) g[i] = yr[i] * zr[i] * sigmoid(zr[i]);
      for (int64_t grp = 0; grp < G; ++grp) {
        const T* gg = g.data() + grp * Dg;
        double ss = 0;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < Dg; ++i) ss += double(gg[i]) * double(gg[i]);
        const T r = static_cast<T>(1.0 / std::sqrt(ss / double(Dg) + double(eps)));
        rstd[m * G + grp] = r;
        for (int64_t i = 0; i < Dg; ++i) orow[grp * Dg + i] = gg[i] * r * w[grp * Dg + i];
      }
    }
  }
}

template <class T>
void gated_rmsnorm_bwd(const T* dout, const T* y, const T* z, const T* w, const T* rstd, T* dy,
                       T* dz, T* dw, int64_t M, int64_t Di, int64_t G) {
  if (G <= 0 || Di % G != 0) throw std::invalid_argument("gated_rmsnorm: Di % G != 0");
  const int64_t Dg = Di / G;
  const int64_t chunk = std::max(kRowChunk, (M + kMaxChunks - 1) / kMaxChunks);
  const int64_t nchunk = (M + chunk - 1) / chunk;
  std::vector<double> part(nchunk * Di, 0.0);  // part[chunk, i]: partial dw over its rows
#pragma omp parallel if (M * Di >= kParallelWork)
  {
    std::vector<T> n(Di), dn(Di), sg(Di);
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < nchunk; ++ch) {
      double* pw = part.data() + ch * Di;
      for (int64_t m = ch * chunk; m < std::min(M, (ch + 1) * chunk); ++m) {
        const T* yr = y + m * Di;
        const T* zr = z + m * Di;
        const T* dor = dout + m * Di;
        for (int64_t grp = 0; grp < G; ++grp) {
          const T r = rstd[m * G + grp];
          double dot = 0;  // sum_i dn_i * n_i over the group
#pragma omp simd reduction(+ : dot)
          for (int64_t i = grp * Dg; i < (grp + 1) * Dg; ++i) {
            sg[i] = sigmoid(zr[i]);
            n[i] = yr[i] * zr[i] * sg[i] * r;  // normalised gated input
            dn[i] = dor[i] * w[i];
            pw[i] += double(dor[i]) * double(n[i]);
            dot += double(dn[i]) * double(n[i]);
          }
          const T mean_dot = static_cast<T>(dot / double(Dg));
#pragma omp simd
          for (int64_t i = grp * Dg; i < (grp + 1) * Dg; ++i) {
            const T dg = r * (dn[i] - n[i] * mean_dot);  // d(loss)/d(y*silu(z))
            const T silu = zr[i] * sg[i];
            dy[m * Di + i] = dg * silu;
            // silu'(z) = s * (1 + z * (1 - s))
            dz[m * Di + i] = dg * yr[i] * sg[i] * (T(1) + zr[i] * (T(1) - sg[i]));
          }
        }
      }
    }
    // dw[i] += sum over chunks in order.
#pragma omp for schedule(static)
    for (int64_t i = 0; i < Di; ++i) {
      double s = 0;
      for (int64_t ch = 0; ch < nchunk; ++ch) s += part[ch * Di + i];
      dw[i] += static_cast<T>(s);
    }
  }
}

template void gated_rmsnorm_fwd<float>(const float*, const float*, const float*, float*, float*,
                                       int64_t, int64_t, int64_t, float);
template void gated_rmsnorm_fwd<double>(const double*, const double*, const double*, double*,
                                        double*, int64_t, int64_t, int64_t, double);
template void gated_rmsnorm_bwd<float>(const float*, const float*, const float*, const float*,
                                       const float*, float*, float*, float*, int64_t, int64_t,
                                       int64_t);
template void gated_rmsnorm_bwd<double>(const double*, const double*, const double*, const double*,
                                        const double*, double*, double*, double*, int64_t, int64_t,
                                        int64_t);

}  // namespace piper::kernels
