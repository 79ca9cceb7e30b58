// attention_unit.cpp — the causal GQA attention block ('*') with RoPE.
#include "kernels.hpp"
#include "model/units.hpp"

namespace piper::model {

namespace k = piper::kernels;

// Params: 0 norm, 1 q_proj [H*hd,D], 2 k_proj [KV*hd,D], 3 v_proj [KV*hd,D], 4 o_proj [D,H*hd].
void AttentionBlock::mixer_forward(int slot, const MicroBatch& mb, const float* xn, float* out) {
  const int64_t M = mb.rows(), D = cfg_.d_model, H = dims_.heads, KV = dims_.kv_heads;
  const int64_t hd = cfg_.attn_head_dim(), Q = H * hd, KVD = KV * hd;
  Saved s;
  s.batch = mb.batch;
  s.seq = mb.seq;
  s.q = act(M * Q), s.k = act(M * KVD), s.v = act(M * KVD), s.att = act(M * Q);
  s.lse = act(mb.batch * H * mb.seq);
  k::linear_fwd(xn, w(1), s.q.data(), M, D, Q);  // q [B,T,H,hd]
  k::linear_fwd(xn, w(2), s.k.data(), M, D, KVD);
  k::linear_fwd(xn, w(3), s.v.data(), M, D, KVD);
  k::rope_fwd(s.q.data(), s.q.data(), mb.batch, mb.seq, H, hd, cfg_.rope_theta);
  k::rope_fwd(s.k.data(), s.k.data(), mb.batch, mb.seq, KV, hd, cfg_.rope_theta);
  k::attention_fwd(s.q.data(), s.k.data(), s.v.data(), s.att.data(), s.lse.data(), mb.batch,
                   mb.seq, H, KV, hd);
  k::linear_fwd(s.att.data(), w(4), out, M, Q, D);
  saved_[slot] = std::move(s);
}

void AttentionBlock::mixer_backward_input(int slot, const float* /*xn*/, const float* dout,
                                          float* dxn) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.batch * s.seq, D = cfg_.d_model, H = dims_.heads, KV = dims_.kv_heads;
  const int64_t hd = cfg_.attn_head_dim(), Q = H * hd, KVD = KV * hd;
  s.dout = scratch(M * D);
  be_.copy(s.dout.data(), dout, static_cast<size_t>(M * D) * sizeof(float));
  Tensor datt = scratch(M * Q);
  k::linear_bwd_input(dout, w(4), datt.data(), M, Q, D, false);
  s.dq = scratch(M * Q), s.dk = scratch(M * KVD), s.dv = scratch(M * KVD);
  k::attention_bwd(datt.data(), s.q.data(), s.k.data(), s.v.data(), s.att.data(), s.lse.data(),
                   s.dq.data(), s.dk.data(), s.dv.data(), s.batch, s.seq, H, KV, hd);
  k::rope_bwd(s.dq.data(), s.dq.data(), s.batch, s.seq, H, hd, cfg_.rope_theta);
  k::rope_bwd(s.dk.data(), s.dk.data(), s.batch, s.seq, KV, hd, cfg_.rope_theta);
  k::linear_bwd_input(s.dq.data(), w(1), dxn, M, D, Q, false);
  k::linear_bwd_input(s.dk.data(), w(2), dxn, M, D, KVD, true);
  k::linear_bwd_input(s.dv.data(), w(3), dxn, M, D, KVD, true);
}

void AttentionBlock::mixer_backward_weight(int slot, const float* xn) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.batch * s.seq, D = cfg_.d_model;
  const int64_t hd = cfg_.attn_head_dim(), Q = dims_.heads * hd, KVD = dims_.kv_heads * hd;
  k::linear_bwd_weight(s.dout.data(), s.att.data(), g(4), M, Q, D);
  k::linear_bwd_weight(s.dq.data(), xn, g(1), M, D, Q);
  k::linear_bwd_weight(s.dk.data(), xn, g(2), M, D, KVD);
  k::linear_bwd_weight(s.dv.data(), xn, g(3), M, D, KVD);
}

void AttentionBlock::mixer_release(int slot) { saved_.erase(slot); }

}  // namespace piper::model
