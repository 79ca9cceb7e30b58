// block.cpp — the pre-norm residual wrapper shared by every block kind.
#include "kernels.hpp"
#include "model/units.hpp"

namespace piper::model {

namespace k = piper::kernels;
constexpr float kNormEps = 1e-5f;

LocalDims::LocalDims(const config::ModelConfig& c, const TpInfo& tp) {
  const int64_t t = tp.size;
  heads = c.n_heads / t;
  kv_heads = c.n_kv_heads / t;
  ffn = c.ffn_hidden / t;
  d_inner = c.d_inner() / t;
  mamba_heads = c.mamba_heads() / t;
  groups = c.n_groups / t;
  conv_channels = d_inner + 2 * groups * c.d_state;
  in_proj_rows = 2 * d_inner + 2 * groups * c.d_state + mamba_heads;
  vocab = c.vocab_size / t;
  vocab_offset = vocab * tp.rank;
}

double Block::forward(int slot, const MicroBatch& mb, const float* x, float* y) {
  const int64_t M = mb.rows(), D = cfg_.d_model;
  Saved s{M, act(M * D), act(M)};
  k::rmsnorm_fwd(x, w(0), s.xn.data(), s.rstd.data(), M, D, kNormEps);
  mixer_forward(slot, mb, s.xn.data(), y);
  tp_allreduce(y, M * D);  // row-parallel output projections leave partial sums
  for (int64_t i = 0; i < M * D; ++i) y[i] += x[i];  // residual
  saved_[slot] = std::move(s);
  return 0.0;
}

void Block::backward_input(int slot, const float* x, const float* dy, float* dx) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.rows, D = cfg_.d_model;
  Tensor dxn = scratch(M * D);
  mixer_backward_input(slot, s.xn.data(), dy, dxn.data());
  tp_allreduce(dxn.data(), M * D);  // column-parallel input projections: partial input gradients
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
