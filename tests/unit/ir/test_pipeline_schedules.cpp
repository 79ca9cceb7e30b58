// test_pipeline_schedules.cpp — unit tests of the pipeline schedules and the timeline player: every op
// once, stage layouts, hand-written orders, played bubble and peak activations against each paper's
// closed form, constraint messages, deadlock detection, and the timelines docs/schedules.md shows.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "ir/pipeline_play.hpp"
#include "ir/pipeline_schedules.hpp"
#include "unit/ir/closed_forms.hpp"

namespace piper::ir {
namespace {

constexpr ScheduleKind GPIPE = ScheduleKind::SCHEDULE_GPIPE;
constexpr ScheduleKind ONE_F_ONE_B = ScheduleKind::SCHEDULE_1F1B;
constexpr ScheduleKind INTERLEAVED = ScheduleKind::SCHEDULE_INTERLEAVED;
constexpr ScheduleKind ZBH1 = ScheduleKind::SCHEDULE_ZBH1;
constexpr ScheduleKind DUALPIPEV = ScheduleKind::SCHEDULE_DUALPIPEV;
constexpr Pass F = Pass::PASS_F, B = Pass::PASS_B, BI = Pass::PASS_BI, BW = Pass::PASS_BW;

struct Case {
  ScheduleKind kind;
  int p, v, m;  // ranks, virtual_stages, microbatches
  bool split;
};

std::string name(const Case& c) {
  return std::string(schedule_name(c.kind)) + " p" + std::to_string(c.p) + " v" + std::to_string(c.v) + " m" +
         std::to_string(c.m) + (c.split ? " split" : "");
}

PipeSchedule make(const Case& c) { return make_schedule(c.kind, c.p, c.v, c.m, c.split); }

// Every schedule over pipelines with m >= p, and the smaller ones each one allows.
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  const std::vector<std::pair<int, int>> pm = {{1, 1}, {1, 3}, {2, 1}, {2, 4}, {3, 5}, {3, 6},
                                               {4, 2}, {4, 3}, {4, 8}, {4, 16}, {8, 16}};
  for (auto [p, m] : pm) {
    for (bool split : {false, true}) {
      cases.push_back({GPIPE, p, 1, m, split});
      cases.push_back({ONE_F_ONE_B, p, 1, m, split});
      if (m % p == 0)
        for (int v : {2, 3}) cases.push_back({INTERLEAVED, p, v, m, split});
    }
    cases.push_back({ZBH1, p, 1, m, true});
    if (m >= 2 * p) cases.push_back({DUALPIPEV, p, 2, m, true});
  }
  cases.push_back({DUALPIPEV, 3, 1, 7, true});  // virtual_stages 1 is accepted: the V always has 2 chunks
  cases.push_back({DUALPIPEV, 2, 2, 5, true});
  return cases;
}

// Unit costs as the papers draw them: F = 1 and a whole backward = 2, fused (B) or split (BI + BW).
PassCosts unit_costs() { return PassCosts{1, 2, 1, 1}; }

std::string thrown_by(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

// ---- completeness and layout ----------------------------------------------------------

TEST(PipeSchedule, EveryPassOfEveryMicrobatchOnceOnTheRankHoldingItsStage) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(name(c));
    const PipeSchedule s = make(c);
    ASSERT_EQ(s.ranks, c.p);
    ASSERT_EQ(s.ops.size(), static_cast<size_t>(c.p));
    EXPECT_EQ(s.microbatches, c.m);
    EXPECT_EQ(s.chunks, c.kind == INTERLEAVED ? c.v : c.kind == DUALPIPEV ? 2 : 1);
    std::map<std::tuple<Pass, int, int>, int> count;  // (pass, microbatch, stage)
    for (int r = 0; r < s.ranks; ++r)
      for (const PipeOp& op : s.ops[static_cast<size_t>(r)]) {
        ASSERT_GE(op.chunk, 0);
        ASSERT_LT(op.chunk, s.chunks);
        ASSERT_GE(op.microbatch, 0);
        ASSERT_LT(op.microbatch, c.m);
        const int stage = s.stage_of(r, op.chunk);
        ASSERT_GE(stage, 0);
        ASSERT_LT(stage, s.stages());
        EXPECT_EQ(s.rank_of(stage), r);
        EXPECT_EQ(s.chunk_of(stage), op.chunk);
        ++count[{op.pass, op.microbatch, stage}];
      }
    const std::vector<Pass> passes = c.split ? std::vector<Pass>{F, BI, BW} : std::vector<Pass>{F, B};
    for (int st = 0; st < s.stages(); ++st)
      for (int mb = 0; mb < c.m; ++mb)
        for (Pass pass : passes)
          EXPECT_EQ((count[{pass, mb, st}]), 1) << pass_name(pass) << mb << " on stage " << st;
    EXPECT_EQ(count.size(), static_cast<size_t>(s.stages() * c.m) * passes.size()) << "ops of other passes";
    EXPECT_NO_THROW(play(s, unit_costs()));
  }
}

