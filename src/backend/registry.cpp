// registry.cpp — the backends this process can compute on.
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.hpp"

namespace piper::backend {

#ifndef PIPER_HAVE_CUDA
Backend* cuda(std::string* why) {
  if (why) *why = "this build has no CUDA backend (configured with -DPIPER_CUDA=OFF)";
  return nullptr;
}
#endif

Backend& named(const std::string& device) {
  if (device == "cpu") return cpu();
  if (device == "cpu_detached") return cpu_detached();
  if (device == "cuda") {
    std::string why;
    if (Backend* gpu = cuda(&why)) return *gpu;
    throw std::runtime_error("device cuda: " + why + "; run on a machine with an NVIDIA GPU, or with device cpu");
  }
  throw std::runtime_error("device '" + device + "': not one of cpu, cuda, cpu_detached");
}

std::vector<Backend*> registered_backends() {
  std::vector<Backend*> all{&cpu()};
  if (Backend* gpu = cuda()) all.push_back(gpu);
  return all;
}

}  // namespace piper::backend
