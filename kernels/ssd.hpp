// ssd.hpp — the Mamba-2 selective state-space scan
// Conventions: see kernels.hpp.
#pragma once

#include <cstdint>

namespace piper::kernels {

// Inputs: x[B,Tn,Hm,P], dt[B,Tn,Hm] (already softplus'ed), A_log[Hm] (A = -exp(A_log)),
//         Bm[B,Tn,G,N], Cm[B,Tn,G,N], D[Hm]. Head h uses group h / (Hm/G).
//   S_h(t) = exp(dt_h(t) A_h) S_h(t-1) + dt_h(t) outer(x_h(t), B_g(t)),  S_h(-1) = 0
//   y_h(t) = S_h(t) @ C_g(t) + D_h x_h(t)                      -> y[B,Tn,Hm,P]
struct SsdShape {
  int64_t B, Tn, Hm, P, G, N;
  int64_t chunk;  // chunk length L of the SSD algorithm (the reference ignores it)
};
// The chunk length the chunked scan uses: `chunk`, or one chunk of the sequence's length where
// chunk <= 0 or the chunk is longer than the sequence (the same numbers; the [L, L] scratch stays
// within the sequence).
inline int64_t ssd_chunk_length(const SsdShape& s) {
  const int64_t whole = s.Tn > 1 ? s.Tn : 1;
  return s.chunk > 0 && s.chunk < whole ? s.chunk : whole;
}
// Floats of saved state the chunked forward writes for its backward:
// B * n_chunks * Hm * P * N (the state entering each chunk).
int64_t ssd_saved_size(const SsdShape& s);
// Elements of the scratch `work` the chunked forward and backward need (the caller allocates
// it, so memory accounting sees it; contents need not survive between calls).
int64_t ssd_fwd_workspace_size(const SsdShape& s);
int64_t ssd_bwd_workspace_size(const SsdShape& s);
// Chunked SSD forward: matrix products inside chunks, a scan across chunks.
template <class T>
void ssd_fwd(const SsdShape& s, const T* x, const T* dt, const T* A_log, const T* Bm, const T* Cm,
             const T* D, T* y, T* saved, T* work);
// Chunked SSD backward. dx, ddt, dB, dC overwritten; dA_log, dD accumulated.
template <class T>
void ssd_bwd(const SsdShape& s, const T* dy, const T* x, const T* dt, const T* A_log,
             const T* Bm, const T* Cm, const T* D, const T* saved, T* dx, T* ddt, T* dA_log,
             T* dBm, T* dCm, T* dD, T* work);
// Plain recurrence from the spec: the test reference.
template <class T>
void ssd_ref_fwd(const SsdShape& s, const T* x, const T* dt, const T* A_log, const T* Bm,
                 const T* Cm, const T* D, T* y);
template <class T>
void ssd_ref_bwd(const SsdShape& s, const T* dy, const T* x, const T* dt, const T* A_log,
                 const T* Bm, const T* Cm, const T* D, T* dx, T* ddt, T* dA_log, T* dBm, T* dCm,
                 T* dD);

}  // namespace piper::kernels