// gpipe/1f1b/interleaved with split_backward run each BW right after its BI.
TEST(PipeSchedule, SplitBackwardPutsBWRightAfterItsBI) {
  for (const Case& c : all_cases()) {
    if (!c.split || c.kind == ZBH1 || c.kind == DUALPIPEV) continue;
    SCOPED_TRACE(name(c));
    for (const auto& ops : make(c).ops)
      for (size_t i = 0; i < ops.size(); ++i)
        if (ops[i].pass == BI) {
          ASSERT_LT(i + 1, ops.size());
          EXPECT_EQ(ops[i + 1], (PipeOp{BW, ops[i].microbatch, ops[i].chunk}));
        }
  }
}

TEST(PipeSchedule, StageLayouts) {
  const PipeSchedule one = make_schedule(ONE_F_ONE_B, 4, 1, 8, false);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(one.stage_of(r, 0), r);
  // interleaved (Megatron): chunk c of rank r holds stage c*p + r
  const PipeSchedule il = make_schedule(INTERLEAVED, 4, 3, 8, false);
  EXPECT_EQ(il.stages(), 12);
  EXPECT_EQ(il.stage_of(1, 0), 1);
  EXPECT_EQ(il.stage_of(1, 1), 5);
  EXPECT_EQ(il.stage_of(1, 2), 9);
  EXPECT_EQ(il.rank_of(9), 1);
  EXPECT_EQ(il.chunk_of(9), 2);
  // V: rank r holds stage r and stage 2p-1-r; rank 0 the first and the last, the last rank the middle two
  const PipeSchedule v = make_schedule(DUALPIPEV, 4, 2, 8, true);
  EXPECT_EQ(v.rank_of_stage, (std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0}));
  EXPECT_EQ(v.stages(), 8);
  EXPECT_EQ(v.stage_of(0, 0), 0);
  EXPECT_EQ(v.stage_of(0, 1), 7);
  EXPECT_EQ(v.stage_of(3, 0), 3);
  EXPECT_EQ(v.stage_of(3, 1), 4);
  EXPECT_EQ(v.rank_of(7), 0);
  EXPECT_EQ(v.rank_of(4), 3);
  EXPECT_EQ(v.chunk_of(4), 1);
  EXPECT_EQ(v.chunk_of(3), 0);
}

// ---- orders written by hand from the papers ---------------------------------------------

