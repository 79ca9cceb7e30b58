// block.cpp — the pre-norm residual wrapper shared by every block kind.
#include "model/units.hpp"

namespace piper::model {

using backend::view;

LocalDims::LocalDims(const config::ModelConfig& c, const TpInfo& tp, const EpInfo& ep) {
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
  moe_ffn = c.moe_ffn_hidden / t;
  experts = c.n_experts / ep.size;
  first_expert = experts * ep.rank;
}

// tp 1: one segment per pass. tp > 1 (ir::pass_shape): the forward's
// row-parallel output projection leaves partial sums that point 0 adds over
// the group before the residual; the backward's column-parallel input
// projections leave a partial dxn that point 0 adds before the norm.
double Block::forward(int k, int slot, const PassIo& a) {
  const int64_t D = cfg_.d_model;
  if (k == 0) {
    const int64_t M = a.mb->rows();
    Saved s{M, act(M * D), act(M), a.y, {}};
    be_.rmsnorm_fwd(view(be_, a.x, {M, D}), view(be_, w(0), {D}), s.xn.view({M, D}), s.rstd.view({M}), kNormEps);
    mixer_forward(slot, *a.mb, s.xn.data(), a.y);
    saved_[slot] = std::move(s);
  } else {
    mixer_forward_segment(k, slot);
  }
  if (!last(ir::NodeKind::FWD, k)) return 0.0;
  const int64_t M = saved_.at(slot).rows;
  be_.add_inplace(view(be_, a.y, {M, D}), view(be_, a.x, {M, D}));  // residual
  return mixer_loss(slot);
}

void Block::backward_input(int k, int slot, const PassIo& a) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.rows, D = cfg_.d_model;
  if (k == 0) {
    s.dxn = scratch(M * D);
    mixer_backward_input(slot, s.xn.data(), a.dy, s.dxn.data());
  } else {
    mixer_backward_segment(k, slot);
  }
  if (last(ir::NodeKind::BWD_I, k)) {
    be_.rmsnorm_bwd(s.dxn.view({M, D}), view(be_, a.x, {M, D}), view(be_, w(0), {D}), s.rstd.view({M}),
                    view(be_, a.dx, {M, D}), view(be_, g(0), {D}));
    be_.add_inplace(view(be_, a.dx, {M, D}), view(be_, a.dy, {M, D}));  // residual
    s.dxn = {}, s.rstd = {};  // the weight gradients read xn
  }
}

CommBuffer Block::point(ir::NodeKind pass, int /*k*/, int slot) {
  Saved& s = saved_.at(slot);
  float* buf = pass == ir::NodeKind::FWD ? s.out : s.dxn.data();
  return {buf, buf, s.rows * cfg_.d_model, {}, {}};
}

void Block::weight_grads(int slot, const PassIo& /*a*/) { mixer_backward_weight(slot, saved_.at(slot).xn.data()); }

void Block::drop(int slot, ir::Recompute mode) {
  mixer_release(slot);
  if (mode != ir::Recompute::RECOMPUTE_FULL) return;
  Saved& s = saved_.at(slot);
  s.xn = {};
  s.rstd = {};
}

// The forward's first segment again, from the same input with the same kernels: the same bits.
void Block::recompute(int slot, const MicroBatch& mb, backend::ConstTensorView x, ir::Recompute mode) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.rows, D = cfg_.d_model;
  widen(s.xn);  // selective: kept from the forward
  if (mode == ir::Recompute::RECOMPUTE_FULL) {
    s.xn = act(M * D);
    s.rstd = act(M);
    Tensor widened;  // the forward widened the same input in the same way
    be_.rmsnorm_fwd(view(be_, f32_of(x, widened), {M, D}), view(be_, w(0), {D}), s.xn.view({M, D}),
                    s.rstd.view({M}), kNormEps);
  }
  Tensor out = scratch(M * D);  // the output is not needed again: the backward reads only the saved state
  mixer_forward(slot, mb, s.xn.data(), out.data());
  narrow(slot);  // the backward reads what it would have read without the recomputation
}

// The normalised input (the mixer's products read it again for the weight gradients): the norm computes
// it in f32. The mixers compute on the storage type and keep nothing to narrow; rstd is a statistic.
std::vector<Tensor*> Block::kept(int slot) {
  auto it = saved_.find(slot);
  if (it == saved_.end()) return {};
  return {&it->second.xn};
}

void Block::release(int slot) {
  mixer_release(slot);
  saved_.erase(slot);
}

}  // namespace piper::model
