// embedding.hpp — embedding
// Conventions: see kernels.hpp.
#pragma once

#include <cstdint>

namespace piper::kernels {

// table[V,D] holds the rows of ids offset..offset+V-1 (the whole vocabulary, or one shard of a
// vocab-parallel table). out[M,D] = table[ids[m] - offset, :], zero for ids outside the table.
template <class T>
void embedding_fwd(const int32_t* ids, const T* table, T* out, int64_t M, int64_t D, int64_t V,
                   int64_t offset);
// dtable[ids[m] - offset, :] += dout[m, :] for ids in the table (deterministic: rows in order
// m = 0..M-1)
template <class T>
void embedding_bwd(const int32_t* ids, const T* dout, T* dtable, int64_t M, int64_t D, int64_t V,
                   int64_t offset);

}  // namespace piper::kernels
