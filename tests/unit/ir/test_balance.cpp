// test_balance.cpp — the default pipeline stages: ir::balance_stages (the min-max contiguous
// partition) against brute force over every cut, its tie-breaks and refusals; ir::unit_costs (the
// work it balances); and ir::expand balancing hybrids by work, where parameter counts mislead.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "ir/model_graph.hpp"
#include "ir/placement.hpp"
#include "ir/strategy.hpp"
#include "ir/work.hpp"
#include "unit/test_configs.hpp"

namespace piper::ir {
namespace {

using piper::testing::mid_model;

// Each stage's cost under `stage_of` (stages 0..stage_of.back()), summed along the model.
std::vector<double> stage_costs(const std::vector<double>& cost, const std::vector<int>& stage_of) {
  std::vector<double> out(static_cast<size_t>(stage_of.back()) + 1, 0.0);
  for (size_t u = 0; u < cost.size(); ++u) out[static_cast<size_t>(stage_of[u])] += cost[u];
  return out;
}

double most(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

// The smallest most expensive stage over every split of units [from, n) into `stages` non-empty
// contiguous stages, the cost so far being `worst`.
double brute_force(const std::vector<double>& cost, size_t from, int stages, double worst) {
  const size_t n = cost.size();
  if (stages == 1) {
    double last = 0;
    for (size_t u = from; u < n; ++u) last += cost[u];
    return std::max(worst, last);
  }
  double best = std::numeric_limits<double>::infinity(), first = 0;
  for (size_t end = from + 1; end + static_cast<size_t>(stages - 1) <= n; ++end) {
    first += cost[end - 1];
    best = std::min(best, brute_force(cost, end, stages - 1, std::max(worst, first)));
  }
  return best;
}

// stage_of puts unit 0 on stage 0 and the last unit on the last stage, each stage a non-empty run.
void expect_contiguous(const std::vector<int>& stage_of, size_t n, int stages) {
  ASSERT_EQ(stage_of.size(), n);
  EXPECT_EQ(stage_of.front(), 0);
  EXPECT_EQ(stage_of.back(), stages - 1);
  for (size_t u = 1; u < n; ++u) {
    const int step = stage_of[u] - stage_of[u - 1];
    EXPECT_TRUE(step == 0 || step == 1) << "unit " << u << " steps from stage " << stage_of[u - 1] << " to "
                                        << stage_of[u];
  }
}

// Hand-made costs (zeros, repeats, six orders of magnitude apart), every stage count up to the
// units: the partition is contiguous and its most expensive stage is the brute-force optimum,
// exactly (both sum each stage along the model from its first unit, so equal splits give equal
// doubles; tolerance 0).
TEST(Balance, MatchesBruteForceOverEveryCut) {
  uint32_t state = 12345;
  auto next = [&state] { return state = state * 1103515245u + 12345u, (state >> 16) % 10; };
  std::vector<std::vector<double>> cases = {{0}, {5, 5}, {0, 0, 0, 0}, {1, 2, 3, 4, 5, 6, 7, 8, 9},
                                            {9, 1, 1, 1, 1, 1, 1, 1, 9}, {1e6, 1, 1e6, 1, 1, 1e6, 2}};
  for (int k = 0; k < 24; ++k) {
    std::vector<double> c(2 + static_cast<size_t>(k) % 8);
    for (double& x : c) x = static_cast<double>(next()) * (k % 3 == 0 ? 1e9 : 1.0);
    cases.push_back(c);
  }
  int checked = 0;
  for (const std::vector<double>& cost : cases)
    for (int stages = 1; stages <= static_cast<int>(cost.size()); ++stages) {
      SCOPED_TRACE(std::to_string(cost.size()) + " units, " + std::to_string(stages) + " stages");
      const std::vector<int> stage_of = balance_stages(cost, stages);
      expect_contiguous(stage_of, cost.size(), stages);
      const double got = most(stage_costs(cost, stage_of)), want = brute_force(cost, 0, stages, 0.0);
      EXPECT_EQ(got, want) << "most expensive stage " << got << ", brute force " << want << " (error "
                           << got - want << ")";
      ++checked;
    }
  std::printf("[ balance ] %d partitions equal to brute force\n", checked);
}

// Of splits whose most expensive stages cost the same, the one whose largest stage holds the fewest
// units, then the one with the most units on the last stage, the units before it split the same way.
TEST(Balance, TiesGoToTheFewestUnitsOnTheLargestStage) {
  // 3 | 0 0 3, 3 0 | 0 3 and 3 0 0 | 3 all cost 3 at most; 3 0 | 0 3 holds 2 units at most.
  EXPECT_EQ(balance_stages({3, 0, 0, 3}, 2), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(balance_stages({1, 1, 1, 1, 1, 1}, 3), (std::vector<int>{0, 0, 1, 1, 2, 2}));
  // Nothing costs anything: 3 units at most on a stage, 3 on the last, the 4 before it 2 and 2.
  EXPECT_EQ(balance_stages({0, 0, 0, 0, 0, 0, 0}, 3), (std::vector<int>{0, 0, 1, 1, 2, 2, 2}));
  EXPECT_EQ(balance_stages({4, 0, 0, 0}, 4), (std::vector<int>{0, 1, 2, 3}));
}

TEST(Balance, RefusesStageCountsAndCostsItCannotSplit) {
  auto message = [](const std::vector<double>& cost, int stages) {
    try {
      balance_stages(cost, stages);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string many = message({1, 2, 3}, 4), none = message({1, 2, 3}, 0);
  const std::string negative = message({1, -2, 3}, 2), nan = message({1, std::nan(""), 3}, 2);
  const std::string inf = message({1, 2, std::numeric_limits<double>::infinity()}, 2);
  std::printf("%s\n%s\n%s\n%s\n%s\n", many.c_str(), none.c_str(), negative.c_str(), nan.c_str(), inf.c_str());
  EXPECT_NE(many.find("4 stages for 3 units; expected 1..3"), std::string::npos) << many;
  EXPECT_NE(none.find("0 stages for 3 units"), std::string::npos) << none;
  EXPECT_NE(negative.find("unit 1 costs -2; expected a finite cost >= 0"), std::string::npos) << negative;
  EXPECT_NE(nan.find("unit 1 costs nan"), std::string::npos) << nan;
  EXPECT_NE(inf.find("unit 2 costs inf"), std::string::npos) << inf;
}


// Each unit's cost is its forward plus its backward FLOPs over one sequence at tp 1.
TEST(UnitCosts, AreForwardPlusBackwardFlopsOfOneSequence) {
  const config::ModelConfig m = mid_model("M*-E");
  const ModelGraph g = make_model_graph(m);
  const int64_t T = 512;
  const std::vector<double> cost = unit_costs(m, g, T);
  ASSERT_EQ(cost.size(), g.units.size());
  for (size_t u = 0; u < g.units.size(); ++u) {
    const char kind = unit_symbol(g.units[u].kind);
    const double want = unit_work(m, kind, Pass::PASS_F, T, T).flops() + unit_work(m, kind, Pass::PASS_B, T, T).flops();
    EXPECT_EQ(cost[u], want) << g.units[u].name;
    EXPECT_GT(cost[u], 0.0) << g.units[u].name;
  }
  // The MoE block holds 8 experts but runs one per token: 8 times the MLP block's expert
  // parameters, under twice its work (the router and the dispatch on top).
  const UnitSpec &mlp = g.units[3], &moe = g.units[4];
  ASSERT_EQ(mlp.kind, UnitKind::UNIT_MLP);
  ASSERT_EQ(moe.kind, UnitKind::UNIT_MOE);
  std::printf("[ unit_costs ] MLP %lld params %.4g FLOPs, MoE %lld params %.4g FLOPs\n",
              static_cast<long long>(mlp.param_count()), cost[3], static_cast<long long>(moe.param_count()), cost[4]);
  EXPECT_GT(moe.param_count(), 7 * mlp.param_count());
  EXPECT_LT(cost[4], 2 * cost[3]);
  // Attention's scores grow with the sequence: more work per token at 4096 than at 512.
  const double per_token_512 = cost[2] / 512, per_token_4096 = unit_costs(m, g, 4096)[2] / 4096;
  EXPECT_GT(per_token_4096, 1.5 * per_token_512);
}

// What balancing by parameter count gave: each unit's parameters, the embedding free.
std::vector<double> parameter_costs(const ModelGraph& g) {
  std::vector<double> cost;
  for (const UnitSpec& u : g.units)
    cost.push_back(u.kind == UnitKind::UNIT_EMBED ? 0.0 : static_cast<double>(u.param_count()));
  return cost;
}

// ir::expand without a place directive balances the hybrid's units by their work: a different
// split from the one equal parameter counts give, and one whose most expensive stage does less
// work. Mamba-2 blocks hold more parameters than attention blocks, but at seq_len 4096 attention
// does more work; MoE blocks hold 8 times an MLP's experts but run one.
TEST(UnitCosts, ExpandBalancesHybridsByWorkNotParameters) {
  struct Case {
    const char* pattern;
    int64_t seq_len;
    int pp;
  };
  for (const Case& c : {Case{"MMMM****", 4096, 2}, Case{"EEEE----", 256, 2}, Case{"MM**MM**", 4096, 4}}) {
    SCOPED_TRACE(std::string(c.pattern) + " seq_len " + std::to_string(c.seq_len) + " pp " + std::to_string(c.pp));
    config::Config cfg;
    cfg.model = mid_model(c.pattern);
    cfg.train.seq_len = c.seq_len;
    cfg.parallel.pp = c.pp;
    cfg.parallel.microbatches = c.pp;
    const ModelGraph g = make_model_graph(cfg.model);
    const std::vector<double> work = unit_costs(cfg.model, g, c.seq_len);
    const std::vector<int> got = expand(cfg, c.pp).place.stage_of_unit;
    EXPECT_EQ(got, balance_stages(work, c.pp));
    const std::vector<int> by_params = balance_stages(parameter_costs(g), c.pp);
    EXPECT_NE(got, by_params);
    const double ours = most(stage_costs(work, got)), theirs = most(stage_costs(work, by_params));
    std::printf("[ balance ] %s seq_len %lld pp %d: most expensive stage %.4g FLOPs by work, %.4g by parameters\n",
                c.pattern, static_cast<long long>(c.seq_len), c.pp, ours, theirs);
    EXPECT_LT(ours, theirs);
  }
}

}  // namespace
}  // namespace piper::ir
