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

backend::DType Block::mixer_dtype(backend::DType storage) const {
  return mixer_writes_f32() ? backend::DType::DTYPE_F32 : partial_dtype(storage);
}

// tp 1: one segment per pass. tp > 1 (ir::pass_shape): the forward's
// row-parallel output projection leaves partial sums that point 0 adds over
// the group before the residual; the backward's column-parallel input
// projections leave a partial dxn that point 0 adds before the norm.
double Block::forward(int k, int slot, const PassArgs& a) {
  const int64_t D = cfg_.d_model;
  if (k == 0) {
    const int64_t M = a.mb->rows();
    const backend::DType t = a.x.dtype, mt = mixer_dtype(t);
    Saved s{M, act(M * D, t), act(M), a.y, {}, {}};
    Tensor nw;
    be_.rmsnorm_fwd(a.x, weight_as(0, {D}, t, nw), s.xn.view({M, D}), s.rstd.view({M}), kNormEps);
    if (mt != a.y.dtype) {
      s.sum = scratch(M * D, mt);
      s.out = s.sum.view({M, D});
    }
    mixer_forward(slot, *a.mb, s.xn.view({M, D}), s.out);
    saved_[slot] = std::move(s);
  } else {
    mixer_forward_segment(k, slot);
  }
  if (!last(ir::NodeKind::FWD, k)) return 0.0;
  Saved& s = saved_.at(slot);
  if (!s.sum.empty()) be_.convert(s.sum.view({s.rows, D}), a.y);
  s.sum = {}, s.out = {};
  be_.add_inplace(a.y, a.x);  // residual
  return mixer_loss(slot);
}

void Block::backward_input(int k, int slot, const PassArgs& a) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.rows, D = cfg_.d_model;
  if (k == 0) {
    s.dxn = scratch(M * D, mixer_dtype(a.dy.dtype));
    mixer_backward_input(slot, s.xn.view({M, D}), a.dy, s.dxn.view({M, D}));
  } else {
    mixer_backward_segment(k, slot);
  }
  if (last(ir::NodeKind::BWD_I, k)) {
    const backend::DType t = a.dx.dtype;
    if (s.dxn.dtype() != t) s.dxn = backend::converted(s.dxn.view(), t, backend::MemCategory::MEM_BUFFERS);
    Tensor nw;
    be_.rmsnorm_bwd(s.dxn.view({M, D}), a.x, weight_as(0, {D}, t, nw), s.rstd.view({M}), a.dx,
                    view(be_, g(0), {D}));
    be_.add_inplace(a.dx, a.dy);  // residual
    s.dxn = {}, s.rstd = {};      // the weight gradients read xn
  }
}

CommBuffer Block::point(ir::NodeKind pass, int /*k*/, int slot) {
  Saved& s = saved_.at(slot);
  void* buf = pass == ir::NodeKind::FWD ? s.out.ptr : s.dxn.view().ptr;
  return {buf, buf, s.rows * cfg_.d_model, {}, {}};
}

void Block::weight_grads(int slot, const PassArgs& /*a*/) {
  Saved& s = saved_.at(slot);
  mixer_backward_weight(slot, s.xn.view({s.rows, cfg_.d_model}));
}

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
  const backend::DType t = x.dtype;
  if (mode == ir::Recompute::RECOMPUTE_FULL) {
    s.xn = act(M * D, t);
    s.rstd = act(M);
    Tensor nw;
    be_.rmsnorm_fwd(backend::ConstTensorView{x.device, t, {M, D}, x.ptr}, weight_as(0, {D}, t, nw),
                    s.xn.view({M, D}), s.rstd.view({M}), kNormEps);
  }
  // The output is not needed again: the backward reads only the saved state.
  Tensor out = scratch(M * D, mixer_dtype(t));
  mixer_forward(slot, mb, s.xn.view({M, D}), out.view({M, D}));
}

void Block::release(int slot) {
  mixer_release(slot);
  saved_.erase(slot);
}

}  // namespace piper::model
