// test_ir.cpp — unit tests of the IR: model graph, single-rank and pipeline DAG builds, placement
// errors, verifier, lowering, hashing, compile and printing. Multi-rank strategies (data parallel,
// ZeRO, pipelines over a rank grid) are in test_build_parallel.cpp; the schedules themselves in
// test_pipeline_schedules.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "config/config.hpp"
#include "ir/build.hpp"
#include "ir/compile.hpp"
#include "ir/graph.hpp"
#include "ir/model_graph.hpp"
#include "ir/program.hpp"
#include "ir/strategy.hpp"
#include "ir/verify.hpp"
#include "unit/ir/strategy_in_code.hpp"
#include "unit/test_configs.hpp"
#include "unit/ir/graph_checks.hpp"

namespace piper::ir {
namespace {

using testing::find_node;
using testing::has_edge;


// ---- helpers ------------------------------------------------------------------------

// The small model (unit/test_configs.hpp): D 16, H 4 (hd 4), KV 2, F 24, N 8, P 8, expand 2
// (d_inner 32, Hm 4), G 2, K 4, V 32.
using testing::small_model;

config::Config small_config(const std::string& pattern = "M*-M-", int64_t mb = 2,
                            const std::string& schedule = "1f1b", bool split_backward = false) {
  config::Config c;
  c.model = small_model(pattern);
  c.parallel.microbatches = mb;
  c.parallel.schedule = schedule;
  c.parallel.split_backward = split_backward;
  return c;
}

// A pipeline-only strategy: `world` pipeline ranks (pp = world, dp = tp = 1), one
// stage per rank for the one-chunk schedules.
// Every unit's values are those of the model "M*-M-" (7 units), stages balanced when none are given.
Strategy strategy(int mb, bool split_backward, ScheduleKind sched = ScheduleKind::SCHEDULE_1F1B,
                  std::vector<int> stage_of_unit = {}, int world = 1) {
  Strategy s;
  s.world_size = world;
  s.place.pp = world;
  s.split.microbatches = mb;
  s.place.stage_of_unit = std::move(stage_of_unit);
  s.order.schedule = sched;
  return testing::with_units(s, small_model("M*-M-"), split_backward);
}

std::map<NodeKind, int> count_kinds(const Graph& g) {
  std::map<NodeKind, int> c;
  for (const Node& n : g.nodes()) ++c[n.kind];
  return c;
}

// A copy of g without the nodes `keep_node` rejects (edges touching them dropped)
// and without the edges `keep_edge` rejects; node ids are renumbered densely.
Graph rebuild(const Graph& g, const std::function<bool(const Node&)>& keep_node,
              const std::function<bool(const Edge&)>& keep_edge = nullptr) {
  Graph out;
  std::vector<int> remap(g.nodes().size(), -1);
  for (const Node& n : g.nodes())
    if (keep_node(n)) remap[static_cast<size_t>(n.id)] = out.add_node(n);
  for (const Edge& e : g.edges()) {
    if (keep_edge && !keep_edge(e)) continue;
    int s = remap[static_cast<size_t>(e.src)], d = remap[static_cast<size_t>(e.dst)];
    if (s >= 0 && d >= 0) out.add_edge(s, d, e.kind);
  }
  return out;
}

// The compute nodes of `rank` in the order the ordering edges chain them; fails
// the test if the ordering edges among them are not one simple chain over all of them.
std::vector<int> order_chain(const Graph& g, int rank) {
  std::set<int> mine;
  for (const Node& n : g.nodes())
    if (is_compute(n.kind) && n.devices == std::vector<int>{rank}) mine.insert(n.id);
  std::map<int, int> next, prev;
  for (const Edge& e : g.edges()) {
    if (e.kind != EdgeKind::EDGE_ORDER || !mine.count(e.src)) continue;
    EXPECT_TRUE(mine.count(e.dst)) << "order edge leaves rank " << rank;
    EXPECT_FALSE(next.count(e.src)) << "node " << e.src << " has two order successors";
    EXPECT_FALSE(prev.count(e.dst)) << "node " << e.dst << " has two order predecessors";
    next[e.src] = e.dst;
    prev[e.dst] = e.src;
  }
  std::vector<int> starts;
  for (int id : mine)
    if (!prev.count(id)) starts.push_back(id);
  EXPECT_EQ(starts.size(), 1u) << "rank " << rank << " order has " << starts.size() << " starts";
  std::vector<int> chain;
  if (starts.empty()) return chain;
  for (int v = starts.front();; v = next.at(v)) {
    chain.push_back(v);
    if (!next.count(v) || chain.size() > mine.size()) break;
  }
  EXPECT_EQ(chain.size(), mine.size()) << "the order of rank " << rank << " does not cover its compute nodes";
  return chain;
}

std::vector<std::string> names_of(const ModelGraph& m) {
  std::vector<std::string> v;
  for (const auto& u : m.units) v.push_back(u.name);
  return v;
}

// ---- model_graph ----------------------------------------------------------------------

TEST(ModelGraph, NamesAndShapesFollowTheSpec) {
  const auto cfg = small_model("M*-M-");
  const ModelGraph mg = make_model_graph(cfg);
  // Sizes from docs/model.md, computed here by hand.
  const int64_t D = 16, V = 32, H = 4, KV = 2, hd = D / H, F = 24, N = 8, P = 8, G = 2, K = 4;
  const int64_t di = 2 * D;           // expand * D = 32
  const int64_t Hm = di / P;          // 4
  const int64_t C = di + 2 * G * N;   // 64
  const int64_t R = 2 * di + 2 * G * N + Hm;  // 100
  ASSERT_EQ(R, 100);
  using Shape = std::vector<int64_t>;
  auto mamba = [&](int i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    return std::vector<std::pair<std::string, Shape>>{
        {p + "norm.weight", {D}},
        {p + "mixer.in_proj.weight", {R, D}},
        {p + "mixer.conv1d.weight", {C, K}},
        {p + "mixer.conv1d.bias", {C}},
        {p + "mixer.dt_bias", {Hm}},
        {p + "mixer.A_log", {Hm}},
        {p + "mixer.D", {Hm}},
        {p + "mixer.norm.weight", {di}},
        {p + "mixer.out_proj.weight", {D, di}}};
  };
  auto attention = [&](int i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    return std::vector<std::pair<std::string, Shape>>{{p + "norm.weight", {D}},
                                                      {p + "mixer.q_proj.weight", {H * hd, D}},
                                                      {p + "mixer.k_proj.weight", {KV * hd, D}},
                                                      {p + "mixer.v_proj.weight", {KV * hd, D}},
                                                      {p + "mixer.o_proj.weight", {D, H * hd}}};
  };
  auto mlp = [&](int i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    return std::vector<std::pair<std::string, Shape>>{{p + "norm.weight", {D}},
                                                      {p + "mixer.gate_proj.weight", {F, D}},
                                                      {p + "mixer.up_proj.weight", {F, D}},
                                                      {p + "mixer.down_proj.weight", {D, F}}};
  };
  struct Want {
    std::string name;
    UnitKind kind;
    int block;
    std::vector<std::pair<std::string, Shape>> params;
  };
  const std::vector<Want> want = {
      {"embed", UnitKind::UNIT_EMBED, -1, {{"embed.weight", {V, D}}}},
      {"layers.0", UnitKind::UNIT_MAMBA, 0, mamba(0)},
      {"layers.1", UnitKind::UNIT_ATTENTION, 1, attention(1)},
      {"layers.2", UnitKind::UNIT_MLP, 2, mlp(2)},
      {"layers.3", UnitKind::UNIT_MAMBA, 3, mamba(3)},
      {"layers.4", UnitKind::UNIT_MLP, 4, mlp(4)},
      {"head", UnitKind::UNIT_HEAD, -1, {{"final_norm.weight", {D}}, {"lm_head.weight", {V, D}}}},
  };
  ASSERT_EQ(mg.units.size(), want.size());
  int64_t total = 0;
  for (size_t u = 0; u < want.size(); ++u) {
    const UnitSpec& us = mg.units[u];
    SCOPED_TRACE(want[u].name);
    EXPECT_EQ(us.index, static_cast<int>(u));
    EXPECT_EQ(us.name, want[u].name);
    EXPECT_EQ(us.kind, want[u].kind);
    EXPECT_EQ(us.block, want[u].block);
    ASSERT_EQ(us.params.size(), want[u].params.size());
    int64_t unit_total = 0;
    for (size_t i = 0; i < us.params.size(); ++i) {
      const ParamSpec& p = us.params[i];
      EXPECT_EQ(p.name, want[u].params[i].first);
      EXPECT_EQ(p.shape, want[u].params[i].second) << p.name;
      // AdamW decays exactly the 2-D (and 3-D) weights.
      EXPECT_EQ(p.weight_decay, p.shape.size() >= 2) << p.name;
      int64_t n = 1;
      for (int64_t d : want[u].params[i].second) n *= d;
      EXPECT_EQ(p.numel(), n) << p.name;
      unit_total += n;
    }
    EXPECT_EQ(us.param_count(), unit_total);
    total += unit_total;
  }
  EXPECT_EQ(mg.param_count(), total);
}

TEST(ModelGraph, InitKindsAndSymbols) {
  const ModelGraph mg = make_model_graph(small_model("M*-"));
  std::map<std::string, InitKind> kinds;
  for (const auto& u : mg.units)
    for (const auto& p : u.params) kinds[p.name] = p.init;
  EXPECT_EQ(kinds.at("layers.0.mixer.A_log"), InitKind::INIT_A_LOG);
  EXPECT_EQ(kinds.at("layers.0.mixer.dt_bias"), InitKind::INIT_DT_BIAS);
  EXPECT_EQ(kinds.at("layers.0.mixer.D"), InitKind::INIT_ONES);
  EXPECT_EQ(kinds.at("layers.0.norm.weight"), InitKind::INIT_ONES);
  EXPECT_EQ(kinds.at("final_norm.weight"), InitKind::INIT_ONES);
  EXPECT_EQ(kinds.at("lm_head.weight"), InitKind::INIT_NORMAL);
  std::string symbols;
  for (const auto& u : mg.units) symbols += unit_symbol(u.kind);
  EXPECT_EQ(symbols, "eM*-h");
  EXPECT_STREQ(unit_kind_name(UnitKind::UNIT_ATTENTION), "attention");
  EXPECT_THROW(make_model_graph(small_model("M?-")), std::invalid_argument);
}

// ---- build ------------------------------------------------------------------------------

TEST(Build, NodeCountsByKind) {
  const ModelGraph mg = make_model_graph(small_model("M*-M-"));
  const int units = static_cast<int>(mg.units.size());
  ASSERT_EQ(units, 7);
  for (int mb : {1, 2, 4}) {
    for (bool sb : {false, true}) {
      SCOPED_TRACE("mb " + std::to_string(mb) + (sb ? " split" : " fused"));
      const Graph g = build(mg, strategy(mb, sb));
      auto c = count_kinds(g);
      EXPECT_EQ(c[NodeKind::FWD], units * mb);
      EXPECT_EQ(c[NodeKind::UPD], units);
      if (sb) {
        EXPECT_EQ(c[NodeKind::BWD], 0);
        EXPECT_EQ(c[NodeKind::BWD_I], (units - 1) * mb);  // the embedding has no input gradient
        EXPECT_EQ(c[NodeKind::BWD_W], units * mb);
        for (int m = 0; m < mb; ++m) EXPECT_EQ(find_node(g, NodeKind::BWD_I, 0, m), -1);
      } else {
        EXPECT_EQ(c[NodeKind::BWD], units * mb);
        EXPECT_EQ(c[NodeKind::BWD_I], 0);
        EXPECT_EQ(c[NodeKind::BWD_W], 0);
      }
      EXPECT_EQ(c[NodeKind::SEND], 0);
      EXPECT_EQ(c[NodeKind::RECV], 0);
      EXPECT_EQ(c[NodeKind::NORM], 1);  // one rank: its norm is the world's, no all-reduce
      EXPECT_EQ(g.nodes().size(), static_cast<size_t>(units * mb * (sb ? 3 : 2) - (sb ? mb : 0) + units + 1));
      for (const Node& n : g.nodes()) {
        EXPECT_EQ(n.devices, std::vector<int>{0});
        EXPECT_EQ(n.stream, Stream::STREAM_COMPUTE);
        EXPECT_EQ(n.tags.segment, 0);  // tp 1: every pass is one segment
        if (n.kind == NodeKind::NORM) continue;
        EXPECT_EQ(n.tags.block, mg.units[static_cast<size_t>(n.tags.unit)].block);
        EXPECT_EQ(n.tags.microbatch < 0, n.kind == NodeKind::UPD);
      }
      // Data edges: FWD(u-1) -> FWD(u); the backward chain runs the other way.
      for (int m = 0; m < mb; ++m) {
        for (int u = 1; u < units; ++u)
          EXPECT_TRUE(has_edge(g, find_node(g, NodeKind::FWD, u - 1, m), find_node(g, NodeKind::FWD, u, m),
                               EdgeKind::EDGE_DATA))
              << "FWD " << u - 1 << " -> FWD " << u << " mb" << m;
        for (int u = 0; u + 1 < units; ++u) {
          int down = find_node(g, sb ? NodeKind::BWD_I : NodeKind::BWD, u + 1, m);
          int up = find_node(g, sb ? (u == 0 ? NodeKind::BWD_W : NodeKind::BWD_I) : NodeKind::BWD, u, m);
          EXPECT_TRUE(has_edge(g, down, up, EdgeKind::EDGE_DATA)) << "backward " << u + 1 << " -> " << u;
        }
        for (int u = 0; u < units; ++u)
          EXPECT_TRUE(has_edge(g, find_node(g, sb ? NodeKind::BWD_W : NodeKind::BWD, u, m),
                               find_node(g, NodeKind::UPD, u, -1), EdgeKind::EDGE_DATA));
      }
      // Ordering edges chain the whole program of the one rank, updates last.
      auto chain = order_chain(g, 0);
      ASSERT_EQ(chain.size(), static_cast<size_t>(c[NodeKind::FWD] + c[NodeKind::BWD] + c[NodeKind::BWD_I] +
                                                  c[NodeKind::BWD_W] + c[NodeKind::NORM] + c[NodeKind::UPD]));
      for (int i = 0; i < units; ++i)
        EXPECT_EQ(g.node(chain[chain.size() - static_cast<size_t>(units - i)]).kind, NodeKind::UPD);
      EXPECT_EQ(g.node(chain[chain.size() - static_cast<size_t>(units) - 1]).kind, NodeKind::NORM);
      EXPECT_NO_THROW(verify(g, mg));
    }
  }
}

TEST(Build, TwoStagesInsertSendRecvPairs) {
  const ModelGraph mg = make_model_graph(small_model("M*-M-"));
  for (int mb : {1, 2, 4}) {
    for (bool sb : {false, true}) {
      SCOPED_TRACE("mb " + std::to_string(mb) + (sb ? " split" : " fused"));
      const Graph g = build(mg, strategy(mb, sb, ScheduleKind::SCHEDULE_1F1B, {0, 0, 0, 1, 1, 1, 1}, 2));
      auto c = count_kinds(g);
      // One cut: forward activations go 0 -> 1, input gradients 1 -> 0, per microbatch.
      EXPECT_EQ(c[NodeKind::SEND], 2 * mb);
      EXPECT_EQ(c[NodeKind::RECV], 2 * mb);
      EXPECT_EQ(g.world_size(), 2);
      for (const Node& n : g.nodes()) {
        if (n.kind == NodeKind::NORM || n.payload == Payload::PAYLOAD_NORM) continue;  // per pipeline rank, the world
        if (is_compute(n.kind)) {
          EXPECT_EQ(n.devices.front(), n.tags.unit <= 2 ? 0 : 1);
          EXPECT_EQ(n.tags.stage, n.tags.unit <= 2 ? 0 : 1);
        } else {
          EXPECT_EQ(n.stream, Stream::STREAM_COMM);
          ASSERT_EQ(n.devices.size(), 1u);
          // peers align with devices: the one rank on the other side of the cut
          EXPECT_EQ(n.peers, std::vector<int>{1 - n.devices.front()});
          // activations go down (SEND on rank 0), input gradients come back up (SEND on rank 1)
          const bool down = (n.kind == NodeKind::SEND) == (n.devices.front() == 0);
          EXPECT_EQ(n.payload, down ? Payload::PAYLOAD_ACTIVATION : Payload::PAYLOAD_GRADIENT);
        }
      }
      for (const Edge& e : g.edges())
        if (g.node(e.src).devices != g.node(e.dst).devices && g.node(e.src).payload != Payload::PAYLOAD_NORM &&
            g.node(e.dst).payload != Payload::PAYLOAD_NORM) {
          EXPECT_EQ(g.node(e.src).kind, NodeKind::SEND);
          EXPECT_EQ(g.node(e.dst).kind, NodeKind::RECV);
          EXPECT_EQ(e.kind, EdgeKind::EDGE_DATA);
        }
      order_chain(g, 0);
      order_chain(g, 1);
      EXPECT_NO_THROW(verify(g, mg));
    }
  }
}

TEST(Build, BadDirectivesThrowBuildError) {
  const ModelGraph mg = make_model_graph(small_model("M*-M-"));  // 7 units: embed, layers.0..4, head
  auto expect_error = [&](const Strategy& s, const std::vector<std::string>& words) {
    try {
      build(mg, s);
      ADD_FAILURE() << "no BuildError";
    } catch (const BuildError& e) {
      for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what() << " lacks " << w;
    }
  };
  expect_error(strategy(0, false), {"microbatches must be >= 1"});
  expect_error(strategy(1, false, ScheduleKind::SCHEDULE_1F1B, {0, 0, 1}, 2), {"stage_of_unit lists 3", "has 7"});
  // not contiguous: layers.2 goes back to stage 0 after layers.1 on stage 1
  expect_error(strategy(1, false, ScheduleKind::SCHEDULE_1F1B, {0, 0, 1, 0, 1, 1, 1}, 2),
               {"place:", "unit layers.2", "is on stage 0 but comes after layers.1 on stage 1", "stages run along the model"});
  // skips a stage: stage 1 of three holds nothing, layers.2 jumps from 0 to 2
  expect_error(strategy(1, false, ScheduleKind::SCHEDULE_1F1B, {0, 0, 0, 2, 2, 2, 2}, 3),
               {"unit layers.2", "is on stage 2 right after layers.1 on stage 0", "stage 1 holds no unit"});
  // leaves the last stage empty: the head must sit on the last stage
  expect_error(strategy(1, false, ScheduleKind::SCHEDULE_1F1B, {0, 0, 0, 1, 1, 1, 1}, 3),
               {"the last unit, head, is on stage 1", "stage 2 holds no unit"});
  // the first unit must sit on stage 0
  expect_error(strategy(1, false, ScheduleKind::SCHEDULE_1F1B, {1, 1, 1, 1, 1, 1, 1}, 2), {"the first unit, embed, is on stage 1", "stage 0 holds no unit"});
  // a stage outside the pipeline
  expect_error(strategy(1, false, ScheduleKind::SCHEDULE_1F1B, {0, 0, 0, 1, 1, 1, 2}, 2), {"unit head is on stage 2"});
  expect_error(strategy(1, false, ScheduleKind::SCHEDULE_1F1B, {-1, 0, 0, 1, 1, 1, 1}, 2), {"unit embed is on stage -1"});
  // one stage with one unit each is the limit: 8 stages for 7 units is too many
  expect_error(strategy(1, false, ScheduleKind::SCHEDULE_1F1B, {}, 8),
               {"place:", "7 units", "too few for 8 pipeline stages", "pp 8 x 1 chunks"});
  {
    Strategy s = strategy(8, false, ScheduleKind::SCHEDULE_INTERLEAVED, {}, 4);
    s.place.virtual_stages = 2;  // 4 ranks x 2 chunks = 8 stages
    expect_error(s, {"too few for 8 pipeline stages", "pp 4 x 2 chunks"});
    s.place.pp = 2;  // 4 stages on a 4-rank world with dp = tp = 1: the grid does not add up
    expect_error(s, {"grid:", "world size 4", "pp(2)"});
    s.world_size = 2;
    EXPECT_NO_THROW(verify(build(mg, s), mg));
  }
  {
    // exactly as many stages as units is fine
    const Graph g = build(mg, strategy(7, false, ScheduleKind::SCHEDULE_1F1B, {}, 7));
    for (const Node& n : g.nodes())
      if (is_compute(n.kind) && n.kind != NodeKind::NORM) {
        EXPECT_EQ(n.tags.stage, n.tags.unit);
      }
    EXPECT_NO_THROW(verify(g, mg));
  }
  // schedule constraints come back as order errors
  expect_error(strategy(2, false, ScheduleKind::SCHEDULE_INTERLEAVED, {0, 0, 0, 1, 1, 1, 1}, 2),
               {"order:", "interleaved"});
  expect_error(strategy(3, true, ScheduleKind::SCHEDULE_DUALPIPEV, {}, 2), {"order:", "dualpipev", "microbatches"});
  expect_error(strategy(2, false, ScheduleKind::SCHEDULE_ZBH1, {}, 2), {"order:", "zbh1", "split_backward"});
}

// The grid's sizes must multiply to the world size; the message starts "grid:" and prints every factor.
TEST(Build, GridThatDoesNotMatchTheWorldIsABuildError) {
  const ModelGraph mg = make_model_graph(small_model("M*-M-"));
  auto message = [&](const Strategy& s) -> std::string {
    try {
      build(mg, s);
    } catch (const BuildError& e) {
      return e.what();
    }
    return "(no BuildError)";
  };
  Strategy s = strategy(2, false);
  s.world_size = 3;
  s.replicate.dp = 2;
  std::string m = message(s);
  EXPECT_EQ(m.rfind("grid:", 0), 0u) << m;
  EXPECT_NE(m.find("world size 3"), std::string::npos) << m;
  EXPECT_NE(m.find("dp(2)"), std::string::npos) << m;
  s.world_size = 0;
  s.replicate.dp = 1;
  m = message(s);
  EXPECT_EQ(m.rfind("grid:", 0), 0u) << m;
  EXPECT_NE(m.find("world size 0"), std::string::npos) << m;
  // an order that lacks a dimension in use, or names an unknown one
  s = strategy(2, false, ScheduleKind::SCHEDULE_1F1B, {}, 2);
  s.grid_order = "tp-dp";
  m = message(s);
  EXPECT_EQ(m.rfind("grid:", 0), 0u) << m;
  EXPECT_NE(m.find("does not name pp"), std::string::npos) << m;
  s.grid_order = "tp-xx-pp";
  m = message(s);
  EXPECT_EQ(m.rfind("grid:", 0), 0u) << m;
  EXPECT_NE(m.find("unknown dimension 'xx'"), std::string::npos) << m;
  s.grid_order = "pp-dp-tp";  // another order is fine
  EXPECT_NO_THROW(verify(build(mg, s), mg));
}

// ---- schedule names -------------------------------------------------------------------
// (the schedules themselves: test_pipeline_schedules.cpp)

TEST(Schedule, NamesParseAndPrint) {
  EXPECT_EQ(parse_schedule("gpipe"), ScheduleKind::SCHEDULE_GPIPE);
  EXPECT_EQ(parse_schedule("dualpipev"), ScheduleKind::SCHEDULE_DUALPIPEV);
  EXPECT_THROW(parse_schedule("2f2b"), std::invalid_argument);
  for (auto k : {ScheduleKind::SCHEDULE_GPIPE, ScheduleKind::SCHEDULE_1F1B, ScheduleKind::SCHEDULE_INTERLEAVED,
                 ScheduleKind::SCHEDULE_ZBH1, ScheduleKind::SCHEDULE_DUALPIPEV})
    EXPECT_EQ(parse_schedule(schedule_name(k)), k);
}

// Multi-stage pipelines built from every schedule are acyclic and complete.
TEST(Build, PipelinesBuildAndVerify) {
  const ModelGraph mg = make_model_graph(small_model("M*-M-"));
  // given placements, and the balanced one (empty) for 1..4 stages
  const std::vector<std::vector<int>> placements = {
      {0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 1, 1, 1, 1}, {0, 0, 1, 1, 2, 2, 2}, {0, 1, 1, 2, 2, 3, 3}};
  for (auto kind : {ScheduleKind::SCHEDULE_GPIPE, ScheduleKind::SCHEDULE_1F1B, ScheduleKind::SCHEDULE_ZBH1})
    for (size_t p = 0; p < placements.size(); ++p)
      for (bool balanced : {false, true})
        for (int mb : {1, 2, 3, 5})
          for (bool sb : {false, true}) {
            if (kind == ScheduleKind::SCHEDULE_ZBH1 && !sb) continue;  // zbh1 needs the split
            SCOPED_TRACE(std::string(schedule_name(kind)) + " stages " + std::to_string(p + 1) + " mb " +
                         std::to_string(mb) + (sb ? " split" : "") + (balanced ? " balanced" : ""));
            const Graph g = build(mg, strategy(mb, sb, kind, balanced ? std::vector<int>{} : placements[p],
                                               static_cast<int>(p) + 1));
            EXPECT_NO_THROW(verify(g, mg));
            for (int r = 0; r <= static_cast<int>(p); ++r) order_chain(g, r);
            std::set<int> stages;
            for (const Node& n : g.nodes()) {
              stages.insert(n.tags.stage);
              if (is_compute(n.kind)) {
                // one stage per rank for these schedules: stage = rank
                EXPECT_EQ(n.devices, std::vector<int>{n.tags.stage});
                if (!balanced && n.kind != NodeKind::NORM) {
                  EXPECT_EQ(n.tags.stage, placements[p][static_cast<size_t>(n.tags.unit)]);
                }
              }
            }
            EXPECT_EQ(stages.size(), p + 1);
          }
}

// ---- verify -----------------------------------------------------------------------------

struct Broken {
  std::string what;
  Graph graph;
  std::vector<std::string> words;  // the message must contain each
};

TEST(Verify, BrokenGraphsAreRejected) {
  const ModelGraph mg = make_model_graph(small_model("M*-M-"));
  const Graph one = build(mg, strategy(2, false));
  const Graph split = build(mg, strategy(2, true));
  const Graph two = build(mg, strategy(2, false, ScheduleKind::SCHEDULE_1F1B, {0, 0, 0, 1, 1, 1, 1}, 2));
  ASSERT_NO_THROW(verify(one, mg));
  ASSERT_NO_THROW(verify(split, mg));
  ASSERT_NO_THROW(verify(two, mg));
  auto is = [](NodeKind k, int unit, int mb) {
    return [=](const Node& n) { return n.kind == k && n.tags.unit == unit && n.tags.microbatch == mb; };
  };
  auto drop_node = [](const Graph& g, std::function<bool(const Node&)> match) {
    return rebuild(g, [&](const Node& n) { return !match(n); });
  };
  auto drop_edge = [](const Graph& g, int src, int dst, EdgeKind kind) {
    EXPECT_TRUE(has_edge(g, src, dst, kind)) << "the mutation must remove an existing edge";
    return rebuild(g, [](const Node&) { return true; },
                   [=](const Edge& e) { return !(e.src == src && e.dst == dst && e.kind == kind); });
  };
  auto with_edge = [](const Graph& g, int src, int dst, EdgeKind kind) {
    Graph c = g;
    c.add_edge(src, dst, kind);
    return c;
  };

  std::vector<Broken> cases;
  cases.push_back({"dangling edge", with_edge(one, 0, static_cast<int>(one.nodes().size()) + 3, EdgeKind::EDGE_ORDER),
                   {"does not exist", std::to_string(one.nodes().size()) + " nodes"}});
  cases.push_back({"ordering cycle on one rank",
                   with_edge(one, find_node(one, NodeKind::UPD, 6, -1), find_node(one, NodeKind::FWD, 0, 0),
                             EdgeKind::EDGE_ORDER),
                   {"deadlock", "rank 0", "cycle"}});
  {
    // Rank 1's order rewritten as one sequence that starts with microbatch 1's
    // backwards: they wait for forwards the order puts after them.
    std::vector<int> seq;
    for (const auto& in : lower(two, 1).compute) seq.push_back(in.node);
    std::stable_partition(seq.begin(), seq.end(), [&](int id) {
      return two.node(id).kind == NodeKind::BWD && two.node(id).tags.microbatch == 1;
    });
    Graph h = rebuild(two, [](const Node&) { return true; }, [&](const Edge& e) {
      return !(e.kind == EdgeKind::EDGE_ORDER && two.node(e.src).devices.front() == 1);
    });
    for (size_t i = 1; i < seq.size(); ++i) h.add_edge(seq[i - 1], seq[i], EdgeKind::EDGE_ORDER);
    cases.push_back({"stage 1 runs a backward before its forward", h, {"deadlock", "rank 1"}});
  }
  {
    // One ordering edge in the middle removed: two sequences on rank 0.
    const auto prog = lower(one, 0).compute;
    const int a = prog[prog.size() / 2].node, b = prog[prog.size() / 2 + 1].node;
    cases.push_back({"order split in two", drop_edge(one, a, b, EdgeKind::EDGE_ORDER),
                     {"rank 0", "2 separate sequences"}});
  }
  // unit u is block layers.(u-1): unit 2 is layers.1
  cases.push_back({"missing FWD", drop_node(one, is(NodeKind::FWD, 2, 0)), {"missing FWD layers.1 mb0"}});
  cases.push_back({"missing fused backward", drop_node(one, is(NodeKind::BWD, 2, 1)),
                   {"missing backward", "layers.1 mb1"}});
  cases.push_back({"missing input half of a split backward", drop_node(split, is(NodeKind::BWD_I, 3, 0)),
                   {"missing backward", "layers.2 mb0"}});
  cases.push_back({"missing weight half of the embedding", drop_node(split, is(NodeKind::BWD_W, 0, 1)),
                   {"missing backward", "embed mb1"}});
  cases.push_back({"missing UPD", drop_node(one, is(NodeKind::UPD, 6, -1)), {"missing UPD head"}});
  cases.push_back({"FWD without its input edge",
                   drop_edge(one, find_node(one, NodeKind::FWD, 1, 0), find_node(one, NodeKind::FWD, 2, 0),
                             EdgeKind::EDGE_DATA),
                   {"FWD layers.1 mb0", "rank 0", "input not produced", "FWD layers.0 mb0"}});
  cases.push_back({"BWD without the next unit's input gradient",
                   drop_edge(one, find_node(one, NodeKind::BWD, 2, 1), find_node(one, NodeKind::BWD, 1, 1),
                             EdgeKind::EDGE_DATA),
                   {"BWD layers.0 mb1", "input not produced", "BWD layers.1 mb1"}});
  cases.push_back({"BWD_W without its input half",
                   drop_edge(split, find_node(split, NodeKind::BWD_I, 4, 0), find_node(split, NodeKind::BWD_W, 4, 0),
                             EdgeKind::EDGE_DATA),
                   {"BWD_W layers.3 mb0", "input not produced", "BWD_I layers.3 mb0"}});
  cases.push_back({"ordering edge across ranks",
                   with_edge(two, find_node(two, NodeKind::FWD, 0, 0), find_node(two, NodeKind::FWD, 5, 1),
                             EdgeKind::EDGE_ORDER),
                   {"ordering edge", "FWD embed mb0 on rank 0", "FWD layers.4 mb1 on rank 1", "different ranks"}});
  {
    // the forward RECV of microbatch 0 (tagged like the SEND, with its producer: layers.1)
    int recv = -1;
    for (const Node& n : two.nodes())
      if (n.kind == NodeKind::RECV && n.tags.unit == 2 && n.tags.microbatch == 0) {
        EXPECT_EQ(recv, -1);
        recv = n.id;
      }
    ASSERT_GE(recv, 0);
    cases.push_back({"SEND without RECV", drop_node(two, [&](const Node& n) { return n.id == recv; }),
                     {"SEND layers.1 mb0 to rank 1 on rank 0", "0 matching RECV"}});
  }
  {
    // a direct data edge across ranks instead of SEND/RECV
    cases.push_back({"data edge across ranks",
                     with_edge(two, find_node(two, NodeKind::FWD, 1, 0), find_node(two, NodeKind::FWD, 4, 0),
                               EdgeKind::EDGE_DATA),
                     {"data edge", "crosses ranks", "rank 0", "rank 1"}});
  }
  {
    // a SEND whose peer is wrong
    Graph g = rebuild(two, [](const Node&) { return true; });
    Graph h;
    for (Node n : g.nodes()) {
      if (n.kind == NodeKind::SEND && n.tags.unit == 2 && n.tags.microbatch == 1) n.peers = {0};
      h.add_node(n);
    }
    for (const Edge& e : g.edges()) h.add_edge(e.src, e.dst, e.kind);
    cases.push_back({"SEND to the wrong peer", h, {"disagree about their peers", "SEND layers.1 mb1 to rank 0", "RECV layers.1 mb1 from rank 0"}});
  }
  {
    // a RECV whose peers list is shorter than its device set
    Graph h;
    for (Node n : two.nodes()) {
      if (n.kind == NodeKind::RECV && n.tags.unit == 2 && n.tags.microbatch == 0) n.peers.clear();
      h.add_node(n);
    }
    for (const Edge& e : two.edges()) h.add_edge(e.src, e.dst, e.kind);
    cases.push_back({"RECV without peers", h, {"disagree about their peers", "SEND layers.1 mb0 to rank 1 on rank 0"}});
  }
  {
    // dp 2 x pp 2 (grid tp-dp-pp: stage 0 on ranks 0,1, stage 1 on ranks 2,3): rank 0 must pair
    // with rank 2 and rank 1 with rank 3; a SEND whose peers are crossed disagrees with its RECV.
    Strategy s = strategy(2, false, ScheduleKind::SCHEDULE_1F1B, {0, 0, 0, 1, 1, 1, 1}, 4);
    s.place.pp = 2;
    s.replicate.dp = 2;
    const Graph dp2 = build(mg, s);
    ASSERT_NO_THROW(verify(dp2, mg));
    Graph h;
    int crossed = 0;
    for (Node n : dp2.nodes()) {
      if (n.kind == NodeKind::SEND && n.tags.unit == 2 && n.tags.microbatch == 1) {
        EXPECT_EQ(n.devices, (std::vector<int>{0, 1}));
        EXPECT_EQ(n.peers, (std::vector<int>{2, 3}));
        n.peers = {3, 2};
        ++crossed;
      }
      h.add_node(n);
    }
    EXPECT_EQ(crossed, 1);
    for (const Edge& e : dp2.edges()) h.add_edge(e.src, e.dst, e.kind);
    cases.push_back({"replicated SEND with crossed peers", h,
                     {"disagree about their peers", "SEND layers.1 mb1 to rank 3 on rank 0,1", "RECV layers.1 mb1 from rank 0",
                      "on rank 2,3"}});
  }
  {
    // a compute node left out of the rank's order
    const int lonely = find_node(one, NodeKind::FWD, 2, 1);
    Graph g = rebuild(one, [](const Node&) { return true; },
                      [&](const Edge& e) { return !(e.kind == EdgeKind::EDGE_ORDER && (e.src == lonely || e.dst == lonely)); });
    cases.push_back({"compute node left out of the order", g, {"schedule of rank 0 misses", "FWD layers.1 mb1"}});
  }
  {
    Graph h;
    for (Node n : one.nodes()) {
      if (n.kind == NodeKind::BWD && n.tags.unit == 4 && n.tags.microbatch == 0) n.devices.clear();
      h.add_node(n);
    }
    for (const Edge& e : one.edges()) h.add_edge(e.src, e.dst, e.kind);
    cases.push_back({"node on no rank", h, {"BWD layers.3 mb0", "placed on no rank"}});
  }
  {
    Graph h = one;
    Node dup = one.node(find_node(one, NodeKind::FWD, 2, 0));
    h.add_node(dup);
    cases.push_back({"duplicate node", h, {"FWD layers.1 mb0", "twice"}});
  }

  for (const Broken& c : cases) {
    SCOPED_TRACE(c.what);
    try {
      verify(c.graph, mg);
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const VerifyError& e) {
      const std::string msg = e.what();
      std::printf("[ verify ] %-58s -> %s\n", c.what.c_str(), msg.c_str());
      for (const auto& w : c.words) EXPECT_NE(msg.find(w), std::string::npos) << "'" << msg << "' lacks '" << w << "'";
    }
  }
}

TEST(Verify, DescribeNamesNodesAsUsersReadThem) {
  const ModelGraph mg = make_model_graph(small_model("M*-M-"));
  const Graph two = build(mg, strategy(2, false, ScheduleKind::SCHEDULE_1F1B, {0, 0, 0, 1, 1, 1, 1}, 2));
  const auto names = names_of(mg);
  EXPECT_EQ(describe(two.node(find_node(two, NodeKind::FWD, 2, 1)), names), "FWD layers.1 mb1");
  EXPECT_EQ(describe(two.node(find_node(two, NodeKind::UPD, 6, -1)), names), "UPD head");
  int send = -1;
  for (const Node& n : two.nodes())
    if (n.kind == NodeKind::SEND && n.tags.unit == 2 && n.tags.microbatch == 0) send = n.id;
  ASSERT_GE(send, 0);
  EXPECT_EQ(describe(two.node(send), names), "SEND layers.1 mb0 to rank 1");
}

// ---- lower ------------------------------------------------------------------------------

void expect_topological(const Graph& g, const Program& p) {
  std::map<int, std::pair<int, size_t>> where;  // node -> (stream, position)
  for (size_t i = 0; i < p.compute.size(); ++i) EXPECT_TRUE(where.emplace(p.compute[i].node, std::make_pair(0, i)).second);
  for (size_t i = 0; i < p.comm.size(); ++i) EXPECT_TRUE(where.emplace(p.comm[i].node, std::make_pair(1, i)).second);
  size_t mine = 0;
  for (const Node& n : g.nodes()) {
    bool on = std::find(n.devices.begin(), n.devices.end(), p.rank) != n.devices.end();
    mine += on;
    EXPECT_EQ(where.count(n.id) > 0, on) << "node " << n.id;
    if (on) {
      EXPECT_EQ(where.at(n.id).first, n.stream == Stream::STREAM_COMPUTE ? 0 : 1);
    }
  }
  EXPECT_EQ(where.size(), mine);
  for (const Edge& e : g.edges()) {
    auto a = where.find(e.src), b = where.find(e.dst);
    if (a == where.end() || b == where.end()) continue;
    if (a->second.first == b->second.first) {
      EXPECT_LT(a->second.second, b->second.second) << "edge " << e.src << " -> " << e.dst;
    }
  }
  for (const auto& in : p.compute) {
    const Node& n = g.node(in.node);
    EXPECT_EQ(in.kind, n.kind);
    EXPECT_EQ(in.unit, n.tags.unit);
    EXPECT_EQ(in.microbatch, n.tags.microbatch);
  }
}

bool same_program(const Program& a, const Program& b) {
  auto eq = [](const std::vector<Instr>& x, const std::vector<Instr>& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i].node != y[i].node || x[i].kind != y[i].kind || x[i].unit != y[i].unit ||
          x[i].microbatch != y[i].microbatch || x[i].peer != y[i].peer || x[i].bytes != y[i].bytes)
        return false;
    return true;
  };
  return a.rank == b.rank && eq(a.compute, b.compute) && eq(a.comm, b.comm);
}

