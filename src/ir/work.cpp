// work.cpp — FLOPs, memory traffic and activation memory of each unit kind,
// op by op as src/model/*.cpp and kernels/*.cpp run them (docs/hardware.md),
// and the units' costs for balancing stages.
#include "ir/work.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace piper::ir {

double Work::flops() const { return matmul_flops() + other_flops(); }

double Work::matmul_flops() const {
  double s = 0.0;
  for (const OpWork& o : ops) s += o.matmul_flops;
  return s;
}

double Work::other_flops() const {
  double s = 0.0;
  for (const OpWork& o : ops) s += o.other_flops;
  return s;
}

double Work::bytes() const {
  double s = 0.0;
  for (const OpWork& o : ops) s += o.bytes;
  return s;
}

const OpWork* Work::op(const std::string& name) const {
  for (const OpWork& o : ops)
    if (o.name == name) return &o;
  return nullptr;
}

void Work::append(const Work& w) {
  ops.insert(ops.end(), w.ops.begin(), w.ops.end());
  tp_comm.insert(tp_comm.end(), w.tp_comm.begin(), w.tp_comm.end());
}

double adamw_bytes_per_element(int state_bytes) { return 7.0 * state_bytes; }
double adamw_flops_per_element() { return 14.0; }

namespace {

// Nominal FLOPs per element of the non-matmul ops (docs/hardware.md lists them).
constexpr double kRmsnormFwd = 4, kRmsnormBwd = 8;        // per element of [M, D]
constexpr double kSwigluFwd = 5, kSwigluBwd = 10;         // per element of [M, F]
constexpr double kSiluFwd = 4, kSiluBwd = 6;
constexpr double kRope = 3;                               // u cos + rotate_half(u) sin
constexpr double kSoftmaxFwd = 5, kSoftmaxBwd = 4;        // per causal score
constexpr double kDtSoftplus = 4;
constexpr double kGatedNormFwd = 9, kGatedNormBwd = 16;   // y silu(z), then the group rmsnorm
constexpr double kCrossEntropy = 6;                       // per logit: max, exp, sum, scale (fused gradient)
constexpr double kIdBytes = 4;                            // token ids and targets are int32
constexpr double kRouteFwd = 8, kRouteBwd = 8;            // per router logit: softmax, top-k, renormalisation
constexpr double kBalance = 3;                            // per router probability: P_e sums and dprobs

// The sizes one tp rank computes with (model::LocalDims), as doubles: counts
// reach 1e15 and more, and rows may be any positive number in a fit.
struct Dims {
  double M, T, Bs;                 // rows, seq_len, sequences (M / T)
  double D, V;                     // d_model, local vocabulary
  double H, KV, hd, Q, KVD;        // local heads, kv heads, head dim, H hd, KV hd
  double F;                        // local MLP hidden
  double di, Hm, G, N, P, C, R, K; // Mamba-2: local d_inner, heads, groups; N, P; conv channels, in_proj rows, d_conv
  double E, top_k, Fe;             // MoE: experts, experts per token, local expert hidden
  int64_t T_int = 1, chunk = 1;
};

void need_divisible(char kind, int tp, const char* what, int64_t n) {
  if (n % tp != 0)
    throw std::invalid_argument(std::string("ir: unit '") + kind + "' at tp " + std::to_string(tp) + ": " +
                                what + " = " + std::to_string(n) + " does not divide by tp");
}

Dims dims_of(const config::ModelConfig& m, char kind, int64_t rows, int64_t seq_len, int tp) {
  if (rows < 1 || seq_len < 1 || tp < 1)
    throw std::invalid_argument("ir: rows (" + std::to_string(rows) + "), seq_len (" + std::to_string(seq_len) +
                                ") and tp (" + std::to_string(tp) + ") must be at least 1");
  switch (kind) {
    case 'e':
    case 'h': need_divisible(kind, tp, "vocab_size", m.vocab_size); break;
    case '*':
      need_divisible(kind, tp, "n_heads", m.n_heads);
      need_divisible(kind, tp, "n_kv_heads", m.n_kv_heads);
      break;
    case '-': need_divisible(kind, tp, "ffn_hidden", m.ffn_hidden); break;
    case 'M':
      need_divisible(kind, tp, "mamba heads (d_inner / head_dim)", m.mamba_heads());
      need_divisible(kind, tp, "n_groups", m.n_groups);
      break;
    case 'E':
      if (m.n_experts < 1 || m.top_k < 1 || m.moe_ffn_hidden < 1)
        throw std::invalid_argument("ir: unit 'E' (MoE) needs model.n_experts, model.top_k and model.moe_ffn_hidden");
      need_divisible(kind, tp, "moe_ffn_hidden", m.moe_ffn_hidden);
      break;
    default:
      throw std::invalid_argument(std::string("ir: unknown unit kind '") + kind +
                                  "'; expected e (embedding), M, *, -, E, h (head)");
  }
  const double t = tp;
  Dims d{};
  d.M = static_cast<double>(rows);
  d.T = static_cast<double>(seq_len);
  d.T_int = seq_len;
  d.Bs = d.M / d.T;
  d.D = static_cast<double>(m.d_model);
  d.V = static_cast<double>(m.vocab_size) / t;
  d.H = static_cast<double>(m.n_heads) / t;
  d.KV = static_cast<double>(m.n_kv_heads) / t;
  d.hd = static_cast<double>(m.attn_head_dim());
  d.Q = d.H * d.hd;
  d.KVD = d.KV * d.hd;
  d.F = static_cast<double>(m.ffn_hidden) / t;
  d.Hm = static_cast<double>(m.mamba_heads()) / t;
  d.G = static_cast<double>(m.n_groups) / t;
  d.N = static_cast<double>(m.d_state);
  d.P = static_cast<double>(m.head_dim);
  d.di = static_cast<double>(m.d_inner()) / t;
  d.C = d.di + 2 * d.G * d.N;
  d.R = 2 * d.di + 2 * d.G * d.N + d.Hm;
  d.K = static_cast<double>(m.d_conv);
  d.chunk = m.ssd_chunk > 0 ? m.ssd_chunk : seq_len;  // chunk <= 0: one chunk (kernels/ssd.cpp)
  d.E = static_cast<double>(m.n_experts);
  d.top_k = static_cast<double>(m.top_k);
  d.Fe = static_cast<double>(m.moe_ffn_hidden) / t;
  return d;
}

// Collects the ops of one call; sizes in elements, traffic at `e` bytes each.
class Ops {
 public:
  explicit Ops(double elem_bytes) : e_(elem_bytes) {}
  // y[m, n] = x[m, k] w^T (w [n, k]) or any [m, k] x [k, n] product; an
  // accumulated result is read and written.
  void gemm(const char* name, double m, double n, double k, bool accumulate = false) {
    add(name, 2 * m * n * k, 0, m * k + k * n + m * n * (accumulate ? 2 : 1));
  }
  // dW[n, k] += dy[M, n]^T x[M, k]
  void weight_grad(const char* name, double M, double n, double k) {
    add(name, 2 * M * n * k, 0, M * n + M * k + 2 * n * k);
  }
  // elems: elements read plus elements written; raw: bytes of int32 ids.
  void pointwise(const char* name, double flops, double elems, double raw = 0) { add(name, 0, flops, elems, raw); }
  void add(const char* name, double mm, double other, double elems, double raw = 0) {
    w_.ops.push_back({name, mm, other, elems * e_ + raw});
  }
  void comm(NodeKind op, double bytes) { w_.tp_comm.push_back({op, bytes}); }
  double elem_bytes() const { return e_; }
  Work take() { return std::move(w_); }

