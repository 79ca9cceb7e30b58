// attention_cuda.hpp — causal GQA softmax attention on CUDA (the twin of attention.hpp)
// Conventions: see cuda_common.cuh. The head dims of kAttentionHeadDims; any other throws
// std::invalid_argument (as do H % KV != 0, and Tn, H or B past the launch limits).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>

namespace piper::kernels::cuda {

// The head dims the kernels are compiled for (one tile shape each).
inline constexpr std::array<int64_t, 6> kAttentionHeadDims{16, 32, 64, 80, 96, 128};

// q[B,Tn,H,hd], k[B,Tn,KV,hd], v[B,Tn,KV,hd] -> out[B,Tn,H,hd], lse[B,H,Tn] (f32)
// q head h attends kv head h / (H/KV); scores scaled by 1/sqrt(hd); lse[b,h,t] is the natural
// log of the sum over keys j <= t of exp(score), as on the CPU.
template <class T>
void attention_fwd(const T* q, const T* k, const T* v, T* out, float* lse, int64_t B, int64_t Tn,
                   int64_t H, int64_t KV, int64_t hd, cudaStream_t s);

// Bytes of attention_bwd's `work`: the row terms D = rowsum(dout * out), f32 [B,H,Tn].
int64_t attention_bwd_workspace_bytes(int64_t B, int64_t Tn, int64_t H);

// dq, dk, dv overwritten; recomputes the scores from lse. Deterministic: dk and dv sum the
// query heads of their group and the query tiles in a fixed order.
template <class T>
void attention_bwd(const T* dout, const T* q, const T* k, const T* v, const T* out,
                   const float* lse, T* dq, T* dk, T* dv, int64_t B, int64_t Tn, int64_t H,
                   int64_t KV, int64_t hd, void* work, cudaStream_t s);

}  // namespace piper::kernels::cuda