TEST(Lower, ProgramsAreTopologicalAndDeterministic) {
  const ModelGraph mg = make_model_graph(small_model("M*-M-"));
  for (auto kind : {ScheduleKind::SCHEDULE_GPIPE, ScheduleKind::SCHEDULE_1F1B})
    for (bool sb : {false, true})
      for (const auto& place : {std::vector<int>{}, std::vector<int>{0, 0, 0, 1, 1, 1, 1},
                                std::vector<int>{0, 1, 1, 2, 2, 3, 3}}) {
        const int world = place.empty() ? 1 : place.back() + 1;
        const Graph g = build(mg, strategy(3, sb, kind, place, world));
        const Graph g2 = build(mg, strategy(3, sb, kind, place, world));
        size_t total = 0;
        for (int r = 0; r < world; ++r) {
          SCOPED_TRACE(std::string(schedule_name(kind)) + " world " + std::to_string(world) + " rank " + std::to_string(r));
          const Program p = lower(g, r);
          EXPECT_EQ(p.rank, r);
          expect_topological(g, p);
          EXPECT_TRUE(same_program(p, lower(g, r)));
          EXPECT_TRUE(same_program(p, lower(g2, r)));
          // The compute stream follows the schedule's chain exactly.
          auto chain = order_chain(g, r);
          ASSERT_EQ(chain.size(), p.compute.size());
          for (size_t i = 0; i < chain.size(); ++i) EXPECT_EQ(p.compute[i].node, chain[i]);
          total += p.compute.size() + p.comm.size();
        }
        size_t placed = 0;  // every node once per rank it runs on
        for (const Node& n : g.nodes()) placed += n.devices.size();
        EXPECT_EQ(total, placed);
      }
}

