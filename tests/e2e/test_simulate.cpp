// test_simulate.cpp — `piper simulate` end to end: the JSON it prints, the trace and picture it
// writes, its errors, and its predictions against measured runs on this machine (a loose bound on
// step time, since CI machines are noisy; bench/sim_accuracy.py holds the 5% table).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

std::string launch(int np) {
  return np > 1 ? "mpirun --oversubscribe --allow-run-as-root --bind-to none -np " + std::to_string(np) + " " : "";
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

// Calibrate on this machine, then predict three strategies and run them. Step time within 30% (the
// benchmark's table shows the real agreement; a shared CI machine is noisy), peak memory within 10%
// (allocator accounting is not noisy).
TEST(SimulateAccuracy, PredictsMeasuredStepTimeAndPeakMemory) {
  TempDir dir("sim-acc");
  const std::string common = " --set data.path=" + corpus() + " --set train.threads=1";
  const std::string cfg = source("config/tiny.yaml");
  const RunResult cal =
      run(launch(2) + piper() + " calibrate " + cfg + common + " --quick --quiet -o " + dir.file("cost.json"));
  ASSERT_EQ(cal.code, 0) << cal.output;
  struct Case {
    const char* name;
    int np;
    std::string sets;
  };
  const std::vector<Case> cases = {
      {"1 rank, 2 microbatches", 1, " --set parallel.microbatches=2"},
      {"dp 2, ZeRO-1", 2, " --set parallel.dp=2 --set parallel.zero=1"},
      {"pp 2, 1f1b, 4 microbatches", 2, " --set parallel.pp=2 --set parallel.microbatches=4"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string metrics = dir.file("m.jsonl");
    const RunResult tr = run(launch(c.np) + piper() + " train " + cfg + common + c.sets +
                             " --set train.steps=10 --quiet --metrics " + metrics);
    ASSERT_EQ(tr.code, 0) << tr.output;
    const auto rows = read_metrics(metrics);
    std::vector<double> ms, peak;
    for (size_t i = 3; i < rows.size(); ++i) {
      ms.push_back(rows[i]["step_ms"].get<double>());
      double p = 0;
      for (const auto& rk : rows[i]["ranks"]) p = std::max(p, rk["peak_mem_bytes"].get<double>());
      peak.push_back(p);
    }
    std::sort(ms.begin(), ms.end());
    std::sort(peak.begin(), peak.end());
    const double measured = ms[ms.size() / 2], measured_peak = peak[peak.size() / 2];
    const RunResult sim = run(piper() + " simulate " + cfg + common + c.sets + " --world " + std::to_string(c.np) +
                              " --cost " + dir.file("cost.json") + " --json");
    ASSERT_EQ(sim.code, 0) << sim.output;
    const nlohmann::json j = nlohmann::json::parse(sim.output);
    double predicted_peak = 0;
    for (const auto& rk : j["ranks"]) predicted_peak = std::max(predicted_peak, rk["peak_mem_bytes"].get<double>());
    const double err = j["step_ms"].get<double>() / measured - 1, mem_err = predicted_peak / measured_peak - 1;
    std::printf("  %-28s step: predicted %.2f ms, measured %.2f ms (%+.1f%%); peak: predicted %.0f, measured %.0f "
                "bytes (%+.1f%%)\n", c.name, j["step_ms"].get<double>(), measured, 100 * err, predicted_peak,
                measured_peak, 100 * mem_err);
    EXPECT_LT(std::abs(err), 0.30) << "step time error " << err;
    EXPECT_LT(std::abs(mem_err), 0.10) << "peak memory error " << mem_err;
  }
}

}  // namespace
}  // namespace piper::e2e
