// test_calibrate.cpp — `piper calibrate` end to end: a quick calibration of the
// tiny model on 1 and 2 ranks, read back with sim::load_cost and checked for
// sensible costs; the all-to-all of an MoE model at ep 2; a bad config is
// refused with exit 2 naming the key.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "e2e/e2e_util.hpp"
#include "sim/cost_model.hpp"

namespace piper::e2e {
namespace {

std::string launcher(int np) {
  return np > 1 ? "mpirun --oversubscribe --allow-run-as-root -np " + std::to_string(np) + " " : "";
}

// Runs a quick calibration of config/tiny.yaml on `np` ranks into `path`.
RunResult calibrate(int np, const std::string& path, const std::string& extra = "") {
  return run(launcher(np) + piper() + " calibrate " + source("config/tiny.yaml") + " --quick -o " + path +
             " --set data.path=" + corpus() + " --set train.threads=1 " + extra);
}

// Every unit kind of tiny's pattern "M*-M-", with costs that make sense.
void expect_sensible_compute(const sim::CostModel& m) {
  EXPECT_EQ(m.source, "calibrate");
  EXPECT_EQ(m.threads_per_rank, 1);
  EXPECT_GT(m.host_cores, 0);
  EXPECT_FALSE(m.hardware.empty());
  // Rows of the quick sizes: batch 1, the microbatch (8 x 64) and twice it.
  // Timing on a shared machine is noisy: the bounds are loose.
  const double small = 64, mb = 8 * 64, large = 16 * 64;
  for (char kind : {'e', 'M', '*', '-', 'h'}) {
    SCOPED_TRACE(std::string("kind ") + kind);
    const sim::OpCost& o = m.op(kind, 1);
    EXPECT_EQ(o.kind, kind);
    EXPECT_EQ(o.tp, 1);
    for (const sim::Linear* l : {&o.f, &o.b, &o.bw}) {
      EXPECT_GT(l->at(mb), 0.0);
      EXPECT_GT(l->b, 0.0) << "time grows with rows";
    }
    if (kind == 'e') continue;  // no input gradient; its saved ids live outside the backend
    EXPECT_GT(o.bi.at(mb), 0.0);
    const double sum = o.bi.at(mb) + o.bw.at(mb), fused = o.b.at(mb);
    EXPECT_LT(sum, 3.0 * fused) << "bi + bw vs b";
    EXPECT_GT(sum, fused / 3.0) << "bi + bw vs b";
    EXPECT_GT(o.saved.at(small), 0.0);
    EXPECT_GT(o.saved.at(large), o.saved.at(small)) << "saved activations grow with rows";
    EXPECT_GE(o.transient.at(large), o.saved.at(large) * 0.99);
    if (kind != 'h') {
      EXPECT_GT(o.b.at(mb), o.f.at(mb)) << "a block's backward costs more than its forward";
    }
  }
  EXPECT_GT(m.update.at(1e6), 0.0);
  EXPECT_GT(m.update.b, 0.0);
  EXPECT_GE(m.step_overhead.at(1), 0.0);
}

TEST(Calibrate, QuickOneRank) {
  TempDir tmp("calibrate1");
  const std::string out = tmp.file("cost.json");
  auto r = calibrate(1, out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("compute at tp 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("wrote"), std::string::npos) << r.output;
  const sim::CostModel m = sim::load_cost(out);
  expect_sensible_compute(m);
  EXPECT_TRUE(m.comm.empty()) << "one rank: nothing to communicate";
  EXPECT_EQ(m.ops.size(), 5u);
}

TEST(Calibrate, QuickTwoRanksMeasuresCommunication) {
  TempDir tmp("calibrate2");
  const std::string out = tmp.file("cost.json");
  auto r = calibrate(2, out);
  ASSERT_EQ(r.code, 0) << r.output;
  const sim::CostModel m = sim::load_cost(out);
  expect_sensible_compute(m);
  for (sim::CommOp op : {sim::CommOp::COMM_P2P, sim::CommOp::COMM_ALLREDUCE, sim::CommOp::COMM_REDUCE_SCATTER,
                         sim::CommOp::COMM_ALLGATHER}) {
    SCOPED_TRACE(sim::comm_op_name(op));
    int found = 0;
    for (const sim::CommCost& c : m.comm)
      if (c.op == op) {
        ++found;
        EXPECT_EQ(c.ranks, 2);
        EXPECT_GT(c.t.at(4 << 20), c.t.at(4 << 10)) << "time grows with bytes";
        EXPECT_GT(c.t.at(4 << 20), 0.0);
      }
    EXPECT_EQ(found, 1);
    EXPECT_GT(m.comm_ms(op, 2, 4 << 20), 0.0);
  }
}

// An MoE model at ep 2: all-to-all entries over the ep group, measured at the
// sizes of the DAG's ALLTOALL nodes, so that simulate prices dispatch and combine.
TEST(Calibrate, ExpertParallelMeasuresAllToAll) {
  TempDir tmp("calibrate-ep");
  const std::string out = tmp.file("cost.json");
  const std::string sets = " --set data.path=" + corpus() + " --set train.threads=1 --set parallel.dp=2 --set parallel.ep=2";
  auto r = run(launcher(2) + piper() + " calibrate " + source("config/tiny-moe.yaml") + " --quick -o " + out + sets);
  ASSERT_EQ(r.code, 0) << r.output;
  const sim::CostModel m = sim::load_cost(out);
  const sim::CommCost* a2a = nullptr;
  for (const sim::CommCost& c : m.comm)
    if (c.op == sim::CommOp::COMM_ALLTOALL) {
      EXPECT_EQ(a2a, nullptr) << "one all-to-all entry per group size";
      a2a = &c;
    }
  ASSERT_NE(a2a, nullptr) << r.output;
  EXPECT_EQ(a2a->ranks, 2);
  // tiny-moe: 4 experts, top 2, d_model 64; a microbatch of 8 / dp 2 samples of 64 tokens.
  // The DAG's ALLTOALL nodes: the counts exchange (4 floats) and the rows (256 x 2 x 64 floats).
  const double counts = 4 * 4, rows = 256.0 * 2 * 64 * 4;
  auto measured_at = [&](double bytes) {
    return std::any_of(a2a->points.begin(), a2a->points.end(), [&](const auto& p) { return p.first == bytes; });
  };
  EXPECT_TRUE(measured_at(counts)) << "the counts exchange's size";
  EXPECT_TRUE(measured_at(rows)) << "the dispatch's size";
  for (size_t i = 0; i < a2a->points.size(); ++i) {
    const auto [bytes, ms] = a2a->points[i];
    SCOPED_TRACE(std::to_string(bytes) + " bytes");
    EXPECT_GT(ms, 0.0);
    if (i > 0) {
      EXPECT_GT(bytes, a2a->points[i - 1].first) << "ascending sizes";
    }
  }
  // Timing on a shared machine is noisy: only the ends are compared (16 bytes against 4 MiB).
  EXPECT_GT(a2a->points.back().second, a2a->points.front().second) << "time grows with bytes";
  EXPECT_GT(m.comm_ms(sim::CommOp::COMM_ALLTOALL, 2, static_cast<int64_t>(rows)), 0.0);
  auto s = run(piper() + " simulate " + source("config/tiny-moe.yaml") + " --cost " + out + " --json" + sets);
  ASSERT_EQ(s.code, 0) << s.output;
  EXPECT_NE(s.output.find("\"step_ms\""), std::string::npos) << s.output;
}

TEST(Calibrate, TensorParallelOnTwoRanks) {
  TempDir tmp("calibrate-tp");
  const std::string out = tmp.file("cost.json");
  auto r = calibrate(2, out, "--set parallel.tp=2 --quiet");
  ASSERT_EQ(r.code, 0) << r.output;
  const sim::CostModel m = sim::load_cost(out);
  for (char kind : {'e', 'M', '*', '-', 'h'}) {
    SCOPED_TRACE(std::string("kind ") + kind);
    EXPECT_EQ(m.op(kind, 2).tp, 2);
    EXPECT_EQ(m.op(kind, 1).tp, 1);
    EXPECT_GT(m.op(kind, 2).f.at(512), 0.0);
  }
}

TEST(Calibrate, BadConfigNamesTheKey) {
  TempDir tmp("calibrate-bad");
  const std::string out = tmp.file("cost.json");
  auto r = calibrate(1, out, "--set model.d_modle=64");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("d_modle"), std::string::npos) << r.output;
  auto v = calibrate(1, out, "--set train.seq_len=0");
  EXPECT_EQ(v.code, 2) << v.output;
  EXPECT_NE(v.output.find("train.seq_len"), std::string::npos) << v.output;
  EXPECT_FALSE(std::filesystem::exists(out)) << "nothing written for a bad config";
  auto o = calibrate(1, tmp.file("no/such/dir/cost.json"));
  EXPECT_EQ(o.code, 2) << o.output;
  EXPECT_NE(o.output.find("-o"), std::string::npos) << o.output;
}

}  // namespace
}  // namespace piper::e2e
