// conv1d.cpp — causal depthwise 1-D convolution (left zero padding) forward and backward.
//
// x[B,Tn,C], w[C,K], bias[C] -> y[B,Tn,C]
//   y[b,t,c] = bias[c] + sum_{k<K} w[c,k] * x[b, t-(K-1)+k, c]   (x[b,<0,c] = 0)
#include "conv1d.hpp"

#include <algorithm>
#include <vector>

namespace piper::kernels {

namespace {
constexpr int64_t kRowChunk = 64;   // rows per partial sum of dw/dbias (at least) ...
constexpr int64_t kMaxChunks = 64;  // ... and at most this many chunks (bounds the buffer)
constexpr int64_t kParallelWork = int64_t(1) << 15;  // B*Tn*C*K below which one thread runs
}  // namespace

template <class T>
void conv1d_fwd(const T* x, const T* w, const T* bias, T* y, int64_t B, int64_t Tn, int64_t C,
                int64_t K) {
  // Transposed taps wt[k, c] so the inner loop runs over contiguous channels.
  std::vector<T> wt(K * C);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t k = 0; k < K; ++k) wt[k * C + c] = w[c * K + k];
  const T* wp = wt.data();
#pragma omp parallel for schedule(static) if (B * Tn * C * K >= kParallelWork)
  for (int64_t bt = 0; bt < B * Tn; ++bt) {
    const int64_t b = bt / Tn, t = bt % Tn;
    T* yr = y + bt * C;
    for (int64_t c = 0; c < C; ++c) yr[c] = bias[c];
    // tap k reads time s = t-(K-1)+k; skip taps that fall in the zero padding.
    for (int64_t k = std::max<int64_t>(0, K - 1 - t); k < K; ++k) {
      const int64_t s = t - (K - 1) + k;
      const T* xr = x + (b * Tn + s) * C;
      const T* wk = wp + k * C;
      for (int64_t c = 0; c < C; ++c) yr[c] += wk[c] * xr[c];
    }
  }
}

template <class T>
void conv1d_bwd(const T* dy, const T* x, const T* w, T* dx, T* dw, T* dbias, int64_t B, int64_t Tn,
                int64_t C, int64_t K) {
  std::vector<T> wt(K * C);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t k = 0; k < K; ++k) wt[k * C + c] = w[c * K + k];
  const T* wp = wt.data();

  // Fused with the dx pass, per row chunk (a fixed function of the shape, not of the
  // thread count, so results do not depend on it): partial sums in double,
  //   part[chunk][k][c]  = sum_{rows (b,t) in chunk} dy[b,t,c] * x[b,t-(K-1)+k,c]   (k < K)
  //   part[chunk][K][c]  = sum_{rows (b,t) in chunk} dy[b,t,c]
  // then dw[c,k] += sum_chunk part[chunk][k][c] and dbias[c] += sum_chunk part[chunk][K][c],
  // chunks in ascending order.
  const int64_t rows = B * Tn;
  const int64_t chunk = std::max(kRowChunk, (rows + kMaxChunks - 1) / kMaxChunks);
  const int64_t nchunk = (rows + chunk - 1) / chunk;
  const int64_t stride = (K + 1) * C;  // one chunk's partials
  std::vector<double> part(nchunk * stride, 0.0);
  const bool par = rows * C * K >= kParallelWork;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t ch = 0; ch < nchunk; ++ch) {
    double* pw = part.data() + ch * stride;
    double* pb = pw + K * C;
    for (int64_t row = ch * chunk; row < std::min(rows, (ch + 1) * chunk); ++row) {
      const int64_t b = row / Tn, s = row % Tn;
      // dx[b,s,c] = sum_k w[c,k] * dy[b, s+(K-1)-k, c]  over taps with s+(K-1)-k < Tn.
      T* dxr = dx + row * C;
      for (int64_t c = 0; c < C; ++c) dxr[c] = T(0);
      for (int64_t k = std::max<int64_t>(0, s + K - Tn); k < K; ++k) {
        const T* dyr = dy + (b * Tn + s + (K - 1) - k) * C;
        const T* wk = wp + k * C;
        for (int64_t c = 0; c < C; ++c) dxr[c] += wk[c] * dyr[c];
      }
      // this row's contributions to dw and dbias (row = (b, t = s))
      const T* dyr = dy + row * C;
      for (int64_t c = 0; c < C; ++c) pb[c] += double(dyr[c]);
      for (int64_t k = std::max<int64_t>(0, K - 1 - s); k < K; ++k) {
        const T* xr = x + (row - (K - 1) + k) * C;
        double* pk = pw + k * C;
        for (int64_t c = 0; c < C; ++c) pk[c] += double(dyr[c]) * double(xr[c]);
      }
    }
  }
#pragma omp parallel for schedule(static) if (par)
  for (int64_t idx = 0; idx < stride; ++idx) {  // idx = k*C + c, k == K for the bias
    double acc = 0;
    for (int64_t ch = 0; ch < nchunk; ++ch) acc += part[ch * stride + idx];
    const int64_t k = idx / C, c = idx % C;
    if (k < K)
      dw[c * K + k] += static_cast<T>(acc);
    else
      dbias[c] += static_cast<T>(acc);
  }
}

template void conv1d_fwd<float>(const float*, const float*, const float*, float*, int64_t, int64_t,
                                int64_t, int64_t);
template void conv1d_fwd<double>(const double*, const double*, const double*, double*, int64_t,
                                 int64_t, int64_t, int64_t);
template void conv1d_bwd<float>(const float*, const float*, const float*, float*, float*, float*,
                                int64_t, int64_t, int64_t, int64_t);
template void conv1d_bwd<double>(const double*, const double*, const double*, double*, double*,
                                 double*, int64_t, int64_t, int64_t, int64_t);

}  // namespace piper::kernels