 private:
  double e_;
  Work w_;
};

// ---- the pre-norm residual wrapper (model/block.cpp) ---------------------------------------

void norm_fwd(Ops& o, const Dims& d, const char* name) {
  o.pointwise(name, kRmsnormFwd * d.M * d.D, 2 * d.M * d.D + d.M + d.D);  // x -> xn, rstd; w
}

void norm_bwd(Ops& o, const Dims& d, const char* name) {
  // reads dxn, x, rstd, w; writes dx; accumulates dw
  o.pointwise(name, kRmsnormBwd * d.M * d.D, 3 * d.M * d.D + d.M + 3 * d.D);
}

void residual(Ops& o, const Dims& d) { o.pointwise("residual", d.M * d.D, 3 * d.M * d.D); }

void tp_allreduce_rows(Ops& o, const Dims& d, int tp) {
  if (tp > 1) o.comm(NodeKind::ALLREDUCE, d.M * d.D * o.elem_bytes());
}

// ---- MLP (model/mlp_unit.cpp) ----------------------------------------------------------------

void mlp_fwd(Ops& o, const Dims& d) {
  o.gemm("gate_proj", d.M, d.F, d.D);
  o.gemm("up_proj", d.M, d.F, d.D);
  o.pointwise("swiglu", kSwigluFwd * d.M * d.F, 3 * d.M * d.F);
  o.gemm("down_proj", d.M, d.D, d.F);
}

void mlp_bwd_input(Ops& o, const Dims& d) {
  o.pointwise("stash_dout", 0, 2 * d.M * d.D);
  o.gemm("down_proj_dx", d.M, d.F, d.D);  // dh = dout down_proj
  o.pointwise("swiglu_bwd", kSwigluBwd * d.M * d.F, 5 * d.M * d.F);
  o.gemm("gate_proj_dx", d.M, d.D, d.F);
  o.gemm("up_proj_dx", d.M, d.D, d.F, true);
}

void mlp_bwd_weight(Ops& o, const Dims& d) {
  o.weight_grad("down_proj_dw", d.M, d.D, d.F);
  o.weight_grad("gate_proj_dw", d.M, d.F, d.D);
  o.weight_grad("up_proj_dw", d.M, d.F, d.D);
}

// ---- MoE (model/moe_unit.cpp, model/moe_dispatch.cpp, kernels/moe.cpp) ------------------------

// Balanced routing: each of the M top_k (row, expert) assignments is one row through one expert, so a
// rank's experts see M top_k rows whatever ep is. The experts' weights are read once per call (all
// E of them: at ep > 1 a rank holds E / ep, so the traffic is an upper bound).
void expert_gemm(Ops& o, const char* name, const Dims& d, double n, double k) {
  const double rows = d.M * d.top_k;
  o.add(name, 2 * rows * n * k, 0, rows * k + d.E * n * k + rows * n);
}

void expert_weight_grad(Ops& o, const char* name, const Dims& d, double n, double k) {
  const double rows = d.M * d.top_k;
  o.add(name, 2 * rows * n * k, 0, rows * n + rows * k + 2 * d.E * n * k);
}

void moe_fwd(Ops& o, const Dims& d) {
  const double M = d.M, MK = d.M * d.top_k;
  o.gemm("router", M, d.E, d.D);
  o.pointwise("route", kRouteFwd * M * d.E, 2 * M * d.E + 2 * MK);
  o.pointwise("balance", kBalance * M * d.E, 2 * M * d.E + MK);
  o.pointwise("dispatch", 0, M * d.D + MK * d.D, 2 * kIdBytes * MK);  // the rows gathered expert-major
  expert_gemm(o, "experts_gate", d, d.Fe, d.D);
  expert_gemm(o, "experts_up", d, d.Fe, d.D);
  o.pointwise("experts_swiglu", kSwigluFwd * MK * d.Fe, 3 * MK * d.Fe);
  expert_gemm(o, "experts_down", d, d.D, d.Fe);
  o.pointwise("combine", 2 * MK * d.D, MK * d.D + M * d.D + MK, kIdBytes * MK);
}

void moe_bwd_input(Ops& o, const Dims& d) {
  const double M = d.M, MK = d.M * d.top_k;
  o.pointwise("combine_bwd", 4 * MK * d.D, M * d.D + 2 * MK * d.D + 2 * MK, kIdBytes * MK);
  expert_gemm(o, "experts_down_dx", d, d.Fe, d.D);
  o.pointwise("experts_swiglu_bwd", kSwigluBwd * MK * d.Fe, 5 * MK * d.Fe);
  expert_gemm(o, "experts_gate_dx", d, d.D, d.Fe);
  expert_gemm(o, "experts_up_dx", d, d.D, d.Fe);
  o.pointwise("dispatch_bwd", MK * d.D, MK * d.D + 2 * M * d.D, kIdBytes * MK);
  o.pointwise("route_bwd", kRouteBwd * M * d.E, 4 * M * d.E + 3 * MK);
  o.gemm("router_dx", M, d.D, d.E, true);
}

void moe_bwd_weight(Ops& o, const Dims& d) {
  o.weight_grad("router_dw", d.M, d.E, d.D);
  expert_weight_grad(o, "experts_down_dw", d, d.D, d.Fe);
  expert_weight_grad(o, "experts_gate_dw", d, d.Fe, d.D);
  expert_weight_grad(o, "experts_up_dw", d, d.Fe, d.D);
}

// ---- attention (model/attention_unit.cpp, kernels/attention.cpp) ------------------------------

// Causal scores of the call: per (sequence, head) T (T + 1) / 2.
double causal_scores(const Dims& d) { return d.Bs * d.H * d.T * (d.T + 1) / 2; }

void attention_fwd(Ops& o, const Dims& d) {
  o.gemm("q_proj", d.M, d.Q, d.D);
  o.gemm("k_proj", d.M, d.KVD, d.D);
  o.gemm("v_proj", d.M, d.KVD, d.D);
  o.pointwise("rope", kRope * d.M * (d.Q + d.KVD), 2 * d.M * (d.Q + d.KVD));
  // S = Q K^T and O = P V over the lower triangle: 2 products of 2 hd FLOPs per score.
  // Flash-style: the scores stay in cache; q, k, v are read, out and lse written.
  const double s = causal_scores(d);
  o.add("attention", 2 * 2 * d.hd * s, kSoftmaxFwd * s + d.M * d.Q, 2 * d.M * d.Q + 2 * d.M * d.KVD + d.M * d.H);
  o.gemm("o_proj", d.M, d.D, d.Q);
}

void attention_bwd_input(Ops& o, const Dims& d) {
  o.pointwise("stash_dout", 0, 2 * d.M * d.D);
  o.gemm("o_proj_dx", d.M, d.Q, d.D);
  // Recomputes S = Q K^T, then dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q: 5 causal products.
  // Reads dout, q, k, v, out, lse; writes dq, dk, dv.
  const double s = causal_scores(d);
  o.add("attention_bwd", 5 * 2 * d.hd * s, kSoftmaxBwd * s + 2 * d.M * d.Q,
        4 * d.M * d.Q + 4 * d.M * d.KVD + d.M * d.H);
  o.pointwise("rope_bwd", kRope * d.M * (d.Q + d.KVD), 2 * d.M * (d.Q + d.KVD));
  o.gemm("q_proj_dx", d.M, d.D, d.Q);
  o.gemm("k_proj_dx", d.M, d.D, d.KVD, true);
  o.gemm("v_proj_dx", d.M, d.D, d.KVD, true);
}

void attention_bwd_weight(Ops& o, const Dims& d) {
  o.weight_grad("o_proj_dw", d.M, d.D, d.Q);
  o.weight_grad("q_proj_dw", d.M, d.Q, d.D);
  o.weight_grad("k_proj_dw", d.M, d.KVD, d.D);
  o.weight_grad("v_proj_dw", d.M, d.KVD, d.D);
}

// ---- Mamba-2 (model/mamba_unit.cpp, kernels/ssd.cpp) -----------------------------------------

// The chunked SSD scan of kernels/ssd.cpp, summed over its chunks (the last may be shorter).
// Per (sequence, group, chunk) of Lc steps: C B^T over the lower triangle. Per (sequence, head,
// chunk): the decay-weighted masked matrix M, the intra-chunk output (M + D I) X, the inter-chunk
// output diag(exp(acum)) C S_in^T (not in the first chunk) and the state update
// S_out = exp(acum(Lc-1)) S_in + X^T diag(w) B (not after the last). The backward recomputes
// C B^T and runs the transposed products (docs/hardware.md).
OpWork ssd_work(const Dims& d, bool backward) {
  const int64_t L = d.chunk, T = d.T_int, nc = (T + L - 1) / L;
  const double hpg = d.Hm / d.G, N = d.N, P = d.P, Hm = d.Hm, G = d.G;
  double mm = 0, other = 0, workspace = 0;  // per sequence
  for (int64_t c = 0; c < nc; ++c) {
    const double Lc = static_cast<double>(std::min(L, T - c * L)), tri = Lc * (Lc + 1) / 2;
    const bool first = c == 0, last = c + 1 == nc;
    if (!backward) {
      mm += G * 2 * N * tri;                        // C B^T
      other += Hm * (3 * tri + 2 * Lc);             // decay rows, M = (C B^T) o E o dt, D on the diagonal
      mm += Hm * 2 * P * tri;                       // Y = (M + D I) X
      if (!first) mm += Hm * 2 * Lc * N * P, other += Hm * Lc * N;              // inter-chunk output
      if (!last) mm += Hm * 2 * N * P * Lc, other += Hm * (Lc + Lc * N + P * N);  // state update
      workspace += 2 * G * Lc * Lc;                 // C B^T written, then read
    } else {
      mm += G * 3 * 2 * N * tri;                    // C B^T again; dC += dCB B; dB += dCB^T C
      other += G * (hpg - 1) * (tri + 2 * Lc * N);  // the group's heads summed
      mm += Hm * 2 * 2 * P * tri;                   // dM = dY X^T; dX = (M + D I)^T dY
      other += Hm * (10 * tri + 8 * Lc);            // the row sweep and the log-decay gradient
      if (!first) mm += Hm * 2 * 2 * Lc * N * P, other += Hm * (4 * Lc * N + P * N);  // via S_in
      if (!last) mm += Hm * 2 * 2 * Lc * N * P, other += Hm * (5 * Lc * N + 2 * P * N);  // via dS_out
      workspace += 2 * G * Lc * Lc + 2 * Hm * Lc * Lc + 4 * Lc * Hm * N;  // C B^T, dCB, per-head dC/dB
    }
  }
  const double Tn = d.T, states = static_cast<double>(nc) * Hm * P * N;
  const double io = backward ? 3 * Tn * Hm * P + 2 * Tn * Hm + 4 * Tn * G * N + states  // dy, x, dx; dt, ddt; B, C, dB, dC
                             : 2 * Tn * Hm * P + Tn * Hm + 2 * Tn * G * N + states;    // x, y; dt; B, C; states out
  return {backward ? "ssd_scan_bwd" : "ssd_scan", d.Bs * mm, d.Bs * other, d.Bs * (io + workspace)};
}

void mamba_fwd(Ops& o, const Dims& d) {
  const double M = d.M;
  o.gemm("in_proj", M, d.R, d.D);
  o.pointwise("split_zxbcdt", 0, 2 * M * d.R);
  o.pointwise("conv1d", (2 * d.K + 1) * M * d.C, 2 * M * d.C + d.C * d.K + d.C);
  o.pointwise("silu", kSiluFwd * M * d.C, 2 * M * d.C);
  o.pointwise("split_xbc", 0, 2 * M * d.C);
  o.pointwise("dt_softplus", kDtSoftplus * M * d.Hm, 2 * M * d.Hm + d.Hm);
  OpWork ssd = ssd_work(d, false);
  o.add(ssd.name.c_str(), ssd.matmul_flops, ssd.other_flops, ssd.bytes / o.elem_bytes());
  o.pointwise("gated_rmsnorm", kGatedNormFwd * M * d.di, 3 * M * d.di + M * d.G + d.di);
  o.gemm("out_proj", M, d.D, d.di);
}

void mamba_bwd_input(Ops& o, const Dims& d) {
  const double M = d.M;
  o.pointwise("stash_dout", 0, 2 * M * d.D);
  o.gemm("out_proj_dx", M, d.di, d.D);
  o.pointwise("gated_rmsnorm_bwd", kGatedNormBwd * M * d.di, 6 * M * d.di + M * d.G + 2 * d.di);
  o.pointwise("scatter_dz", 0, 2 * M * d.di);
  OpWork ssd = ssd_work(d, true);
  o.add(ssd.name.c_str(), ssd.matmul_flops, ssd.other_flops, ssd.bytes / o.elem_bytes());
  o.pointwise("dt_softplus_bwd", kDtSoftplus * M * d.Hm, 3 * M * d.Hm + 2 * d.Hm);
  o.pointwise("scatter_ddt", 0, 2 * M * d.Hm);
  o.pointwise("gather_dxbc", 0, 2 * M * d.C);
  o.pointwise("silu_bwd", kSiluBwd * M * d.C, 3 * M * d.C);
  o.pointwise("conv1d_bwd", (4 * d.K + 1) * M * d.C, 3 * M * d.C + 3 * d.C * d.K + 2 * d.C);
  o.pointwise("scatter_dxbc", 0, 2 * M * d.C);
  o.gemm("in_proj_dx", M, d.D, d.R);
}

void mamba_bwd_weight(Ops& o, const Dims& d) {
  o.weight_grad("out_proj_dw", d.M, d.D, d.di);
  o.weight_grad("in_proj_dw", d.M, d.R, d.D);
}

// ---- embedding and head (model/embed_head_units.cpp) -----------------------------------------

void embed_pass(Ops& o, const Dims& d, Pass pass, int tp) {
  const double M = d.M, D = d.D, t = tp;
  if (pass == Pass::PASS_F) {
    // This rank's rows of the table (all at tp 1), the whole [M, D] output written.
    o.pointwise("embedding", 0, M * D / t + M * D, kIdBytes * M);
    tp_allreduce_rows(o, d, tp);
  }
  if (pass == Pass::PASS_BI || pass == Pass::PASS_B) o.pointwise("stash_dy", 0, 2 * M * D);
  if (pass == Pass::PASS_BW || pass == Pass::PASS_B)  // rows of this rank's vocabulary
    o.pointwise("embedding_bwd", M * D / t, 3 * M * D / t, kIdBytes * M);
}

void head_pass(Ops& o, const Dims& d, Pass pass, int tp) {
  const double M = d.M;
  if (pass == Pass::PASS_F) {
    norm_fwd(o, d, "final_norm");
    o.gemm("lm_head", M, d.V, d.D);
    // Fused: the loss and d(loss)/d(logits) in one pass over the logits.
    o.pointwise("cross_entropy", kCrossEntropy * M * d.V, 2 * M * d.V, kIdBytes * M);
    if (tp > 1) {  // vocab-parallel: a table of the row maxima, the exp sums and target logits summed (fp32)
      o.comm(NodeKind::ALLREDUCE, 4.0 * M * tp);
      o.comm(NodeKind::ALLREDUCE, 4.0 * 2 * M);
    }
  }
  if (pass == Pass::PASS_BI || pass == Pass::PASS_B) {
    o.gemm("lm_head_dx", M, d.D, d.V);
    tp_allreduce_rows(o, d, tp);
    norm_bwd(o, d, "final_norm_bwd");
  }
  if (pass == Pass::PASS_BW || pass == Pass::PASS_B) o.weight_grad("lm_head_dw", M, d.V, d.D);
}

void block_pass(Ops& o, const Dims& d, char kind, Pass pass, int tp) {
  if (pass == Pass::PASS_F) {
    norm_fwd(o, d, "rmsnorm");
    if (kind == '-') mlp_fwd(o, d);
    if (kind == '*') attention_fwd(o, d);
    if (kind == 'M') mamba_fwd(o, d);
    if (kind == 'E') moe_fwd(o, d);
    tp_allreduce_rows(o, d, tp);  // row-parallel output projection: partial sums
    residual(o, d);
    return;
  }
  if (pass == Pass::PASS_BI || pass == Pass::PASS_B) {
    if (kind == '-') mlp_bwd_input(o, d);
    if (kind == '*') attention_bwd_input(o, d);
    if (kind == 'M') mamba_bwd_input(o, d);
    if (kind == 'E') {
      moe_bwd_input(o, d);
      if (tp > 1) o.comm(NodeKind::ALLREDUCE, d.M * d.top_k * o.elem_bytes());  // the routing weights' gradient
    }
    tp_allreduce_rows(o, d, tp);  // column-parallel input projections: partial input gradients
    norm_bwd(o, d, "rmsnorm_bwd");
    residual(o, d);
  }
  if (pass == Pass::PASS_BW || pass == Pass::PASS_B) {
    if (kind == '-') mlp_bwd_weight(o, d);
    if (kind == '*') attention_bwd_weight(o, d);
    if (kind == 'M') mamba_bwd_weight(o, d);
    if (kind == 'E') moe_bwd_weight(o, d);
  }
}

}  // namespace

