// test_forward_program.cpp — ir::forward_program, what an evaluation plays (docs/architecture.md,
// "Evaluation"): the forward of a rank's training program in its order, nothing of the backward,
// the gradient reductions or the updates; and every library schedule's forward programs, played
// together by ir::Player's rules, finish.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "ir/compile.hpp"
#include "ir/pipeline_schedules.hpp"
#include "ir/program.hpp"
#include "ir/world_play.hpp"
#include "unit/test_configs.hpp"

namespace piper::ir {
namespace {

std::vector<int> nodes_of(const std::vector<Instr>& stream) {
  std::vector<int> out;
  for (const Instr& in : stream) out.push_back(in.node);
  return out;
}

// `sub` is `all` with some entries left out, the rest in their order.
bool subsequence(const std::vector<int>& sub, const std::vector<int>& all) {
  auto it = all.begin();
  for (int v : sub) {
    it = std::find(it, all.end(), v);
    if (it == all.end()) return false;
    ++it;
  }
  return true;
}

config::Config pipeline(const std::string& pattern, int pp, int tp, int dp, int zero, int m) {
  config::Config c;
  c.model = testing::small_model(pattern);
  c.parallel.pp = pp;
  c.parallel.tp = tp;
  c.parallel.dp = dp;
  c.parallel.zero = zero;
  c.parallel.microbatches = m;
  c.train.global_batch = dp * m;
  return c;
}

void expect_forward_of(const Program& training, const Program& fwd, const std::string& what) {
  size_t forwards = 0;
  for (const Instr& in : training.compute) forwards += in.kind == NodeKind::FWD;
  EXPECT_EQ(fwd.compute.size(), forwards) << what << ": every FWD segment and nothing else";
  for (const Instr& in : fwd.compute) EXPECT_EQ(in.kind, NodeKind::FWD) << what;
  for (const Instr& c : fwd.comm) {
    const bool activation = c.payload == Payload::PAYLOAD_ACTIVATION;
    EXPECT_TRUE(activation || c.pass == Pass::PASS_F)
        << what << ": " << node_kind_name(c.kind) << " node " << c.node << " is no forward communication";
    EXPECT_NE(c.payload, Payload::PAYLOAD_WGRAD) << what;
    EXPECT_NE(c.payload, Payload::PAYLOAD_NORM) << what;
  }
  EXPECT_TRUE(subsequence(nodes_of(fwd.compute), nodes_of(training.compute))) << what;
  EXPECT_TRUE(subsequence(nodes_of(fwd.comm), nodes_of(training.comm))) << what;
  std::set<int> kept;
  for (const auto* s : {&fwd.compute, &fwd.comm})
    for (const Instr& in : *s) kept.insert(in.node);
  for (const auto* s : {&fwd.compute, &fwd.comm})
    for (const Instr& in : *s)
      for (int w : in.waits) EXPECT_TRUE(kept.count(w)) << what << ": node " << in.node << " waits on " << w;
}

TEST(ForwardProgram, IsTheTrainingForwardInItsOrder) {
  struct Case {
    const char* name;
    config::Config cfg;
    size_t activation_msgs, zero3_gathers, tp_collectives;  // at least this many of each on rank 0
  };
  config::Config moe = pipeline("M*E-", 1, 1, 2, 0, 2);
  moe.parallel.ep = 2;
  const std::vector<Case> cases = {
      {"pp 2 x tp 2 x dp 2, zero 3, 1f1b", pipeline("M*-M*-M-", 2, 2, 2, 3, 4), 4, 1, 1},
      {"dp 2 x ep 2 (MoE)", moe, 0, 0, 1},
  };
  for (const Case& c : cases) {
    const Plan plan = compile(c.cfg, static_cast<int>(c.cfg.parallel.pp * c.cfg.parallel.tp * c.cfg.parallel.dp));
    const std::vector<Program> programs = lower_all(plan.graph, plan.strategy.world_size);
    for (const Program& p : programs) expect_forward_of(p, forward_program(p), c.name);
    const Program fwd = forward_program(programs.front());
    size_t msgs = 0, gathers = 0, unit_collectives = 0;
    for (const Instr& in : fwd.comm) {
      msgs += in.payload == Payload::PAYLOAD_ACTIVATION;
      gathers += is_zero3_gather(in);
      unit_collectives += in.payload == Payload::PAYLOAD_UNIT;
    }
    std::printf("[ forward ] %s: rank 0 keeps %zu of %zu compute and %zu of %zu communication instructions\n", c.name,
                fwd.compute.size(), programs.front().compute.size(), fwd.comm.size(), programs.front().comm.size());
    EXPECT_GE(msgs, c.activation_msgs) << c.name;
    EXPECT_GE(gathers, c.zero3_gathers) << c.name;
    EXPECT_GE(unit_collectives, c.tp_collectives) << c.name;
  }
}

// Every library schedule on pp ranks x tp 2 x dp 2: the forward programs of all ranks finish.
TEST(ForwardProgram, EveryLibraryScheduleFinishesWhenPlayed) {
  int played = 0;
  for (const std::string& schedule : schedule_names())
    for (int pp : {2, 4})
      for (int m : {pp, 2 * pp})
        for (int zero : {1, 3}) {
          const ScheduleKind kind = parse_schedule(schedule);
          const bool dual = kind == ScheduleKind::SCHEDULE_DUALPIPEV;
          if (dual && m < 2 * pp) continue;
          config::Config c = pipeline("M*-M*-M-", pp, 2, 2, zero, m);
          c.parallel.schedule = schedule;
          c.parallel.virtual_stages = kind == ScheduleKind::SCHEDULE_INTERLEAVED || dual ? 2 : 1;
          c.parallel.split_backward = dual || kind == ScheduleKind::SCHEDULE_ZBH1;
          const Plan plan = compile(c, pp * 4);
          std::vector<Program> fwd;
          for (const Program& p : lower_all(plan.graph, plan.strategy.world_size)) fwd.push_back(forward_program(p));
          WorldPlay w(fwd, plan.strategy.dims());
          const std::vector<int> left = w.play_abstract();
          EXPECT_TRUE(left.empty()) << schedule << " pp " << pp << " m " << m << " zero " << zero << ": rank "
                                    << (left.empty() ? -1 : left.front()) << " cannot finish";
          ++played;
        }
  EXPECT_EQ(played, 5 * 2 * 2 * 2 - 2 * 2);  // dualpipev needs m >= 2 pp: not m = pp, at either zero
}

}  // namespace
}  // namespace piper::ir
