// mlp_unit.cpp — the SwiGLU MLP block ('-'): down(silu(gate(x)) * up(x)).
#include "kernels.hpp"
#include "model/units.hpp"

namespace piper::model {

namespace k = piper::kernels;

// Params: 0 norm, 1 gate_proj [F,D], 2 up_proj [F,D], 3 down_proj [D,F].
void MlpBlock::mixer_forward(int slot, const MicroBatch& mb, const float* xn, float* out) {
  const int64_t M = mb.rows(), D = cfg_.d_model, F = dims_.ffn;
  Saved s{M, act(M * F), act(M * F), act(M * F), {}, {}, {}};
  k::linear_fwd(xn, w(1), s.gate.data(), M, D, F);
  k::linear_fwd(xn, w(2), s.up.data(), M, D, F);
  k::swiglu_fwd(s.gate.data(), s.up.data(), s.h.data(), M * F);
  k::linear_fwd(s.h.data(), w(3), out, M, F, D);
  saved_[slot] = std::move(s);
}

void MlpBlock::mixer_backward_input(int slot, const float* /*xn*/, const float* dout, float* dxn) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.rows, D = cfg_.d_model, F = dims_.ffn;
  s.dout = scratch(M * D);
  be_.copy(s.dout.data(), dout, static_cast<size_t>(M * D) * sizeof(float));
  Tensor dh = scratch(M * F);
  k::linear_bwd_input(dout, w(3), dh.data(), M, F, D, false);
  s.dgate = scratch(M * F);
  s.dup = scratch(M * F);
  k::swiglu_bwd(dh.data(), s.gate.data(), s.up.data(), s.dgate.data(), s.dup.data(), M * F);
  k::linear_bwd_input(s.dgate.data(), w(1), dxn, M, D, F, false);
  k::linear_bwd_input(s.dup.data(), w(2), dxn, M, D, F, true);
}

void MlpBlock::mixer_backward_weight(int slot, const float* xn) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.rows, D = cfg_.d_model, F = dims_.ffn;
  k::linear_bwd_weight(s.dout.data(), s.h.data(), g(3), M, F, D);
  k::linear_bwd_weight(s.dgate.data(), xn, g(1), M, D, F);
  k::linear_bwd_weight(s.dup.data(), xn, g(2), M, D, F);
}

void MlpBlock::mixer_release(int slot) { saved_.erase(slot); }

}  // namespace piper::model
