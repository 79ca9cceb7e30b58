// test_replicas.cpp — SimOptions::replicas: a plan compiled at a small data-parallel degree and
// simulated with replicas = k predicts what the same strategy compiled at k times the dp (and the
// global batch) predicts, rank for rank, on an analytic cost model covering the full strategy; and
// the replica counts it cannot stand for are refused with a message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "ir/compile.hpp"
#include "ir/parallel_dims.hpp"
#include "sim/cost_model.hpp"
#include "sim/hardware.hpp"
#include "sim/simulator.hpp"
#include "unit/test_configs.hpp"

namespace piper::sim {
namespace {

struct Case {
  std::string pattern = "M*-M-";
  int dp = 4, small_dp = 2;  // the full strategy's dp; the compiled plan's
  int tp = 1, pp = 1, ep = 1, zero = 0, mb = 2;
  std::string schedule = "1f1b";
};

std::string name(const Case& c) {
  return c.pattern + " dp " + std::to_string(c.dp) + " as " + std::to_string(c.small_dp) + " x " +
         std::to_string(c.dp / c.small_dp) + ", tp " + std::to_string(c.tp) + ", pp " + std::to_string(c.pp) + " " +
         c.schedule + ", ep " + std::to_string(c.ep) + ", ZeRO " + std::to_string(c.zero);
}

// The case at data-parallel degree `dp`: two sequences of 16 tokens per microbatch and replica.
config::Config config_at(const Case& c, int dp) {
  config::Config cfg;
  cfg.model = testing::small_model(c.pattern);
  cfg.train.seq_len = 16;
  cfg.train.global_batch = 2 * dp * c.mb;
  cfg.parallel.dp = dp;
  cfg.parallel.tp = c.tp;
  cfg.parallel.pp = c.pp;
  cfg.parallel.ep = c.ep;
  cfg.parallel.zero = c.zero;
  cfg.parallel.microbatches = c.mb;
  cfg.parallel.schedule = c.schedule;
  return cfg;
}

// |a - b| relative to the larger magnitude (0 when both are 0).
double rel(double a, double b) {
  const double m = std::max(std::abs(a), std::abs(b));
  return m > 0 ? std::abs(a - b) / m : 0.0;
}

// The largest relative difference between the small plan's results and the full plan's, each full
// rank against the small plan's rank with its tp and pp coordinates and its dp coordinate modulo
// the small dp.
double largest_difference(const SimResult& full, const ir::ParallelDims& full_dims, const SimResult& small,
                          const ir::ParallelDims& small_dims) {
  double err = std::max(rel(full.step_ms, small.step_ms), rel(full.bubble, small.bubble));
  const int small_dp = small_dims.degree(ir::Axis::DP);
  for (const RankResult& f : full.ranks) {
    ir::Coords at = full_dims.coords(f.rank);
    at.dp %= small_dp;
    const RankResult& s = small.ranks.at(static_cast<size_t>(small_dims.rank_of(at)));
    for (auto [a, b] : {std::pair{f.finish_ms, s.finish_ms}, {f.compute_ms, s.compute_ms}, {f.comm_ms, s.comm_ms},
                        {f.bubble_ms, s.bubble_ms}, {f.peak_total, s.peak_total}})
      err = std::max(err, rel(a, b));
    for (int m = 0; m < kMemCount; ++m) {
      err = std::max(err, rel(f.peak[static_cast<size_t>(m)], s.peak[static_cast<size_t>(m)]));
      err = std::max(err, rel(f.state[static_cast<size_t>(m)], s.state[static_cast<size_t>(m)]));
    }
  }
  return err;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int dp : {4, 8})
    for (int zero : {0, 1, 2, 3}) out.push_back({.dp = dp, .zero = zero});
  out.push_back({.pp = 2, .zero = 1, .mb = 4});
  out.push_back({.dp = 8, .pp = 2, .zero = 3, .mb = 4});
  out.push_back({.pp = 2, .zero = 2, .mb = 4, .schedule = "dualpipev"});
  out.push_back({.dp = 8, .pp = 2, .zero = 0, .mb = 4, .schedule = "dualpipev"});
  out.push_back({.tp = 2, .zero = 0});
  out.push_back({.dp = 8, .tp = 2, .zero = 3});
  out.push_back({.dp = 8, .tp = 2, .pp = 2, .zero = 1, .mb = 4});
  // MoE: ep 2 of dp 8 compiled at dp 2 (one ep group, an expert-data group of 1) stands for
  // expert-data groups of 4.
  for (int zero : {0, 1, 3}) out.push_back({.pattern = "M-E*E", .dp = 8, .small_dp = 2, .ep = 2, .zero = zero});
  return out;
}

// The analytic cost model of an H100 cluster, covering the full strategy's group sizes.
CostModel cost_for(const config::Config& full, const ir::ParallelDims& dims) {
  const CostCoverage cov = coverage_of(dims);
  return analytic_cost(full.model, full.train.seq_len, 4, *find_hardware("h100-sxm"), cov.tps, cov.group_sizes);
}

// Every case: the small plan with replicas predicts the full plan's step, bubble and every rank's
// times and memory to 1e-9 relative; without replicas it does not (so the comparison can fail).
TEST(SimulatorReplicas, ASmallPlanWithReplicasPredictsTheFullStrategy) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name(c));
    const config::Config full_cfg = config_at(c, c.dp), small_cfg = config_at(c, c.small_dp);
    const ir::Plan full = ir::compile(full_cfg, c.tp * c.pp * c.dp);
    const ir::Plan small = ir::compile(small_cfg, c.tp * c.pp * c.small_dp);
    const ir::ParallelDims full_dims = full.strategy.dims(), small_dims = small.strategy.dims();
    const CostModel cost = cost_for(full_cfg, full_dims);
    SimOptions opts;
    opts.replicas = c.dp / c.small_dp;
    const SimResult want = simulate(full, full_cfg, cost);
    const SimResult got = simulate(small, small_cfg, cost, opts);
    const SimResult alone = simulate(small, small_cfg, cost);
    const double err = largest_difference(want, full_dims, got, small_dims);
    const double without = largest_difference(want, full_dims, alone, small_dims);
    std::printf("[ replicas ] %-52s step %.6f ms (full %.6f), largest relative difference %.3g (without replicas "
                "%.3g)\n",
                name(c).c_str(), got.step_ms, want.step_ms, err, without);
    ASSERT_EQ(got.ranks.size(), static_cast<size_t>(small.strategy.world_size)) << "the plan's ranks are reported";
    EXPECT_LE(err, 1e-9);
    EXPECT_GT(without, 1e-6) << "the replicas change the prediction";
  }
}