Work unit_work(const config::ModelConfig& m, char kind, Pass pass, int64_t rows, int64_t seq_len, int tp,
               int elem_bytes) {
  if (pass != Pass::PASS_F && pass != Pass::PASS_B && pass != Pass::PASS_BI && pass != Pass::PASS_BW)
    throw std::invalid_argument(std::string("ir: unit_work takes the passes F, B, BI, BW, not ") + pass_name(pass));
  if (elem_bytes < 1) throw std::invalid_argument("ir: elem_bytes must be at least 1");
  const Dims d = dims_of(m, kind, rows, seq_len, tp);
  Ops o(elem_bytes);
  if (kind == 'e')
    embed_pass(o, d, pass, tp);
  else if (kind == 'h')
    head_pass(o, d, pass, tp);
  else
    block_pass(o, d, kind, pass, tp);
  return o.take();
}

std::vector<double> unit_costs(const config::ModelConfig& m, const ModelGraph& g, int64_t seq_len) {
  std::vector<double> cost;
  for (const UnitSpec& u : g.units) {
    const char kind = unit_symbol(u.kind);
    cost.push_back(unit_work(m, kind, Pass::PASS_F, seq_len, seq_len).flops() +
                   unit_work(m, kind, Pass::PASS_B, seq_len, seq_len).flops());
  }
  return cost;
}

