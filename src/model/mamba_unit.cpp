// mamba_unit.cpp — the Mamba-2 block ('M'): in_proj, causal depthwise conv,
// selective state-space scan (chunked SSD), gated grouped RMSNorm, out_proj.
#include "model/units.hpp"

namespace piper::model {

using backend::view;

namespace {

// Parameters in spec order (0 is the block's norm): in_proj [R,D], conv1d.weight [C,K],
// conv1d.bias [C], dt_bias [Hm], A_log [Hm], D [Hm], norm.weight [d_inner], out_proj [D,d_inner].
// in_proj rows R = d_inner (z) + C (xBC) + Hm (dt); xBC = x [d_inner], B [G*N], C [G*N].
enum MambaParam : size_t {
  MAMBA_IN_PROJ = 1,
  MAMBA_CONV_WEIGHT,
  MAMBA_CONV_BIAS,
  MAMBA_DT_BIAS,
  MAMBA_A_LOG,
  MAMBA_D,
  MAMBA_NORM_WEIGHT,
  MAMBA_OUT_PROJ,
};

}  // namespace

void MambaBlock::mixer_forward(int slot, const MicroBatch& mb, const float* xn, float* out) {
  const int64_t B = mb.batch, T = mb.seq, M = mb.rows(), D = cfg_.d_model, di = dims_.d_inner;
  const int64_t Hm = dims_.mamba_heads, G = dims_.groups, N = cfg_.d_state, P = cfg_.head_dim;
  const int64_t GN = G * N, C = dims_.conv_channels, R = dims_.in_proj_rows, K = cfg_.d_conv;
  Saved s;
  s.batch = B, s.seq = T;
  {
    Tensor zxbcdt = scratch(M * R);
    be_.linear_fwd(view(be_, xn, {M, D}), weight(MAMBA_IN_PROJ, {R, D}), zxbcdt.view({M, R}));
    s.z = act(M * di), s.xbc_in = act(M * C), s.dt_raw = act(M * Hm);
    be_.gather_cols(zxbcdt.view({M, R}), 0, s.z.view({M, di}));
    be_.gather_cols(zxbcdt.view({M, R}), di, s.xbc_in.view({M, C}));
    be_.gather_cols(zxbcdt.view({M, R}), di + C, s.dt_raw.view({M, Hm}));
  }
  s.xbc_conv = act(M * C);
  be_.conv1d_fwd(s.xbc_in.view({B, T, C}), view(be_, w(MAMBA_CONV_WEIGHT), {C, K}),
                 view(be_, w(MAMBA_CONV_BIAS), {C}), s.xbc_conv.view({B, T, C}));
  {
    Tensor xbc = scratch(M * C);
    be_.silu_fwd(s.xbc_conv.view(), xbc.view());
    s.x = act(M * di), s.B = act(M * GN), s.C = act(M * GN);
    be_.gather_cols(xbc.view({M, C}), 0, s.x.view({M, di}));
    be_.gather_cols(xbc.view({M, C}), di, s.B.view({M, GN}));
    be_.gather_cols(xbc.view({M, C}), di + GN, s.C.view({M, GN}));
  }
  s.dt = act(M * Hm);
  be_.dt_softplus_fwd(s.dt_raw.view({M, Hm}), view(be_, w(MAMBA_DT_BIAS), {Hm}), s.dt.view({M, Hm}));
  const backend::Shape xs{B, T, Hm, P}, bs{B, T, G, N};
  s.y = act(M * di);
  s.states = act(be_.ssd_saved_numel(xs, bs, cfg_.ssd_chunk));
  be_.ssd_fwd(s.x.view(xs), s.dt.view({B, T, Hm}), view(be_, w(MAMBA_A_LOG), {Hm}), s.B.view(bs),
              s.C.view(bs), view(be_, w(MAMBA_D), {Hm}), s.y.view(xs), s.states.view(),
              cfg_.ssd_chunk);
  s.normed = act(M * di);
  s.rstd = act(M * G);
  be_.gated_rmsnorm_fwd(s.y.view({M, di}), s.z.view({M, di}), view(be_, w(MAMBA_NORM_WEIGHT), {di}),
                        s.normed.view({M, di}), s.rstd.view({M, G}), kNormEps);
  be_.linear_fwd(s.normed.view({M, di}), weight(MAMBA_OUT_PROJ, {D, di}), view(be_, out, {M, D}));
  saved_[slot] = std::move(s);
}

void MambaBlock::mixer_backward_input(int slot, const float* /*xn*/, const float* dout, float* dxn) {
  Saved& s = saved_.at(slot);
  const int64_t B = s.batch, T = s.seq, M = B * T, D = cfg_.d_model, di = dims_.d_inner;
  const int64_t Hm = dims_.mamba_heads, G = dims_.groups, N = cfg_.d_state, P = cfg_.head_dim;
  const int64_t GN = G * N, C = dims_.conv_channels, R = dims_.in_proj_rows, K = cfg_.d_conv;
  s.dout = scratch(M * D);
  be_.copy(s.dout.data(), dout, static_cast<size_t>(M * D) * sizeof(float));
  s.dzxbcdt = scratch(M * R);
  const auto dzxbcdt = s.dzxbcdt.view({M, R});
  {
    Tensor dnormed = scratch(M * di), dy = scratch(M * di), dz = scratch(M * di);
    be_.linear_bwd_input(view(be_, dout, {M, D}), weight(MAMBA_OUT_PROJ, {D, di}),
                         dnormed.view({M, di}), false);
    be_.gated_rmsnorm_bwd(dnormed.view({M, di}), s.y.view({M, di}), s.z.view({M, di}),
                          view(be_, w(MAMBA_NORM_WEIGHT), {di}), s.rstd.view({M, G}), dy.view({M, di}),
                          dz.view({M, di}), view(be_, g(MAMBA_NORM_WEIGHT), {di}));
    be_.scatter_cols(dz.view({M, di}), dzxbcdt, 0);
    Tensor dx = scratch(M * di), ddt = scratch(M * Hm), dB = scratch(M * GN), dC = scratch(M * GN);
    const backend::Shape xs{B, T, Hm, P}, bs{B, T, G, N}, ts{B, T, Hm};
    be_.ssd_bwd(dy.view(xs), s.x.view(xs), s.dt.view(ts), view(be_, w(MAMBA_A_LOG), {Hm}),
                s.B.view(bs), s.C.view(bs), view(be_, w(MAMBA_D), {Hm}), s.states.view(), dx.view(xs),
                ddt.view(ts), view(be_, g(MAMBA_A_LOG), {Hm}), dB.view(bs), dC.view(bs),
                view(be_, g(MAMBA_D), {Hm}), cfg_.ssd_chunk);
    Tensor ddt_raw = scratch(M * Hm);
    be_.dt_softplus_bwd(ddt.view({M, Hm}), s.dt_raw.view({M, Hm}), view(be_, w(MAMBA_DT_BIAS), {Hm}),
                        ddt_raw.view({M, Hm}), view(be_, g(MAMBA_DT_BIAS), {Hm}));
    be_.scatter_cols(ddt_raw.view({M, Hm}), dzxbcdt, di + C);
    Tensor dxbc = scratch(M * C);
    be_.scatter_cols(dx.view({M, di}), dxbc.view({M, C}), 0);
    be_.scatter_cols(dB.view({M, GN}), dxbc.view({M, C}), di);
    be_.scatter_cols(dC.view({M, GN}), dxbc.view({M, C}), di + GN);
    Tensor dconv = scratch(M * C), dxbc_in = scratch(M * C);
    be_.silu_bwd(dxbc.view(), s.xbc_conv.view(), dconv.view());
    be_.conv1d_bwd(dconv.view({B, T, C}), s.xbc_in.view({B, T, C}), view(be_, w(MAMBA_CONV_WEIGHT), {C, K}),
                   dxbc_in.view({B, T, C}), view(be_, g(MAMBA_CONV_WEIGHT), {C, K}),
                   view(be_, g(MAMBA_CONV_BIAS), {C}));
    be_.scatter_cols(dxbc_in.view({M, C}), dzxbcdt, di);
  }
  // The weight gradients read the gated norm's output (normed) and the stash, nothing else of the forward's.
  s.z = {}, s.xbc_in = {}, s.dt_raw = {}, s.xbc_conv = {}, s.x = {}, s.B = {}, s.C = {}, s.dt = {};
  s.y = {}, s.states = {}, s.rstd = {};
  be_.linear_bwd_input(dzxbcdt, weight(MAMBA_IN_PROJ, {R, D}), view(be_, dxn, {M, D}), false);
}

void MambaBlock::mixer_backward_weight(int slot, const float* xn) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.batch * s.seq, D = cfg_.d_model, di = dims_.d_inner, R = dims_.in_proj_rows;
  be_.linear_bwd_weight(s.dout.view({M, D}), s.normed.view({M, di}), view(be_, g(MAMBA_OUT_PROJ), {D, di}));
  be_.linear_bwd_weight(s.dzxbcdt.view({M, R}), view(be_, xn, {M, D}), view(be_, g(MAMBA_IN_PROJ), {R, D}));
}

// The wide activations; the scan's step sizes (dt_raw, dt: one value per row and head, which the
// scan's decays exponentiate), its chunk states and the norm's rstd stay f32.
std::vector<Tensor*> MambaBlock::mixer_kept(int slot) {
  auto it = saved_.find(slot);
  if (it == saved_.end()) return {};
  Saved& s = it->second;
  return {&s.z, &s.xbc_in, &s.xbc_conv, &s.x, &s.B, &s.C, &s.y, &s.normed};
}

void MambaBlock::mixer_release(int slot) { saved_.erase(slot); }

}  // namespace piper::model