TEST(PipeSchedule, ExactOrdersWrittenByHand) {
  using V = std::vector<PipeOp>;
  // 1F1B p4 m8, rank 0: 3 warm-up F, 5 x (F B), 3 B
  auto s = make_schedule(ONE_F_ONE_B, 4, 1, 8, false);
  EXPECT_EQ(s.ops[0], (V{{F, 0, 0}, {F, 1, 0}, {F, 2, 0}, {F, 3, 0}, {B, 0, 0}, {F, 4, 0}, {B, 1, 0}, {F, 5, 0},
                         {B, 2, 0}, {F, 6, 0}, {B, 3, 0}, {F, 7, 0}, {B, 4, 0}, {B, 5, 0}, {B, 6, 0}, {B, 7, 0}}));
  // fewer microbatches than ranks: all forwards, then the backwards
  s = make_schedule(ONE_F_ONE_B, 4, 1, 2, true);
  EXPECT_EQ(s.ops[0], (V{{F, 0, 0}, {F, 1, 0}, {BI, 0, 0}, {BW, 0, 0}, {BI, 1, 0}, {BW, 1, 0}}));
  s = make_schedule(GPIPE, 3, 1, 3, false);
  for (const auto& ops : s.ops) EXPECT_EQ(ops, (V{{F, 0, 0}, {F, 1, 0}, {F, 2, 0}, {B, 0, 0}, {B, 1, 0}, {B, 2, 0}}));

  // ZB-H1 p4 m8: rank 0 defers no W; the last rank defers 3 and runs them at the end.
  s = make_schedule(ZBH1, 4, 1, 8, true);
  EXPECT_EQ(s.ops[0], (V{{F, 0, 0}, {F, 1, 0}, {F, 2, 0}, {F, 3, 0}, {BI, 0, 0}, {BW, 0, 0}, {F, 4, 0}, {BI, 1, 0},
                         {BW, 1, 0}, {F, 5, 0}, {BI, 2, 0}, {BW, 2, 0}, {F, 6, 0}, {BI, 3, 0}, {BW, 3, 0}, {F, 7, 0},
                         {BI, 4, 0}, {BW, 4, 0}, {BI, 5, 0}, {BW, 5, 0}, {BI, 6, 0}, {BW, 6, 0}, {BI, 7, 0},
                         {BW, 7, 0}}));
  EXPECT_EQ(s.ops[3], (V{{F, 0, 0}, {BI, 0, 0}, {F, 1, 0}, {BI, 1, 0}, {F, 2, 0}, {BI, 2, 0}, {F, 3, 0}, {BI, 3, 0},
                         {BW, 0, 0}, {F, 4, 0}, {BI, 4, 0}, {BW, 1, 0}, {F, 5, 0}, {BI, 5, 0}, {BW, 2, 0}, {F, 6, 0},
                         {BI, 6, 0}, {BW, 3, 0}, {F, 7, 0}, {BI, 7, 0}, {BW, 4, 0}, {BW, 5, 0}, {BW, 6, 0},
                         {BW, 7, 0}}));

  // Interleaved p2 v2 m4 (Megatron): microbatches pass the chunks in groups of p = 2;
  // rank 0 warms up with 2(p-1) + (v-1)p = 4 forwards, rank 1 with 2.
  s = make_schedule(INTERLEAVED, 2, 2, 4, false);
  EXPECT_EQ(s.ops[0], (V{{F, 0, 0}, {F, 1, 0}, {F, 0, 1}, {F, 1, 1}, {F, 2, 0}, {B, 0, 1}, {F, 3, 0}, {B, 1, 1},
                         {F, 2, 1}, {B, 0, 0}, {F, 3, 1}, {B, 1, 0}, {B, 2, 1}, {B, 3, 1}, {B, 2, 0}, {B, 3, 0}}));
  EXPECT_EQ(s.ops[1], (V{{F, 0, 0}, {F, 1, 0}, {F, 0, 1}, {B, 0, 1}, {F, 1, 1}, {B, 1, 1}, {F, 2, 0}, {B, 0, 0},
                         {F, 3, 0}, {B, 1, 0}, {F, 2, 1}, {B, 2, 1}, {F, 3, 1}, {B, 3, 1}, {B, 2, 0}, {B, 3, 0}}));

  // DualPipeV p2 m4, step by step as DualPipeV.step() runs it.
  s = make_schedule(DUALPIPEV, 2, 2, 4, true);
  EXPECT_EQ(s.ops[0], (V{{F, 0, 0}, {F, 1, 0},                          // 1: 2 x F0
                         {F, 2, 0}, {F, 0, 1},                          // 2: 1 x F0 F1
                         {BI, 0, 1}, {BW, 0, 1}, {F, 1, 1},             // 3: 1 x B1(zb) W F1
                         {F, 3, 0}, {BI, 1, 1}, {BW, 1, 1},             // 4: 1 x F0&B1
                         {F, 2, 1}, {BI, 0, 0}, {BW, 0, 0},             //         F1&B0
                         {BI, 2, 1}, {BW, 2, 1},                        // 5: 1 x B1
                         {F, 3, 1}, {BI, 1, 0}, {BW, 1, 0},             //         F1&B0
                         {BI, 3, 1}, {BW, 3, 1}, {BI, 2, 0},            // 6: 1 x B1 B0(zb)
                         {BW, 2, 0}, {BI, 3, 0},                        // 7: 1 x W B0(zb)
                         {BW, 3, 0}}));                                 // 8: 1 x W
  EXPECT_EQ(s.ops[1], (V{{F, 0, 0}, {F, 0, 1}, {F, 1, 0}, {F, 1, 1},    // 2: 2 x F0 F1
                         {F, 2, 0}, {BI, 0, 1}, {BW, 0, 1},             // 4: 2 x F0&B1
                         {F, 2, 1}, {BI, 0, 0}, {BW, 0, 0},             //         F1&B0
                         {F, 3, 0}, {BI, 1, 1}, {BW, 1, 1},
                         {F, 3, 1}, {BI, 1, 0}, {BW, 1, 0},
                         {BI, 2, 1}, {BW, 2, 1}, {BI, 2, 0}, {BW, 2, 0},  // 6: B1 B0, then B1(zb) B0(zb)
                         {BI, 3, 1}, {BI, 3, 0},
                         {BW, 3, 1}, {BW, 3, 0}}));                     // 8: 2 x W
}

