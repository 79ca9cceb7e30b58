// registry.cpp — the backends this process can compute on.
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.hpp"

namespace piper::backend {

#ifndef PIPER_HAVE_CUDA
void set_cuda_environment() {}

Backend* cuda(std::string* why) {
  if (why) *why = "this build has no CUDA backend (configured with -DPIPER_CUDA=OFF)";
  return nullptr;
}
#endif

std::vector<Backend*> registered_backends() {
  std::vector<Backend*> all{&cpu()};
  if (Backend* gpu = cuda()) all.push_back(gpu);
  return all;
}

}  // namespace piper::backend
