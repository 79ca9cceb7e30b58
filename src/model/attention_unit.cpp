// attention_unit.cpp — the causal GQA attention block ('*') with RoPE.
#include "model/units.hpp"

namespace piper::model {

using backend::view;

namespace {
// Parameters in spec order: q_proj [H*hd,D], k_proj [KV*hd,D], v_proj [KV*hd,D], o_proj [D,H*hd]
// (0 is the block's norm).
enum AttentionParam : size_t { ATTN_Q_PROJ = 1, ATTN_K_PROJ, ATTN_V_PROJ, ATTN_O_PROJ };
}  // namespace

// The mixer computes on the activations' storage type (bf16 under train.precision bf16): q, k, v, the
// attention output, their gradients and the weight half's stash are tensors of it, lse f32, as the block's
// xn; the output and the input gradient are in Block::mixer_dtype (f32 where the tp group sums them).
void AttentionBlock::mixer_forward(int slot, const MicroBatch& mb, backend::ConstTensorView xn, backend::TensorView out) {
  const int64_t M = mb.rows(), D = cfg_.d_model, H = dims_.heads, KV = dims_.kv_heads;
  const int64_t B = mb.batch, T = mb.seq, hd = cfg_.attn_head_dim(), Q = H * hd, KVD = KV * hd;
  const backend::DType t = activation_storage();
  Saved s;
  s.batch = B;
  s.seq = T;
  s.q = act(M * Q, t), s.k = act(M * KVD, t), s.v = act(M * KVD, t), s.att = act(M * Q, t);
  s.lse = act(B * H * T);
    be_.linear_fwd(xn, weight(ATTN_Q_PROJ, {Q, D}), s.q.view({M, Q}));
  be_.linear_fwd(xn, weight(ATTN_K_PROJ, {KVD, D}), s.k.view({M, KVD}));
  be_.linear_fwd(xn, weight(ATTN_V_PROJ, {KVD, D}), s.v.view({M, KVD}));
  const backend::Shape qs{B, T, H, hd}, ks{B, T, KV, hd};
  be_.rope_fwd(s.q.view(qs), s.q.view(qs), cfg_.rope_theta);
  be_.rope_fwd(s.k.view(ks), s.k.view(ks), cfg_.rope_theta);
  be_.attention_fwd(s.q.view(qs), s.k.view(ks), s.v.view(ks), s.att.view(qs), s.lse.view({B, H, T}));
  be_.linear_fwd(s.att.view({M, Q}), weight(ATTN_O_PROJ, {D, Q}), out);
  saved_[slot] = std::move(s);
}

void AttentionBlock::mixer_backward_input(int slot, backend::ConstTensorView /*xn*/, backend::ConstTensorView dout,
                                          backend::TensorView dxn) {
  Saved& s = saved_.at(slot);
  const int64_t B = s.batch, T = s.seq, M = B * T, D = cfg_.d_model, H = dims_.heads;
  const int64_t KV = dims_.kv_heads, hd = cfg_.attn_head_dim(), Q = H * hd, KVD = KV * hd;
  const backend::DType t = s.att.dtype();
  s.dout = backend::converted(dout, t, backend::MemCategory::MEM_BUFFERS);
  Tensor datt = scratch(M * Q, t);
  be_.linear_bwd_input(dout, weight(ATTN_O_PROJ, {D, Q}), datt.view({M, Q}),
                       false);
  s.dq = scratch(M * Q, t), s.dk = scratch(M * KVD, t), s.dv = scratch(M * KVD, t);
  const backend::Shape qs{B, T, H, hd}, ks{B, T, KV, hd};
  be_.attention_bwd(datt.view(qs), s.q.view(qs), s.k.view(ks), s.v.view(ks), s.att.view(qs),
                    s.lse.view({B, H, T}), s.dq.view(qs), s.dk.view(ks), s.dv.view(ks));
  be_.rope_bwd(s.dq.view(qs), s.dq.view(qs), cfg_.rope_theta);
  be_.rope_bwd(s.dk.view(ks), s.dk.view(ks), cfg_.rope_theta);
  s.q = {}, s.k = {}, s.v = {}, s.lse = {};  // the weight gradients read the output att, not these
  be_.linear_bwd_input(s.dq.view({M, Q}), weight(ATTN_Q_PROJ, {Q, D}), dxn, false);
  be_.linear_bwd_input(s.dk.view({M, KVD}), weight(ATTN_K_PROJ, {KVD, D}), dxn, true);
  be_.linear_bwd_input(s.dv.view({M, KVD}), weight(ATTN_V_PROJ, {KVD, D}), dxn, true);
}

void AttentionBlock::mixer_backward_weight(int slot, backend::ConstTensorView xn) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.batch * s.seq, D = cfg_.d_model;
  const int64_t hd = cfg_.attn_head_dim(), Q = dims_.heads * hd, KVD = dims_.kv_heads * hd;
    be_.linear_bwd_weight(s.dout.view({M, D}), s.att.view({M, Q}), view(be_, g(ATTN_O_PROJ), {D, Q}));
  be_.linear_bwd_weight(s.dq.view({M, Q}), xn, view(be_, g(ATTN_Q_PROJ), {Q, D}));
  be_.linear_bwd_weight(s.dk.view({M, KVD}), xn, view(be_, g(ATTN_K_PROJ), {KVD, D}));
  be_.linear_bwd_weight(s.dv.view({M, KVD}), xn, view(be_, g(ATTN_V_PROJ), {KVD, D}));
}

void AttentionBlock::mixer_release(int slot) { saved_.erase(slot); }

}  // namespace piper::model
