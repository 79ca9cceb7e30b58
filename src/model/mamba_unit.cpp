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

// The mixer computes on the activations' storage type (bf16 under train.precision bf16): in_proj's output
// and its slices (z, the conv's input, dt_raw), the conv's output, the scan's x, B, C, dt and output, the
// gated norm's output, their gradients and the weight half's stash are tensors of it, with the conv's
// and the gated norm's weights in it too; A_log, D and dt_bias, the chunk states and the norm's rstd are
// f32, as the parameter gradients. The block's xn is of the storage type too; the output and the input
// gradient are in Block::mixer_dtype (f32 where the tp group sums them).
void MambaBlock::mixer_forward(int slot, const MicroBatch& mb, backend::ConstTensorView xn, backend::TensorView out) {
  const int64_t B = mb.batch, T = mb.seq, M = mb.rows(), D = cfg_.d_model, di = dims_.d_inner;
  const int64_t Hm = dims_.mamba_heads, G = dims_.groups, N = cfg_.d_state, P = cfg_.head_dim;
  const int64_t GN = G * N, C = dims_.conv_channels, R = dims_.in_proj_rows, K = cfg_.d_conv;
  const backend::DType t = activation_storage();
  Saved s;
  s.batch = B, s.seq = T;
  {
    Tensor zxbcdt = scratch(M * R, t);
    be_.linear_fwd(xn, weight(MAMBA_IN_PROJ, {R, D}), zxbcdt.view({M, R}));
    s.z = act(M * di, t), s.xbc_in = act(M * C, t), s.dt_raw = act(M * Hm, t);
    be_.gather_cols(zxbcdt.view({M, R}), 0, s.z.view({M, di}));
    be_.gather_cols(zxbcdt.view({M, R}), di, s.xbc_in.view({M, C}));
    be_.gather_cols(zxbcdt.view({M, R}), di + C, s.dt_raw.view({M, Hm}));
  }
  s.xbc_conv = act(M * C, t);
  {
    Tensor cw, cb;
    be_.conv1d_fwd(s.xbc_in.view({B, T, C}), weight_as(MAMBA_CONV_WEIGHT, {C, K}, t, cw),
                   weight_as(MAMBA_CONV_BIAS, {C}, t, cb), s.xbc_conv.view({B, T, C}));
  }
  {
    Tensor xbc = scratch(M * C, t);
    be_.silu_fwd(s.xbc_conv.view(), xbc.view());
    s.x = act(M * di, t), s.B = act(M * GN, t), s.C = act(M * GN, t);
    be_.gather_cols(xbc.view({M, C}), 0, s.x.view({M, di}));
    be_.gather_cols(xbc.view({M, C}), di, s.B.view({M, GN}));
    be_.gather_cols(xbc.view({M, C}), di + GN, s.C.view({M, GN}));
  }
  s.dt = act(M * Hm, t);
  be_.dt_softplus_fwd(s.dt_raw.view({M, Hm}), view(be_, w(MAMBA_DT_BIAS), {Hm}), s.dt.view({M, Hm}));
  const backend::Shape xs{B, T, Hm, P}, bs{B, T, G, N};
  s.y = act(M * di, t);
  s.states = act(be_.ssd_saved_numel(xs, bs, cfg_.ssd_chunk));
  be_.ssd_fwd(s.x.view(xs), s.dt.view({B, T, Hm}), view(be_, w(MAMBA_A_LOG), {Hm}), s.B.view(bs),
              s.C.view(bs), view(be_, w(MAMBA_D), {Hm}), s.y.view(xs), s.states.view(),
              cfg_.ssd_chunk);
  s.normed = act(M * di, t);
  s.rstd = act(M * G);
  {
    Tensor nw;
    be_.gated_rmsnorm_fwd(s.y.view({M, di}), s.z.view({M, di}), weight_as(MAMBA_NORM_WEIGHT, {di}, t, nw),
                          s.normed.view({M, di}), s.rstd.view({M, G}), kNormEps);
  }
  be_.linear_fwd(s.normed.view({M, di}), weight(MAMBA_OUT_PROJ, {D, di}), out);
  saved_[slot] = std::move(s);
}

