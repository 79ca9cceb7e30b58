// test_deadlock.cpp — the verifier's proof that the ranks' programs, played by ir::Player's rules,
// finish (ir::verify_play, docs/architecture.md "Deadlock freedom"): collectives out of order across a
// group, a hand-written pipeline order that deadlocks across ranks, a lowering that deadlocks where
// the DAG has no cycle, and every library schedule under tp, dp and ZeRO.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "ir/build.hpp"
#include "ir/compile.hpp"
#include "ir/graph.hpp"
#include "ir/model_graph.hpp"
#include "ir/parallel_dims.hpp"
#include "ir/pipeline_schedules.hpp"
#include "ir/verify.hpp"
#include "unit/test_configs.hpp"

namespace piper::ir {
namespace {

// The VerifyError's message of `f`, or "(accepted)".
template <class F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const VerifyError& e) {
    return e.what();
  }
  return "(accepted)";
}

void expect_words(const std::string& msg, const std::vector<std::string>& words) {
  for (const std::string& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "missing \"" << w << "\" in:\n" << msg;
}

ParallelDims data_parallel(int world) {
  Degrees d;
  d.dp = world;
  return ParallelDims(world, "tp-dp-pp", d);
}

Node compute(int rank, int unit) {
  Node n;
  n.kind = NodeKind::FWD;
  n.tags.unit = unit;
  n.tags.microbatch = 0;
  n.devices = {rank};
  return n;
}

Node allreduce(int unit) {
  Node n;
  n.kind = NodeKind::ALLREDUCE;
  n.stream = Stream::STREAM_COMM;
  n.group = GroupDim::GROUP_WORLD;
  n.payload = Payload::PAYLOAD_WGRAD;
  n.tags.pass = Pass::PASS_COMM;
  n.tags.unit = unit;
  n.units = {unit};
  n.devices = {0, 1};
  return n;
}

TEST(DeadlockFreedom, CollectivesInOppositeOrdersAreRefused) {
  // Rank 0 can issue A at once and B after its own compute; rank 1 the other way round. Lowered
  // (communication as soon as its inputs are), rank 0 issues A, B and rank 1 issues B, A.
  const ModelGraph mg = make_model_graph(testing::small_model("M*-M-"));
  Graph g;
  const int p0 = g.add_node(compute(0, 1)), p1 = g.add_node(compute(1, 2));
  const int a = g.add_node(allreduce(1)), b = g.add_node(allreduce(2));
  g.add_edge(p0, b, EdgeKind::EDGE_DATA);
  g.add_edge(p1, a, EdgeKind::EDGE_DATA);
  ASSERT_EQ(lower(g, 0).comm.front().node, a);
  ASSERT_EQ(lower(g, 1).comm.front().node, b);
  const std::string msg = refusal([&] { verify_play(g, mg, data_parallel(2)); });
  expect_words(msg, {"world group of ranks 0, 1", "different orders", "position 0",
                     "rank 0 issues ALLREDUCE world layers.0 units 1 (pass C, stage 0)",
                     "rank 1 issues ALLREDUCE world layers.1 units 2 (pass C, stage 0)",
                     "rank 1's ALLREDUCE world layers.1 units 2 (pass C, stage 0) waits on rank 0",
                     "issues it at position 1"});

  // In one order on both ranks (B after A on rank 1 too) they pass.
  g.add_edge(a, b, EdgeKind::EDGE_DATA);
  EXPECT_EQ(refusal([&] { verify_play(g, mg, data_parallel(2)); }), "(accepted)");
}

// The small model on two pipeline ranks with the orders written out (docs/directives.md).
config::Config two_ranks(const std::string& rank0, const std::string& rank1) {
  return config::parse(testing::kSmallModelYaml + "directives:\n"
                                                  "  - split: {microbatches: 2}\n"
                                                  "  - place: {pp: 2}\n"
                                                  "  - order:\n"
                                                  "      ranks:\n"
                                                  "        - \"" + rank0 + "\"\n"
                                                  "        - \"" + rank1 + "\"\n",
                       "order.yaml");
}

TEST(DeadlockFreedom, AHandWrittenOrderThatDeadlocksAcrossRanksIsRefused) {
  ASSERT_NO_THROW(compile(two_ranks("F0 F1 B0 B1", "F0 B0 F1 B1"), 2));
  // Each rank's order is one a rank may run (every backward after its forward), but rank 1 waits for
  // microbatch 1's activations, which rank 0 sends after microbatch 0's backward, which waits for the
  // gradient rank 1 sends after its microbatch 1.
  const std::string msg = refusal([] { compile(two_ranks("F0 B0 F1 B1", "F1 F0 B0 B1"), 2); });
  expect_words(msg, {"deadlock", "cycle", "which waits for", "on rank 0", "on rank 1", "SEND", "RECV",
                     "(pass F, microbatch 1, stage 1) on rank 1", "(pass B, microbatch 0, stage 0) on rank 0"});
}

// `g` with its nodes renumbered in the order of `key` (ties by id) and its ordering edges
// dropped: each rank's compute then runs in the order lowering's tie break (node id) gives.
template <class Key>
Graph renumbered_without_order(const Graph& g, Key key) {
  std::vector<int> ids(g.nodes().size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int x, int y) { return key(g.node(x)) < key(g.node(y)); });
  std::vector<int> id_of(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) id_of[static_cast<size_t>(ids[i])] = static_cast<int>(i);
  Graph out;
  for (int id : ids) {
    Node n = g.node(id);
    if (n.tag >= 0) n.tag = id_of[static_cast<size_t>(n.tag)];  // a message's tag is its SEND's id
    out.add_node(n);
  }
  for (const Edge& e : g.edges())
    if (e.kind == EdgeKind::EDGE_DATA)
      out.add_edge(id_of[static_cast<size_t>(e.src)], id_of[static_cast<size_t>(e.dst)], e.kind);
  return out;
}