// The activations and gradients between pipeline stages travel in their storage type: 4 bytes an
// element, 2 under train.precision bf16.
TEST(Compile, StageMessagesCarryTheActivationsStorageType) {
  for (const char* precision : {"fp32", "tf32", "bf16"}) {
    config::Config cfg = small_config("M*-M-", 2, "1f1b");
    cfg.parallel.pp = 2;
    cfg.train.precision = precision;
    const Plan plan = compile(cfg, 2);
    const int64_t elem = std::string(precision) == "bf16" ? 2 : 4;
    EXPECT_EQ(plan.strategy.activation_bytes, plan.strategy.microbatch_rows * cfg.model.d_model * elem) << precision;
    int messages = 0;
    for (const Node& n : plan.graph.nodes())
      if (n.kind == NodeKind::SEND || n.kind == NodeKind::RECV) {
        EXPECT_EQ(n.bytes, plan.strategy.activation_bytes) << precision << " " << describe(n, {});
        ++messages;
      }
    EXPECT_EQ(messages, 8) << precision;  // per microbatch: the activation down, its gradient up, each a SEND and a RECV
  }
}

TEST(Lower, Default1F1BTwoMicrobatchesOnOneRank) {
  config::Config cfg = small_config("M*-M-", 2, "1f1b");
  const Plan plan = compile(cfg, 1);
  const Program p = lower(plan.graph, 0);
  EXPECT_TRUE(p.comm.empty());
  // One stage: F mb0 (embed..head), B mb0 (head..embed), F mb1, B mb1, then UPD of every unit.
  std::vector<std::tuple<NodeKind, int, int>> want;
  for (int mb = 0; mb < 2; ++mb) {
    for (int u = 0; u < 7; ++u) want.emplace_back(NodeKind::FWD, u, mb);
    for (int u = 6; u >= 0; --u) want.emplace_back(NodeKind::BWD, u, mb);
  }
  want.emplace_back(NodeKind::NORM, -1, -1);
  for (int u = 0; u < 7; ++u) want.emplace_back(NodeKind::UPD, u, -1);
  ASSERT_EQ(p.compute.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(p.compute[i].kind, std::get<0>(want[i])) << i;
    EXPECT_EQ(p.compute[i].unit, std::get<1>(want[i])) << i;
    EXPECT_EQ(p.compute[i].microbatch, std::get<2>(want[i])) << i;
  }
  const std::string text = format_program(p, plan.model);
  EXPECT_NE(text.find("FWD"), std::string::npos);
  // the first instruction line names FWD embed mb0
  const size_t first = text.find("\n    ");
  ASSERT_NE(first, std::string::npos);
  const std::string line0 = text.substr(first + 1, text.find('\n', first + 1) - first - 1);
  EXPECT_NE(line0.find("FWD"), std::string::npos) << line0;
  EXPECT_NE(line0.find("embed"), std::string::npos) << line0;
  EXPECT_NE(line0.find("mb0"), std::string::npos) << line0;
}

