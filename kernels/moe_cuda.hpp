// moe_cuda.hpp — mixture-of-experts routing on CUDA (the twin of moe.hpp)
// Conventions: see cuda_common.cuh and moe.hpp (the same contracts). The router (logits, probs,
// experts' weights, their gradients, the balance loss's dprobs) and the combine weights and
// dweights are f32; token rows (src, dst, y, out, dout, dy, dxp, dx) are T; experts, counts,
// rows and pos int32, in range (the backend checks them). Sums over a row's K slots accumulate in
// double, k ascending, as on the CPU; sums over D columns (moe_combine_dw) and over a sequence's
// rows (moe_balance) accumulate in double in a fixed order of their own (a warp's or a block's
// tree), not the CPU's: the same from run to run, equal to the CPU's to rounding.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace piper::kernels::cuda {

// probs[M,E] = softmax of each row of logits[M,E]; experts[M,K]: the K largest probs of each row
// in descending order (ties: the lower expert index first); weights[M,K] = those probs divided by
// their sum.
void moe_route_fwd(const float* logits, float* probs, int32_t* experts, float* weights, int64_t M,
                   int64_t E, int64_t K, cudaStream_t s);
// dlogits[M,E] (overwritten): the renormalisation's and the softmax's backward (moe.hpp).
void moe_route_bwd(const float* dweights, const float* dprobs, const float* probs,
                   const int32_t* experts, const float* weights, float* dlogits, int64_t M,
                   int64_t E, int64_t K, cudaStream_t s);

// Bytes of moe_balance's `work`: one double per sequence.
int64_t moe_balance_workspace_bytes(int64_t M, int64_t seq);
// The sequence-wise balance loss (moe.hpp): *loss = the sum over the M / seq sequences, in order;
// dprobs[M,E] (overwritten) = scale * E * f_e(s) / seq. seq must divide M; E at most 4096.
void moe_balance(const float* probs, const int32_t* experts, float* dprobs, double* loss,
                 int64_t M, int64_t E, int64_t K, int64_t seq, float scale, void* work,
                 cudaStream_t s);

// Bytes of moe_permute_index's `work`: per-chunk expert counts.
int64_t moe_permute_index_workspace_bytes(int64_t M, int64_t E, int64_t K);
// A stable counting sort of the M*K assignments by expert: counts[E]; rows[P] the token row of
// each permuted row, expert-major, rows ascending within an expert; pos[M,K] the permuted row of
// each (row, slot). Equal to the CPU's output.
void moe_permute_index(const int32_t* experts, int32_t* counts, int32_t* rows, int32_t* pos,
                       int64_t M, int64_t E, int64_t K, void* work, cudaStream_t s);

// dst[P,D]: dst[p] = src[rows[p]]
template <class T>
void gather_rows(const T* src, const int32_t* rows, T* dst, int64_t P, int64_t D, cudaStream_t s);
// out[M,D] (overwritten) = sum over k of weights[m,k] * y[pos[m,k]]  (y[P,D]); out of either
// float type (an MoE block's rows in bf16 combine into its f32 output)
template <class T, class U>
void moe_combine(const T* y, const int32_t* pos, const float* weights, U* out, int64_t M,
                 int64_t K, int64_t D, cudaStream_t s);
// dy[P,D] (overwritten): dy[pos[m,k]] = weights[m,k] * dout[m] (pos a permutation of the P rows);
// dweights[M,K] (overwritten) = dot(dout[m], y[pos[m,k]])
template <class T>
void moe_combine_bwd(const T* dout, const T* y, const int32_t* pos, const float* weights, T* dy,
                     float* dweights, int64_t M, int64_t K, int64_t D, cudaStream_t s);
// dx[M,D] += sum over k of dxp[pos[m,k]]  (dxp[P,D]); dx of either float type
template <class T, class U>
void moe_dispatch_bwd(const T* dxp, const int32_t* pos, U* dx, int64_t M, int64_t K, int64_t D,
                      cudaStream_t s);

}  // namespace piper::kernels::cuda
