// mlp_unit.cpp — the SwiGLU MLP block ('-'): down(silu(gate(x)) * up(x)).
#include "model/units.hpp"

namespace piper::model {

using backend::view;

namespace {
// Parameters in spec order: gate_proj [F,D], up_proj [F,D], down_proj [D,F] (0 is the block's norm).
enum MlpParam : size_t { MLP_GATE_PROJ = 1, MLP_UP_PROJ, MLP_DOWN_PROJ };
}  // namespace

// The mixer computes on the activations' storage type (bf16 under train.precision bf16): gate, up, h, their
// gradients and the weight half's stash are tensors of it, as the block's xn; the output and the input
// gradient are in Block::mixer_dtype (f32 where the tp group sums them).
void MlpBlock::mixer_forward(int slot, const MicroBatch& mb, backend::ConstTensorView xn, backend::TensorView out) {
  const int64_t M = mb.rows(), D = cfg_.d_model, F = dims_.ffn;
  const backend::DType t = activation_storage();
  Saved s{M, act(M * F, t), act(M * F, t), act(M * F, t), {}, {}, {}};
    be_.linear_fwd(xn, weight(MLP_GATE_PROJ, {F, D}), s.gate.view({M, F}));
  be_.linear_fwd(xn, weight(MLP_UP_PROJ, {F, D}), s.up.view({M, F}));
  be_.swiglu_fwd(s.gate.view(), s.up.view(), s.h.view());
  be_.linear_fwd(s.h.view({M, F}), weight(MLP_DOWN_PROJ, {D, F}), out);
  saved_[slot] = std::move(s);
}

void MlpBlock::mixer_backward_input(int slot, backend::ConstTensorView /*xn*/, backend::ConstTensorView dout,
                                          backend::TensorView dxn) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.rows, D = cfg_.d_model, F = dims_.ffn;
  const backend::DType t = s.h.dtype();
  s.dout = backend::converted(dout, t, backend::MemCategory::MEM_BUFFERS);
  Tensor dh = scratch(M * F, t);
  be_.linear_bwd_input(dout, weight(MLP_DOWN_PROJ, {D, F}), dh.view({M, F}),
                       false);
  s.dgate = scratch(M * F, t);
  s.dup = scratch(M * F, t);
  be_.swiglu_bwd(dh.view(), s.gate.view(), s.up.view(), s.dgate.view(), s.dup.view());
  s.gate = {}, s.up = {};  // the weight gradients read h, not these
  be_.linear_bwd_input(s.dgate.view({M, F}), weight(MLP_GATE_PROJ, {F, D}), dxn, false);
  be_.linear_bwd_input(s.dup.view({M, F}), weight(MLP_UP_PROJ, {F, D}), dxn, true);
}

void MlpBlock::mixer_backward_weight(int slot, backend::ConstTensorView xn) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.rows, D = cfg_.d_model, F = dims_.ffn;
    be_.linear_bwd_weight(s.dout.view({M, D}), s.h.view({M, F}), view(be_, g(MLP_DOWN_PROJ), {D, F}));
  be_.linear_bwd_weight(s.dgate.view({M, F}), xn, view(be_, g(MLP_GATE_PROJ), {F, D}));
  be_.linear_bwd_weight(s.dup.view({M, F}), xn, view(be_, g(MLP_UP_PROJ), {F, D}));
}

void MlpBlock::mixer_release(int slot) { saved_.erase(slot); }

}  // namespace piper::model