std::string refusal(const ir::Plan& plan, const config::Config& cfg, const SimOptions& opts) {
  try {
    simulate(plan, cfg, cost_for(cfg, plan.strategy.dims()), opts);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

TEST(SimulatorReplicas, ReplicaCountsItCannotStandForAreRefused) {
  const Case c;
  const config::Config cfg = config_at(c, 2);
  const ir::Plan plan = ir::compile(cfg, 2);
  SimOptions opts;
  opts.replicas = 0;
  std::string m = refusal(plan, cfg, opts);
  EXPECT_NE(m.find("SimOptions::replicas = 0: "), std::string::npos) << m;
  EXPECT_NE(m.find("give at least 1"), std::string::npos) << m;
  opts.replicas = 2;
  opts.ranks_per_host = 2;
  m = refusal(plan, cfg, opts);
  EXPECT_NE(m.find("SimOptions::replicas = 2: ranks_per_host = 2 "), std::string::npos) << m;
  EXPECT_NE(m.find("give ranks_per_host 0 or 1, or replicas 1"), std::string::npos) << m;
  opts.ranks_per_host = 1;  // a host per rank: nothing shared
  EXPECT_EQ(refusal(plan, cfg, opts), "no error");
  opts.replicas = kMaxGroupRanks;
  m = refusal(plan, cfg, opts);
  EXPECT_NE(m.find("dp 2 x replicas is " + std::to_string(2 * kMaxGroupRanks)), std::string::npos) << m;
  EXPECT_NE(m.find("give at most " + std::to_string(kMaxGroupRanks / 2)), std::string::npos) << m;
  const config::Config one_cfg = config_at(c, 1);
  opts.replicas = 4;
  m = refusal(ir::compile(one_cfg, 1), one_cfg, opts);
  EXPECT_NE(m.find("SimOptions::replicas = 4: the plan has dp 1"), std::string::npos) << m;
  EXPECT_NE(m.find("compile it at dp 2"), std::string::npos) << m;
}

}  // namespace
}  // namespace piper::sim
