// embedding.hpp — embedding
// Conventions: see kernels.hpp.
#pragma once

#include <cstdint>

namespace piper::kernels {

// out[M,D] = table[ids[m], :]
template <class T>
void embedding_fwd(const int32_t* ids, const T* table, T* out, int64_t M, int64_t D);
// dtable[ids[m], :] += dout[m, :]  (deterministic: rows in order m = 0..M-1)
template <class T>
void embedding_bwd(const int32_t* ids, const T* dout, T* dtable, int64_t M, int64_t D);

}  // namespace piper::kernels
