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

}  // namespace piper::kernels
