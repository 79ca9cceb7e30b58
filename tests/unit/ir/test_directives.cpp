// test_directives.cpp — directives in the IR: `directives_yaml` reads back through the config module to
// the same Strategy; a hand-written order (OrderDirective::custom) copying a schedule function's ops
// builds the same DAG as the schedule; custom orders that name missing ops are BuildErrors naming the
// op and the rank; and the verifier rejects custom orders that deadlock or miss work.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "ir/build.hpp"
#include "ir/compile.hpp"
#include "ir/model_graph.hpp"
#include "ir/pipeline_schedules.hpp"
#include "ir/program.hpp"
#include "ir/strategy.hpp"
#include "ir/validate.hpp"
#include "ir/verify.hpp"
#include "unit/ir/strategy_in_code.hpp"

namespace piper::ir {
namespace {

// A small model (8 blocks: units embed, layers.0..7, head) as YAML, so that parse() can read it.
const std::string kModelYaml =
    "model:\n"
    "  pattern: \"M*-M*-M-\"\n"
    "  vocab_size: 32\n"
    "  d_model: 16\n"
    "  n_heads: 4\n"
    "  n_kv_heads: 2\n"
    "  ffn_hidden: 24\n"
    "  d_state: 8\n"
    "  head_dim: 8\n"
    "  n_groups: 2\n";

struct Par {
  int dp = 1, pp = 1, zero = 0, vs = 1, mb = 2;
  std::string schedule = "1f1b";
  bool split_backward = false;
  std::string extra;  // more `parallel:` lines
};

std::string name(const Par& p) {
  return p.schedule + " dp" + std::to_string(p.dp) + " pp" + std::to_string(p.pp) + " zero" + std::to_string(p.zero) +
         " v" + std::to_string(p.vs) + " mb" + std::to_string(p.mb) + (p.split_backward ? " split" : "") + p.extra;
}

std::string train_yaml(const Par& p) { return "train:\n  global_batch: " + std::to_string(4 * p.dp * p.mb) + "\n"; }

std::string parallel_yaml(const Par& p) {
  return "parallel:\n  dp: " + std::to_string(p.dp) +
         "\n  pp: " + std::to_string(p.pp) + "\n  zero: " + std::to_string(p.zero) +
         "\n  virtual_stages: " + std::to_string(p.vs) + "\n  microbatches: " + std::to_string(p.mb) +
         "\n  schedule: " + p.schedule + "\n  split_backward: " + (p.split_backward ? "true" : "false") + "\n" +
         p.extra;
}

// A different `parallel:` shorthand: directives printed in full must not depend on it.
const std::string kOtherParallel =
    "parallel:\n  dp: 3\n  pp: 1\n  zero: 2\n  microbatches: 2\n  schedule: dualpipev\n"
    "  split_backward: true\n  order: pp-dp-tp\n  bucket_mb: 3\n";

int world(const Par& p) { return p.dp * p.pp; }

// What directives_yaml writes out: the strategy with its schedule as a hand-written order and its
// placement as explicit ranks.
Strategy expanded(Strategy s) {
  const PipeSchedule sched = schedule_of(s);
  s.order = OrderDirective{};
  s.order.custom = sched.ops;
  s.order.chunks = sched.chunks;
  s.place.rank_of_stage = sched.rank_of_stage;
  return s;
}

TEST(DirectivesYaml, ReadsBackToTheSameStrategy) {
  std::vector<Par> cases;
  for (const char* s : {"gpipe", "1f1b", "zbh1"})
    for (int pp : {1, 2, 4})
      for (bool sb : {false, true}) cases.push_back({1, pp, 0, 1, 4, s, sb, ""});
  cases.push_back({1, 2, 0, 2, 4, "interleaved", false, ""});
  cases.push_back({1, 2, 0, 1, 4, "dualpipev", true, ""});
  cases.push_back({1, 2, 0, 2, 4, "dualpipev", true, ""});
  for (int zero : {0, 1, 2, 3}) cases.push_back({2, 2, zero, 1, 2, "1f1b", false, "  bucket_mb: 0.1\n"});
  cases.push_back({2, 1, 1, 1, 2, "gpipe", false, "  order: pp-dp-tp\n"});
  for (const Par& p : cases) {
    SCOPED_TRACE(name(p));
    const config::Config cfg = config::parse(kModelYaml + train_yaml(p) + parallel_yaml(p), "orig.yaml");
    ASSERT_NO_THROW(ir::validate(cfg, world(p)));
    const Strategy s = expand(cfg, world(p));
    const std::string text = directives_yaml(s, make_model_graph(cfg.model));
    // Read back under the same shorthand, and under a different one.
    for (const std::string& parallel : {parallel_yaml(p), kOtherParallel}) {
      const config::Config back = config::parse(kModelYaml + train_yaml(p) + parallel + text, "back.yaml");
      ASSERT_TRUE(back.directives.present) << text;
      ASSERT_NO_THROW(ir::validate(back, world(p))) << text;
      const Strategy t = expand(back, world(p));
      EXPECT_TRUE(t == expanded(s)) << text;
      EXPECT_EQ(compile(back, world(p)).hash, compile(cfg, world(p)).hash) << text;
    }
  }
}

// Directives for subsets of the units print as a directive for most units and `unit:` filters
// for the rest, and read back to the same Strategy under any shorthand.
TEST(DirectivesYaml, SubsetsReadBackToTheSameStrategy) {
  const std::vector<std::pair<std::string, int>> cases = {
      {"  - place: {pp: 2}\n  - split_backward: {kind: \"*\"}\n", 2},
      {"  - split_backward: true\n  - place: {pp: 2}\n  - split_backward: {stage: 0}\n", 2},
      {"  - replicate: {dp: 2}\n  - replicate: {shard_optimizer: true, shard_grads: true, shard_params: true, "
       "kind: [embed, head]}\n", 2},
      {"  - replicate: {dp: 2, shard_optimizer: true}\n  - replicate: {shard_grads: true, blocks: \"0-2\"}\n"
       "  - replicate: {shard_optimizer: false, unit: head}\n  - place: {pp: 2}\n  - order: {schedule: zbh1}\n"
       "  - split_backward: {kind: M}\n", 4},
  };
  for (const auto& [directives, world] : cases) {
    SCOPED_TRACE(directives);
    const config::Config cfg = config::parse(kModelYaml + "directives:\n" + directives, "orig.yaml");
    ASSERT_NO_THROW(ir::validate(cfg, world));
    const Strategy s = expand(cfg, world);
    const std::string text = directives_yaml(s, make_model_graph(cfg.model));
    std::printf("%s", text.c_str());
    for (const std::string& parallel : {std::string(), kOtherParallel}) {
      const config::Config back = config::parse(kModelYaml + parallel + text, "back.yaml");
      ASSERT_NO_THROW(ir::validate(back, world)) << text;
      EXPECT_TRUE(expand(back, world) == expanded(s)) << text;
      EXPECT_EQ(compile(back, world).hash, compile(cfg, world).hash) << text;
    }
  }
}

TEST(DirectivesYaml, CustomOrdersPrintTheirRanks) {
  const config::Config cfg = config::parse(kModelYaml +
                                               "parallel:\n  microbatches: 4\n"
                                               "directives:\n"
                                               "  - place: {pp: 2, virtual_stages: 2}\n"
                                               "  - order:\n"
                                               "      ranks:\n"
                                               "        - [F0, F1, F2, F3, F0.1, F1.1, F2.1, F3.1, B0.1, B1.1, B2.1, "
                                               "B3.1, B0, B1, B2, B3]\n"
                                               "        - [F0, F1, F2, F3, F0.1, F1.1, F2.1, F3.1, B0.1, B1.1, B2.1, "
                                               "B3.1, B0, B1, B2, B3]\n",
                                           "custom.yaml");
  ASSERT_NO_THROW(ir::validate(cfg, 2));
  const Strategy s = expand(cfg, 2);
  ASSERT_EQ(s.order.custom.size(), 2u);
  EXPECT_EQ(s.order.chunks, 2);
  EXPECT_EQ(s.order.custom[0][4], (PipeOp{Pass::PASS_F, 0, 1}));
  EXPECT_EQ(s.order.custom[1][15], (PipeOp{Pass::PASS_B, 3, 0}));
  EXPECT_FALSE(s.any_split_backward());
  const std::string text = directives_yaml(s, make_model_graph(cfg.model));
  std::printf("%s", text.c_str());
  EXPECT_NE(text.find("  - order:\n      ranks:\n        - [F0.0, F1.0, F2.0, F3.0, F0.1,"), std::string::npos) << text;
  EXPECT_EQ(text.find("schedule"), std::string::npos) << text;
  const config::Config back = config::parse(kModelYaml + kOtherParallel + text, "back.yaml");
  ASSERT_NO_THROW(ir::validate(back, 2));
  EXPECT_TRUE(expand(back, 2) == expanded(s)) << text;
  EXPECT_EQ(compile(back, 2).hash, compile(cfg, 2).hash);
}

// A custom order holding exactly what a schedule function emits builds the same DAG.
TEST(CustomOrder, CopyOfAScheduleBuildsTheSameDag) {
  struct Case {
    const char* schedule;
    int pp, vs, mb;
    bool split;
  };
  const config::Config base = config::parse(kModelYaml, "m.yaml");
  const ModelGraph mg = make_model_graph(base.model);
  for (const Case& c : std::vector<Case>{{"gpipe", 2, 1, 4, false},
                                         {"1f1b", 2, 1, 4, false},
                                         {"1f1b", 4, 1, 6, true},
                                         {"interleaved", 2, 2, 4, false},
                                         {"interleaved", 2, 2, 4, true},
                                         {"zbh1", 3, 1, 5, true},
                                         {"1f1b", 1, 1, 3, false}}) {
    SCOPED_TRACE(std::string(c.schedule) + " pp" + std::to_string(c.pp) + " v" + std::to_string(c.vs) + " mb" +
                 std::to_string(c.mb));
    Strategy named;
    named.world_size = c.pp;
    named.split.microbatches = c.mb;
    named.place.pp = c.pp;
    named.place.virtual_stages = c.vs;
    named.order.schedule = parse_schedule(c.schedule);
    named.activation_bytes = 1024;
    named = testing::with_units(named, base.model, c.split);
    Strategy custom = named;
    custom.order.schedule = ScheduleKind::SCHEDULE_1F1B;
    custom.order.custom = make_schedule(named.order.schedule, c.pp, c.vs, c.mb, c.split).ops;
    custom.order.chunks = c.vs;
    const Graph a = build(mg, named), b = build(mg, custom);
    ASSERT_NO_THROW(verify(b, mg));
    EXPECT_EQ(plan_hash(a, mg), plan_hash(b, mg));
    for (int r = 0; r < c.pp; ++r)
      EXPECT_EQ(format_program(lower(a, r), mg), format_program(lower(b, r), mg)) << "rank " << r;
  }
}

Strategy two_ranks(int mb, std::vector<std::vector<PipeOp>> ops, int chunks = 1, bool split = false) {
  Strategy s;
  s.world_size = 2;
  s.split.microbatches = mb;
  s.place.pp = 2;
  s.place.virtual_stages = chunks;
  s.order.custom = std::move(ops);
  s.order.chunks = chunks;
  return testing::with_units(s, config::parse(kModelYaml, "m.yaml").model, split);
}

std::string build_error(const Strategy& s) {
  const ModelGraph mg = make_model_graph(config::parse(kModelYaml, "m.yaml").model);
  try {
    const Graph g = build(mg, s);
    verify(g, mg);
  } catch (const BuildError& e) {
    return std::string("BuildError: ") + e.what();
  } catch (const VerifyError& e) {
    return std::string("VerifyError: ") + e.what();
  }
  return "";
}

constexpr Pass F = Pass::PASS_F, B = Pass::PASS_B, BI = Pass::PASS_BI, BW = Pass::PASS_BW;

TEST(CustomOrder, BadOpsAreBuildErrorsNamingOpAndRank) {
  const std::vector<PipeOp> r0 = {{F, 0, 0}, {F, 1, 0}, {B, 0, 0}, {B, 1, 0}};
  const std::vector<PipeOp> r1 = {{F, 0, 0}, {B, 0, 0}, {F, 1, 0}, {B, 1, 0}};
  EXPECT_EQ(build_error(two_ranks(2, {r0, r1})), "");
  struct Row {
    Strategy s;
    std::vector<std::string> needs;
  };
  std::vector<PipeOp> f9 = r1;
  f9[2] = {F, 9, 0};
  std::vector<PipeOp> chunk = r1;
  chunk[2] = {F, 1, 1};
  std::vector<PipeOp> dup = r1;
  dup.push_back({B, 0, 0});
  Strategy wrong_chunks = two_ranks(2, {r0, r1});
  wrong_chunks.order.chunks = 2;
  for (const Row& row : std::vector<Row>{
           {two_ranks(2, {r0, f9}), {"BuildError: order: op 2 of rank 1 of the hand-written order: rank 1 runs F9", "2 microbatches (0..1"}},
           {two_ranks(2, {r0, chunk}), {"order: op 2 of rank 1 of the hand-written order: rank 1 runs F1.1", "each rank holds 1 model chunk(s)"}},
           {two_ranks(2, {r0, dup}), {"order: op 4 of rank 1 of the hand-written order: rank 1 runs B0 twice (first as op 1 of rank 1)"}},
           {two_ranks(2, {r0}), {"order: the hand-written order: lists the ops of 1 rank(s), but there are 2 pipeline ranks (place pp 2)"}},
           {two_ranks(2, {r0, r1}, 1, true), {"op 2 of rank 0 of the hand-written order: rank 0 runs B0, a fused backward", "BI0 and BW0"}},
           {two_ranks(2, {{{F, 0, 0}, {BI, 0, 0}, {BW, 0, 0}, {F, 1, 0}, {BI, 1, 0}, {BW, 1, 0}}, r1}),
            {"rank 1 runs B0, but op 1 of rank 0 is a split backward"}},
           {wrong_chunks, {"has 2 chunk(s) per rank, but place has virtual_stages 1"}},
           {two_ranks(2, {r0, {}}), {"order: rank 1 of the hand-written order: rank 1 has no ops"}},
       }) {
    const std::string m = build_error(row.s);
    std::printf("%s\n", m.c_str());
    for (const std::string& n : row.needs) EXPECT_NE(m.find(n), std::string::npos) << m;
  }
}

TEST(CustomOrder, VerifierRejectsDeadlocksAndMissingWork) {
  const std::vector<PipeOp> r0 = {{F, 0, 0}, {F, 1, 0}, {B, 0, 0}, {B, 1, 0}};
  // rank 1 runs B0 before F0: its backward waits for its own forward.
  std::string m = build_error(two_ranks(2, {r0, {{B, 0, 0}, {F, 0, 0}, {F, 1, 0}, {B, 1, 0}}}));
  EXPECT_NE(m.find("VerifyError: the schedule can deadlock"), std::string::npos) << m;
  EXPECT_NE(m.find("on rank 1"), std::string::npos) << m;
  // rank 0 waits for the gradient of mb0 before sending mb1's activation; rank 1 wants F1 first.
  m = build_error(two_ranks(2, {{{F, 0, 0}, {B, 0, 0}, {F, 1, 0}, {B, 1, 0}},
                                {{F, 0, 0}, {F, 1, 0}, {B, 0, 0}, {B, 1, 0}}}));
  EXPECT_NE(m.find("VerifyError: the schedule can deadlock"), std::string::npos) << m;
  // rank 0 leaves out microbatch 1.
  m = build_error(two_ranks(2, {{{F, 0, 0}, {B, 0, 0}}, {{F, 0, 0}, {B, 0, 0}, {F, 1, 0}, {B, 1, 0}}}));
  EXPECT_NE(m.find("BuildError: order: rank 0: no op runs F of embed (unit 0, stage 0) for microbatch 1; add F1"),
            std::string::npos)
      << m;
  // Split backward: rank 0 runs a weight half before its input half.
  m = build_error(two_ranks(1, {{{F, 0, 0}, {BW, 0, 0}, {BI, 0, 0}}, {{F, 0, 0}, {BI, 0, 0}, {BW, 0, 0}}}, 1, true));
  EXPECT_NE(m.find("VerifyError: the schedule can deadlock"), std::string::npos) << m;
  EXPECT_NE(m.find("on rank 0"), std::string::npos) << m;
}

}  // namespace

// The compute nodes of one rank in the order its ordering edges chain them.
std::vector<int> chain(const Graph& g, int rank) {
  std::vector<int> next(g.nodes().size(), -1), prev(g.nodes().size(), -1);
  for (const Edge& e : g.edges())
    if (e.kind == EdgeKind::EDGE_ORDER && g.node(e.src).devices.front() == rank) next[e.src] = e.dst, prev[e.dst] = e.src;
  std::vector<int> out;
  for (const Node& n : g.nodes())
    if (n.devices.front() == rank && next[n.id] >= 0 && prev[n.id] < 0)
      for (int v = n.id; v >= 0; v = next[v]) out.push_back(v);
  return out;
}

// A group runs its ops' segments in turn: with tp 2 at pp 1, [F1, B0] alternates a segment of F1
// with one of B0, so each one's all-reduce is in flight while the other computes.
TEST(Groups, OpsOfAGroupRunTheirSegmentsInTurn) {
  const config::ModelConfig m = config::parse(kModelYaml, "m.yaml").model;
  const ModelGraph mg = make_model_graph(m);
  Strategy s;
  s.world_size = 2;
  s.shard.tp = 2;
  s.split.microbatches = 2;
  s.order.pairs = true;
  s.microbatch_rows = 64;
  s.activation_bytes = 64 * 64 * 4;
  s = testing::with_units(s, m, false);
  const Graph g = build(mg, s);
  ASSERT_NO_THROW(verify(g, mg));
  const std::vector<int> order = chain(g, 0);
  // F0 alone, then the group: F1 and B0 take turns until F1 runs out.
  size_t i = 0;
  while (i < order.size() && g.node(order[i]).tags.microbatch == 0 && g.node(order[i]).kind == NodeKind::FWD) ++i;
  int f1 = 0, b0 = 0, turns = 0;
  for (bool f_turn = true; i < order.size(); ++i, f_turn = !f_turn) {
    const Node& n = g.node(order[i]);
    if (n.kind == NodeKind::UPD || n.kind == NodeKind::NORM) break;
    const bool is_f1 = n.kind == NodeKind::FWD && n.tags.microbatch == 1;
    const bool is_b0 = n.kind == NodeKind::BWD && n.tags.microbatch == 0;
    if (!is_f1 && !is_b0) break;
    if (is_f1 != f_turn) break;
    f1 += is_f1, b0 += is_b0, ++turns;
  }
  int f1_nodes = 0, b0_nodes = 0;
  for (const Node& n : g.nodes()) {
    f1_nodes += n.kind == NodeKind::FWD && n.tags.microbatch == 1;
    b0_nodes += n.kind == NodeKind::BWD && n.tags.microbatch == 0;
  }
  std::printf("group [F1, B0]: %d turns alternate (F1 %d of %d segments, B0 %d of %d)\n", turns, f1, f1_nodes, b0,
              b0_nodes);
  ASSERT_GT(f1_nodes, b0_nodes);  // the forward has more segments (the embedding's and the head's)
  EXPECT_EQ(b0, b0_nodes);        // every B0 segment ran in turn with an F1 segment,
  EXPECT_EQ(f1, b0_nodes + 1);    // F1 began the turns and ran its remaining segments once B0 ran out
  // Without pairs no forward runs ahead: B0 follows F0.
  s.order.pairs = false;
  const Graph plain = build(mg, s);
  const std::vector<int> flat = chain(plain, 0);
  EXPECT_EQ(plain.node(flat[static_cast<size_t>(f1_nodes)]).kind, NodeKind::BWD);
  EXPECT_EQ(plain.node(flat[static_cast<size_t>(f1_nodes)]).tags.microbatch, 0);
}

// An explicit placement that is not a loop: stage 1 on rank 2 and stage 2 on rank 1, so sends go
// from rank 0 to rank 2, back to rank 1; the order by hand follows it.
TEST(Placement, NonLoopPlacementBuildsAndVerifies) {
  const config::ModelConfig m = config::parse(kModelYaml, "m.yaml").model;
  const ModelGraph mg = make_model_graph(m);
  Strategy s;
  s.world_size = 3;
  s.split.microbatches = 2;
  s.place.pp = 3;
  s.place.rank_of_stage = {0, 2, 1};
  s.order.custom = {{{F, 0, 0}, {F, 1, 0}, {B, 0, 0}, {B, 1, 0}},
                    {{F, 0, 0}, {B, 0, 0}, {F, 1, 0}, {B, 1, 0}},
                    {{F, 0, 0}, {F, 1, 0}, {B, 0, 0}, {B, 1, 0}}};
  s = testing::with_units(s, m, false);
  const Graph g = build(mg, s);
  ASSERT_NO_THROW(verify(g, mg));
  const std::vector<int> rank_of_stage = {0, 2, 1};
  for (const Node& n : g.nodes()) {
    if (n.kind == NodeKind::FWD) {
      EXPECT_EQ(n.devices.front(), rank_of_stage[static_cast<size_t>(n.tags.stage)]);
    }
  }
  bool zero_to_two = false;
  for (const Node& n : g.nodes())
    zero_to_two |= n.kind == NodeKind::SEND && n.devices.front() == 0 && n.peers.front() == 2;
  EXPECT_TRUE(zero_to_two);
  s.place.rank_of_stage = {0, 0, 1};
  EXPECT_NE(build_error(s).find("pipeline rank 2 holds no stage"), std::string::npos) << build_error(s);
}

}  // namespace piper::ir