// ---- played bubble against the closed forms ---------------------------------------------

// With F = 1 and a whole backward = 2 (fused B = 2, or BI = BW = 1) and free communication, every
// rank does the same work, m * chunks * 3, so the bubble is the idle time of each rank,
// makespan - work, and the fraction the player reports is idle / (work + idle).
struct BubbleCase {
  ScheduleKind kind;
  int p, v, m;
  double idle;  // the closed form, in units of one chunk's F
};

TEST(PipePlay, BubbleMatchesEachPapersClosedForm) {
  std::vector<BubbleCase> cases;
  for (auto [p, m] : std::vector<std::pair<int, int>>{{2, 4}, {3, 6}, {4, 8}, {4, 16}, {8, 32}}) {
    for (ScheduleKind k : {GPIPE, ONE_F_ONE_B, ZBH1, DUALPIPEV}) cases.push_back({k, p, 1, m, closed::closed_form_idle(k, p)});
    for (int v : {2, 3, 4}) cases.push_back({INTERLEAVED, p, v, m, closed::closed_form_idle(INTERLEAVED, p)});
  }
  for (const BubbleCase& c : cases) {
    const bool split = c.kind == ZBH1 || c.kind == DUALPIPEV;
    const PipeSchedule s = make_schedule(c.kind, c.p, c.v, c.m, split);
    SCOPED_TRACE(std::string(schedule_name(c.kind)) + " p" + std::to_string(c.p) + " m" + std::to_string(c.m) +
                 " v" + std::to_string(s.chunks));
    const PlayResult res = play(s, unit_costs());
    const double work = 3.0 * c.m * s.chunks;
    for (double b : res.busy) EXPECT_DOUBLE_EQ(b, work);
    EXPECT_DOUBLE_EQ(res.makespan, work + c.idle);
    EXPECT_NEAR(res.bubble, c.idle / (work + c.idle), 1e-12);
  }
  // the two forms of the GPipe/1F1B bubble agree: (p-1)/(m+p-1) of the total time
  const PlayResult g = play(make_schedule(ONE_F_ONE_B, 4, 1, 8, false), unit_costs());
  EXPECT_NEAR(g.bubble, 3.0 / 11.0, 1e-12);
}

