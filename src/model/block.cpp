// block.cpp — the pre-norm residual wrapper shared by every block kind.
#include "kernels.hpp"
#include "model/units.hpp"

namespace piper::model {

namespace k = piper::kernels;
constexpr float kNormEps = 1e-5f;

double Block::forward(int slot, const MicroBatch& mb, const float* x, float* y) {
  const int64_t M = mb.rows(), D = cfg_.d_model;
  Saved s{M, act(M * D), act(M)};
  k::rmsnorm_fwd(x, w(0), s.xn.data(), s.rstd.data(), M, D, kNormEps);
  mixer_forward(slot, mb, s.xn.data(), y);
  for (int64_t i = 0; i < M * D; ++i) y[i] += x[i];  // residual
  saved_[slot] = std::move(s);
  return 0.0;
}

void Block::backward_input(int slot, const float* x, const float* dy, float* dx) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.rows, D = cfg_.d_model;
  Tensor dxn = scratch(M * D);
  mixer_backward_input(slot, s.xn.data(), dy, dxn.data());
  k::rmsnorm_bwd(dxn.data(), x, w(0), s.rstd.data(), dx, g(0), M, D);
  for (int64_t i = 0; i < M * D; ++i) dx[i] += dy[i];  // residual
}

void Block::backward_weight(int slot) {
  mixer_backward_weight(slot, saved_.at(slot).xn.data());
  release(slot);
}

void Block::release(int slot) {
  mixer_release(slot);
  saved_.erase(slot);
}

}  // namespace piper::model
