// cross_entropy_cuda.hpp — fused softmax cross-entropy and the vocab-parallel pieces on CUDA (the
// twins of cross_entropy.hpp and of tensor_ops.hpp's row_max)
// Conventions: see cuda_common.cuh. logits, dlogits, exps: T; row_max, sums: f32; the loss sums
// are written to one double in device memory (overwritten). A target outside [0, V) gives a NaN
// loss for its row and no one-hot term (the op contract refuses such targets before the call).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace piper::kernels::cuda {

// Bytes of cross_entropy's `work`: the M row losses (double).
int64_t cross_entropy_workspace_bytes(int64_t M);

// logits[M,V], targets[M] -> *loss = the sum of the M row losses (in double, rows summed in a
// fixed order); when dlogits != nullptr also writes dlogits = (softmax - onehot) * scale.
template <class T>
void cross_entropy(const T* logits, const int32_t* targets, T* dlogits, double* loss, int64_t M,
                   int64_t V, float scale, void* work, cudaStream_t s);

// out[M] = the max of each row of x[M,N]
template <class T>
void row_max(const T* x, float* out, int64_t M, int64_t N, cudaStream_t s);

// One shard logits[M,V] of the vocabulary at `offset`, given the group's row_max[M]:
// exps[M,V] = exp(logits - row_max); sums[2M] = (sum of exps | target logit, 0 when the target
// is in another shard).
template <class T>
void vocab_ce_partials(const T* logits, const float* row_max, const int32_t* targets,
                       int64_t offset, T* exps, float* sums, int64_t M, int64_t V,
                       cudaStream_t s);
// Given the group's sums: dlogits (holding exps) becomes (softmax - onehot) * scale; *loss = the
// sum of the M losses (in double, in a fixed order).
template <class T>
void vocab_ce_finish(const float* sums, const float* row_max, const int32_t* targets,
                     int64_t offset, T* dlogits, double* loss, int64_t M, int64_t V, float scale,
                     cudaStream_t s);

}  // namespace piper::kernels::cuda
