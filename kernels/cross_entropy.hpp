// cross_entropy.hpp — fused softmax cross-entropy
// Conventions: see kernels.hpp.
#pragma once

#include <cstdint>

namespace piper::kernels {

// logits[M,V], targets[M] -> returns the *sum* of the M losses (in double);
// when dlogits != nullptr also writes dlogits = (softmax - onehot) * scale.
template <class T>
double cross_entropy(const T* logits, const int32_t* targets, T* dlogits, int64_t M, int64_t V,
                     T scale);

// Vocab-parallel cross-entropy over one shard logits[M,V] holding the vocabulary from `offset`,
// in two halves around the caller's sums over the shards (Megatron). Given the group's
// row_max[M]: exps[M,V] = exp(logits - row_max); sums[2M] = (sum of exps | target logit, 0 when
// the target is in another shard).
template <class T>
void vocab_ce_partials(const T* logits, const T* row_max, const int32_t* targets, int64_t offset,
                       T* exps, T* sums, int64_t M, int64_t V);
// Given the group's sums: dlogits (holding exps) becomes (softmax - onehot) * scale; returns the
// sum of the M losses.
template <class T>
double vocab_ce_finish(const T* sums, const T* row_max, const int32_t* targets, int64_t offset,
                       T* dlogits, int64_t M, int64_t V, T scale);

}  // namespace piper::kernels