// DualPipe's README numbers, checked where piper and DualPipe agree: with F&B = F + B the README's
// DualPipeV bubble (p-1)(F&B + B - 3W) exceeds ZB-H1's per-rank (p-1)(F + B - 2W) by (p-1)*BI; piper's
// played DualPipeV bubble equals ZB-H1's per rank in chunk units, i.e. half of ZB-H1's on the same
// ranks and model (a ZB-H1 stage is two DualPipeV chunks).
TEST(PipePlay, DualPipeVHalvesZBH1OnTheSameRanks) {
  for (auto [p, m] : std::vector<std::pair<int, int>>{{2, 4}, {4, 8}, {8, 16}}) {
    const PlayResult zb = play(make_schedule(ZBH1, p, 1, m, true), PassCosts{2, 4, 2, 2});  // a stage = 2 chunks
    const PlayResult dv = play(make_schedule(DUALPIPEV, p, 2, m, true), unit_costs());
    EXPECT_DOUBLE_EQ(zb.busy[0], dv.busy[0]);
    EXPECT_DOUBLE_EQ(zb.makespan - zb.busy[0], 2 * (dv.makespan - dv.busy[0])) << "p" << p << " m" << m;
  }
}

TEST(PipePlay, TimelineOfATwoRank1F1BByHand) {
  const PlayResult res = play(make_schedule(ONE_F_ONE_B, 2, 1, 2, false), unit_costs());
  auto span = [&](int r, size_t i) {
    const PlayedOp& o = res.timeline[static_cast<size_t>(r)][i];
    return std::make_pair(o.start, o.end);
  };
  // rank 0: F0 F1 B0 B1; rank 1: F0 B0 F1 B1
  EXPECT_EQ(span(0, 0), std::make_pair(0.0, 1.0));
  EXPECT_EQ(span(0, 1), std::make_pair(1.0, 2.0));
  EXPECT_EQ(span(1, 0), std::make_pair(1.0, 2.0));
  EXPECT_EQ(span(1, 1), std::make_pair(2.0, 4.0));
  EXPECT_EQ(span(0, 2), std::make_pair(4.0, 6.0));
  EXPECT_EQ(span(1, 2), std::make_pair(4.0, 5.0));
  EXPECT_EQ(span(1, 3), std::make_pair(5.0, 7.0));
  EXPECT_EQ(span(0, 3), std::make_pair(7.0, 9.0));
  EXPECT_EQ(res.timeline[1][1].stage, 1);
  EXPECT_DOUBLE_EQ(res.makespan, 9);
  EXPECT_DOUBLE_EQ(res.busy[0], 6);
  EXPECT_NEAR(res.bubble, 1.0 / 3.0, 1e-12);
  EXPECT_EQ(res.peak_alive, (std::vector<int>{2, 1}));
}

// ---- peak activations ---------------------------------------------------------------------

TEST(PipePlay, PeakActivationsPerRankFollowThePapers) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(name(c));
    const PlayResult res = play(make(c), unit_costs());
    ASSERT_EQ(res.peak_alive.size(), static_cast<size_t>(c.p));
    for (int r = 0; r < c.p; ++r)
      EXPECT_EQ(res.peak_alive[static_cast<size_t>(r)], closed::expected_peak(c.kind, c.p, c.v, c.m, r)) << "rank " << r;
  }
}

// ---- constraints --------------------------------------------------------------------------

