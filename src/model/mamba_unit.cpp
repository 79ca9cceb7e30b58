// mamba_unit.cpp — the Mamba-2 block ('M'): in_proj, causal depthwise conv,
// selective state-space scan (chunked SSD), gated grouped RMSNorm, out_proj.
#include <cmath>
#include <cstring>

#include "kernels.hpp"
#include "model/units.hpp"

namespace piper::model {

namespace k = piper::kernels;

namespace {

constexpr float kNormEps = 1e-5f;

// dst[M, n] = src[M, ld][:, col : col + n]
void gather_cols(const float* src, int64_t ld, int64_t col, int64_t n, float* dst, int64_t M) {
#pragma omp parallel for schedule(static) if (M * n > 32768)
  for (int64_t r = 0; r < M; ++r)
    std::memcpy(dst + r * n, src + r * ld + col, static_cast<size_t>(n) * sizeof(float));
}

// dst[M, ld][:, col : col + n] = src[M, n]
void scatter_cols(const float* src, int64_t n, float* dst, int64_t ld, int64_t col, int64_t M) {
#pragma omp parallel for schedule(static) if (M * n > 32768)
  for (int64_t r = 0; r < M; ++r)
    std::memcpy(dst + r * ld + col, src + r * n, static_cast<size_t>(n) * sizeof(float));
}

}  // namespace

// Params: 0 norm, 1 in_proj [R,D], 2 conv1d.weight [C,K], 3 conv1d.bias [C], 4 dt_bias [Hm],
//         5 A_log [Hm], 6 D [Hm], 7 norm.weight [d_inner], 8 out_proj [D,d_inner].
// in_proj rows R = d_inner (z) + C (xBC) + Hm (dt); xBC = x [d_inner], B [G*N], C [G*N].
void MambaBlock::mixer_forward(int slot, const MicroBatch& mb, const float* xn, float* out) {
  const int64_t M = mb.rows(), D = cfg_.d_model, di = dims_.d_inner, Hm = dims_.mamba_heads;
  const int64_t GN = dims_.groups * cfg_.d_state, C = dims_.conv_channels, R = dims_.in_proj_rows;
  Saved s;
  s.batch = mb.batch, s.seq = mb.seq;
  {
    Tensor zxbcdt = scratch(M * R);
    k::linear_fwd(xn, w(1), zxbcdt.data(), M, D, R);
    s.z = act(M * di), s.xbc_in = act(M * C), s.dt_raw = act(M * Hm);
    gather_cols(zxbcdt.data(), R, 0, di, s.z.data(), M);
    gather_cols(zxbcdt.data(), R, di, C, s.xbc_in.data(), M);
    gather_cols(zxbcdt.data(), R, di + C, Hm, s.dt_raw.data(), M);
  }
  s.xbc_conv = act(M * C);
  k::conv1d_fwd(s.xbc_in.data(), w(2), w(3), s.xbc_conv.data(), mb.batch, mb.seq, C, cfg_.d_conv);
  {
    Tensor xbc = scratch(M * C);
    k::silu_fwd(s.xbc_conv.data(), xbc.data(), M * C);
    s.x = act(M * di), s.B = act(M * GN), s.C = act(M * GN);
    gather_cols(xbc.data(), C, 0, di, s.x.data(), M);
    gather_cols(xbc.data(), C, di, GN, s.B.data(), M);
    gather_cols(xbc.data(), C, di + GN, GN, s.C.data(), M);
  }
  s.dt = act(M * Hm);
  k::dt_softplus_fwd(s.dt_raw.data(), w(4), s.dt.data(), M, Hm);
  const k::SsdShape shape = ssd_shape(mb.batch, mb.seq);
  s.y = act(M * di);
  s.states = act(k::ssd_saved_size(shape));
  k::ssd_fwd(shape, s.x.data(), s.dt.data(), w(5), s.B.data(), s.C.data(), w(6), s.y.data(),
             s.states.data());
  s.normed = act(M * di);
  s.rstd = act(M * dims_.groups);
  k::gated_rmsnorm_fwd(s.y.data(), s.z.data(), w(7), s.normed.data(), s.rstd.data(), M, di,
                       dims_.groups, kNormEps);
  k::linear_fwd(s.normed.data(), w(8), out, M, di, D);
  saved_[slot] = std::move(s);
}

void MambaBlock::mixer_backward_input(int slot, const float* /*xn*/, const float* dout, float* dxn) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.batch * s.seq, D = cfg_.d_model, di = dims_.d_inner, Hm = dims_.mamba_heads;
  const int64_t GN = dims_.groups * cfg_.d_state, C = dims_.conv_channels, R = dims_.in_proj_rows;
  s.dout = scratch(M * D);
  be_.copy(s.dout.data(), dout, static_cast<size_t>(M * D) * sizeof(float));
  s.dzxbcdt = scratch(M * R);
  {
    Tensor dnormed = scratch(M * di), dy = scratch(M * di), dz = scratch(M * di);
    k::linear_bwd_input(dout, w(8), dnormed.data(), M, di, D, false);
    k::gated_rmsnorm_bwd(dnormed.data(), s.y.data(), s.z.data(), w(7), s.rstd.data(), dy.data(),
                         dz.data(), g(7), M, di, dims_.groups);
    scatter_cols(dz.data(), di, s.dzxbcdt.data(), R, 0, M);
    Tensor dx = scratch(M * di), ddt = scratch(M * Hm), dB = scratch(M * GN), dC = scratch(M * GN);
    k::ssd_bwd(ssd_shape(s.batch, s.seq), dy.data(), s.x.data(), s.dt.data(), w(5), s.B.data(),
               s.C.data(), w(6), s.states.data(), dx.data(), ddt.data(), g(5), dB.data(),
               dC.data(), g(6));
    Tensor ddt_raw = scratch(M * Hm);
    k::dt_softplus_bwd(ddt.data(), s.dt_raw.data(), w(4), ddt_raw.data(), g(4), M, Hm);
    scatter_cols(ddt_raw.data(), Hm, s.dzxbcdt.data(), R, di + C, M);
    Tensor dxbc = scratch(M * C);
    scatter_cols(dx.data(), di, dxbc.data(), C, 0, M);
    scatter_cols(dB.data(), GN, dxbc.data(), C, di, M);
    scatter_cols(dC.data(), GN, dxbc.data(), C, di + GN, M);
    Tensor dconv = scratch(M * C), dxbc_in = scratch(M * C);
    k::silu_bwd(dxbc.data(), s.xbc_conv.data(), dconv.data(), M * C);
    k::conv1d_bwd(dconv.data(), s.xbc_in.data(), w(2), dxbc_in.data(), g(2), g(3), s.batch, s.seq,
                  C, cfg_.d_conv);
    scatter_cols(dxbc_in.data(), C, s.dzxbcdt.data(), R, di, M);
  }
  k::linear_bwd_input(s.dzxbcdt.data(), w(1), dxn, M, D, R, false);
}

void MambaBlock::mixer_backward_weight(int slot, const float* xn) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.batch * s.seq, D = cfg_.d_model, di = dims_.d_inner, R = dims_.in_proj_rows;
  k::linear_bwd_weight(s.dout.data(), s.normed.data(), g(8), M, di, D);
  k::linear_bwd_weight(s.dzxbcdt.data(), xn, g(1), M, D, R);
}

void MambaBlock::mixer_release(int slot) { saved_.erase(slot); }

kernels::SsdShape MambaBlock::ssd_shape(int64_t batch, int64_t seq) const {
  return {batch, seq, dims_.mamba_heads, cfg_.head_dim, dims_.groups, cfg_.d_state, cfg_.ssd_chunk};
}

}  // namespace piper::model
