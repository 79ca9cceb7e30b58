// test_simulator.cpp — the simulator on hand-set costs: every schedule's bubble and peak activation
// count through the whole training DAG equal the published closed forms; communication, ZeRO and
// tensor-parallel memory follow the executor's allocations; a large world simulates quickly.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <string>

#include "ir/build.hpp"
#include "ir/compile.hpp"
#include "ir/parallel_dims.hpp"
#include "ir/verify.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulator.hpp"
#include "unit/ir/closed_forms.hpp"
#include "unit/test_configs.hpp"

namespace piper::sim {
namespace {

using piper::testing::small_config;

using ir::ScheduleKind;

// F = 1, B = 2 (BI = BW = 1) per block; the embedding, the head and the optimiser are free, and so
// is communication: the papers' abstract costs. One byte of saved activation per row.
CostModel abstract_costs() {
  CostModel m;
  m.free_comm = true;
  for (char k : {'M', '*', '-'}) {
    OpCost o;
    o.kind = k;
    o.f = {1, 0}, o.b = {2, 0}, o.bi = {1, 0}, o.bw = {1, 0};
    o.saved = {0, 1}, o.kept_for_w = {0, 1};
    m.ops.push_back(o);
  }
  for (char k : {'e', 'h'}) {
    OpCost o;
    o.kind = k;
    m.ops.push_back(o);
  }
  return m;
}


config::Config pipeline_config(ScheduleKind kind, int p, int v, int m) {
  const int stages = p * (kind == ScheduleKind::SCHEDULE_DUALPIPEV ? 2 : v);
  config::Config cfg = small_config(std::string(static_cast<size_t>(stages), '-'), m, 4);
  cfg.parallel.pp = p;
  cfg.parallel.microbatches = m;
  cfg.parallel.virtual_stages = kind == ScheduleKind::SCHEDULE_DUALPIPEV ? 2 : v;
  cfg.parallel.schedule = ir::schedule_name(kind);
  cfg.parallel.split_backward = kind == ScheduleKind::SCHEDULE_ZBH1 || kind == ScheduleKind::SCHEDULE_DUALPIPEV;
  return cfg;
}

// One block per stage: the embedding joins the first stage, the head the last.
ir::Plan one_block_per_stage(const config::Config& cfg) {
  ir::Plan plan;
  plan.model = ir::make_model_graph(cfg.model);
  plan.strategy = ir::expand(cfg, static_cast<int>(cfg.parallel.pp));
  const int blocks = static_cast<int>(cfg.model.n_blocks());
  auto& stage = plan.strategy.place.stage_of_unit;
  stage.assign(plan.model.units.size(), 0);
  for (int b = 0; b < blocks; ++b) stage[static_cast<size_t>(b + 1)] = b;
  stage.back() = blocks - 1;
  plan.graph = ir::build(plan.model, plan.strategy);
  ir::verify(plan.graph, plan.model);
  return plan;
}

struct Case {
  ScheduleKind kind;
  int p, v, m;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (auto [p, m] : std::vector<std::pair<int, int>>{{2, 4}, {3, 6}, {4, 8}, {4, 16}}) {
    for (ScheduleKind k : {ir::closed::GPIPE, ir::closed::ONE_F_ONE_B, ir::closed::ZBH1, ir::closed::DUALPIPEV}) out.push_back({k, p, 1, m});
    out.push_back({ir::closed::INTERLEAVED, p, 2, m});
  }
  return out;
}

std::string name(const Case& c) {
  return std::string(ir::schedule_name(c.kind)) + " p" + std::to_string(c.p) + " v" + std::to_string(c.v) + " m" +
         std::to_string(c.m);
}

TEST(Simulator, BubbleOfEveryScheduleEqualsItsClosedForm) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name(c));
    const config::Config cfg = pipeline_config(c.kind, c.p, c.v, c.m);
    const SimResult r = simulate(one_block_per_stage(cfg), cfg, abstract_costs());
    const int chunks = static_cast<int>(cfg.parallel.virtual_stages);
    const double work = 3.0 * c.m * chunks, idle = ir::closed::closed_form_idle(c.kind, c.p);
    EXPECT_DOUBLE_EQ(r.step_ms, work + idle);
    EXPECT_NEAR(r.bubble, idle / (work + idle), 1e-12) << "simulated bubble " << r.bubble;
    for (const RankResult& rr : r.ranks) {
      EXPECT_DOUBLE_EQ(rr.compute_ms, work) << "rank " << rr.rank;
      EXPECT_DOUBLE_EQ(rr.comm_ms, 0.0) << "rank " << rr.rank << ": communication is free";
      EXPECT_DOUBLE_EQ(rr.bubble_ms, idle) << "rank " << rr.rank;
    }
  }
}