TEST(PipeSchedule, ConstraintViolationsThrowNamingTheValues) {
  const std::vector<std::pair<std::function<void()>, std::string>> cases = {
      {[] { make_schedule(DUALPIPEV, 2, 2, 3, true); },
       "dualpipev needs microbatches >= 2 x pipeline ranks (got 3 microbatches for 2 ranks)"},
      {[] { make_schedule(DUALPIPEV, 4, 1, 6, true); },
       "dualpipev needs microbatches >= 2 x pipeline ranks (got 6 microbatches for 4 ranks)"},
      {[] { make_schedule(DUALPIPEV, 2, 2, 4, false); },
       "dualpipev needs split_backward (its W passes fill the bubbles)"},
      {[] { make_schedule(DUALPIPEV, 2, 3, 4, true); },
       "dualpipev holds exactly 2 model chunks per rank: virtual_stages must be 1 or 2 (got 3)"},
      {[] { make_schedule(INTERLEAVED, 4, 2, 6, false); },
       "interleaved needs microbatches divisible by pipeline ranks (got 6 microbatches for 4 ranks)"},
      {[] { make_schedule(INTERLEAVED, 4, 1, 8, false); },
       "interleaved needs virtual_stages >= 2 model chunks per rank (got 1); with one chunk use 1f1b"},
      {[] { make_schedule(ZBH1, 4, 1, 8, false); }, "zbh1 needs split_backward (its W passes fill the bubbles)"},
      {[] { make_schedule(ZBH1, 4, 2, 8, true); },
       "zbh1 holds one model chunk per rank: virtual_stages must be 1 (got 2); interleaved runs several"},
      {[] { make_schedule(ONE_F_ONE_B, 4, 2, 8, false); },
       "1f1b holds one model chunk per rank: virtual_stages must be 1 (got 2); interleaved runs several"},
      {[] { make_schedule(GPIPE, 0, 1, 8, false); }, "gpipe needs at least 1 pipeline rank (got 0)"},
      {[] { make_schedule(ONE_F_ONE_B, 2, 1, 0, false); }, "1f1b needs at least 1 microbatch (got 0)"},
  };
  for (const auto& [call, message] : cases) {
    EXPECT_THROW(call(), std::invalid_argument) << message;
    EXPECT_EQ(thrown_by(call), message);
  }
}

// ---- the player's checks ------------------------------------------------------------------

PipeSchedule hand_written(int ranks, int m, std::vector<std::vector<PipeOp>> ops) {
  PipeSchedule s;
  s.ranks = ranks;
  s.microbatches = m;
  s.rank_of_stage = loop_placement(ranks, 1);
  s.ops = std::move(ops);
  return s;
}

TEST(PipePlay, DetectsADeadlockingOrder) {
  // rank 1 runs B0 before F0: rank 0 waits for rank 1's B0, rank 1 for its own F0
  const PipeSchedule s = hand_written(2, 1, {{{F, 0, 0}, {B, 0, 0}}, {{B, 0, 0}, {F, 0, 0}}});
  EXPECT_THROW(play(s, unit_costs()), std::logic_error);
  EXPECT_EQ(thrown_by([&] { play(s, unit_costs()); }),
            "pipeline order deadlocks; first blocked op of each rank: rank 0 op 1 (B0) on stage 0; "
            "rank 1 op 0 (B0) on stage 1");
  // a swapped pair of forwards on the middle rank of three blocks everything after it
  const PipeSchedule t = hand_written(3, 2,
                                      {{{F, 0, 0}, {F, 1, 0}, {B, 0, 0}, {B, 1, 0}},
                                       {{F, 1, 0}, {F, 0, 0}, {B, 0, 0}, {B, 1, 0}},
                                       {{F, 0, 0}, {B, 0, 0}, {F, 1, 0}, {B, 1, 0}}});
  EXPECT_NO_THROW(play(t, unit_costs()));  // only slower: F1 waits on rank 1, nothing cycles
  // a missing op: rank 1 never runs B0, so rank 0 waits forever while rank 1 finishes
  const PipeSchedule u = hand_written(2, 1, {{{F, 0, 0}, {B, 0, 0}}, {{F, 0, 0}}});
  EXPECT_EQ(thrown_by([&] { play(u, unit_costs()); }),
            "pipeline order deadlocks; first blocked op of each rank: rank 0 op 1 (B0) on stage 0; rank 1 done");
  // a zero-bubble order that waits for a W before its B
  const PipeSchedule w = hand_written(1, 1, {{{F, 0, 0}, {BW, 0, 0}, {BI, 0, 0}}});
  EXPECT_EQ(thrown_by([&] { play(w, unit_costs()); }),
            "pipeline order deadlocks; first blocked op of each rank: rank 0 op 1 (BW0) on stage 0");
}