// ---- hash, compile, printing ---------------------------------------------------------------

TEST(PlanHash, SameConfigSameHashDifferentConfigDifferentHash) {
  const Plan a = compile(small_config("M*-M-", 2), 1);
  const Plan b = compile(small_config("M*-M-", 2), 1);
  EXPECT_EQ(a.hash, b.hash);
  EXPECT_EQ(a.hash, plan_hash(a.graph, a.model));
  EXPECT_NE(a.hash, 0u);
  const uint64_t mb4 = compile(small_config("M*-M-", 4), 1).hash;
  const uint64_t gpipe = compile(small_config("M*-M-", 2, "gpipe"), 1).hash;
  const uint64_t split = compile(small_config("M*-M-", 2, "1f1b", true), 1).hash;
  std::printf("[ hash ] base %016llx mb4 %016llx gpipe %016llx split %016llx\n",
              static_cast<unsigned long long>(a.hash), static_cast<unsigned long long>(mb4),
              static_cast<unsigned long long>(gpipe), static_cast<unsigned long long>(split));
  EXPECT_NE(a.hash, mb4);
  EXPECT_NE(a.hash, gpipe);
  EXPECT_NE(a.hash, split);
  // a single added edge changes the hash
  Graph g = a.graph;
  g.add_edge(0, 1, EdgeKind::EDGE_ORDER);
  EXPECT_NE(plan_hash(g, a.model), a.hash);
}

