// cuda_check.hpp — host-side checks of CUDA runtime calls, for the kernels' launchers and the
// CUDA backend alike (host code only: no device functions here).
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace piper::kernels::cuda {

// Throws std::runtime_error naming the call, the file and line, and CUDA's error.
inline void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA error in ") + what + " at " + file + ":" +
                             std::to_string(line) + ": " + cudaGetErrorName(e) + " (" +
                             cudaGetErrorString(e) + ")");
}

}  // namespace piper::kernels::cuda

#define PIPER_CUDA_CHECK(expr) ::piper::kernels::cuda::check((expr), #expr, __FILE__, __LINE__)
// After a kernel launch: a bad configuration shows here, with the kernel's name.
#define PIPER_CUDA_LAUNCHED(kernel) \
  ::piper::kernels::cuda::check(cudaGetLastError(), "launch of " kernel, __FILE__, __LINE__)
