// test_player.cpp — the executor and the simulator play a rank's program alike: the simulator's
// player, which waits for other ranks, issues, completes and runs exactly what a player whose
// every completion succeeds at once (the executor's, whose waits block) does, in the same order,
// for every schedule on pipeline, data- and tensor-parallel grids.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ir/compile.hpp"
#include "ir/player.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulator.hpp"
#include "unit/test_configs.hpp"

namespace piper::sim {
namespace {

using ir::PlayEvent;

// The executor's way: every wait returns once the operation is complete.
struct BlockingHost final : ir::PlayHost {
  void issue(size_t) override {}
  bool complete(size_t) override { return true; }
  void run(size_t) override {}
};

std::vector<PlayEvent> blocking_play(const ir::Program& p) {
  std::vector<PlayEvent> log;
  BlockingHost inner;
  ir::RecordingHost host(inner, log);
  ir::Player player(p);
  EXPECT_TRUE(player.advance(host).finished) << "rank " << p.rank << ": a blocking play stopped before the end";
  return log;
}

CostModel unit_costs() {
  CostModel m;
  for (char k : {'e', 'M', '*', '-', 'h'}) {
    OpCost o;
    o.kind = k;
    o.f = {1, 0}, o.b = {2, 0}, o.bi = {1, 0}, o.bw = {1, 0};
    m.ops.push_back(o);
  }
  for (CommOp op : {CommOp::COMM_P2P, CommOp::COMM_ALLREDUCE, CommOp::COMM_REDUCE_SCATTER, CommOp::COMM_ALLGATHER}) {
    CommCost c;
    c.op = op;
    c.t = {0.5, 1e-6};
    m.comm.push_back(c);
  }
  return m;
}

struct Case {
  std::string schedule;
  int tp, dp, pp, v, zero;
  bool split;
};

TEST(Player, SimulatorAndExecutorPlayEveryScheduleInTheSameOrder) {
  const std::vector<Case> cases = {
      {"1f1b", 1, 1, 1, 1, 0, false},      {"gpipe", 1, 1, 2, 1, 0, false},    {"1f1b", 1, 1, 2, 1, 0, true},
      {"interleaved", 1, 1, 2, 2, 0, false}, {"zbh1", 1, 1, 2, 1, 0, true},     {"dualpipev", 1, 1, 2, 2, 0, true},
      {"1f1b", 1, 2, 2, 1, 1, false},      {"1f1b", 1, 2, 1, 1, 3, false},     {"1f1b", 2, 1, 1, 1, 0, false},
      {"1f1b", 2, 1, 1, 1, 0, true},       {"1f1b", 2, 2, 1, 1, 3, false},     {"zbh1", 2, 1, 2, 1, 0, true},
      {"interleaved", 2, 1, 2, 2, 2, false}, {"dualpipev", 2, 2, 2, 2, 0, true},
  };
  const CostModel cost = unit_costs();
  for (const Case& c : cases) {
    const std::string name = c.schedule + " tp" + std::to_string(c.tp) + " dp" + std::to_string(c.dp) + " pp" +
                             std::to_string(c.pp) + " v" + std::to_string(c.v) + " zero" + std::to_string(c.zero) +
                             (c.split ? " split" : "");
    SCOPED_TRACE(name);
    const int blocks = c.pp * c.v * 2;
    config::Config cfg;
    cfg.model = testing::small_model(std::string(static_cast<size_t>(blocks / 2), 'M') +
                                     std::string(static_cast<size_t>(blocks - blocks / 2), '*'));
    cfg.parallel.tp = c.tp, cfg.parallel.dp = c.dp, cfg.parallel.pp = c.pp;
    cfg.parallel.virtual_stages = c.v, cfg.parallel.zero = c.zero;
    cfg.parallel.schedule = c.schedule;
    cfg.parallel.split_backward = c.split;
    cfg.parallel.microbatches = 4;
    cfg.train.global_batch = 4 * c.dp;
    cfg.train.seq_len = 4;
    const int world = c.tp * c.dp * c.pp;
    const ir::Plan plan = ir::compile(cfg, world);
    std::vector<std::vector<PlayEvent>> simulated;
    SimOptions opts;
    opts.play_log = &simulated;
    simulate(plan, cfg, cost, opts);
    ASSERT_EQ(simulated.size(), static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      const ir::Program p = ir::lower(plan.graph, r);
      const std::vector<PlayEvent> blocking = blocking_play(p);
      // Every instruction once: each compute run, each communication issued and completed.
      EXPECT_EQ(blocking.size(), p.compute.size() + 2 * p.comm.size()) << "rank " << r;
      ASSERT_EQ(simulated[static_cast<size_t>(r)].size(), blocking.size()) << "rank " << r;
      for (size_t i = 0; i < blocking.size(); ++i)
        ASSERT_EQ(simulated[static_cast<size_t>(r)][i], blocking[i])
            << "rank " << r << ": play event " << i << " differs (what " << int(blocking[i].what) << ", index "
            << blocking[i].index << " vs what " << int(simulated[static_cast<size_t>(r)][i].what) << ", index "
            << simulated[static_cast<size_t>(r)][i].index << ")";
    }
  }
}

}  // namespace
}  // namespace piper::sim