// Two patterns with the same number of blocks must not share a plan hash:
// ranks started with different models would not notice.
TEST(PlanHash, DifferentPatternDifferentHash) {
  const uint64_t a = compile(small_config("M*-M-", 2), 1).hash;
  const uint64_t b = compile(small_config("M-M*-", 2), 1).hash;  // same unit count, other order
  const uint64_t c = compile(small_config("MMMMM", 2), 1).hash;
  std::printf("[ hash ] M*-M- %016llx M-M*- %016llx MMMMM %016llx\n", static_cast<unsigned long long>(a),
              static_cast<unsigned long long>(b), static_cast<unsigned long long>(c));
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  // a different block count changes the graph itself
  EXPECT_NE(a, compile(small_config("M*-M", 2), 1).hash);
}

TEST(Compile, ProducesAVerifiedPlan) {
  config::Config cfg = small_config("M*-M-", 4, "gpipe", false);
  const Plan p = compile(cfg, 1);
  EXPECT_EQ(p.model.units.size(), 7u);
  EXPECT_EQ(p.strategy.split.microbatches, 4);
  EXPECT_EQ(p.strategy.order.schedule, ScheduleKind::SCHEDULE_GPIPE);
  EXPECT_FALSE(p.strategy.any_split_backward());
  EXPECT_NO_THROW(verify(p.graph, p.model));
  // zero-bubble schedules imply the backward split
  cfg.parallel.schedule = "zbh1";
  const Plan zb = compile(cfg, 1);
  EXPECT_EQ(zb.strategy.split_backward_of_unit, std::vector<bool>(7, true));
}