TEST(Simulator, PeakActivationsPerStageFollowThePublishedCounts) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name(c));
    const config::Config cfg = pipeline_config(c.kind, c.p, c.v, c.m);
    const SimResult r = simulate(one_block_per_stage(cfg), cfg, abstract_costs());
    for (const RankResult& rr : r.ranks)
      EXPECT_EQ(rr.peak_microbatches, ir::closed::expected_peak(c.kind, c.p, c.v, c.m, rr.rank)) << "rank " << rr.rank;
  }
}

// Four data-parallel ranks always compute together: on a host of 2 cores every instruction takes
// twice its time; with a core each (2 ranks per host) nothing changes.
TEST(SimulatorHosts, RanksSharingCoresStretchTheirCompute) {
  config::Config cfg = small_config("M-", 4, 4);
  cfg.parallel.dp = 4;
  CostModel cost = abstract_costs();
  cost.host_cores = 2;
  cost.threads_per_rank = 1;
  const ir::Plan plan = ir::compile(cfg, 4);
  SimOptions own, shared;
  own.ranks_per_host = 2;
  shared.ranks_per_host = 4;
  const SimResult a = simulate(plan, cfg, cost, own), b = simulate(plan, cfg, cost, shared);
  ASSERT_EQ(a.ranks.size(), 4u);
  for (size_t r = 0; r < 4; ++r)
    EXPECT_NEAR(b.ranks[r].compute_ms, 2 * a.ranks[r].compute_ms, 1e-2) << "rank " << r;
  EXPECT_NEAR(b.step_ms, 2 * a.step_ms, 1e-2);
}

// Two pipeline stages on one core: they only slow each other where both compute, so the step is
// longer than with a core each, and about all the work done one after the other (the averaged
// sharing factors are an approximation of processor sharing: within 2% of it).
TEST(SimulatorHosts, PipelineStagesOnOneCoreShareOnlyWhereTheyOverlap) {
  const config::Config cfg = pipeline_config(ir::ScheduleKind::SCHEDULE_1F1B, 2, 1, 4);
  const ir::Plan plan = one_block_per_stage(cfg);
  CostModel cost = abstract_costs();
  cost.host_cores = 1;
  SimOptions shared;
  shared.ranks_per_host = 2;
  const SimResult own = simulate(plan, cfg, cost), one = simulate(plan, cfg, cost, shared);
  const double work = 2 * 3.0 * 4;  // both ranks' F + B of 4 microbatches
  EXPECT_GT(one.step_ms, own.step_ms + 1);
  EXPECT_NEAR(one.step_ms, work, 0.02 * work) << "one core does all the work in a row";
}

