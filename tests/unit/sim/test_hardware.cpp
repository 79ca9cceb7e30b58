// test_hardware.cpp — the hardware table, user hardware files, ring collective
// times and the analytic cost model (src/sim/hardware.hpp) against hand numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

#include "sim/hardware.hpp"

namespace piper::sim {
namespace {

using ir::Pass;

void expect_rel(double got, double want, double tol, const std::string& what) {
  EXPECT_LE(std::abs(got - want), tol * std::abs(want)) << what << ": got " << got << ", want " << want;
}

void expect_same(const Hardware& a, const Hardware& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.description, b.description);
  expect_rel(a.peak_flops, b.peak_flops, 1e-12, a.name + " peak_flops");
  expect_rel(a.vector_flops, b.vector_flops, 1e-12, a.name + " vector_flops");
  expect_rel(a.mem_bw, b.mem_bw, 1e-12, a.name + " mem_bw");
  EXPECT_DOUBLE_EQ(a.mfu, b.mfu);
  EXPECT_DOUBLE_EQ(a.mem_eff, b.mem_eff);
  EXPECT_EQ(a.elem_bytes, b.elem_bytes);
  expect_rel(a.launch, b.launch, 1e-12, a.name + " launch");
  EXPECT_EQ(a.devices_per_node, b.devices_per_node);
  expect_rel(a.memory_bytes, b.memory_bytes, 1e-12, a.name + " memory_bytes");
  for (const auto& [x, y] : {std::pair{a.intra_node, b.intra_node}, std::pair{a.inter_node, b.inter_node}}) {
    EXPECT_EQ(x.name, y.name);
    expect_rel(x.bandwidth, y.bandwidth, 1e-12, a.name + " link bandwidth");
    expect_rel(x.latency, y.latency, 1e-12, a.name + " link latency");
  }
}

std::string error_of(const std::string& json_text) {
  try {
    parse_hardware(json_text, "my_hw.json");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(HardwareTable, HasNamedEntriesWithPositiveNumbers) {
  for (const char* name : {"h100-sxm", "h200-sxm", "b200", "a100-sxm-80gb", "mi300x", "cpu-local"}) {
    const Hardware* h = find_hardware(name);
    ASSERT_NE(h, nullptr) << name;
    EXPECT_EQ(h->name, name);
    EXPECT_FALSE(h->description.empty()) << name;
    EXPECT_GT(h->peak_flops, 0) << name;
    EXPECT_GT(h->vector_flops, 0) << name;
    EXPECT_LE(h->vector_flops, h->peak_flops) << name;
    EXPECT_GT(h->mem_bw, 0) << name;
    EXPECT_GT(h->mfu, 0) << name;
    EXPECT_LE(h->mfu, 1) << name;
    EXPECT_GT(h->mem_eff, 0) << name;
    EXPECT_LE(h->mem_eff, 1) << name;
    EXPECT_GT(h->memory_bytes, 0) << name;
    EXPECT_GE(h->devices_per_node, 1) << name;
    EXPECT_GT(h->intra_node.bandwidth, 0) << name;
    EXPECT_GT(h->inter_node.bandwidth, 0) << name;
    EXPECT_GT(h->intra_node.latency, 0) << name;
    EXPECT_NE(hardware_help().find(name), std::string::npos) << name;
  }
  // Datasheet numbers (bf16 dense, per direction).
  EXPECT_DOUBLE_EQ(find_hardware("h100-sxm")->peak_flops, 989.4e12);
  EXPECT_DOUBLE_EQ(find_hardware("h100-sxm")->mem_bw, 3.35e12);
  EXPECT_EQ(find_hardware("h100-sxm")->intra_node.name, "nvlink4");
  EXPECT_EQ(find_hardware("cpu-local")->elem_bytes, 4);  // piper trains fp32 on the CPU
  EXPECT_EQ(find_hardware("h100-sxm")->elem_bytes, 2);
  for (const char* name : {"nvlink3", "nvlink4", "nvlink5", "ib-hdr", "ib-ndr", "ib-xdr", "roce-100", "roce-200",
                           "roce-400", "pcie4", "pcie5"}) {
    ASSERT_NE(find_link(name), nullptr) << name;
    EXPECT_GT(find_link(name)->bandwidth, 0) << name;
    EXPECT_GT(find_link(name)->latency, 0) << name;
  }
  EXPECT_DOUBLE_EQ(find_link("nvlink4")->bandwidth, 450e9);  // 900 GB/s bidirectional
  EXPECT_DOUBLE_EQ(find_link("ib-ndr")->bandwidth, 50e9);    // 400 Gb/s
  EXPECT_EQ(find_hardware("h100"), nullptr);
  EXPECT_EQ(find_link("nvlink9"), nullptr);
}

TEST(HardwareFile, RoundTripsEveryEntry) {
  for (const Hardware& h : hardware_table()) expect_same(parse_hardware(hardware_to_json(h), "rt.json"), h);
  // Through a file, and resolve_hardware takes a path as well as a name.
  const std::string path = std::string(PIPER_BINARY_DIR) + "/test_hardware_roundtrip.json";
  const Hardware& mi = *find_hardware("mi300x");
  std::ofstream(path) << hardware_to_json(mi);
  expect_same(load_hardware(path), mi);
  expect_same(resolve_hardware(path), mi);
  expect_same(resolve_hardware("mi300x"), mi);
  std::remove(path.c_str());
}

TEST(HardwareFile, MinimalAndBaseFiles) {
  const Hardware h = parse_hardware(
      R"({"name": "my-gpu", "peak_tflops": 100, "mem_bw_gbs": 1000, "memory_gb": 40,
          "inter_node": {"name": "eth", "bandwidth_gbs": 10, "latency_us": 20}})",
      "my_hw.json");
  EXPECT_EQ(h.name, "my-gpu");
  EXPECT_DOUBLE_EQ(h.peak_flops, 100e12);
  EXPECT_DOUBLE_EQ(h.vector_flops, 100e12);  // no vector_tflops: the matmul peak
  EXPECT_DOUBLE_EQ(h.mem_bw, 1000e9);
  EXPECT_DOUBLE_EQ(h.memory_bytes, 40e9);
  EXPECT_EQ(h.intra_node.name, "pcie4");
  EXPECT_EQ(h.inter_node.name, "eth");
  EXPECT_DOUBLE_EQ(h.inter_node.bandwidth, 10e9);
  EXPECT_DOUBLE_EQ(h.inter_node.latency, 20e-6);
  const Hardware b = parse_hardware(R"({"base": "h100-sxm", "name": "h100-roce", "inter_node": "roce-400"})", "b.json");
  EXPECT_EQ(b.name, "h100-roce");
  EXPECT_DOUBLE_EQ(b.peak_flops, find_hardware("h100-sxm")->peak_flops);
  EXPECT_EQ(b.inter_node.name, "roce-400");
}

TEST(HardwareFile, BadFileThrowsNamingFileAndKey) {
  auto expect_names = [](const std::string& json_text, const std::string& key) {
    const std::string e = error_of(json_text);
    EXPECT_NE(e.find("my_hw.json"), std::string::npos) << e;
    EXPECT_NE(e.find(key), std::string::npos) << "want " << key << " in: " << e;
  };
  expect_names(R"({"name": "x", "peak_tflops": 100})", "mem_bw_gbs");                       // missing
  expect_names(R"({"name": "x", "peak_tflops": -1, "mem_bw_gbs": 10})", "peak_tflops");     // negative
  expect_names(R"({"name": "x", "peak_tflops": "fast", "mem_bw_gbs": 10})", "peak_tflops"); // not a number
  expect_names(R"({"name": "x", "peak_tflops": 1, "mem_bw_gbs": 10, "mfu": 1.5})", "mfu");  // not a fraction
  expect_names(R"({"name": "x", "peak_tflops": 1, "mem_bw_gbs": 10, "peak_tflop": 2})", "peak_tflop");  // unknown
  expect_names(R"({"name": "x", "peak_tflops": 1, "mem_bw_gbs": 10, "intra_node": "nvlink9"})", "intra_node");
  expect_names(R"({"name": "x", "peak_tflops": 1, "mem_bw_gbs": 10, "inter_node": {"name": "e"}})",
               "inter_node.bandwidth_gbs");
  expect_names(R"({"name": "x", "peak_tflops": 1, "mem_bw_gbs": 10, "elem_bytes": 2.5})", "elem_bytes");
  expect_names(R"({"base": "h1000"})", "base");
  expect_names(R"({"name": "x", )", "JSON");
  try {
    load_hardware("/nonexistent/hw.json");
    ADD_FAILURE() << "a missing file loaded";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/hw.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(resolve_hardware("no-such-gpu"), std::invalid_argument);
}

// Every number within a stated range, in the file's units, so the analytic times stay finite.
TEST(HardwareFile, NumbersOutsideTheirRangesAreRefused) {
  auto expect_refused = [](const std::string& extra, const std::string& key, const std::string& allowed) {
    const std::string e = error_of(R"({"name": "x", "peak_tflops": 1, "mem_bw_gbs": 10, )" + extra + "}");
    EXPECT_NE(e.find("my_hw.json: key \"" + key + "\""), std::string::npos) << extra << " -> " << e;
    EXPECT_NE(e.find(allowed), std::string::npos) << extra << " -> " << e;
  };
  expect_refused(R"("vector_tflops": 1e-9)", "vector_tflops", "from 1e-06 to 1e+06");
  expect_refused(R"("mem_bw_gbs": 1e7)", "mem_bw_gbs", "from 1e-06 to 1e+06");
  expect_refused(R"("launch_us": 1e10)", "launch_us", "a number from 0 to 1e+09");
  expect_refused(R"("launch_us": -1)", "launch_us", "non-negative");
  expect_refused(R"("memory_gb": 1e7)", "memory_gb", "a number from 0 to 1e+06");
  expect_refused(R"("devices_per_node": 100000)", "devices_per_node", "[1, 65536]");
  expect_refused(R"("devices_per_node": 0)", "devices_per_node", "[1, 65536]");
  expect_refused(R"("intra_node": {"name": "l", "bandwidth_gbs": 1e-7, "latency_us": 1})", "intra_node.bandwidth_gbs",
                 "from 1e-06 to 1e+06");
  expect_refused(R"("inter_node": {"name": "l", "bandwidth_gbs": 10, "latency_us": 1e12})", "inter_node.latency_us",
                 "a number from 0 to 1e+09");
  // The slowest hardware a file may describe still gives a cost model within its bounds for a small model.
  const Hardware slow = parse_hardware(
      R"({"name": "slow", "peak_tflops": 1e-6, "mem_bw_gbs": 1e-6, "launch_us": 1e9,
          "intra_node": {"name": "l", "bandwidth_gbs": 1e-6, "latency_us": 1e9}})", "slow.json");
  config::ModelConfig m;
  m.pattern = "M-";
  EXPECT_NO_THROW(analytic_cost(m, 128, 4, slow, {1}, {2}));
}

// Ring collectives by hand: n = 8 on NVLink 4 (450 GB/s, 2 us), 1 GB per rank.
TEST(HardwareComm, RingFormulas) {
  const Link& nv = *find_link("nvlink4");
  EXPECT_DOUBLE_EQ(comm_seconds(CommOp::COMM_ALLREDUCE, 8, 1e9, nv), 2 * 7.0 / 8 * 1e9 / 450e9 + 14 * 2e-6);
  EXPECT_DOUBLE_EQ(comm_seconds(CommOp::COMM_REDUCE_SCATTER, 8, 1e9, nv), 7.0 / 8 * 1e9 / 450e9 + 7 * 2e-6);
  EXPECT_DOUBLE_EQ(comm_seconds(CommOp::COMM_ALLGATHER, 8, 1e9, nv), 7.0 / 8 * 1e9 / 450e9 + 7 * 2e-6);
  EXPECT_DOUBLE_EQ(comm_seconds(CommOp::COMM_P2P, 2, 1e9, nv), 1e9 / 450e9 + 2e-6);
  EXPECT_DOUBLE_EQ(comm_seconds(CommOp::COMM_ALLREDUCE, 1, 1e9, nv), 0.0);
  const Hardware& h = *find_hardware("h100-sxm");
  EXPECT_EQ(link_for(h, 8, NodeSpan::SPAN_BY_SIZE).name, "nvlink4");
  EXPECT_EQ(link_for(h, 16, NodeSpan::SPAN_BY_SIZE).name, "ib-ndr");
  EXPECT_EQ(link_for(h, 2, NodeSpan::SPAN_INTER_NODE).name, "ib-ndr");
}

// A Llama-like MLP block (D 4096, F 14336) forward on an H100 over 2 sequences of 4096 tokens,
// by hand: three GEMMs at 65% of 989.4 TFLOP/s (compute-bound), rmsnorm, SwiGLU and the
// residual add memory-bound at 80% of 3.35 TB/s in bf16, 4 us per op.
TEST(HardwareAnalytic, MlpBlockForwardOnH100) {
  config::ModelConfig m;
  m.pattern = "-";
  m.d_model = 4096;
  m.ffn_hidden = 14336;
  m.n_heads = 32;
  m.n_kv_heads = 8;
  m.vocab_size = 32000;
  const Hardware& h = *find_hardware("h100-sxm");
  const int64_t T = 4096, rows = 2 * T;
  const CostModel cm = analytic_cost(m, T, 4, h, {1, 8}, {2, 8, 16});
  EXPECT_EQ(cm.source, "analytic");
  EXPECT_EQ(cm.hardware.rfind(h.description, 0), 0u) << cm.hardware;

  const double M = rows, D = 4096, F = 14336;
  const double gemm_flops = 2 * M * 3 * D * F;  // 2.886e12
  const double gemm_s = gemm_flops / (989.4e12 * 0.65);
  const double elementwise_bytes = 2 * ((2 * M * D + M + D) + 3 * M * F + 3 * M * D);
  const double elementwise_s = elementwise_bytes / (3.35e12 * 0.8);
  const double hand_ms = (gemm_s + elementwise_s + 6 * 4e-6) * 1e3;  // ~4.9 ms
  const double f_ms = cm.compute_ms('-', Pass::PASS_F, 1, rows);
  expect_rel(f_ms, hand_ms, 1e-6, "MLP forward on H100");
  EXPECT_GT(f_ms, gemm_flops / 989.4e12 * 1e3);            // never faster than the peak
  EXPECT_LT(f_ms, 2 * gemm_flops / (989.4e12 * 0.65) * 1e3);  // nor slower than twice the GEMMs at mfu

  // tp 8: GEMMs and SwiGLU split, rmsnorm and residual not, plus the all-reduce of [M, D] bf16 over NVLink 4.
  const double ew8 = 2 * ((2 * M * D + M + D) + 3 * M * F / 8 + 3 * M * D) / (3.35e12 * 0.8);
  const double ar8 = 2 * 7.0 / 8 * (M * D * 2) / 450e9 + 14 * 2e-6;
  const double hand8_ms = (gemm_s / 8 + ew8 + 6 * 4e-6 + ar8) * 1e3;
  expect_rel(cm.compute_ms('-', Pass::PASS_F, 8, rows), hand8_ms, 1e-6, "MLP forward on H100, tp 8");

  // The backward is about twice the forward (plus the stash copies and the SwiGLU gradient).
  const double b_ms = cm.compute_ms('-', Pass::PASS_B, 1, rows);
  EXPECT_GT(b_ms, 1.9 * f_ms);
  EXPECT_LT(b_ms, 2.3 * f_ms);
  expect_rel(b_ms, cm.compute_ms('-', Pass::PASS_BI, 1, rows) + cm.compute_ms('-', Pass::PASS_BW, 1, rows), 1e-9,
             "B = BI + BW");

  // Data-parallel all-reduce of 1 GB over 16 ranks crosses nodes: IB NDR, 50 GB/s, 5 us.
  expect_rel(cm.comm_ms(CommOp::COMM_ALLREDUCE, 16, 1000000000), (2 * 15.0 / 16 * 1e9 / 50e9 + 30 * 5e-6) * 1e3,
             1e-9, "allreduce over 16");
  expect_rel(cm.comm_ms(CommOp::COMM_ALLREDUCE, 8, 1000000000), (2 * 7.0 / 8 * 1e9 / 450e9 + 14 * 2e-6) * 1e3, 1e-9,
             "allreduce over 8");
  // AdamW: 28 bytes per element at 80% of 3.35 TB/s.
  expect_rel(cm.update.b, 28 / (3.35e12 * 0.8) * 1e3, 1e-12, "update per element");
}

TEST(HardwareAnalytic, FillsEveryKindTpAndGroup) {
  config::ModelConfig m;  // the default hybrid "M-M*M-M-", with groups that split over tp 2
  m.n_groups = 2;
  const Hardware& h = *find_hardware("cpu-local");
  AnalyticOptions opt;
  opt.collectives = NodeSpan::SPAN_INTER_NODE;
  const CostModel cm = analytic_cost(m, 256, 4, h, {2, 1, 2}, {1, 2, 4}, opt);
  ASSERT_EQ(cm.ops.size(), 5u * 2);  // e, M, -, *, h at tp 1 and 2
  for (const OpCost& o : cm.ops) {
    const std::string what = std::string("kind ") + o.kind + " tp " + std::to_string(o.tp);
    EXPECT_GT(o.f.at(1024), 0) << what;
    EXPECT_GT(o.bw.at(1024), 0) << what;
    EXPECT_GE(o.transient.b, 0) << what;
    if (o.kind != 'e') {  // (the embedding's forward holds its tp all-reduce, its backward none)
      EXPECT_GT(o.b.at(1024), o.f.at(1024)) << what;
      EXPECT_GT(o.saved.b, 0) << what;
      EXPECT_GT(o.kept_for_w.b, 0) << what;  // what the weight half reads, and its stash
    }
  }
  EXPECT_GT(cm.op('M', 2).f.b, 0);
  // The embedding's BWD_W node runs its whole backward.
  EXPECT_DOUBLE_EQ(cm.op('e', 1).bw.b, cm.op('e', 1).b.b);
  ASSERT_EQ(cm.comm.size(), 2u * 4 + 1);  // groups 2 and 4, four collectives each; p2p
  for (const CommCost& c : cm.comm) EXPECT_GT(c.t.b, 0);
  // Collectives forced across nodes: IB HDR at 25 GB/s.
  expect_rel(cm.comm_ms(CommOp::COMM_ALLGATHER, 4, 1000000), (3.0 / 4 * 1e6 / 25e9 + 3 * 5e-6) * 1e3, 1e-9,
             "allgather over 4");
  EXPECT_GT(cm.update.b, 0);
}

TEST(HardwareAnalytic, RefusesMoeAndBadHardware) {
  config::ModelConfig m;
  m.pattern = "M-E";
  EXPECT_THROW(analytic_cost(m, 128, 4, *find_hardware("h100-sxm"), {1}, {}), std::invalid_argument);
  m.pattern = "M-";
  Hardware bad = *find_hardware("h100-sxm");
  bad.mem_bw = 0;
  EXPECT_THROW(analytic_cost(m, 128, 4, bad, {1}, {}), std::invalid_argument);
}

}  // namespace
}  // namespace piper::sim