TEST(Compile, GridThatDoesNotMatchTheWorldIsABuildError) {
  // tp x dp x pp must be the world size: a world of 0 ranks, or 3 ranks for dp 2.
  auto message = [](const config::Config& cfg, int world) -> std::string {
    try {
      compile(cfg, world);
    } catch (const BuildError& e) {
      return e.what();
    }
    return "(no BuildError)";
  };
  std::string m = message(small_config(), 0);
  EXPECT_EQ(m.rfind("grid:", 0), 0u) << m;
  EXPECT_NE(m.find("world size 0"), std::string::npos) << m;
  config::Config cfg = small_config("M*-M-", 2);
  cfg.parallel.dp = 2;
  m = message(cfg, 3);
  EXPECT_EQ(m.rfind("grid:", 0), 0u) << m;
  EXPECT_NE(m.find("world size 3 != tp(1) x dp(2) x pp(1) = 2"), std::string::npos) << m;
  cfg.parallel.pp = 2;
  m = message(cfg, 2);
  EXPECT_NE(m.find("dp(2) x pp(2) = 4"), std::string::npos) << m;
  EXPECT_NO_THROW(compile(cfg, 4));
}

TEST(Printing, DirectivesYaml) {
  const ModelGraph mg = make_model_graph(small_model("M*-M-"));
  Strategy s = strategy(4, true, ScheduleKind::SCHEDULE_GPIPE);
  std::string y = directives_yaml(s, mg);
  std::printf("%s", y.c_str());
  EXPECT_NE(y.find("directives:"), std::string::npos);
  EXPECT_NE(y.find("split: {microbatches: 4}"), std::string::npos) << y;
  EXPECT_NE(y.find("split_backward: true"), std::string::npos) << y;
  EXPECT_NE(y.find("order:  # gpipe, op by op\n      ranks:\n        - [F0, F1, F2, F3, BI0, BW0,"), std::string::npos)
      << y;
  EXPECT_NE(y.find("place: {pp: 1, virtual_stages: 1, stage_of_unit: [0, 0, 0, 0, 0, 0, 0], ranks: [0]}"),
            std::string::npos)
      << y;  // every unit's stage, balanced ones too
  EXPECT_NE(y.find("grid: {order: tp-dp-pp}"), std::string::npos) << y;
  Strategy t = strategy(3, false, ScheduleKind::SCHEDULE_1F1B, {0, 0, 0, 1, 1, 1, 1}, 4);
  t.replicate.dp = 2;
  t.replicate.zero_of_unit.assign(7, 2);
  y = directives_yaml(t, mg);
  std::printf("%s", y.c_str());
  EXPECT_NE(y.find("microbatches: 3"), std::string::npos) << y;
  EXPECT_NE(y.find("split_backward: false"), std::string::npos) << y;  // every field, to read back alike
  EXPECT_NE(y.find("# 1f1b, op by op"), std::string::npos) << y;
  EXPECT_NE(y.find("place: {pp: 4, virtual_stages: 1, stage_of_unit: [0, 0, 0, 1, 1, 1, 1], ranks: [0, 1, 2, 3]}"),
            std::string::npos)
      << y;
  EXPECT_NE(y.find("replicate: {dp: 2, shard_grads: true, shard_params: false, shard_optimizer: true, bucket_mb: 25}"),
            std::string::npos)
      << y;
  EXPECT_NE(y.find("shard: {tp: 1, ep: 1}"), std::string::npos) << y;
}