namespace {
// Bytes a block saves outside its mixer: the normalised input xn [rows, D], kept at kept_bytes, and
// its rstd [rows], f32.
double block_norm_saved(const Dims& d, int kept_bytes) { return d.M * (d.D * kept_bytes + 4.0); }
// The block's own work in a forward, around its mixer (model/block.cpp).
bool block_wrapper_op(const std::string& name) { return name == "rmsnorm" || name == "residual"; }
}  // namespace

UnitMemory unit_memory(const config::ModelConfig& m, char kind, int64_t rows, int64_t seq_len, int tp,
                       int kept_bytes) {
  if (kept_bytes < 1 || kept_bytes > 4)
    throw std::invalid_argument("unit_memory: kept_bytes must be 1 to 4, not " + std::to_string(kept_bytes));
  const Dims d = dims_of(m, kind, rows, seq_len, tp);
  const double M = d.M;
  constexpr double kFloat = 4;
  const bool narrow = kept_bytes < kFloat;
  // Elements: what the forward keeps, at kept_bytes — computed in f32 and narrowed (kept: the head's
  // dlogits), or computed in the storage type (native: all the rest); the saved rest (stats), f32; what
  // BWD_I frees of the native and the stats before the weight half; its stash for the weight half, f32
  // or native; the scratch at the peak of a backward above saved and stash (f32 or native), and of a
  // forward above all it saves (f32).
  double kept = 0, native = 0, stats = 0, freed_native = 0, freed_stats = 0;
  double stash = 0, stash_native = 0, scratch = 0, scratch_native = 0, fwd_scratch = 0;
  // Every unit computes on the storage type (model/*.cpp) but for what a pass sums over the tp group,
  // which is f32 and rounded into the storage type once summed.
  const bool summed = narrow && tp > 1;
  if (kind == 'e') {
    // The token ids are a std::vector, outside the backend's accounting; the backward adds dy's rows
    // into the table's gradient as they are.
    if (summed) fwd_scratch = M * d.D;          // the lookup's f32 sum
  } else if (kind == 'h') {
    native = M * d.D;                           // xn
    kept = M * d.V;                             // dlogits [M, V/tp], computed in f32
    stats = M;                                  // rstd
    freed_stats = M;                            // rstd, once the norm's backward has read it
    fwd_scratch = M * d.V;                      // the logits
    if (summed || !narrow)
      scratch = M * d.D;                        // dxn, f32
    else
      scratch_native = M * d.D;                 // dxn
    if (summed) scratch_native = M * d.D;       // dxn rounded for the norm's backward
  } else {
    // A block computes on the storage type (model/block.cpp). What the input half frees before the
    // weight half: all the weight gradients do not read (they read xn, the stash and the input of each
    // output projection).
    native = M * d.D;                           // the block's xn and rstd (block_norm_saved)
    stats = M;
    freed_stats = M;                            // rstd, once the norm's backward has read it
    // The mixer's output and input gradient: in the storage type, or f32 where the tp group sums them
    // or the mixer writes f32 (an MoE block's), rounded into the storage type once final.
    const bool f32_mixer = tp > 1 || kind == 'E';
    if (narrow && f32_mixer) {
      fwd_scratch = M * d.D;                    // the output's f32 sum
      scratch_native = M * d.D;                 // dxn rounded for the norm's backward
    }
    const double dxn = f32_mixer || !narrow ? M * d.D : 0;  // the block's f32 scratch throughout BWD_I
    if (dxn == 0) scratch_native = M * d.D;     // dxn in the storage type
    if (kind == '-') {
      native += 3 * M * d.F;                    // gate, up, h
      freed_native = 2 * M * d.F;               // gate, up
      stash_native = M * (d.D + 2 * d.F);       // dout, dgate, dup
      scratch += dxn;
      scratch_native += M * d.F;                // dh
    } else if (kind == '*') {
      native += M * (2 * d.Q + 2 * d.KVD);      // q, k, v after RoPE, att
      stats += M * d.H;                         // lse
      freed_native = M * (d.Q + 2 * d.KVD);     // q, k, v
      freed_stats += M * d.H;                   // lse
      stash_native = M * (d.D + d.Q + 2 * d.KVD);  // dout, dq, dk, dv
      scratch += dxn;
      scratch_native += M * d.Q;                // datt
    } else if (kind == 'E') {
      // The experts' rows: in, in the storage type; out, and the gradients back, in it too, or in f32
      // where the tp group sums them (model/moe_dispatch.hpp).
      const double MK = M * d.top_k, xrows = MK * d.D, out_native = summed ? 0 : xrows, out_f32 = xrows - out_native;
      native += 3 * MK * d.Fe + xrows + out_native;  // gate, up, h; the experts' rows in and out
      // probs, dprobs, experts, weights; the dispatcher's indices; the experts' rows out where f32
      stats += M * (2 * d.E + 2 * d.top_k) + 2 * MK + out_f32;
      freed_native = 2 * MK * d.Fe + out_native;  // gate, up; the experts' rows out
      freed_stats += 2 * M * d.E + out_f32;       // probs, dprobs; the experts' rows out where f32
      stash = M * d.E + out_f32;                  // dlogits; the rows' gradients where f32
      stash_native = 2 * MK * d.Fe + out_native;  // dgate, dup; the rows' gradients
      // + the experts' input gradients (f32), the rows' gradients on their way where f32, and dout
      // widened beside them
      scratch += dxn + xrows + out_f32 + (summed ? M * d.D : 0);
      scratch_native += d.Fe * MK + out_native;   // dh; the rows' gradients on their way
    } else {
      const double nc = static_cast<double>((d.T_int + d.chunk - 1) / d.chunk);
      const double states = d.Bs * nc * d.Hm * d.P * d.N;  // chunk-entry states
      const double mixer = M * (4 * d.di + 2 * d.C + 2 * d.G * d.N + 2 * d.Hm);  // z, x, y, normed; xbc_in, xbc_conv; B, C; dt_raw, dt
      native += mixer;
      stats += M * d.G + states;                                     // the gated norm's rstd, the chunk states
      freed_native = mixer - M * d.di;          // all but normed
      freed_stats += M * d.G + states;
      stash_native = M * (d.D + d.R);           // dout, dzxbcdt
      scratch += dxn;
      scratch_native += M * (4 * d.di + 2 * d.Hm + 2 * d.G * d.N + 3 * d.C);  // the gradients of its inner scope
    }
  }
  const double saved = (kept + native) * kept_bytes + stats * kFloat;
  // A forward computes what it keeps narrowed (the head's dlogits) in f32 before storing it; a backward
  // widens it back.
  const double forward = (kept + stats + fwd_scratch) * kFloat + native * kept_bytes;
  const double backward = (stash + scratch) * kFloat + (stash_native + scratch_native) * kept_bytes +
                          kept * (kFloat - kept_bytes);
  const double kept_for_w = saved - freed_native * kept_bytes + (stash - freed_stats) * kFloat +
                            stash_native * kept_bytes;
  return {saved, kept_for_w, std::max(forward, backward)};
}

