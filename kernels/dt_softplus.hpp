// dt_softplus.hpp — dt = softplus(dt_raw + dt_bias)
// Conventions: see kernels.hpp.
#pragma once

#include <cstdint>

namespace piper::kernels {

// Above this softplus(v) == v to float and double precision alike (torch's threshold).
inline constexpr double kSoftplusLinearAbove = 20;

// dt_raw[M,Hm], dt_bias[Hm] -> dt[M,Hm]
template <class T>
void dt_softplus_fwd(const T* dt_raw, const T* dt_bias, T* dt, int64_t M, int64_t Hm);
// ddt_raw overwritten, ddt_bias accumulated
template <class T>
void dt_softplus_bwd(const T* ddt, const T* dt_raw, const T* dt_bias, T* ddt_raw, T* ddt_bias,
                     int64_t M, int64_t Hm);

}  // namespace piper::kernels