TEST(Printing, SummaryAndProgram) {
  const Plan p = compile(small_config("M*-M-", 2), 1);
  const std::string s = summary(p.graph, p.model);
  std::printf("%s", s.c_str());
  // 7 units x 2 microbatches forward and backward, the norm, 7 updates = 36 nodes
  EXPECT_NE(s.find("36 nodes"), std::string::npos) << s;
  EXPECT_NE(s.find("FWD=14"), std::string::npos) << s;
  EXPECT_NE(s.find("BWD=14"), std::string::npos) << s;
  EXPECT_NE(s.find("UPD=7"), std::string::npos) << s;
  EXPECT_EQ(s.find("SEND="), std::string::npos) << s;
  EXPECT_NE(s.find("NORM=1"), std::string::npos) << s;
  EXPECT_NE(s.find("35 order"), std::string::npos) << s;  // one chain over 36 nodes
  EXPECT_NE(s.find("2 microbatch"), std::string::npos) << s;
  EXPECT_NE(s.find("1 rank"), std::string::npos) << s;
  EXPECT_NE(s.find("units (7, " + std::to_string(p.model.param_count()) + " parameters)"), std::string::npos) << s;
  EXPECT_NE(s.find("layers.1[*]"), std::string::npos) << s;
  char hash[32];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(p.hash));
  EXPECT_NE(s.find(hash), std::string::npos) << s;

  const Program prog = lower(p.graph, 0);
  const std::string t = format_program(prog, p.model);
  std::printf("%s", t.c_str());
  EXPECT_NE(t.find("rank 0: 36 compute, 0 communication instructions"), std::string::npos) << t;
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 2 + 36) << t;
  EXPECT_NE(t.find("BWD            layers.3     mb1"), std::string::npos) << t;
  EXPECT_NE(t.find("UPD            head"), std::string::npos) << t;

  // a pipeline rank prints its communication stream too
  const ModelGraph mg = make_model_graph(small_model("M*-M-"));
  const Graph two = build(mg, strategy(2, false, ScheduleKind::SCHEDULE_1F1B, {0, 0, 0, 1, 1, 1, 1}, 2));
  const std::string t1 = format_program(lower(two, 1), mg);
  EXPECT_NE(t1.find("stream comm"), std::string::npos) << t1;
  EXPECT_NE(t1.find("RECV"), std::string::npos) << t1;
  EXPECT_NE(summary(two, mg).find("SEND=4"), std::string::npos);
}

}  // namespace
}  // namespace piper::ir