std::vector<double> segment_shares(const config::ModelConfig& m, char kind, NodeKind pass, const PassShape& shape,
                                   int64_t rows, int64_t seq_len, int tp) {
  std::vector<double> share(static_cast<size_t>(shape.segments), 0.0);
  share[0] = 1.0;
  // The points of an MoE pass at ep > 1 (ir::pass_shape): the forward's counts, dispatch and return;
  // the backward's dispatch and return of the row gradients.
  std::vector<size_t> a2a;
  for (size_t k = 0; k < shape.points.size(); ++k)
    if (shape.points[k].kind == NodeKind::ALLTOALL) a2a.push_back(k);
  if (kind != 'E' || a2a.empty()) return share;
  const bool forward = pass == NodeKind::FWD;
  const size_t experts = (forward ? a2a.at(1) : a2a.at(0)) + 1, after = experts + 1;
  const Pass p = forward ? Pass::PASS_F : pass == NodeKind::BWD_I ? Pass::PASS_BI : Pass::PASS_B;
  const Work w = unit_work(m, kind, p, rows, seq_len, tp);
  auto starts = [](const std::string& name, const char* prefix) { return name.rfind(prefix, 0) == 0; };
  std::fill(share.begin(), share.end(), 0.0);
  for (const OpWork& o : w.ops) {
    size_t seg = 0;
    if (starts(o.name, "experts_") && !starts(o.name, "experts_down_dw") && !starts(o.name, "experts_gate_dw") &&
        !starts(o.name, "experts_up_dw"))
      seg = experts;  // the experts' forward, or their input-gradient backward
    else if (forward ? (o.name == "combine" || o.name == "residual")
                     : (o.name != "combine_bwd"))  // the dispatch and router backward, the norm, the weight half
      seg = after;
    share[seg] += o.flops();
  }
  const double total = w.flops();
  for (double& s : share) s = total > 0 ? s / total : 0.0;
  if (total <= 0) share[0] = 1.0;
  return share;
}

RecomputeShare recompute_share(const config::ModelConfig& m, char kind, Recompute mode, int64_t rows,
                               int64_t seq_len, int tp, int kept_bytes) {
  if (mode == Recompute::RECOMPUTE_NONE) return {};
  if (mode == Recompute::RECOMPUTE_FULL) return {1.0, 1.0};
  const Work w = unit_work(m, kind, Pass::PASS_F, rows, seq_len, tp);
  double mixer = 0;
  for (const OpWork& op : w.ops)
    if (!block_wrapper_op(op.name)) mixer += op.flops();
  const double saved = unit_memory(m, kind, rows, seq_len, tp, kept_bytes).saved;
  const double norm = block_norm_saved(dims_of(m, kind, rows, seq_len, tp), kept_bytes);
  return {w.flops() > 0 ? mixer / w.flops() : 0.0, saved > 0 ? std::max(0.0, saved - norm) / saved : 0.0};
}

}  // namespace piper::ir
