// ssd_cuda.hpp — the Mamba-2 chunked SSD scan on CUDA (the twin of ssd.hpp's ssd_fwd / ssd_bwd)
// Conventions: see cuda_common.cuh. Shapes and the recurrence: see ssd.hpp (SsdShape, whose
// chunk length follows ssd_chunk_length).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ssd.hpp"

namespace piper::kernels::cuda {

// The largest head dim P the kernels take: a block keeps a [64, P] tile of y or dx in registers.
// Larger P is refused with std::invalid_argument. N, the chunk length and the head counts are
// not limited (beyond Hm being a multiple of G).
inline constexpr int64_t kSsdMaxHeadDim = 128;

// f32 elements of the state ssd_fwd saves for ssd_bwd: the state entering each chunk,
// [B, n_chunks, Hm, P, N].
int64_t ssd_saved_numel(const SsdShape& s);
// Bytes of the scratch `work` each call needs (contents need not survive between calls).
int64_t ssd_fwd_workspace_bytes(const SsdShape& s);
int64_t ssd_bwd_workspace_bytes(const SsdShape& s);

// x[B,Tn,Hm,P], dt[B,Tn,Hm] (softplus'ed), A_log[Hm] f32, Bm, Cm [B,Tn,G,N], D[Hm] f32
//   -> y[B,Tn,Hm,P], saved[ssd_saved_numel] f32
template <class T>
void ssd_fwd(const SsdShape& s, const T* x, const T* dt, const float* A_log, const T* Bm,
             const T* Cm, const float* D, T* y, float* saved, void* work, cudaStream_t st);
// dx, ddt, dBm, dCm overwritten; dA_log[Hm], dD[Hm] (f32) accumulated.
template <class T>
void ssd_bwd(const SsdShape& s, const T* dy, const T* x, const T* dt, const float* A_log,
             const T* Bm, const T* Cm, const float* D, const float* saved, T* dx, T* ddt,
             float* dA_log, T* dBm, T* dCm, float* dD, void* work, cudaStream_t st);

}  // namespace piper::kernels::cuda
