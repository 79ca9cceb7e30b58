// test_simulate.cpp — `piper simulate` end to end: the JSON it prints, the trace and picture it
// writes, its errors. Its predictions against measured runs: tests/accuracy.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "e2e_util.hpp"

namespace piper::e2e {
namespace {

// F = 1, B = 2 (BI = BW = 1) per block, free embedding, head and communication.
const char* kAbstractCost = R"({"source": "manual", "hardware": "F=1 B=2 W=1", "free_comm": true,
  "ops": [{"kind": "e", "f": 0, "b": 0, "bi": 0, "bw": 0}, {"kind": "h", "f": 0, "b": 0, "bi": 0, "bw": 0},
          {"kind": "M", "f": 1, "b": 2, "bi": 1, "bw": 1}, {"kind": "*", "f": 1, "b": 2, "bi": 1, "bw": 1},
          {"kind": "-", "f": 1, "b": 2, "bi": 1, "bw": 1}]})";

std::string simulate(const std::string& args) {
  return piper() + " simulate " + source("config/tiny.yaml") + " --set data.path=" + corpus() + " " + args;
}

TEST(SimulateCli, JsonHasStepTimeAndPerRankFigures) {
  TempDir dir("sim-json");
  const std::string cost = dir.write("cost.json", kAbstractCost);
  const RunResult r = run(simulate("--cost " + cost + " --set parallel.pp=2 --set parallel.microbatches=4 --json"));
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  // tiny.yaml: M*-M- over 2 stages; every block F=1, B=2; 4 microbatches.
  EXPECT_GT(j.at("step_ms").get<double>(), 0);
  ASSERT_EQ(j.at("ranks").size(), 2u);
  double compute = 0;
  for (const auto& rk : j["ranks"]) {
    EXPECT_GT(rk.at("peak_mem_bytes").get<double>(), 0);
    EXPECT_GT(rk.at("mem_bytes").at("params").get<double>(), 0);
    EXPECT_LE(rk.at("finish_ms").get<double>(), j["step_ms"].get<double>() + 1e-9);
    compute += rk.at("compute_ms").get<double>();
  }
  EXPECT_DOUBLE_EQ(compute, 5 * 3 * 4.0) << "5 blocks, F+B = 3, 4 microbatches, over both ranks";
}

TEST(SimulateCli, WritesATraceAndAPictureOfThePredictedStep) {
  TempDir dir("sim-trace");
  const std::string cost = dir.write("cost.json", kAbstractCost);
  const RunResult r = run(simulate("--cost " + cost + " --set parallel.pp=2 --set parallel.microbatches=4 --trace " +
                                   dir.file("t.json") + " --svg " + dir.file("t.svg")));
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream tf(dir.file("t.json"));
  const nlohmann::json t = nlohmann::json::parse(tf);
  int fwd[2] = {0, 0};
  for (const auto& e : t.at("traceEvents"))
    if (e.value("ph", "") == "X" && e.at("args").at("kind") == "FWD") ++fwd[e.at("pid").get<int>()];
  // 7 units (embedding, 5 blocks, head) x 4 microbatches, split over the two ranks.
  EXPECT_EQ(fwd[0] + fwd[1], 7 * 4);
  EXPECT_GT(fwd[0], 0);
  EXPECT_GT(fwd[1], 0);
  std::ifstream sf(dir.file("t.svg"));
  std::stringstream svg;
  svg << sf.rdbuf();
  EXPECT_NE(svg.str().find("<svg"), std::string::npos);
  EXPECT_NE(svg.str().find("</svg>"), std::string::npos);
}

// parallel.recompute=full: a RECOMP event per block and microbatch in the predicted trace, each as
// long as the block's forward (1 ms), and the JSON's compute grows by them.
TEST(SimulateCli, RecomputationShowsAsRecompEvents) {
  TempDir dir("sim-recompute");
  const std::string cost = dir.write("cost.json", kAbstractCost);
  const std::string sets = "--cost " + cost + " --set parallel.pp=2 --set parallel.microbatches=4 ";
  const RunResult r = run(simulate(sets + "--set parallel.recompute=full --trace " + dir.file("t.json")));
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream tf(dir.file("t.json"));
  const nlohmann::json t = nlohmann::json::parse(tf);
  int recomp = 0;
  double recomp_ms = 0;
  for (const auto& e : t.at("traceEvents"))
    if (e.value("ph", "") == "X" && e.at("args").at("kind") == "RECOMP") {
      ++recomp;
      recomp_ms += e.at("dur").get<double>() / 1000.0;
    }
  EXPECT_EQ(recomp, 5 * 4) << "5 blocks x 4 microbatches";
  EXPECT_NEAR(recomp_ms, 5 * 4 * 1.0, 1e-6);
  const RunResult j = run(simulate(sets + "--set parallel.recompute=full --json"));
  ASSERT_EQ(j.code, 0) << j.output;
  const nlohmann::json figures = nlohmann::json::parse(j.output);
  double compute = 0;
  for (const auto& rk : figures.at("ranks")) compute += rk.at("compute_ms").get<double>();
  EXPECT_DOUBLE_EQ(compute, 5 * 4 * 4.0) << "5 blocks, F+B+RECOMP = 4, 4 microbatches, over both ranks";
}