// The outside tester's cases, built in code past the cost file's bounds: a host_slowdown of 1e308 or
// unit times of 1e308 made clocks inf, then NaN, which the simulator read as "not issued yet" and
// re-issued forever (and the busy count NaN indexed host_slowdown[-1]). Now the first time that is not
// finite ends the simulation with a SimError saying which rank and instruction overflowed.
TEST(SimulatorLimits, TimesThatOverflowAreRefusedNamingTheInstruction) {
  const config::Config cfg = pipeline_config(ir::ScheduleKind::SCHEDULE_1F1B, 2, 1, 4);
  const ir::Plan plan = one_block_per_stage(cfg);
  auto message = [&](const CostModel& cost, int ranks_per_host) {
    SimOptions o;
    o.ranks_per_host = ranks_per_host;
    try {
      simulate(plan, cfg, cost, o);
    } catch (const SimError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CostModel slow = abstract_costs();
  slow.host_cores = 1;
  slow.host_slowdown = {1.0, 1e308};
  const auto t0 = std::chrono::steady_clock::now();
  std::string m = message(slow, 2);
  EXPECT_NE(m.find("overflowed at"), std::string::npos) << m;
  EXPECT_NE(m.find("rank "), std::string::npos) << m;
  CostModel huge = abstract_costs();
  for (OpCost& o : huge.ops) o.f = o.b = o.bi = o.bw = {1e308, 0};
  m = message(huge, 0);
  EXPECT_NE(m.find("overflowed at FWD"), std::string::npos) << m;
  EXPECT_NE(message(huge, 2).find("overflowed"), std::string::npos);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  // The largest slowdown a cost file may hold settles to a finite step.
  slow.host_slowdown = {1.0, kMaxSlowdown};
  check_cost(slow, "test");
  SimOptions shared;
  shared.ranks_per_host = 2;
  const SimResult r = simulate(plan, cfg, slow, shared);
  EXPECT_TRUE(std::isfinite(r.step_ms));
  EXPECT_GT(r.step_ms, 2 * 3.0 * 4) << "slower than all the work done in a row on one core";
}

// A slowdown that falls and rises with the ranks computing (1000x at 2 and 4, 1x at 3) makes the
// damped iteration hop between timelines; it stops after kMaxSharingRounds with a message.
TEST(SimulatorLimits, HostSharingThatDoesNotSettleStopsWithAMessage) {
  config::Config cfg = small_config("M*-M-", 8, 64);
  cfg.parallel.pp = 2;
  cfg.parallel.dp = 2;
  cfg.parallel.microbatches = 4;
  const ir::Plan plan = ir::compile(cfg, 4);
  CostModel cost = abstract_costs();
  cost.host_slowdown = {1, 1000, 1, 1000};
  SimOptions o;
  o.ranks_per_host = 4;
  try {
    simulate(plan, cfg, cost, o);
    ADD_FAILURE() << "expected the host sharing not to settle";
  } catch (const SimError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("did not settle: after 30 rounds"), std::string::npos) << m;
    EXPECT_NE(m.find("--ranks-per-host 4"), std::string::npos) << m;
  }
}

TEST(SimulatorLimits, InstructionsCountsWhatEveryRankPlays) {
  config::Config cfg = small_config("M*-M-", 8, 8);
  cfg.parallel.pp = 2;
  cfg.parallel.dp = 2;
  cfg.parallel.tp = 2;
  cfg.parallel.microbatches = 2;
  const ir::Plan plan = ir::compile(cfg, 8);
  const SimResult r = simulate(plan, cfg, abstract_costs());
  EXPECT_EQ(instructions(plan), r.nodes);
  // The CLI's bound before compiling: world / pp ranks run F and B of every unit for every microbatch.
  EXPECT_GE(r.nodes, 8 / 2 * (5 + 2) * 2 * 2);
}

// Model state per rank at dp 4 against ZeRO-0: params + grads + both moments = 16 bytes per element;
// ZeRO-1 shards the moments (4 + 4 + 8/4 = 10/16), ZeRO-2 also the gradients (4 + 1 + 2 = 7/16),
// ZeRO-3 everything (4/16). Padding to the dp group makes the shards a hair larger.
TEST(SimulatorMemory, ZeroStagesShardTheModelStateAsPublished) {
  config::Config cfg = small_config("M*-M-", 8, 8);
  cfg.parallel.dp = 4;
  double base = 0;
  for (int zero : {0, 1, 2, 3}) {
    cfg.parallel.zero = zero;
    const SimResult r = simulate(ir::compile(cfg, 4), cfg, abstract_costs());
    const double state = r.ranks[0].state[0] + r.ranks[0].state[1] + r.ranks[0].state[2];
    if (zero == 0) base = state;
    const double expected[] = {1.0, 10.0 / 16, 7.0 / 16, 4.0 / 16};
    EXPECT_NEAR(state / base, expected[zero], 2e-3) << "ZeRO-" << zero << ": " << state << " of " << base << " bytes";
    EXPECT_GE(r.ranks[0].peak_total, state) << "the peak holds the state and more";
  }
}

// The activations between units and stages are stored in the type the units compute with: with no
// saved state (only those between units count), bf16's peak activations are fp32's halved.
TEST(SimulatorMemory, ActivationsBetweenUnitsTakeTheirStorageTypesBytes) {
  double peak[2] = {0, 0};
  const char* precisions[2] = {"fp32", "bf16"};
  for (int i = 0; i < 2; ++i) {
    config::Config cfg = small_config("M*-M-", 8, 8);
    cfg.parallel.pp = 2;
    cfg.parallel.microbatches = 4;
    cfg.train.precision = precisions[i];
    CostModel cost = abstract_costs();
    for (OpCost& o : cost.ops) o.saved = o.kept_for_w = {0, 0};
    const SimResult r = simulate(ir::compile(cfg, 2), cfg, cost, {});
    for (const RankResult& rk : r.ranks) peak[i] = std::max(peak[i], rk.peak[static_cast<size_t>(Mem::MEM_ACTIVATIONS)]);
  }
  std::printf("[ memory ] peak activations between units: fp32 %.0f bytes, bf16 %.0f\n", peak[0], peak[1]);
  EXPECT_GT(peak[0], 0.0);
  EXPECT_DOUBLE_EQ(peak[1], peak[0] / 2);
}

// Under bf16 every unit computes with its values rounded to bf16, its compute copy, held from the
// unit's first pass to its update (2 bytes per element over the f32 master weights: on one rank every
// unit's at once, since every forward comes before the first update), and ZeRO-3 gathers them in bf16
// and computes with them as gathered: 2 bytes per element where fp32 gathers 4, in half the time.
TEST(SimulatorMemory, Bf16KeepsACopyOfTheValuesAndZero3GathersThemInBf16) {
  double params[2] = {0, 0}, gathered[2] = {0, 0}, comm[2] = {0, 0};
  const char* precisions[2] = {"fp32", "bf16"};
  int64_t total = 0;
  for (int i = 0; i < 2; ++i) {
    config::Config cfg = small_config("M*-M-", 8, 8);
    cfg.train.precision = precisions[i];
    const ir::Plan plan = ir::compile(cfg, 1);
    total = 0;
    for (const ir::UnitSpec& u : plan.model.units) total += u.param_count();
    params[i] = simulate(plan, cfg, abstract_costs()).ranks[0].peak[static_cast<size_t>(Mem::MEM_PARAMS)];
    cfg.parallel.dp = 2;
    cfg.parallel.zero = 3;
    CostModel cost = abstract_costs();
    cost.free_comm = false;
    cost.comm = {{CommOp::COMM_ALLGATHER, 2, {0, 1e-3}, {}}, {CommOp::COMM_REDUCE_SCATTER, 2, {0, 1e-9}, {}},
                 {CommOp::COMM_ALLREDUCE, 2, {0, 1e-9}, {}}};
    const SimResult z = simulate(ir::compile(cfg, 2), cfg, cost);
    gathered[i] = z.ranks[0].peak[static_cast<size_t>(Mem::MEM_PARAMS)] - z.ranks[0].state[0];
    comm[i] = z.ranks[0].comm_ms;
  }
  std::printf("[ memory ] peak parameters: fp32 %.0f bytes, bf16 %.0f (%" PRId64
              " elements); ZeRO-3 above the shard: fp32 %.0f, bf16 %.0f; exposed comm fp32 %.3f ms, bf16 %.3f\n",
              params[0], params[1], total, gathered[0], gathered[1], comm[0], comm[1]);
  EXPECT_DOUBLE_EQ(params[1] - params[0], 2.0 * static_cast<double>(total)) << "every unit's compute copy";
  EXPECT_GT(gathered[0], 0.0);
  EXPECT_DOUBLE_EQ(gathered[1], 0.5 * gathered[0]) << "the gathered values at 2 bytes, nothing widened";
  EXPECT_LT(comm[1], comm[0]) << "the gathers move half the bytes";
}

// Recomputation: the saved state leaves at each forward's end and comes back at its RECOMP, so the
// peak activations fall (full below selective below none) while the compute grows by the RECOMPs'
// time: the forward's (full) or the mixer's share of it (selective), shown as RECOMP events.
TEST(SimulatorMemory, RecomputationLowersThePeakActivationsForItsTime) {
  config::Config cfg = small_config("M*-M-", 8, 8);
  cfg.parallel.pp = 2;
  cfg.parallel.microbatches = 4;
  CostModel cost = abstract_costs();
  for (OpCost& o : cost.ops) o.saved = o.kept_for_w = {0, 1000};  // bytes per row: the state dominates
  double peak[3] = {0, 0, 0}, compute[3] = {0, 0, 0};
  int recomps[3] = {0, 0, 0};
  const char* modes[3] = {"none", "selective", "full"};
  for (int m = 0; m < 3; ++m) {
    cfg.parallel.recompute = modes[m];
    SimOptions opts;
    opts.timeline = true;
    const SimResult r = simulate(ir::compile(cfg, 2), cfg, cost, opts);
    for (const RankResult& rk : r.ranks) {
      peak[m] = std::max(peak[m], rk.peak[static_cast<size_t>(Mem::MEM_ACTIVATIONS)]);
      compute[m] += rk.compute_ms;
    }
    for (const trace::Event& e : r.trace.events) recomps[m] += e.kind == "RECOMP";
    std::printf("[ recompute ] %-9s peak activations %.0f bytes, compute %.3f ms, %d RECOMP events\n", modes[m],
                peak[m], compute[m], recomps[m]);
  }
  EXPECT_LT(peak[1], peak[0]);
  EXPECT_LT(peak[2], peak[1]);
  EXPECT_EQ(recomps[0], 0);
  EXPECT_EQ(recomps[1], 3 * 4);  // M, *, M blocks x 4 microbatches
  EXPECT_EQ(recomps[2], 5 * 4);
  // Full adds one forward (F = 1 ms) per block and microbatch; selective the mixers' share of three.
  EXPECT_NEAR(compute[2] - compute[0], 5 * 4 * 1.0, 1e-9);
  EXPECT_GT(compute[1] - compute[0], 0.0);
  EXPECT_LT(compute[1] - compute[0], 3 * 4 * 1.0);
}

// ZeRO for a subset of the units: the simulated model state is each unit's share at its own stage
// (ZeRO-3 for the embedding and the head: 16 / 4 bytes per parameter at dp 4; ZeRO-0 elsewhere: 16).
TEST(SimulatorMemory, ZeroPerUnitShardsEachUnitsState) {
  config::Config cfg = small_config("M*-M-", 8, 8);
  cfg.parallel.dp = 4;
  const SimResult all = simulate(ir::compile(cfg, 4), cfg, abstract_costs());
  config::Directive d;
  d.kind = config::DirectiveKind::REPLICATE;
  d.shard_optimizer = d.shard_grads = d.shard_params = true;
  d.filter.kinds = {"embed", "head"};
  cfg.directives.present = true;
  cfg.directives.list.push_back(d);
  const ir::Plan plan = ir::compile(cfg, 4);
  const SimResult some = simulate(plan, cfg, abstract_costs());
  double sharded = 0, total = 0;  // parameters of the units at ZeRO-3, of all
  for (const ir::UnitSpec& u : plan.model.units) {
    total += static_cast<double>(u.param_count());
    if (plan.strategy.replicate.zero(u.index) == 3) sharded += static_cast<double>(u.param_count());
  }
  ASSERT_GT(sharded, 0);
  const auto state = [](const SimResult& r) { return r.ranks[0].state[0] + r.ranks[0].state[1] + r.ranks[0].state[2]; };
  const double expected = (total - sharded + sharded / 4) / total;
  EXPECT_NEAR(state(some) / state(all), expected, 2e-3) << state(some) << " of " << state(all) << " bytes";
}

// A 1024-rank strategy (pp 8 x dp 64 x tp 2): every rank is played, ranks of one pipeline stage
// finish together, and every stage holds its 1F1B count of microbatches. (How fast: printed, and
// quoted in docs/simulator.md; not asserted.)
TEST(SimulatorScale, A1024RankStrategyPlaysEveryRank) {
  config::Config cfg = small_config("M-M*M-M-M-M*M-M-", 1024, 4);
  cfg.parallel.pp = 8;
  cfg.parallel.dp = 64;
  cfg.parallel.tp = 2;
  cfg.parallel.zero = 1;
  cfg.parallel.microbatches = 16;
  CostModel cost = abstract_costs();
  cost.free_comm = false;
  for (CommOp op : {CommOp::COMM_P2P, CommOp::COMM_ALLREDUCE, CommOp::COMM_ALLGATHER})
    cost.comm.push_back({op, 2, {0.01, 1e-7}, {}});
  const auto t0 = std::chrono::steady_clock::now();
  const ir::Plan plan = ir::compile(cfg, 1024);
  const SimResult r = simulate(plan, cfg, cost);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("  1024 ranks: %lld instructions compiled and simulated in %.2f s, step %.1f\n",
              static_cast<long long>(r.nodes), s, r.step_ms);
  ASSERT_EQ(r.ranks.size(), 1024u);
  const ir::ParallelDims grid(1024, plan.strategy.grid_order, {.tp = 2, .dp = 64, .pp = 8});
  std::vector<double> finish(8, -1);
  for (const RankResult& rr : r.ranks) {
    const int stage = grid.coord(rr.rank, ir::Axis::PP);
    if (finish[static_cast<size_t>(stage)] < 0) finish[static_cast<size_t>(stage)] = rr.finish_ms;
    EXPECT_NEAR(rr.finish_ms, finish[static_cast<size_t>(stage)], 1e-9) << "rank " << rr.rank;
    EXPECT_EQ(rr.peak_microbatches, 8 - stage) << "rank " << rr.rank;
  }
  EXPECT_GT(r.step_ms, 3.0 * 16) << "at least one stage's 16 microbatches of F + B";
}

}  // namespace
}  // namespace piper::sim
