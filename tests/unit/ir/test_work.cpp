// test_work.cpp — the FLOPs, traffic and memory of src/ir/work.hpp against
// numbers computed by hand from docs/model.md and against 6 N D.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "ir/model_graph.hpp"
#include "ir/work.hpp"
#include "unit/test_configs.hpp"

namespace piper::ir {
namespace {

using piper::testing::mid_model;


void expect_rel(double got, double want, double tol, const std::string& what) {
  EXPECT_LE(std::abs(got - want), tol * std::abs(want)) << what << ": got " << got << ", want " << want;
}

// Forward of an MLP block: three GEMMs, 2 M (3 D F); the rmsnorm, SwiGLU and residual add
// elementwise FLOPs (4 D + 5 F + D per row) stay under 1% at D 512, F 1536.
TEST(FlopsMlp, ForwardIsThreeGemms) {
  const auto m = mid_model("-");
  const int64_t T = 128, rows = 4 * T;
  const double D = 512, F = 1536, M = static_cast<double>(rows);
  const Work w = unit_work(m, '-', Pass::PASS_F, rows, T);
  EXPECT_DOUBLE_EQ(w.matmul_flops(), 2 * M * 3 * D * F);
  expect_rel(w.flops(), 2 * M * 3 * D * F, 0.01, "MLP forward FLOPs");
  EXPECT_GT(w.flops(), w.matmul_flops());  // the elementwise terms are counted
  ASSERT_NE(w.op("gate_proj"), nullptr);
  EXPECT_DOUBLE_EQ(w.op("gate_proj")->matmul_flops, 2 * M * D * F);
  // Traffic of gate_proj in fp32: x [M, D] and W [F, D] read once, [M, F] written.
  EXPECT_DOUBLE_EQ(w.op("gate_proj")->bytes, 4 * (M * D + F * D + M * F));
  EXPECT_TRUE(w.tp_comm.empty());
}

// Attention forward on a small config by hand: D 64, H 4, KV 2 (hd 16), T 16, 3 sequences.
TEST(FlopsAttention, ForwardGemmsMatchHand) {
  config::ModelConfig m = mid_model("*");
  m.d_model = 64;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  const int64_t T = 16, rows = 3 * T;
  const double M = 48, D = 64, hd = 16, H = 4, KV = 2;
  const Work w = unit_work(m, '*', Pass::PASS_F, rows, T);
  EXPECT_DOUBLE_EQ(w.op("q_proj")->matmul_flops, 2 * M * D * (H * hd));    // 393216
  EXPECT_DOUBLE_EQ(w.op("k_proj")->matmul_flops, 2 * M * D * (KV * hd));   // 196608
  EXPECT_DOUBLE_EQ(w.op("v_proj")->matmul_flops, 2 * M * D * (KV * hd));
  EXPECT_DOUBLE_EQ(w.op("o_proj")->matmul_flops, 2 * M * (H * hd) * D);
  // Causal: per (sequence, head) T (T + 1) / 2 = 136 scores, each 2 hd FLOPs in Q K^T and in P V.
  EXPECT_DOUBLE_EQ(w.op("attention")->matmul_flops, 3 * H * 136 * 2 * (2 * hd));  // 104448
  EXPECT_DOUBLE_EQ(w.matmul_flops(), 393216.0 * 2 + 196608.0 * 2 + 104448.0);
  // The backward recomputes Q K^T and runs four more causal products.
  const Work bi = unit_work(m, '*', Pass::PASS_BI, rows, T);
  EXPECT_DOUBLE_EQ(bi.op("attention_bwd")->matmul_flops, 2.5 * 104448.0);
}

// Training FLOPs of an attention-only model: 6 N D for the matrix products (N: the 2-D
// parameters but the embedding, which is a lookup) plus the causal attention products,
// 2 forward and 5 backward (recomputing Q K^T) of M H hd (T + 1) FLOPs each per layer.
// Against Kaplan's 6 N D + 6 L T d_attn D (causal, no recompute) it is within 3%.
TEST(FlopsModel, AttentionOnlyTrainingIsSixND) {
  config::ModelConfig m = mid_model("***");
  m.n_kv_heads = 8;
  const int64_t T = 256, rows = 4 * T;
  double total = 0;
  for (char kind : std::string("e***h"))
    for (Pass p : {Pass::PASS_F, Pass::PASS_B}) total += unit_work(m, kind, p, rows, T).flops();
  double n_params = 0;
  for (const UnitSpec& u : make_model_graph(m).units)
    for (const ParamSpec& p : u.params)
      if (p.shape.size() == 2 && p.name != "embed.weight") n_params += static_cast<double>(p.numel());
  EXPECT_DOUBLE_EQ(n_params, 3 * 4 * 512.0 * 512 + 1024.0 * 512);
  const double D_tok = static_cast<double>(rows), L = 3, d_attn = 512;
  const double attention = L * D_tok * 7 * d_attn * (T + 1);
  expect_rel(total, 6 * n_params * D_tok + attention, 0.01, "6ND + causal attention with recompute");
  expect_rel(total, 6 * n_params * D_tok + 6 * L * T * d_attn * D_tok, 0.03, "Kaplan's 6ND + 6 L T d D");
}

// B is BI then BW, FLOPs, traffic and tp collectives alike, for every kind.
TEST(FlopsPasses, BackwardIsInputPlusWeight) {
  const auto m = mid_model("M*-");
  for (char kind : std::string("eM*-h"))
    for (int tp : {1, 2, 4}) {
      const std::string what = std::string("kind ") + kind + " tp " + std::to_string(tp);
      const Work b = unit_work(m, kind, Pass::PASS_B, 512, 128, tp);
      const Work bi = unit_work(m, kind, Pass::PASS_BI, 512, 128, tp);
      const Work bw = unit_work(m, kind, Pass::PASS_BW, 512, 128, tp);
      expect_rel(b.flops(), bi.flops() + bw.flops(), 1e-12, what + " flops");
      expect_rel(b.bytes(), bi.bytes() + bw.bytes(), 1e-12, what + " bytes");
      EXPECT_EQ(b.ops.size(), bi.ops.size() + bw.ops.size()) << what;
      EXPECT_EQ(b.tp_comm.size(), bi.tp_comm.size() + bw.tp_comm.size()) << what;
      EXPECT_GT(bw.flops(), 0) << what;
      if (kind != 'e') {
        EXPECT_GT(bi.matmul_flops(), 0) << what;
        EXPECT_TRUE(bw.tp_comm.empty()) << what;  // weight gradients need no tp sum
      }
    }
}

// Tensor parallelism splits every matrix product (heads, kv heads, F, Mamba heads and groups,
// vocabulary): matmul FLOPs per rank = total / tp. The blocks add one all-reduce of [M, D] per
// forward and per input half.
TEST(FlopsTensorParallel, ShardedGemmsSplitByTp) {
  const auto m = mid_model("M*-");
  for (char kind : std::string("M*-h"))
    for (Pass p : {Pass::PASS_F, Pass::PASS_BI, Pass::PASS_BW})
      for (int tp : {2, 4}) {
        const double one = unit_work(m, kind, p, 1024, 256, 1).matmul_flops();
        const Work w = unit_work(m, kind, p, 1024, 256, tp);
        expect_rel(w.matmul_flops() * tp, one, 1e-12,
                   std::string("kind ") + kind + " pass " + pass_name(p) + " tp " + std::to_string(tp));
      }
  const Work f = unit_work(m, '-', Pass::PASS_F, 1024, 256, 2);
  ASSERT_EQ(f.tp_comm.size(), 1u);
  EXPECT_EQ(f.tp_comm[0].op, NodeKind::ALLREDUCE);
  EXPECT_DOUBLE_EQ(f.tp_comm[0].bytes, 1024.0 * 512 * 4);
}

// The SSD scan's FLOPs follow the chunked algorithm. Per sequence, T = nc L, per group and
// chunk C B^T over the lower triangle (N L (L + 1)); per head and chunk the intra-chunk product
// (P L (L + 1)), the inter-chunk output (2 L N P, chunks after the first) and the state update
// (2 N P L, chunks before the last). One chunk is the quadratic dual form.
TEST(FlopsMamba, SsdScanFollowsChunkedAlgorithm) {
  config::ModelConfig m = mid_model("M");
  const double N = 32, P = 32, Hm = 32, G = 4;
  for (int64_t L : {int64_t(16), int64_t(32), int64_t(128)}) {
    m.ssd_chunk = L;
    const int64_t T = 128, seqs = 3;
    const double nc = static_cast<double>(T / L), l = static_cast<double>(L);
    const double per_seq = G * nc * N * l * (l + 1) + Hm * nc * P * l * (l + 1) + Hm * (nc - 1) * 2 * (2 * l * N * P);
    const Work w = unit_work(m, 'M', Pass::PASS_F, seqs * T, T);
    ASSERT_NE(w.op("ssd_scan"), nullptr);
    expect_rel(w.op("ssd_scan")->matmul_flops, seqs * per_seq, 1e-12, "scan, chunk " + std::to_string(L));
  }
  // A last chunk shorter than the others: T 100 with L 32 is chunks of 32, 32, 32, 4.
  m.ssd_chunk = 32;
  double per_seq = 0;
  for (double lc : {32.0, 32.0, 32.0, 4.0}) per_seq += G * N * lc * (lc + 1) + Hm * P * lc * (lc + 1);
  per_seq += Hm * (2 * 32 * N * P + 2 * 32 * N * P + 2 * 4 * N * P);  // inter-chunk, chunks 1..3
  per_seq += Hm * (2 * N * P * 32 * 3);                               // state update, chunks 0..2
  expect_rel(unit_work(m, 'M', Pass::PASS_F, 100, 100).op("ssd_scan")->matmul_flops, per_seq, 1e-12, "ragged");
  // The backward scan does more than the forward one, and is all in the input half.
  const Work bi = unit_work(m, 'M', Pass::PASS_BI, 256, 128), bw = unit_work(m, 'M', Pass::PASS_BW, 256, 128);
  EXPECT_GT(bi.op("ssd_scan_bwd")->matmul_flops, unit_work(m, 'M', Pass::PASS_F, 256, 128).op("ssd_scan")->matmul_flops);
  EXPECT_EQ(bw.op("ssd_scan_bwd"), nullptr);
}

// Activation memory counts the tensors src/model/*.cpp allocates, kept in f32 here
// (tests/unit/model/test_unit_memory.cpp holds both storage types against the runtime).
TEST(FlopsMemory, MatchesRuntimeTensors) {
  const auto m = mid_model("M*-");
  const double M = 512, D = 512, F = 1536, Q = 512, KVD = 256, H = 8;
  const UnitMemory mlp = unit_memory(m, '-', 512, 128);
  EXPECT_DOUBLE_EQ(mlp.saved, 4 * M * (D + 1 + 3 * F));                     // xn, rstd; gate, up, h
  // The input half frees rstd, gate and up, and stashes dout, dgate, dup.
  EXPECT_DOUBLE_EQ(mlp.kept_for_w, mlp.saved - 4 * M * (1 + 2 * F) + 4 * M * (D + 2 * F));
  EXPECT_DOUBLE_EQ(mlp.transient, 4 * M * (2 * D + 3 * F));                  // dxn, stash, dh
  const UnitMemory att = unit_memory(m, '*', 512, 128);
  EXPECT_DOUBLE_EQ(att.saved, 4 * M * (D + 1 + 2 * Q + 2 * KVD + H));        // q, k, v, att, lse
  // The input half frees rstd, q, k, v and lse, and stashes dout, dq, dk, dv.
  EXPECT_DOUBLE_EQ(att.kept_for_w, att.saved - 4 * M * (1 + Q + 2 * KVD + H) + 4 * M * (D + Q + 2 * KVD));
  // Mamba: chunk-entry states B nc Hm P N with nc = 128 / 32.
  const double di = 1024, C = 1024 + 2 * 4 * 32, GN = 128, Hm = 32, R = 2 * di + 2 * GN + Hm;
  const UnitMemory mam = unit_memory(m, 'M', 512, 128);
  const double states = 4 * 4 * Hm * 32 * 32;
  EXPECT_DOUBLE_EQ(mam.saved, 4 * (M * (D + 1 + 4 * di + 2 * C + 2 * GN + 2 * Hm + 4) + states));
  // The input half frees all but xn and the gated norm's output, and stashes dout and d(in_proj's output).
  EXPECT_DOUBLE_EQ(mam.kept_for_w, 4 * M * (D + di) + 4 * M * (D + R));
  // Tensor parallelism splits all but the block's xn and rstd.
  const UnitMemory mlp2 = unit_memory(m, '-', 512, 128, 2);
  EXPECT_DOUBLE_EQ(mlp2.saved, 4 * M * (D + 1 + 3 * F / 2));
  const UnitMemory head = unit_memory(m, 'h', 512, 128);
  EXPECT_DOUBLE_EQ(head.saved, 4 * M * (D + 1 + 1024));  // xn, rstd, dlogits
}

// An MoE block's FLOPs are those of its active experts: M top_k rows through one expert's three
// matrices each (2 M K 3 D F), plus the router (2 M E D), as a dense MLP of hidden K F would have
// them; the backward's are twice the forward's (input and weight halves).
TEST(FlopsMoe, ActiveExpertsAndRouter) {
  auto m = mid_model("E");
  m.n_experts = 8, m.top_k = 2, m.moe_ffn_hidden = 768;
  const int64_t T = 128, rows = 4 * T;
  const double D = 512, F = 768, E = 8, K = 2, M = static_cast<double>(rows);
  const Work f = unit_work(m, 'E', Pass::PASS_F, rows, T);
  EXPECT_DOUBLE_EQ(f.matmul_flops(), 2 * M * K * 3 * D * F + 2 * M * E * D);
  ASSERT_NE(f.op("experts_gate"), nullptr);
  // The experts' rows read and written, and every expert's weights read once.
  EXPECT_DOUBLE_EQ(f.op("experts_gate")->bytes, 4 * (M * K * D + E * F * D + M * K * F));
  const Work bi = unit_work(m, 'E', Pass::PASS_BI, rows, T), bw = unit_work(m, 'E', Pass::PASS_BW, rows, T);
  EXPECT_DOUBLE_EQ(bi.matmul_flops(), 2 * M * K * 3 * D * F + 2 * M * E * D);
  EXPECT_DOUBLE_EQ(bw.matmul_flops(), 2 * M * K * 3 * D * F + 2 * M * E * D);
  // Against an MLP block with the same active parameters (hidden K F): the same expert products.
  auto dense = mid_model("-");
  dense.ffn_hidden = static_cast<int64_t>(K * F);
  EXPECT_DOUBLE_EQ(f.matmul_flops() - 2 * M * E * D, unit_work(dense, '-', Pass::PASS_F, rows, T).matmul_flops());
  // tp splits each expert's hidden size; the routing weights' gradient is summed over tp.
  const Work bi2 = unit_work(m, 'E', Pass::PASS_BI, rows, T, 2);
  EXPECT_DOUBLE_EQ(bi2.op("experts_gate_dx")->matmul_flops, bi.op("experts_gate_dx")->matmul_flops / 2);
  ASSERT_EQ(bi2.tp_comm.size(), 2u);
  EXPECT_DOUBLE_EQ(bi2.tp_comm[0].bytes, 4 * M * K);
}

// At ep > 1 an MoE pass's time splits over its segments as its work does: the experts between the
// dispatch and the return, the combine after it; every other pass runs in its first segment.
TEST(FlopsMoe, SegmentSharesFollowTheAllToAlls) {
  auto m = mid_model("E");
  m.n_experts = 8, m.top_k = 2, m.moe_ffn_hidden = 768;
  const int64_t T = 128, rows = 4 * T;
  const PassDims ep2{1, 2, m.d_model, m.top_k, m.n_experts}, ep1{2, 1, m.d_model, m.top_k, m.n_experts};
  const auto f = segment_shares(m, 'E', NodeKind::FWD, pass_shape(UnitKind::UNIT_MOE, NodeKind::FWD, ep2),
                                rows, T);
  ASSERT_EQ(f.size(), 4u);  // route | counts | size | dispatch | experts | return | combine
  const Work w = unit_work(m, 'E', Pass::PASS_F, rows, T);
  double experts = 0;
  for (const OpWork& o : w.ops)
    if (o.name.rfind("experts_", 0) == 0) experts += o.flops();
  EXPECT_DOUBLE_EQ(f[1], 0.0);
  EXPECT_NEAR(f[2], experts / w.flops(), 1e-12);
  EXPECT_GT(f[2], 0.8);  // the experts dominate
  EXPECT_GT(f[0], 0.0);
  EXPECT_GT(f[3], 0.0);
  EXPECT_NEAR(f[0] + f[1] + f[2] + f[3], 1.0, 1e-12);
  const auto b = segment_shares(m, 'E', NodeKind::BWD, pass_shape(UnitKind::UNIT_MOE, NodeKind::BWD, ep2),
                                rows, T);
  ASSERT_EQ(b.size(), 3u);  // combine backward | experts backward | dispatch and router backward, weight half
  EXPECT_GT(b[2], b[0]);
  EXPECT_NEAR(b[0] + b[1] + b[2], 1.0, 1e-12);
  // Without all-to-alls (tp only) and for other kinds: all in the first segment.
  const auto t = segment_shares(m, 'E', NodeKind::FWD, pass_shape(UnitKind::UNIT_MOE, NodeKind::FWD, ep1),
                                rows, T, 2);
  EXPECT_EQ(t, (std::vector<double>{1.0, 0.0}));
}

// Every pass's last segment finishes its result (stored in the activations' type after a sum over the group).
TEST(PassShapes, NoPassEndsWithAPoint) {
  for (UnitKind kind : {UnitKind::UNIT_EMBED, UnitKind::UNIT_MAMBA, UnitKind::UNIT_ATTENTION, UnitKind::UNIT_MLP,
                        UnitKind::UNIT_MOE, UnitKind::UNIT_HEAD})
    for (NodeKind pass : {NodeKind::FWD, NodeKind::BWD_I, NodeKind::BWD_W, NodeKind::BWD})
      for (int tp : {1, 2})
        for (int ep : {1, 2}) {
          const PassShape s = pass_shape(kind, pass, {tp, ep, 64, 2, 4});
          EXPECT_EQ(s.points.size() + 1, static_cast<size_t>(s.segments))
              << unit_kind_name(kind) << " " << node_kind_name(pass) << " tp " << tp << " ep " << ep;
        }
}

TEST(FlopsErrors, RefusesMoeUnknownKindsAndBadTp) {
  config::ModelConfig m = mid_model("M*-");
  m.n_experts = m.top_k = m.moe_ffn_hidden = 0;  // no expert sizes
  try {
    unit_work(m, 'E', Pass::PASS_F, 128, 128);
    ADD_FAILURE() << "MoE without its sizes accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("MoE"), std::string::npos) << e.what();
  }
  EXPECT_THROW(unit_work(m, 'x', Pass::PASS_F, 128, 128), std::invalid_argument);
  EXPECT_THROW(unit_work(m, '-', Pass::PASS_U, 128, 128), std::invalid_argument);
  EXPECT_THROW(unit_work(m, '-', Pass::PASS_F, 0, 128), std::invalid_argument);
  try {
    unit_work(m, '*', Pass::PASS_F, 128, 128, 3);
    ADD_FAILURE() << "tp 3 accepted with 8 heads";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("n_heads"), std::string::npos) << e.what();
  }
}

TEST(FlopsAdamw, BytesPerElement) {
  EXPECT_DOUBLE_EQ(adamw_bytes_per_element(), 28.0);  // read p, g, m, v; write p, m, v; fp32
  EXPECT_DOUBLE_EQ(adamw_bytes_per_element(2), 14.0);
  EXPECT_GT(adamw_flops_per_element(), 0.0);
}

}  // namespace
}  // namespace piper::ir