namespace piper::ir {
namespace {

// With tensor parallelism every pass that needs its tp group in the middle is compute segments
// joined by collective nodes (unit_passes.hpp): blocks all-reduce their output before the residual
// and their input gradient before the norm, the embedding all-reduces its vocab-parallel lookup
// (and stores the sum in the activations' type in a second segment),
// the head gathers row maxima and all-reduces [sum | target]. The collectives run on the comm
// stream over the tp group, move the bytes the unit's buffer holds, and lower between their
// segments.
TEST(TensorParallel, PassesAreSegmentsJoinedByTpCollectives) {
  for (bool sb : {false, true}) {
    SCOPED_TRACE(sb ? "split backward" : "fused backward");
    config::Config cfg = small_config("M*-", 2, sb ? "zbh1" : "1f1b");
    cfg.parallel.tp = 2;
    cfg.parallel.split_backward = sb;
    const Plan plan = compile(cfg, 2);
    const int64_t rows = plan.strategy.microbatch_rows, D = cfg.model.d_model;
    ASSERT_GT(rows, 0);
    std::map<std::tuple<NodeKind, int, int>, int> segments;           // (pass, unit, mb) -> segment count
    std::map<std::tuple<NodeKind, int, int>, std::vector<int64_t>> points;  // -> bytes of each point
    for (const Node& n : plan.graph.nodes()) {
      if (is_compute(n.kind) && n.tags.unit >= 0 && n.kind != NodeKind::UPD) {
        int& c = segments[std::make_tuple(n.kind, n.tags.unit, n.tags.microbatch)];
        c = std::max(c, n.tags.segment + 1);
      }
      if (n.payload != Payload::PAYLOAD_UNIT) continue;
      EXPECT_EQ(n.group, GroupDim::GROUP_TP) << describe(n, {});
      EXPECT_EQ(n.stream, Stream::STREAM_COMM);
      EXPECT_EQ(n.devices, (std::vector<int>{0, 1}));
      const NodeKind pass = n.tags.pass == Pass::PASS_F ? NodeKind::FWD : n.tags.pass == Pass::PASS_BI ? NodeKind::BWD_I : NodeKind::BWD;
      auto& v = points[std::make_tuple(pass, n.tags.unit, n.tags.microbatch)];
      if (v.size() <= static_cast<size_t>(n.tags.segment)) v.resize(static_cast<size_t>(n.tags.segment) + 1);
      v[static_cast<size_t>(n.tags.segment)] = n.bytes;
    }
    const int head = static_cast<int>(plan.model.units.size()) - 1;
    const NodeKind back = sb ? NodeKind::BWD_I : NodeKind::BWD;
    for (int mb = 0; mb < 2; ++mb) {
      EXPECT_EQ(segments[std::make_tuple(NodeKind::FWD, 0, mb)], 2);  // the sum stored after its collective
      EXPECT_EQ(points[std::make_tuple(NodeKind::FWD, 0, mb)], (std::vector<int64_t>{rows * D * 4}));
      for (int u = 1; u < head; ++u) {
        EXPECT_EQ(segments[std::make_tuple(NodeKind::FWD, u, mb)], 2) << "unit " << u;
        EXPECT_EQ(segments[std::make_tuple(back, u, mb)], 2) << "unit " << u;
        if (sb) {
          EXPECT_EQ(segments[std::make_tuple(NodeKind::BWD_W, u, mb)], 1) << "unit " << u;
        }
        EXPECT_EQ(points[std::make_tuple(NodeKind::FWD, u, mb)], (std::vector<int64_t>{rows * D * 4}));
        EXPECT_EQ(points[std::make_tuple(back, u, mb)], (std::vector<int64_t>{rows * D * 4}));
      }
      EXPECT_EQ(segments[std::make_tuple(NodeKind::FWD, head, mb)], 3);
      EXPECT_EQ(points[std::make_tuple(NodeKind::FWD, head, mb)], (std::vector<int64_t>{rows * 4 * 2, rows * 2 * 4}));
      EXPECT_EQ(points[std::make_tuple(back, head, mb)], (std::vector<int64_t>{rows * D * 4}));
    }
    // Lowered, a segment waits for the collective before it, which waits for the segment before it.
    for (int r : {0, 1}) {
      const Program p = lower(plan.graph, r);
      std::map<int, size_t> at;
      for (size_t i = 0; i < p.compute.size(); ++i) at[p.compute[i].node] = i;
      int checked = 0;
      for (const Instr& in : p.compute) {
        if (in.segment == 0) continue;
        int unit_waits = 0;
        for (int w : in.waits) {
          const Node& c = plan.graph.node(w);
          if (c.payload != Payload::PAYLOAD_UNIT) continue;
          ++unit_waits;
          EXPECT_EQ(c.tags.segment, in.segment - 1);
          EXPECT_EQ(c.tags.unit, in.unit);
        }
        EXPECT_EQ(unit_waits, 1) << describe(plan.graph.node(in.node), {});
        ++checked;
      }
      EXPECT_GT(checked, 0);
    }
  }
}

}  // namespace
}  // namespace piper::ir