TEST(PipePlay, RejectsOpsOutsideTheScheduleOrListedTwice) {
  const PipeSchedule twice = hand_written(1, 1, {{{F, 0, 0}, {F, 0, 0}, {B, 0, 0}}});
  EXPECT_EQ(thrown_by([&] { play(twice, unit_costs()); }), "play: rank 0 op 1 (F0) is listed twice");
  const PipeSchedule outside = hand_written(1, 1, {{{F, 0, 0}, {B, 1, 0}}});
  EXPECT_THROW(play(outside, unit_costs()), std::invalid_argument);
  const PipeSchedule chunk = hand_written(1, 1, {{{F, 0, 1}}});
  EXPECT_THROW(play(chunk, unit_costs()), std::invalid_argument);
  const PipeSchedule update = hand_written(1, 1, {{{Pass::PASS_U, 0, 0}}});
  EXPECT_THROW(play(update, unit_costs()), std::invalid_argument);
  const PipeSchedule no_rows = hand_written(2, 1, {{{F, 0, 0}}});
  EXPECT_THROW(play(no_rows, unit_costs()), std::invalid_argument);
}

// ---- rendering and docs/schedules.md -------------------------------------------------------

TEST(PipeRender, DrawsBoxesAndIdleTime) {
  EXPECT_EQ(render(make_schedule(ONE_F_ONE_B, 2, 1, 2, false), unit_costs()),
            "r0 |F0|F1|......B0   |...B1   |\n"
            "r1 |...F0|B0   |F1|B1   |\n");
  EXPECT_EQ(render(make_schedule(ZBH1, 2, 1, 2, true), unit_costs()),
            "r0 |F0|F1|...B0|W0|B1|W1|\n"
            "r1 |...F0|B0|F1|B1|W0|W1|\n");
  // two chunks: the second in lower case; more: a ".c" suffix
  const std::string v = render(make_schedule(DUALPIPEV, 1, 2, 2, true), unit_costs());
  EXPECT_EQ(v, "r0 |F0|f0|F1|b0|w0|f1|B0|W0|b1|w1|B1|W1|\n");
  const std::string three = render(make_schedule(INTERLEAVED, 1, 3, 1, false), unit_costs());
  EXPECT_EQ(three, "r0 |F0.0|F0.1|F0.2|B0.2     |B0.1     |B0.0     |\n");
}

// The timelines in docs/schedules.md are this player's output; regenerate them with render() when
// a schedule changes.
TEST(PipeRender, DocsShowThePlayedTimelines) {
  std::ifstream in(std::string(PIPER_SOURCE_DIR) + "/docs/schedules.md");
  ASSERT_TRUE(in) << "docs/schedules.md missing";
  std::stringstream doc;
  doc << in.rdbuf();
  const std::vector<Case> shown = {{GPIPE, 4, 1, 8, false},      {ONE_F_ONE_B, 4, 1, 8, false},
                                   {ONE_F_ONE_B, 4, 1, 8, true}, {INTERLEAVED, 4, 2, 8, false},
                                   {ZBH1, 4, 1, 8, true},        {DUALPIPEV, 4, 2, 8, true}};
  for (const Case& c : shown) {
    const std::string drawn = render(make(c), unit_costs());
    EXPECT_NE(doc.str().find(drawn), std::string::npos) << "docs/schedules.md lacks the " << name(c)
                                                        << " timeline:\n" << drawn;
  }
}

}  // namespace
}  // namespace piper::ir

// ---- pairs --------------------------------------------------------------------------------------