TEST(SimulateCli, BadCostFilesAreRefusedNamingTheKey) {
  TempDir dir("sim-bad");
  const std::string unknown = dir.write("unknown.json", R"({"ops": [], "speed": 3})");
  RunResult r = run(simulate("--cost " + unknown));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("unknown.json"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"speed\""), std::string::npos) << r.output;

  const std::string no_attention = dir.write("partial.json", R"({"free_comm": true, "ops": [
    {"kind": "e", "f": 0}, {"kind": "h", "f": 0}, {"kind": "M", "f": 1}, {"kind": "-", "f": 1}]})");
  r = run(simulate("--cost " + no_attention));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("unit kind '*'"), std::string::npos) << r.output;

  r = run(simulate(""));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--cost FILE"), std::string::npos) << r.output;
}

TEST(SimulateCli, AnalyticCostsFromTheHardwareTable) {
  RunResult r = run(simulate("--hardware help"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("h100-sxm"), std::string::npos) << r.output;
  r = run(simulate("--hardware h100-sxm --set parallel.dp=2 --set parallel.zero=1 --json"));
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json h100 = nlohmann::json::parse(r.output);
  EXPECT_EQ(h100.at("cost_source"), "analytic");
  EXPECT_EQ(h100.at("ranks").size(), 2u);
  r = run(simulate("--hardware a100-sxm-80gb --set parallel.dp=2 --set parallel.zero=1 --json"));
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json a100 = nlohmann::json::parse(r.output);
  // The same step on a slower chip (312 against 989 TFLOP/s, 2.0 against 3.35 TB/s) takes longer.
  EXPECT_GT(a100.at("step_ms").get<double>(), h100.at("step_ms").get<double>());
  r = run(simulate("--hardware h900"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("h100-sxm"), std::string::npos) << "the message lists the known names: " << r.output;
}

// Refusals that must come quickly: each run is wrapped in `timeout 30`, so a hang reads 124, not 2.
RunResult run_bounded(const std::string& args) { return run("timeout 30 " + simulate(args)); }

TEST(SimulateLimits, WorldZeroIsRefusedWithASaneRange) {
  TempDir dir("sim-world0");
  const std::string cost = dir.write("cost.json", kAbstractCost);
  const RunResult r = run_bounded("--cost " + cost + " --world 0");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--world"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1 to 16384"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("17976931"), std::string::npos) << "no 309-digit range: " << r.output;
  EXPECT_LT(r.output.size(), 400u) << r.output;
}

TEST(SimulateLimits, WorldAboveTheLimitIsRefusedQuickly) {
  TempDir dir("sim-world-big");
  const std::string cost = dir.write("cost.json", kAbstractCost);
  RunResult r = run_bounded("--cost " + cost + " --world 100000 --set parallel.dp=100000 --set train.global_batch=100000");
  EXPECT_EQ(r.code, 2) << "2 is a refusal; 124 would be the timeout: " << r.output;
  EXPECT_NE(r.output.find("--world"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("16384"), std::string::npos) << r.output;
  // The config's own grid above the limit, without --world: the keys are named.
  r = run_bounded("--cost " + cost + " --set parallel.dp=20000 --set train.global_batch=20000");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("parallel.dp x parallel.tp x parallel.pp = 20000 x 1 x 1 = 20000"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("allowed: 1 to 16384 ranks"), std::string::npos) << r.output;
  // Within the world limit but too many instructions: refused before compiling, with the figure.
  r = run_bounded("--cost " + cost +
                  " --world 16384 --set parallel.dp=16384 --set parallel.microbatches=64 --set train.global_batch=1048576");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--world 16384 with this config plays at least 14680064 instructions"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("limit of 4194304"), std::string::npos) << r.output;
}

TEST(SimulateLimits, CostsThatWouldOverflowAreRefused) {
  TempDir dir("sim-huge");
  const std::string huge = dir.write("huge.json", R"({"free_comm": true, "ops": [
    {"kind": "e", "f": 0}, {"kind": "h", "f": 0}, {"kind": "M", "f": 1e308, "b": 1e308, "bi": 1e308, "bw": 1e308},
    {"kind": "*", "f": 1e308, "b": 1e308}, {"kind": "-", "f": 1e308, "b": 1e308}]})");
  RunResult r = run_bounded("--cost " + huge + " --set parallel.pp=2 --set parallel.microbatches=4 --json");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(r.output.find("null"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("huge.json: ops[2].f: the constant 1e+308 ms is out of range (allowed: 0 to 1e+12"),
            std::string::npos)
      << r.output;
  // The slowdown that made host sharing loop forever.
  const std::string slow = dir.write("slow.json", R"({"free_comm": true, "host_slowdown": [1, 1e308], "ops": [
    {"kind": "e", "f": 0}, {"kind": "h", "f": 0}, {"kind": "M", "f": 1, "b": 2}, {"kind": "*", "f": 1, "b": 2},
    {"kind": "-", "f": 1, "b": 2}]})");
  r = run_bounded("--cost " + slow + " --set parallel.pp=2 --set parallel.microbatches=4 --ranks-per-host 2 --json");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("slow.json: host_slowdown[1]"), std::string::npos) << r.output;
  // Negative times and absurd core counts.
  const std::string neg = dir.write("neg.json", R"({"free_comm": true, "host_cores": -5, "ops": []})");
  r = run_bounded("--cost " + neg);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("neg.json: host_cores: expected an integer from 0 to 4096, got -5"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace piper::e2e
