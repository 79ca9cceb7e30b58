// embedding_cuda.hpp — embedding on CUDA (the twin of embedding.hpp)
// Conventions: see cuda_common.cuh. out, dout: T; table: Tt, T or bf16 (the unit's compute copy of
// its parameters, bf16 while the rows are f32); dtable: f32 (a parameter gradient).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace piper::kernels::cuda {

// table[V,D] holds the rows of ids offset..offset+V-1. out[M,D] = table[ids[m] - offset, :],
// zero for ids outside the table.
template <class Tt, class T>
void embedding_fwd(const int32_t* ids, const Tt* table, T* out, int64_t M, int64_t D, int64_t V,
                   int64_t offset, cudaStream_t s);

// Bytes of embedding_bwd's `work`: the ids' sort (keys and row numbers, twice) and cub's radix
// sort scratch. Asks cub, so it needs the current CUDA device; M and V at most 2^31 - 2.
int64_t embedding_bwd_workspace_bytes(int64_t M, int64_t V);

// dtable[ids[m] - offset, :] += dout[m, :] for ids in the table. Deterministic without atomics:
// a stable radix sort of the rows by id, then each table row adds its dout rows in the order
// m = 0..M-1, as on the CPU.
template <class T>
void embedding_bwd(const int32_t* ids, const T* dout, float* dtable, int64_t M, int64_t D,
                   int64_t V, int64_t offset, void* work, cudaStream_t s);

}  // namespace piper::kernels::cuda
