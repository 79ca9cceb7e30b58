// gated_rmsnorm.cpp — Mamba-2 gated grouped RMSNorm: out = grouped_rmsnorm(y * silu(z)) * w.
//
// y[M,Di], z[M,Di], w[Di]; G contiguous groups of Dg = Di/G channels per row.
//   g = y * silu(z);  rstd[m,grp] = 1/sqrt(mean_{i in grp} g_i^2 + eps);  out = g * rstd * w
// Saved for backward: rstd[M*G] (row-major [M, G]).
#include "gated_rmsnorm.hpp"
#include "vmath.hpp"

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
      for (int64_t i = 0; i < Di; ++i) g[i] = yr[i] * zr[i] * vmath::sigmoid(zr[i]);
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
            sg[i] = vmath::sigmoid(zr[i]);
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