TEST(DeadlockFreedom, CatchesADeadlockTheAcyclicityCheckDoesNot) {
  // Without ordering edges the DAG has no cycle and verify() accepts it, but each rank runs its
  // compute in node-id order: rank 0 (stage 0) microbatch 0's forward and backward before microbatch
  // 1, rank 1 (stage 1) microbatch 1 first. Rank 0 waits for microbatch 0's gradient, which rank 1
  // sends after microbatch 1, whose activations rank 0 sends after microbatch 0's backward.
  const config::Config cfg = two_ranks("F0 F1 B0 B1", "F0 F1 B0 B1");
  const Plan plan = compile(cfg, 2);
  const Graph g = renumbered_without_order(plan.graph, [](const Node& n) {
    if (n.tags.microbatch < 0) return 2;  // per-step nodes last
    return n.tags.stage == 1 ? 1 - n.tags.microbatch : n.tags.microbatch;
  });
  ASSERT_NO_THROW(verify(g, plan.model));
  const std::string msg = refusal([&] { verify_play(g, plan.model, plan.strategy.dims()); });
  expect_words(msg, {"deadlock", "rank 0 stops at BWD", "(pass B, microbatch 0, stage 0)",
                     "waiting for RECV", "from rank 1", "SEND", "on rank 1, not issued: rank 1 stops at FWD",
                     "(pass F, microbatch 1, stage 1)", "2 rank(s) cannot finish: 0, 1"});
}

// The 10-unit small model with every schedule of the library, on pp pipeline ranks x tp 2 x dp 2.
TEST(DeadlockFreedom, EveryLibraryScheduleWithTensorAndDataParallelismPasses) {
  int compiled = 0;
  for (const std::string& schedule : schedule_names())
    for (int pp : {2, 4})
      for (int m : {pp, 2 * pp, 3 * pp})
        for (int zero = 1; zero <= 3; ++zero) {
          const ScheduleKind kind = parse_schedule(schedule);
          const bool dual = kind == ScheduleKind::SCHEDULE_DUALPIPEV;
          if (dual && m < 2 * pp) continue;
          config::Config c;
          c.model = testing::small_model("M*-M*-M-");
          c.parallel.pp = pp;
          c.parallel.tp = 2;
          c.parallel.dp = 2;
          c.parallel.zero = zero;
          c.parallel.microbatches = m;
          c.parallel.schedule = schedule;
          c.parallel.virtual_stages = kind == ScheduleKind::SCHEDULE_INTERLEAVED || dual ? 2 : 1;
          c.parallel.split_backward = dual || kind == ScheduleKind::SCHEDULE_ZBH1;
          c.train.global_batch = 2 * m;
          const std::string what = schedule + " pp " + std::to_string(pp) + " m " + std::to_string(m) + " zero " +
                                   std::to_string(zero);
          EXPECT_EQ(refusal([&] { compile(c, pp * 4); }), "(accepted)") << what;
          ++compiled;
        }
  EXPECT_EQ(compiled, 5 * 2 * 3 * 3 - 2 * 3);  // dualpipev needs m >= 2 pp
}

}  // namespace
}  // namespace piper::ir
