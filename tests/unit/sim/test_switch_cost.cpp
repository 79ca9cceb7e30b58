// test_switch_cost.cpp — a switch plan's time (src/sim/switch_cost.hpp) on hand-made plans and
// hardware with round numbers, against times worked out by hand.
#include <gtest/gtest.h>

#include <cstdio>

#include "sim/switch_cost.hpp"

namespace piper::sim {
namespace {

// Intra-node 100 B/s after 1 s, inter-node 10 B/s after 2 s; copies at 1000 B/s x 0.5 plus 0.25 s.
Hardware round_hardware() {
  Hardware hw;
  hw.name = "round";
  hw.peak_flops = hw.vector_flops = 1;
  hw.mem_bw = 1000;
  hw.mem_eff = 0.5;
  hw.launch = 0.25;
  hw.intra_node = {"intra", 100, 1};
  hw.inter_node = {"inter", 10, 2};
  return hw;
}

state::Transfer transfer(int src, int dst, int64_t begin, int64_t end) {
  state::Transfer t;
  t.unit = 0;
  t.param = "w";
  t.src = src, t.dst = dst;
  t.runs = {{begin, end}};
  return t;
}

// Four processes. Step 0: round 0 sends 0 -> 1 (25 elements, 100 B) and 2 -> 0 (5 elements, 20 B),
// round 1 sends 1 -> 3 (10 elements, 40 B); copies of 50 + 25 elements on rank 0, 10 on rank 1.
// Step 1: round 0 sends 3 -> 2 (50 elements, 200 B).
state::SwitchPlan hand_plan() {
  state::SwitchPlan p;
  p.processes = 4;
  p.chunk_elems = 64;
  p.transfers = {transfer(0, 0, 0, 50), transfer(0, 0, 100, 125), transfer(1, 1, 0, 10), transfer(0, 1, 200, 225),
                 transfer(2, 0, 0, 5),  transfer(1, 3, 0, 10),     transfer(3, 2, 0, 50)};
  state::BlockStep s0;
  s0.local = {0, 1, 2};
  s0.rounds = {{{{0, 1, 3, 0, 25}, {2, 0, 4, 0, 5}}}, {{{1, 3, 5, 0, 10}}}};
  state::BlockStep s1;
  s1.block = {0, state::StateKind::STATE_EXP_AVG};
  s1.rounds = {{{{3, 2, 6, 0, 50}}}};
  p.steps = {s0, s1};
  return p;
}

TEST(SwitchCost, RoundsAndCopiesAsWorkedByHand) {
  const state::SwitchPlan plan = hand_plan();
  const Hardware hw = round_hardware();
  // Two processes to a host: hosts {0, 1} and {2, 3}.
  //   round 0: max(0 -> 1 intra 1 + 100/100 = 2, 2 -> 0 inter 2 + 20/10 = 4) = 4
  //   round 1: 1 -> 3 inter 2 + 40/10 = 6; step 1: 3 -> 2 intra 1 + 200/100 = 3
  //   copies: rank 0 copies 75 elements = 300 B, read and written: 600 / (1000 x 0.5) + 0.25 = 1.45
  const SwitchTime t = switch_time(plan, hw, 2);
  std::printf("network %.6f s (expected 13), local %.6f s (expected 1.45), %zu rounds\n", t.network_s, t.local_s, t.rounds);
  EXPECT_NEAR(t.network_s, 13.0, 1e-12);
  EXPECT_NEAR(t.local_s, 1.45, 1e-12);
  EXPECT_EQ(t.rounds, 3u);
  EXPECT_NEAR(switch_seconds(plan, hw, 2), 14.45, 1e-12);
  // One host: every message intra-node: max(2, 1 + 20/100) + (1 + 40/100) + 3 = 6.4.
  EXPECT_NEAR(switch_time(plan, hw, 4).network_s, 6.4, 1e-12);
  // A process to a host: 0 -> 1 and 3 -> 2 cross hosts too: max(2 + 10, 4) + 6 + (2 + 20) = 40.
  EXPECT_NEAR(switch_time(plan, hw, 1).network_s, 40.0, 1e-12);
}

TEST(SwitchCost, AnEmptyPlanTakesNoTime) {
  state::SwitchPlan plan;
  plan.steps.resize(3);
  const SwitchTime t = switch_time(plan, round_hardware(), 8);
  EXPECT_EQ(t.seconds(), 0.0);
  EXPECT_EQ(t.rounds, 0u);
}

TEST(SwitchCost, RefusesHostsWithoutProcesses) {
  EXPECT_THROW(switch_time(hand_plan(), round_hardware(), 0), std::invalid_argument);
}

}  // namespace
}  // namespace piper::sim