namespace piper::ir {
namespace {

// DualPipeV's steady phase: each F&B pair of its steps 4 and 5 is a group [F, BI] of two
// microbatches; without pairs the same ops run one after the other.
TEST(SchedulePairs, DualPipeVGroupsTheForwardBackwardPairsOfItsSteadyPhase) {
  const int p = 4, m = 10;
  const PipeSchedule plain = make_schedule(DUALPIPEV, p, 2, m, true, false);
  const PipeSchedule paired = make_schedule(DUALPIPEV, p, 2, m, true, true);
  for (int r = 0; r < p; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const auto& ops = paired.ops[static_cast<size_t>(r)];
    ASSERT_EQ(ops.size(), plain.ops[static_cast<size_t>(r)].size());
    int groups = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      PipeOp flat = ops[i];
      flat.grouped = false;
      EXPECT_EQ(flat, plain.ops[static_cast<size_t>(r)][i]);
      if (!ops[i].grouped) continue;
      ++groups;
      ASSERT_GT(i, 0u);
      EXPECT_EQ(ops[i].pass, BI);
      EXPECT_EQ(ops[i - 1].pass, F);
      EXPECT_FALSE(ops[i - 1].grouped);
      EXPECT_NE(ops[i].microbatch == ops[i - 1].microbatch, ops[i].chunk != ops[i - 1].chunk)
          << "a pair of one microbatch and chunk";
    }
    EXPECT_EQ(groups, 2 * (m - 2 * p + r + 1) + (p - r - 1));  // step 4: two pairs each; step 5: one
  }
}

// Without pipeline parallelism F(i+1) pairs with B(i): one forward runs ahead.
TEST(SchedulePairs, OneFOneBAtOneRankPairsTheNextForwardWithTheBackward) {
  const PipeSchedule s = make_schedule(ONE_F_ONE_B, 1, 1, 4, false, true);
  EXPECT_EQ(pipe_ops_text(s.ops[0], 1), "F0, [F1, B0], [F2, B1], [F3, B2], B3");
  const PipeSchedule z = make_schedule(ZBH1, 1, 1, 3, true, true);
  EXPECT_EQ(pipe_ops_text(z.ops[0], 1), "F0, [F1, BI0], BW0, [F2, BI1], BW1, BI2, BW2");
  EXPECT_EQ(pipe_ops_text(make_schedule(ONE_F_ONE_B, 1, 1, 4, false, false).ops[0], 1), "F0, B0, F1, B1, F2, B2, F3, B3");
}

TEST(SchedulePairs, RefusedWhereAPairWouldHoldTheForwardBack) {
  const auto pp2 = schedule_problem(ONE_F_ONE_B, 2, 1, 4, false, true);
  ASSERT_TRUE(pp2.has_value());
  EXPECT_EQ(pp2->key, "parallel.pairs");
  EXPECT_NE(pp2->message.find("1f1b pairs F(i+1) with B(i) only without pipeline parallelism (pp 1, got 2)"),
            std::string::npos)
      << pp2->message;
  EXPECT_NE(pp2->message.find("pair with dualpipev"), std::string::npos) << pp2->message;
  const auto gpipe = schedule_problem(GPIPE, 1, 1, 4, false, true);
  ASSERT_TRUE(gpipe.has_value());
  EXPECT_NE(gpipe->message.find("gpipe runs every forward before every backward"), std::string::npos);
  EXPECT_FALSE(schedule_problem(DUALPIPEV, 2, 2, 4, true, true).has_value());
  EXPECT_FALSE(schedule_problem(INTERLEAVED, 1, 2, 4, false, true).has_value());
}

TEST(SchedulePlacement, ProblemsOfAPlacement) {
  EXPECT_EQ(placement_problem({0, 1, 1, 0}, 2), "");
  EXPECT_EQ(placement_problem({0, 0}, 2), "pipeline rank 1 holds no stage; place at least one stage on every rank");
  EXPECT_EQ(placement_problem({0, 3}, 2), "stage 1 is placed on pipeline rank 3, but there are 2 pipeline ranks (0..1)");
  EXPECT_EQ(placement_problem({0, 1, 1}, 2),
            "pipeline rank 0 holds 1 stage(s) but rank 1 holds 2; every rank holds the same number of stages (its "
            "model chunks)");
  PipeSchedule s;
  s.ranks = 3;
  s.chunks = 1;
  s.rank_of_stage = {0, 2, 1};
  EXPECT_EQ(s.stage_of(2, 0), 1);
  EXPECT_EQ(s.rank_of(2), 1);
  EXPECT_EQ(s.chunk_of(1), 0);
}

}  // namespace
}  // namespace piper::ir
