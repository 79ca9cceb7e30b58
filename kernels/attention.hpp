// attention.hpp — causal GQA softmax attention (after RoPE)
// Conventions: see kernels.hpp.
#pragma once

#include <cstdint>

namespace piper::kernels {

// q[B,Tn,H,hd], k[B,Tn,KV,hd], v[B,Tn,KV,hd] -> out[B,Tn,H,hd], lse[B,H,Tn]
// q head h attends kv head h / (H/KV); scores scaled by 1/sqrt(hd).
template <class T>
void attention_fwd(const T* q, const T* k, const T* v, T* out, T* lse, int64_t B, int64_t Tn,
                   int64_t H, int64_t KV, int64_t hd);
// dq, dk, dv overwritten
template <class T>
void attention_bwd(const T* dout, const T* q, const T* k, const T* v, const T* out, const T* lse,
                   T* dq, T* dk, T* dv, int64_t B, int64_t Tn, int64_t H, int64_t KV, int64_t hd);

}  // namespace piper::kernels
