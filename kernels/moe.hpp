// moe.hpp — mixture-of-experts routing: the softmax top-k router, the sequence-wise balance
// loss, the permutation of token rows into per-expert groups, and the weighted combine.
// Conventions: see kernels.hpp. Shapes: M token rows, E experts, K = top_k (1 <= K <= E),
// D width, P = M*K permuted rows; experts, counts, rows and pos are int32 indices, in range
// (the backend checks them). Every sum (over a row's E values, its K slots or D columns)
// accumulates in double in a fixed order, k ascending, and is rounded once: the results do not
// depend on the thread count, and K equal parts weighted 1/K (K a power of two) sum back to
// the value exactly.
#pragma once

#include <cstdint>

namespace piper::kernels {

// probs[M,E] = softmax of each row of logits[M,E]; experts[M,K]: the K largest probs of each
// row in descending order (ties: the lower expert index first); weights[M,K] = those probs
// divided by their sum.
template <class T>
void moe_route_fwd(const T* logits, T* probs, int32_t* experts, T* weights, int64_t M, int64_t E,
                   int64_t K);
// dlogits[M,E] (overwritten): with S = sum_j p[i_j] and w_k = p[i_k] / S, the gradient of the
// probabilities dp_e = dprobs_e + sum over k with i_k = e of (dweights_k - sum_j dweights_j w_j) / S,
// then the softmax backward dlogits_e = p_e (dp_e - sum_f dp_f p_f). The selection is fixed.
template <class T>
void moe_route_bwd(const T* dweights, const T* dprobs, const T* probs, const int32_t* experts,
                   const T* weights, T* dlogits, int64_t M, int64_t E, int64_t K);
// Sequence-wise balance loss over M / seq sequences of seq rows each (seq divides M): for
// sequence s, f_e = (assignments of s's rows to e) / (seq*K), P_e = mean over s's rows of
// probs[:,e]; returns sum over s of E * sum_e f_e * P_e, sequences summed in order.
// dprobs[M,E] (overwritten) = scale * E * f_e(s) / seq on every row of s.
template <class T>
double moe_balance(const T* probs, const int32_t* experts, T* dprobs, int64_t M, int64_t E,
                   int64_t K, int64_t seq, T scale);
// A stable counting sort of the M*K assignments by expert: counts[E] assignments per expert;
// rows[P] the token row of each permuted row, expert-major, rows ascending within an expert;
// pos[M,K] the permuted row of each (row, slot).
void moe_permute_index(const int32_t* experts, int32_t* counts, int32_t* rows, int32_t* pos,
                       int64_t M, int64_t E, int64_t K);
// dst[P,D]: dst[p] = src[rows[p]]
template <class T>
void gather_rows(const T* src, const int32_t* rows, T* dst, int64_t P, int64_t D);
// out[M,D] (overwritten) = sum over k of weights[m,k] * y[pos[m,k]]  (y[P,D])
template <class T>
void moe_combine(const T* y, const int32_t* pos, const T* weights, T* out, int64_t M, int64_t K,
                 int64_t D);
// dy[P,D] (overwritten): dy[pos[m,k]] = weights[m,k] * dout[m] (pos a permutation of the P rows);
// dweights[M,K] (overwritten) = dot(dout[m], y[pos[m,k]])
template <class T>
void moe_combine_bwd(const T* dout, const T* y, const int32_t* pos, const T* weights, T* dy,
                     T* dweights, int64_t M, int64_t K, int64_t D);
// dx[M,D] += sum over k of dxp[pos[m,k]]  (dxp[P,D]): the backward of gather_rows by rows
template <class T>
void moe_dispatch_bwd(const T* dxp, const int32_t* pos, T* dx, int64_t M, int64_t K, int64_t D);

}  // namespace piper::kernels