void MambaBlock::mixer_backward_input(int slot, backend::ConstTensorView /*xn*/, backend::ConstTensorView dout,
                                          backend::TensorView dxn) {
  Saved& s = saved_.at(slot);
  const int64_t B = s.batch, T = s.seq, M = B * T, D = cfg_.d_model, di = dims_.d_inner;
  const int64_t Hm = dims_.mamba_heads, G = dims_.groups, N = cfg_.d_state, P = cfg_.head_dim;
  const int64_t GN = G * N, C = dims_.conv_channels, R = dims_.in_proj_rows, K = cfg_.d_conv;
  const backend::DType t = s.normed.dtype();
  s.dout = backend::converted(dout, t, backend::MemCategory::MEM_BUFFERS);
  s.dzxbcdt = scratch(M * R, t);
  const auto dzxbcdt = s.dzxbcdt.view({M, R});
  {
    Tensor dnormed = scratch(M * di, t), dy = scratch(M * di, t), dz = scratch(M * di, t), nw;
    be_.linear_bwd_input(dout, weight(MAMBA_OUT_PROJ, {D, di}),
                         dnormed.view({M, di}), false);
    be_.gated_rmsnorm_bwd(dnormed.view({M, di}), s.y.view({M, di}), s.z.view({M, di}),
                          weight_as(MAMBA_NORM_WEIGHT, {di}, t, nw), s.rstd.view({M, G}), dy.view({M, di}),
                          dz.view({M, di}), view(be_, g(MAMBA_NORM_WEIGHT), {di}));
    be_.scatter_cols(dz.view({M, di}), dzxbcdt, 0);
    Tensor dx = scratch(M * di, t), ddt = scratch(M * Hm, t), dB = scratch(M * GN, t), dC = scratch(M * GN, t);
    const backend::Shape xs{B, T, Hm, P}, bs{B, T, G, N}, ts{B, T, Hm};
    be_.ssd_bwd(dy.view(xs), s.x.view(xs), s.dt.view(ts), view(be_, w(MAMBA_A_LOG), {Hm}),
                s.B.view(bs), s.C.view(bs), view(be_, w(MAMBA_D), {Hm}), s.states.view(), dx.view(xs),
                ddt.view(ts), view(be_, g(MAMBA_A_LOG), {Hm}), dB.view(bs), dC.view(bs),
                view(be_, g(MAMBA_D), {Hm}), cfg_.ssd_chunk);
    Tensor ddt_raw = scratch(M * Hm, t);
    be_.dt_softplus_bwd(ddt.view({M, Hm}), s.dt_raw.view({M, Hm}), view(be_, w(MAMBA_DT_BIAS), {Hm}),
                        ddt_raw.view({M, Hm}), view(be_, g(MAMBA_DT_BIAS), {Hm}));
    be_.scatter_cols(ddt_raw.view({M, Hm}), dzxbcdt, di + C);
    Tensor dxbc = scratch(M * C, t);
    be_.scatter_cols(dx.view({M, di}), dxbc.view({M, C}), 0);
    be_.scatter_cols(dB.view({M, GN}), dxbc.view({M, C}), di);
    be_.scatter_cols(dC.view({M, GN}), dxbc.view({M, C}), di + GN);
    Tensor dconv = scratch(M * C, t), dxbc_in = scratch(M * C, t), cw;
    be_.silu_bwd(dxbc.view(), s.xbc_conv.view(), dconv.view());
    be_.conv1d_bwd(dconv.view({B, T, C}), s.xbc_in.view({B, T, C}), weight_as(MAMBA_CONV_WEIGHT, {C, K}, t, cw),
                   dxbc_in.view({B, T, C}), view(be_, g(MAMBA_CONV_WEIGHT), {C, K}),
                   view(be_, g(MAMBA_CONV_BIAS), {C}));
    be_.scatter_cols(dxbc_in.view({M, C}), dzxbcdt, di);
  }
  // The weight gradients read the gated norm's output (normed) and the stash, nothing else of the forward's.
  s.z = {}, s.xbc_in = {}, s.dt_raw = {}, s.xbc_conv = {}, s.x = {}, s.B = {}, s.C = {}, s.dt = {};
  s.y = {}, s.states = {}, s.rstd = {};
  be_.linear_bwd_input(dzxbcdt, weight(MAMBA_IN_PROJ, {R, D}), dxn, false);
}

void MambaBlock::mixer_backward_weight(int slot, backend::ConstTensorView xn) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.batch * s.seq, D = cfg_.d_model, di = dims_.d_inner, R = dims_.in_proj_rows;
  be_.linear_bwd_weight(s.dout.view({M, D}), s.normed.view({M, di}), view(be_, g(MAMBA_OUT_PROJ), {D, di}));
  be_.linear_bwd_weight(s.dzxbcdt.view({M, R}), xn, view(be_, g(MAMBA_IN_PROJ), {R, D}));
}

void MambaBlock::mixer_release(int slot) { saved_.erase(slot); }

}  // namespace piper::model
