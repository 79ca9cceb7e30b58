// test_recompute.cpp — activation recomputation in the IR: the recompute directive and the
// parallel.recompute shorthand read into a recomputation per unit (filters over blocks, kind and
// stage), their refusals at the file position of the key they concern, RECOMP nodes in the DAG
// right before each recomputed unit's backward, the verifier refusing a backward without its
// RECOMP, the plan hash covering the mode, and directives_yaml reading back to the same Strategy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "ir/build.hpp"
#include "ir/compile.hpp"
#include "ir/program.hpp"
#include "ir/strategy.hpp"
#include "ir/validate.hpp"
#include "ir/verify.hpp"
#include "unit/ir/strategy_in_code.hpp"
#include "unit/test_configs.hpp"

namespace piper::ir {
namespace {

const std::string& kModel = testing::kSmallModelYaml;  // lines 1..8; blocks 0..4: M * - M -

constexpr Recompute N = Recompute::RECOMPUTE_NONE, S = Recompute::RECOMPUTE_SELECTIVE, F = Recompute::RECOMPUTE_FULL;

config::Config parse(const std::string& yaml) { return config::parse(kModel + yaml, "d.yaml"); }

std::vector<Recompute> recompute_of(const std::string& yaml, int world = 1) {
  const config::Config c = parse(yaml);
  ir::validate(c, world);
  return expand(c, world).recompute;
}

TEST(Recompute, ShorthandCoversTheBlocks) {
  // units: embed, M, *, -, M, -, head
  EXPECT_EQ(recompute_of(""), (std::vector<Recompute>{N, N, N, N, N, N, N}));
  EXPECT_EQ(recompute_of("parallel:\n  recompute: full\n"), (std::vector<Recompute>{N, F, F, F, F, F, N}));
  // Selective drops the mixers' inner activations: MLP blocks have none.
  EXPECT_EQ(recompute_of("parallel:\n  recompute: selective\n"), (std::vector<Recompute>{N, S, S, N, S, N, N}));
}

TEST(Recompute, DirectivesApplyInOrderOverTheirFilters) {
  EXPECT_EQ(recompute_of("directives:\n  - recompute: {mode: full, kind: \"-\"}\n"),
            (std::vector<Recompute>{N, N, N, F, N, F, N}));
  EXPECT_EQ(recompute_of("directives:\n  - recompute: {mode: full, blocks: [0, \"3-4\"]}\n"),
            (std::vector<Recompute>{N, F, N, N, F, F, N}));
  EXPECT_EQ(recompute_of("parallel:\n  recompute: full\ndirectives:\n  - recompute: {mode: selective, kind: M}\n"),
            (std::vector<Recompute>{N, S, F, F, S, F, N}));
  // Filters combine: blocks 0..3 of kind M.
  EXPECT_EQ(recompute_of("directives:\n  - recompute: {mode: full, blocks: \"0-3\", kind: M}\n"),
            (std::vector<Recompute>{N, F, N, N, F, N, N}));
  // stage: the placement's stages, balanced when no place directive gives them.
  const config::Config c = parse("parallel:\n  pp: 2\ndirectives:\n  - recompute: {mode: full, stage: 0}\n");
  ir::validate(c, 2);
  const Strategy s = expand(c, 2);
  ASSERT_EQ(s.place.stage_of_unit.size(), 7u);  // complete: the balance is in the Strategy
  for (size_t u = 1; u + 1 < 7; ++u)
    EXPECT_EQ(s.recompute[u], s.place.stage_of_unit[u] == 0 ? F : N) << "unit " << u;
  EXPECT_EQ(recompute_of("directives:\n  - place: {pp: 2, stages: [{blocks: \"0-1\"}, {blocks: \"2-4\"}]}\n"
                         "  - recompute: {mode: full, stage: [1]}\n",
                         2),
            (std::vector<Recompute>{N, N, N, F, F, F, N}));
}

TEST(Recompute, DirectiveReadsAndWritesBack) {
  const config::Config c =
      parse("directives:\n  - recompute: {mode: full, blocks: [0, \"2-3\"], kind: [M, \"*\"], stage: [0, 1]}\n");
  ASSERT_EQ(c.directives.list.size(), 1u);
  const config::Directive& d = c.directives.list[0];
  EXPECT_EQ(d.kind, config::DirectiveKind::RECOMPUTE);
  EXPECT_EQ(d.mode, "full");
  EXPECT_EQ(d.filter.blocks, (config::Filter::Ranges{{0, 0}, {2, 3}}));
  EXPECT_EQ(d.filter.kinds, (std::vector<std::string>{"M", "*"}));
  EXPECT_EQ(d.filter.stages, (config::Filter::Ranges{{0, 0}, {1, 1}}));
  // to_yaml writes it so that it reads back alike.
  const config::Config back = config::parse(config::to_yaml(c), "back.yaml");
  EXPECT_TRUE(back.same_settings(c)) << config::to_yaml(c);
}

struct Refusal {
  const char* name;
  std::string yaml;  // after kModel: line 9 on
  int world;
  std::vector<std::string> needs;
};

std::ostream& operator<<(std::ostream& os, const Refusal& r) { return os << r.name; }

const std::vector<Refusal> kRefusals = {
    {"UnknownShorthandMode", "parallel:\n  recompute: ful\n", 1,
     {"d.yaml:10:3: parallel.recompute=\"ful\": unknown recompute mode 'ful'", "none, selective, full",
      "did you mean 'full'?"}},
    {"UnknownDirectiveMode", "directives:\n  - recompute: {mode: selctive}\n", 1,
     {"d.yaml:10:17: directives[0].recompute.mode: unknown recompute mode 'selctive'", "did you mean 'selective'?"}},
    {"NoMode", "directives:\n  - recompute: {blocks: 1}\n", 1,
     {"d.yaml:10:5: directives[0].recompute: a recompute directive needs its mode: key"}},
    {"UnknownKey", "directives:\n  - recompute: {mode: full, block: 1}\n", 1,
     {"d.yaml:10:29: directives[0].recompute: unknown key 'block'", "did you mean 'blocks'?"}},
    {"Embedding", "directives:\n  - recompute: {mode: full, kind: embed}\n", 1,
     {"d.yaml:10:29: directives[0].recompute.kind: the embedding is never recomputed", "select blocks"}},
    {"Head", "directives:\n  - recompute: {mode: full, kind: [M, head]}\n", 1,
     {"d.yaml:10:29: directives[0].recompute.kind: the head is never recomputed"}},
    {"NoSuchBlock", "directives:\n  - recompute: {mode: full, blocks: \"3-9\"}\n", 1,
     {"d.yaml:10:29: directives[0].recompute.blocks: block 9 does not exist; the pattern \"M*-M-\" has blocks 0..4"}},
    {"NoSuchStage", "parallel:\n  pp: 2\ndirectives:\n  - recompute: {mode: full, stage: 2}\n", 2,
     {"d.yaml:12:29: directives[0].recompute.stage: stage 2 does not exist; the placement has stages 0..1"}},
    {"SelectsNothing", "directives:\n  - recompute: {mode: full, blocks: 2, kind: M}\n", 1,
     {"d.yaml:10:5: directives[0].recompute: selects no block of the pattern \"M*-M-\""}},
    {"SelectiveOverMlpOnly", "directives:\n  - recompute: {mode: selective, kind: \"-\"}\n", 1,
     {"d.yaml:10:5: directives[0].recompute: selective recomputation drops the inner activations",
      "use mode: full"}},
    {"NegativeStage", "directives:\n  - recompute: {mode: full, stage: -1}\n", 1,
     {"d.yaml:10:36: directives[0].recompute.stage: stage indices start at 0; found -1"}},
};

class RecomputeRefusals : public ::testing::TestWithParam<Refusal> {};

TEST_P(RecomputeRefusals, NameTheKeyAndWhatWouldBeRight) {
  const Refusal& r = GetParam();
  std::string msg;
  try {
    ir::validate(parse(r.yaml), r.world);
  } catch (const config::ConfigError& e) {
    msg = e.what();
  }
  std::printf("[ recompute ] %s:\n%s\n", r.name, msg.c_str());
  ASSERT_FALSE(msg.empty()) << "accepted:\n" << r.yaml;
  for (const std::string& need : r.needs) EXPECT_NE(msg.find(need), std::string::npos) << "needs: " << need;
}

INSTANTIATE_TEST_SUITE_P(Table, RecomputeRefusals, ::testing::ValuesIn(kRefusals),
                         [](const auto& p) { return std::string(p.param.name); });

// ---- the DAG -------------------------------------------------------------------------------------

// With 2 Mamba groups, so that tp 2 splits them.
Plan plan(const std::string& parallel, int world) {
  const config::Config c = config::parse(kModel + parallel, "d.yaml", {"model.n_groups=2"});
  ir::validate(c, world);
  return compile(c, world);
}

// Every recomputed (unit, microbatch) has one RECOMP, and each rank runs it right before the unit's
// first backward segment; units not recomputed have none.
void expect_recomp_before_backward(const Plan& p) {
  const int n_mb = p.strategy.split.microbatches;
  int recomps = 0;
  for (const Node& n : p.graph.nodes()) recomps += n.kind == NodeKind::RECOMP;
  int expected = 0;
  for (size_t u = 0; u < p.model.units.size(); ++u)
    expected += p.strategy.recompute_of(static_cast<int>(u)) != Recompute::RECOMPUTE_NONE ? n_mb : 0;
  EXPECT_EQ(recomps, expected);
  EXPECT_GT(recomps, 0);
  for (int r = 0; r < p.strategy.world_size; ++r) {
    const Program prog = lower(p.graph, r);
    for (size_t i = 0; i < prog.compute.size(); ++i) {
      const Instr& in = prog.compute[i];
      const bool backward = in.kind == NodeKind::BWD || in.kind == NodeKind::BWD_I;
      if (in.kind == NodeKind::RECOMP) {
        EXPECT_EQ(in.recompute, p.strategy.recompute_of(in.unit));
        ASSERT_LT(i + 1, prog.compute.size());
        const Instr& next = prog.compute[i + 1];
        EXPECT_TRUE((next.kind == NodeKind::BWD || next.kind == NodeKind::BWD_I) && next.unit == in.unit &&
                    next.microbatch == in.microbatch && next.segment == 0)
            << "rank " << r << ": RECOMP of unit " << in.unit << " mb" << in.microbatch << " is followed by "
            << node_kind_name(next.kind) << " of unit " << next.unit;
      } else if (backward && in.segment == 0 && p.strategy.recompute_of(in.unit) != Recompute::RECOMPUTE_NONE) {
        ASSERT_GT(i, 0u);
        EXPECT_EQ(prog.compute[i - 1].kind, NodeKind::RECOMP) << "rank " << r << " unit " << in.unit;
      }
    }
  }
}

TEST(RecomputeDag, RecompRightBeforeTheBackwardInEverySchedule) {
  for (const std::string mode : {"selective", "full"})
    for (const std::string par : {"parallel:\n  microbatches: 2\n",
                                   "parallel:\n  pp: 2\n  microbatches: 4\n  schedule: gpipe\n",
                                   "parallel:\n  pp: 2\n  microbatches: 4\n",
                                   "parallel:\n  pp: 2\n  microbatches: 4\n  schedule: zbh1\n",
                                   "parallel:\n  pp: 2\n  microbatches: 4\n  schedule: interleaved\n  virtual_stages: 2\n",
                                   "parallel:\n  pp: 2\n  microbatches: 4\n  schedule: dualpipev\n",
                                   "parallel:\n  tp: 2\n  microbatches: 2\n",
                                   "parallel:\n  dp: 2\n  zero: 3\n  microbatches: 2\n"}) {
      SCOPED_TRACE(mode + " " + par);
      const std::string yaml = par + "  recompute: " + mode + "\n";
      int world = 1;
      for (const char* k : {"pp: 2", "tp: 2", "dp: 2"}) world *= par.find(k) != std::string::npos ? 2 : 1;
      expect_recomp_before_backward(plan(yaml, world));
    }
}

TEST(RecomputeDag, RecompHasNoCollectiveAndReadsTheForwardAndItsInput) {
  const Plan p = plan("parallel:\n  tp: 2\n  pp: 2\n  microbatches: 2\n  recompute: full\n", 4);
  for (const Node& n : p.graph.nodes()) {
    if (n.kind != NodeKind::RECOMP) continue;
    std::vector<int> srcs;
    for (int e : p.graph.in_edges()[static_cast<size_t>(n.id)])
      if (p.graph.edges()[static_cast<size_t>(e)].kind == EdgeKind::EDGE_DATA)
        srcs.push_back(p.graph.edges()[static_cast<size_t>(e)].src);
    bool own_forward = false, input = false;
    for (int s : srcs) {
      const Node& a = p.graph.node(s);
      own_forward |= a.kind == NodeKind::FWD && a.tags.unit == n.tags.unit;
      input |= (a.kind == NodeKind::RECV || a.tags.unit == n.tags.unit - 1) && a.tags.microbatch == n.tags.microbatch;
    }
    EXPECT_TRUE(own_forward && input) << describe(n, {});
    for (int e : p.graph.out_edges()[static_cast<size_t>(n.id)])
      EXPECT_TRUE(is_compute(p.graph.node(p.graph.edges()[static_cast<size_t>(e)].dst).kind))
          << describe(n, {}) << " feeds a communication node";
  }
}

TEST(RecomputeDag, VerifierRefusesABackwardWithoutItsRecomp) {
  const Plan p = plan("parallel:\n  microbatches: 2\n  recompute: full\n", 1);
  // The same graph with the data edges from RECOMP to the backward left out.
  Graph g;
  for (const Node& n : p.graph.nodes()) g.add_node(n);
  int dropped = 0;
  for (const Edge& e : p.graph.edges()) {
    const bool recomp_to_bwd = p.graph.node(e.src).kind == NodeKind::RECOMP && e.kind == EdgeKind::EDGE_DATA;
    if (recomp_to_bwd && dropped++ == 0) continue;
    g.add_edge(e.src, e.dst, e.kind);
  }
  ASSERT_EQ(dropped, 2 * 5);  // 5 blocks x 2 microbatches
  std::string msg;
  try {
    verify(g, p.model);
  } catch (const VerifyError& e) {
    msg = e.what();
  }
  std::printf("%s\n", msg.c_str());
  EXPECT_NE(msg.find("input not produced: its recomputed state (RECOMP"), std::string::npos) << msg;
  EXPECT_NO_THROW(verify(p.graph, p.model));
}

TEST(RecomputeDag, BuilderRefusesRecomputingTheEmbeddingOrSelectiveMlp) {
  const config::ModelConfig m = testing::small_model("M*-M-");
  const ModelGraph model = make_model_graph(m);
  Strategy s;
  s.split.microbatches = 1;
  s = testing::with_units(s, m, false);
  s.recompute.assign(model.units.size(), N);
  s.recompute[0] = F;
  EXPECT_THROW(build(model, s), BuildError);
  s.recompute[0] = N;
  s.recompute[3] = S;  // layers.2, an MLP block
  try {
    build(model, s);
    ADD_FAILURE() << "selective MLP accepted";
  } catch (const BuildError& e) {
    EXPECT_NE(std::string(e.what()).find("layers.2"), std::string::npos) << e.what();
  }
}

TEST(RecomputeDag, PlanHashAndPrintingCoverTheMode) {
  const Plan none = plan("parallel:\n  microbatches: 2\n", 1);
  const Plan sel = plan("parallel:\n  microbatches: 2\n  recompute: selective\n", 1);
  const Plan full = plan("parallel:\n  microbatches: 2\n  recompute: full\n", 1);
  EXPECT_NE(none.hash, sel.hash);
  EXPECT_NE(sel.hash, full.hash);
  // Full over the attention and Mamba blocks only has the same nodes and edges as selective: the mode tells them apart.
  const Plan full_mixers =
      plan("parallel:\n  microbatches: 2\ndirectives:\n  - recompute: {mode: full, kind: [M, \"*\"]}\n", 1);
  EXPECT_EQ(full_mixers.graph.nodes().size(), sel.graph.nodes().size());
  EXPECT_NE(full_mixers.hash, sel.hash);
  const std::string text = format_program(lower(sel.graph, 0), sel.model);
  EXPECT_NE(text.find("RECOMP"), std::string::npos) << text;
  EXPECT_NE(text.find("selective"), std::string::npos) << text;
  EXPECT_NE(summary(full.graph, full.model).find("RECOMP=10"), std::string::npos) << summary(full.graph, full.model);
}

TEST(RecomputeDirectivesYaml, ReadsBackToTheSameStrategy) {
  for (const std::string& yaml :
       {std::string("parallel:\n  recompute: full\n"), std::string("parallel:\n  recompute: selective\n"),
        std::string("parallel:\n  pp: 2\n  recompute: full\ndirectives:\n  - recompute: {mode: none, stage: 1}\n"
                    "  - recompute: {mode: selective, blocks: 3}\n"),
        std::string("directives:\n  - recompute: {mode: full, blocks: [0, 2]}\n")}) {
    SCOPED_TRACE(yaml);
    const int world = yaml.find("pp: 2") != std::string::npos ? 2 : 1;
    const config::Config c = parse(yaml);
    ir::validate(c, world);
    const Strategy s = expand(c, world);
    const std::string text = directives_yaml(s, make_model_graph(c.model));
    std::printf("%s", text.c_str());
    // Under a shorthand that says otherwise.
    const config::Config back = parse("parallel:\n  recompute: selective\n" + text);
    ASSERT_NO_THROW(ir::validate(back, world)) << text;
    EXPECT_EQ(expand(back, world).recompute, s.recompute) << text;  // the order reads back as a hand-written one
    EXPECT_EQ(compile(back, world).hash, compile(c, world).hash) << text;
  }
}

}  // namespace
}  // namespace piper::ir
