// test_build_parallel.cpp — unit tests of multi-rank builds: data parallelism (replicated compute,
// gradient buckets, ZeRO 1/2/3 collectives), pipelines over a rank grid (SEND/RECV pairs and their
// peers, stage balancing, every schedule), the lowered per-rank programs played together, and the
// plan hash of multi-rank plans. World sizes 2, 4 and 8.
//
// config::validate still refuses dp/tp/pp > 1, so configs here are filled in directly and handed to
// ir::compile (or a Strategy to ir::build) without validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "config/config.hpp"
#include "ir/build.hpp"
#include "ir/compile.hpp"
#include "ir/graph.hpp"
#include "ir/parallel_dims.hpp"
#include "ir/model_graph.hpp"
#include "ir/pipeline_schedules.hpp"
#include "ir/program.hpp"
#include "ir/strategy.hpp"
#include "ir/validate.hpp"
#include "ir/verify.hpp"
#include "ir/work.hpp"
#include "unit/ir/strategy_in_code.hpp"
#include "unit/test_configs.hpp"
#include "unit/ir/graph_checks.hpp"

namespace piper::ir {
namespace {

using testing::find_node;
using testing::has_edge;


// ---- helpers ------------------------------------------------------------------------

// The small model of test_ir.cpp (unit/test_configs.hpp): D 16, H 4, KV 2, F 24, N 8, P 8,
// expand 2, G 2, K 4, V 32.
using testing::small_model;

struct Par {
  int dp = 1, pp = 1, zero = 0, vs = 1;
  int mb = 2;
  std::string schedule = "1f1b";
  bool split_backward = false;
};

std::string name(const Par& p) {
  return p.schedule + " dp" + std::to_string(p.dp) + " pp" + std::to_string(p.pp) + " zero" +
         std::to_string(p.zero) + " v" + std::to_string(p.vs) + " mb" + std::to_string(p.mb) +
         (p.split_backward ? " split" : "");
}

config::Config make_config(const std::string& pattern, const Par& p) {
  config::Config c;
  c.model = small_model(pattern);
  c.parallel.dp = p.dp;
  c.parallel.pp = p.pp;
  c.parallel.zero = p.zero;
  c.parallel.virtual_stages = p.vs;
  c.parallel.microbatches = p.mb;
  c.parallel.schedule = p.schedule;
  c.parallel.split_backward = p.split_backward;
  c.train.global_batch = 8 * p.dp * p.mb;
  return c;
}

// A Strategy written by hand (what expand() gives, plus bucket_bytes, which has no config key).
Strategy make_strategy(const config::ModelConfig& m, int world, const Par& p, int64_t bucket_bytes = 25 << 20) {
  Strategy s;
  s.world_size = world;
  s.split.microbatches = p.mb;
  s.order.schedule = parse_schedule(p.schedule);
  s.place.pp = p.pp;
  s.place.virtual_stages = p.vs;
  s.replicate.dp = p.dp;
  s.replicate.bucket_bytes = bucket_bytes;
  s.activation_bytes = 4096;
  return testing::with_units(s, m, p.split_backward, p.zero);
}

std::vector<int> iota(int from, int to) {  // [from, to)
  std::vector<int> v;
  for (int i = from; i < to; ++i) v.push_back(i);
  return v;
}

std::set<int> data_preds(const Graph& g, int id) {
  std::set<int> s;
  for (int e : g.in_edges()[static_cast<size_t>(id)])
    if (g.edges()[static_cast<size_t>(e)].kind == EdgeKind::EDGE_DATA) s.insert(g.edges()[static_cast<size_t>(e)].src);
  return s;
}

std::set<int> data_succs(const Graph& g, int id) {
  std::set<int> s;
  for (int e : g.out_edges()[static_cast<size_t>(id)])
    if (g.edges()[static_cast<size_t>(e)].kind == EdgeKind::EDGE_DATA) s.insert(g.edges()[static_cast<size_t>(e)].dst);
  return s;
}

// Nodes of a kind, but for the gradient norm's world all-reduce (checked on its own).
std::vector<int> nodes_of(const Graph& g, NodeKind kind) {
  std::vector<int> v;
  for (const Node& n : g.nodes())
    if (n.kind == kind && n.payload != Payload::PAYLOAD_NORM) v.push_back(n.id);
  return v;
}

// The world's all-reduce of the squared gradient norm (-1 on one rank).
int norm_total(const Graph& g) {
  for (const Node& n : g.nodes())
    if (n.payload == Payload::PAYLOAD_NORM) return n.id;
  return -1;
}

// The NORM node of `rank`'s pipeline rank.
int norm_of(const Graph& g, int rank) {
  for (const Node& n : g.nodes())
    if (n.kind == NodeKind::NORM && std::count(n.devices.begin(), n.devices.end(), rank)) return n.id;
  return -1;
}

// The node after which a unit's weight gradients of one microbatch are complete.
int last_grad(const Graph& g, int unit, int mb, bool split_backward) {
  return find_node(g, split_backward ? NodeKind::BWD_W : NodeKind::BWD, unit, mb);
}

// Stage of each unit, read off the FWD nodes of microbatch 0.
std::vector<int> stages_of_units(const Graph& g, int n_units) {
  std::vector<int> s(static_cast<size_t>(n_units), -1);
  for (const Node& n : g.nodes())
    if (n.kind == NodeKind::FWD && n.tags.microbatch == 0) s[static_cast<size_t>(n.tags.unit)] = n.tags.stage;
  return s;
}

int64_t grad_bytes(const ModelGraph& mg, const std::vector<int>& units) {
  int64_t b = 0;
  for (int u : units) b += mg.units[static_cast<size_t>(u)].param_count() * 4;
  return b;
}

// ---- checks on the lowered programs ---------------------------------------------------------

// Every node on each rank of its device set, once, on its stream; every `wait` names a node of
// this rank on the other stream that the program holds, and every cross-stream data edge among
// the rank's nodes is a wait; SEND/RECV instructions carry the peer aligned with the device.
void check_programs(const Graph& g, const std::vector<Program>& progs) {
  size_t placed = 0;
  for (const Node& n : g.nodes()) placed += n.devices.size();
  size_t listed = 0;
  for (const Program& p : progs) {
    SCOPED_TRACE("rank " + std::to_string(p.rank));
    listed += p.compute.size() + p.comm.size();
    std::map<int, int> stream_of;  // node -> 0 compute, 1 comm
    for (const Instr& in : p.compute) EXPECT_TRUE(stream_of.emplace(in.node, 0).second) << "node " << in.node << " twice";
    for (const Instr& in : p.comm) EXPECT_TRUE(stream_of.emplace(in.node, 1).second) << "node " << in.node << " twice";
    for (int s = 0; s < 2; ++s) {
      const auto& instrs = s == 0 ? p.compute : p.comm;
      for (const Instr& in : instrs) {
        const Node& n = g.node(in.node);
        EXPECT_EQ(n.stream == Stream::STREAM_COMPUTE ? 0 : 1, s) << "node " << in.node;
        const auto slot = std::find(n.devices.begin(), n.devices.end(), p.rank);
        ASSERT_NE(slot, n.devices.end()) << "node " << in.node << " is not placed on rank " << p.rank;
        EXPECT_EQ(in.kind, n.kind);
        EXPECT_EQ(in.units, n.units);
        EXPECT_EQ(in.group, n.group);
        EXPECT_EQ(in.payload, n.payload);
        if (n.kind == NodeKind::SEND || n.kind == NodeKind::RECV) {
          ASSERT_EQ(n.peers.size(), n.devices.size());
          EXPECT_EQ(in.peer, n.peers[static_cast<size_t>(slot - n.devices.begin())]);
          EXPECT_NE(in.peer, p.rank);
        } else {
          EXPECT_EQ(in.peer, -1);
        }
        std::set<int> want;
        for (int src : data_preds(g, in.node)) {
          const Node& a = g.node(src);
          if (a.stream != n.stream && std::count(a.devices.begin(), a.devices.end(), p.rank)) want.insert(src);
        }
        const std::set<int> got(in.waits.begin(), in.waits.end());
        EXPECT_EQ(got, want) << "waits of node " << in.node << " (" << node_kind_name(n.kind) << ")";
        for (int w : in.waits) {
          auto it = stream_of.find(w);
          ASSERT_NE(it, stream_of.end()) << "node " << in.node << " waits on node " << w << ", not in rank "
                                         << p.rank << "'s program";
          EXPECT_NE(it->second, s) << "node " << in.node << " waits on node " << w << " of its own stream";
        }
      }
    }
  }
  EXPECT_EQ(listed, placed);
}

// Each rank's compute stream is its pipeline rank's schedule expanded over the units of each
// op's stage (forward: units ascending, backward: descending), then the updates of its units.
void check_follows_schedule(const Graph& g, const Strategy& s, const std::vector<Program>& progs, int n_units) {
  const PipeSchedule sched =
      make_schedule(s.order.schedule, s.place.pp, s.place.virtual_stages, s.split.microbatches, s.any_split_backward());
  const ParallelDims grid = s.dims();
  const std::vector<int> stage = stages_of_units(g, n_units);
  for (const Program& p : progs) {
    SCOPED_TRACE("rank " + std::to_string(p.rank));
    const int pr = grid.coord(p.rank, Axis::PP);
    std::vector<int> want;
    for (const PipeOp& op : sched.ops[static_cast<size_t>(pr)]) {
      const int st = sched.stage_of(pr, op.chunk);
      std::vector<int> units;
      for (int u = 0; u < n_units; ++u)
        if (stage[static_cast<size_t>(u)] == st) units.push_back(u);
      EXPECT_FALSE(units.empty()) << "stage " << st << " holds no unit";
      if (op.pass != Pass::PASS_F) std::reverse(units.begin(), units.end());
      const NodeKind k = op.pass == Pass::PASS_F    ? NodeKind::FWD
                         : op.pass == Pass::PASS_B  ? NodeKind::BWD
                         : op.pass == Pass::PASS_BI ? NodeKind::BWD_I
                                                    : NodeKind::BWD_W;
      for (int u : units) {
        if (k == NodeKind::BWD_I && u == 0) continue;  // the embedding has no input gradient
        want.push_back(find_node(g, k, u, op.microbatch));
      }
    }
    want.push_back(norm_of(g, p.rank));
    for (int u = 0; u < n_units; ++u)
      if (sched.rank_of(stage[static_cast<size_t>(u)]) == pr) want.push_back(find_node(g, NodeKind::UPD, u, -1));
    std::vector<int> got;
    for (const Instr& in : p.compute) got.push_back(in.node);
    EXPECT_EQ(got, want);
  }
}

// SEND/RECV pair ranks with equal tp and dp coordinates; the pipeline coordinate is the one of
// the rank holding the other side's stage. Each SEND has one RECV, on the devices of the next
// (activation) or previous (gradient) stage.
void check_point_to_point(const Graph& g, const Strategy& s) {
  const ParallelDims grid = s.dims();
  const PipeSchedule sched =
      make_schedule(s.order.schedule, s.place.pp, s.place.virtual_stages, s.split.microbatches, s.any_split_backward());
  for (int id : nodes_of(g, NodeKind::SEND)) {
    const Node& send = g.node(id);
    const auto succ = data_succs(g, id);
    ASSERT_EQ(succ.size(), 1u);
    const Node& recv = g.node(*succ.begin());
    ASSERT_EQ(recv.kind, NodeKind::RECV);
    EXPECT_EQ(send.stream, Stream::STREAM_COMM);
    EXPECT_EQ(recv.stream, Stream::STREAM_COMM);
    EXPECT_EQ(send.payload, recv.payload);
    EXPECT_EQ(send.tags.microbatch, recv.tags.microbatch);
    EXPECT_EQ(send.bytes, s.activation_bytes);
    // what moves: the producer's output
    const auto pred = data_preds(g, id);
    ASSERT_EQ(pred.size(), 1u);
    const Node& producer = g.node(*pred.begin());
    EXPECT_EQ(producer.devices, send.devices);
    EXPECT_EQ(send.tags.unit, producer.tags.unit);
    const auto rsucc = data_succs(g, recv.id);
    ASSERT_EQ(rsucc.size(), 1u);
    const Node& consumer = g.node(*rsucc.begin());
    EXPECT_EQ(consumer.devices, recv.devices);
    if (send.payload == Payload::PAYLOAD_ACTIVATION) {
      EXPECT_EQ(producer.kind, NodeKind::FWD);
      EXPECT_EQ(consumer.kind, NodeKind::FWD);
      EXPECT_EQ(consumer.tags.unit, producer.tags.unit + 1);
      EXPECT_EQ(consumer.tags.stage, producer.tags.stage + 1);
    } else {
      EXPECT_EQ(send.payload, Payload::PAYLOAD_GRADIENT);
      EXPECT_TRUE(producer.kind == NodeKind::BWD || producer.kind == NodeKind::BWD_I);
      EXPECT_TRUE(consumer.kind == NodeKind::BWD || consumer.kind == NodeKind::BWD_I ||
                  (consumer.kind == NodeKind::BWD_W && consumer.tags.unit == 0));
      EXPECT_EQ(consumer.tags.unit, producer.tags.unit - 1);
      EXPECT_EQ(consumer.tags.stage, producer.tags.stage - 1);
    }
    ASSERT_EQ(send.peers.size(), send.devices.size());
    ASSERT_EQ(recv.peers.size(), recv.devices.size());
    EXPECT_EQ(send.devices.size(), recv.devices.size());
    for (size_t i = 0; i < send.devices.size(); ++i) {
      const int a = send.devices[i], b = send.peers[i];
      EXPECT_EQ(grid.coord(a, Axis::PP), sched.rank_of(producer.tags.stage));
      EXPECT_EQ(grid.coord(b, Axis::PP), sched.rank_of(consumer.tags.stage));
      EXPECT_EQ(grid.coord(a, Axis::DP), grid.coord(b, Axis::DP)) << a << " -> " << b;
      EXPECT_EQ(grid.coord(a, Axis::TP), grid.coord(b, Axis::TP)) << a << " -> " << b;
      // and the RECV says the same from its side
      auto it = std::find(recv.devices.begin(), recv.devices.end(), b);
      ASSERT_NE(it, recv.devices.end());
      EXPECT_EQ(recv.peers[static_cast<size_t>(it - recv.devices.begin())], a);
    }
  }
  EXPECT_EQ(nodes_of(g, NodeKind::SEND).size(), nodes_of(g, NodeKind::RECV).size());
}

// Collectives carry no tag: every member of a process group must issue its collectives in the
// same order (src/comm/comm.hpp contract).
void check_collective_order(const Graph& g, const Strategy& s, const std::vector<Program>& progs) {
  const ParallelDims grid = s.dims();
  for (const auto& group : grid.groups(Axis::DP)) {
    std::vector<std::vector<int>> seqs;
    for (int r : group) {
      std::vector<int> seq;
      for (const Instr& in : progs[static_cast<size_t>(r)].comm)
        if (in.kind != NodeKind::SEND && in.kind != NodeKind::RECV && in.payload != Payload::PAYLOAD_NORM) {
          EXPECT_EQ(in.group, GroupDim::GROUP_DP);
          const Node& n = g.node(in.node);
          // the node's device set holds whole dp groups
          for (int q : group) EXPECT_TRUE(std::count(n.devices.begin(), n.devices.end(), q)) << "rank " << q;
          seq.push_back(in.node);
        }
      seqs.push_back(seq);
    }
    for (size_t i = 1; i < seqs.size(); ++i)
      EXPECT_EQ(seqs[i], seqs[0]) << "ranks " << group[0] << " and " << group[i] << " order their collectives differently";
  }
}

// Everything above, for one verified graph (the play only when `play`).
void check_plan(const ModelGraph& mg, const Strategy& s, const Graph& g, bool play = true) {
  const auto progs = lower_all(g, s.world_size);
  check_programs(g, progs);
  check_follows_schedule(g, s, progs, static_cast<int>(mg.units.size()));
  check_point_to_point(g, s);
  check_collective_order(g, s, progs);
  if (!play) return;
  try {
    verify_play(g, mg, s.dims());
  } catch (const VerifyError& e) {
    ADD_FAILURE() << "the lowered programs deadlock when played together: " << e.what();
  }
}

void check_plan(const Plan& plan, bool play = true) { check_plan(plan.model, plan.strategy, plan.graph, play); }

// ---- data parallelism -------------------------------------------------------------------------

TEST(DataParallel, ComputeIsReplicatedOnEveryRank) {
  for (int world : {2, 4, 8}) {
    for (bool sb : {false, true}) {
      Par p;
      p.dp = world;
      p.mb = 3;
      p.split_backward = sb;
      SCOPED_TRACE("world " + std::to_string(world) + " " + name(p));
      const Plan plan = compile(make_config("M*-M-", p), world);
      const std::vector<int> all = iota(0, world);
      for (const Node& n : plan.graph.nodes()) {
        EXPECT_EQ(n.devices, all) << describe(n, {});
        EXPECT_TRUE(n.peers.empty());
        if (n.payload == Payload::PAYLOAD_NORM) {
          EXPECT_EQ(n.group, GroupDim::GROUP_WORLD);
          continue;
        }
        if (is_compute(n.kind)) {
          EXPECT_EQ(n.stream, Stream::STREAM_COMPUTE);
        } else {
          EXPECT_EQ(n.stream, Stream::STREAM_COMM);
          EXPECT_EQ(n.group, GroupDim::GROUP_DP);
          EXPECT_EQ(n.kind, NodeKind::ALLREDUCE);  // zero 0: gradients all-reduced, nothing else
        }
      }
      EXPECT_EQ(plan.graph.world_size(), world);
      const auto progs = lower_all(plan.graph, world);
      // every replica runs the same program
      for (int r = 1; r < world; ++r) {
        ASSERT_EQ(progs[r].compute.size(), progs[0].compute.size());
        ASSERT_EQ(progs[r].comm.size(), progs[0].comm.size());
        for (size_t i = 0; i < progs[0].compute.size(); ++i) EXPECT_EQ(progs[r].compute[i].node, progs[0].compute[i].node);
        for (size_t i = 0; i < progs[0].comm.size(); ++i) EXPECT_EQ(progs[r].comm[i].node, progs[0].comm[i].node);
      }
      check_plan(plan);
    }
  }
}

// Each unit's gradients are reduced once, in one bucket; the bucket waits for every microbatch's
// last gradient node of its units and every UPD of its units waits for it.
TEST(DataParallel, EveryUnitInExactlyOneAllReduceBucket) {
  const config::ModelConfig m = small_model("M*-M-");
  const ModelGraph mg = make_model_graph(m);
  const int n_units = static_cast<int>(mg.units.size());
  int64_t largest = 0;
  for (const auto& u : mg.units) largest = std::max(largest, u.param_count() * 4);
  const int64_t tiny = 1, huge = int64_t{1} << 40, middle = largest + largest / 2;
  for (int world : {2, 4}) {
    for (bool sb : {false, true}) {
      for (int64_t bucket : {tiny, middle, huge, int64_t{25} << 20}) {
        Par p;
        p.dp = world;
        p.mb = 3;
        p.split_backward = sb;
        SCOPED_TRACE("world " + std::to_string(world) + " " + name(p) + " bucket_bytes " + std::to_string(bucket));
        const Graph g = build(mg, make_strategy(m, world, p, bucket));
        ASSERT_NO_THROW(verify(g, mg));
        const auto reds = nodes_of(g, NodeKind::ALLREDUCE);
        EXPECT_TRUE(nodes_of(g, NodeKind::REDUCE_SCATTER).empty());
        EXPECT_TRUE(nodes_of(g, NodeKind::ALLGATHER).empty());
        std::map<int, int> bucket_of;  // unit -> ALLREDUCE node
        for (int id : reds) {
          const Node& n = g.node(id);
          ASSERT_FALSE(n.units.empty());
          EXPECT_EQ(n.payload, Payload::PAYLOAD_WGRAD);
          EXPECT_EQ(n.group, GroupDim::GROUP_DP);
          EXPECT_EQ(n.stream, Stream::STREAM_COMM);
          EXPECT_EQ(n.devices, iota(0, world));
          EXPECT_EQ(n.tags.microbatch, -1);
          EXPECT_EQ(n.bytes, grad_bytes(mg, n.units));
          // a bucket is a run of consecutive units
          for (size_t i = 1; i < n.units.size(); ++i) EXPECT_EQ(n.units[i], n.units[i - 1] + 1);
          // at least bucket_bytes unless it reaches the stage's first unit, and never a unit more than needed
          if (n.units.front() != 0) {
            EXPECT_GE(n.bytes, bucket);
          }
          EXPECT_LT(n.bytes - grad_bytes(mg, {n.units.front()}), bucket);
          std::set<int> want_in;
          for (int u : n.units) {
            EXPECT_TRUE(bucket_of.emplace(u, id).second) << "unit " << u << " in two buckets";
            for (int mb = 0; mb < p.mb; ++mb) want_in.insert(last_grad(g, u, mb, sb));
            EXPECT_TRUE(has_edge(g, id, find_node(g, NodeKind::UPD, u, -1))) << "ALLREDUCE before UPD of unit " << u;
          }
          EXPECT_EQ(data_preds(g, id), want_in);
          std::set<int> want_out{norm_of(g, n.devices.front())};  // the norm reads the reduced gradients
          for (int u : n.units) want_out.insert(find_node(g, NodeKind::UPD, u, -1));
          EXPECT_EQ(data_succs(g, id), want_out);
        }
        EXPECT_EQ(static_cast<int>(bucket_of.size()), n_units);
        // an UPD waits for its bucket and the norm only: its gradients are those the all-reduce returns
        for (int u = 0; u < n_units; ++u)
          EXPECT_EQ(data_preds(g, find_node(g, NodeKind::UPD, u, -1)), (std::set<int>{bucket_of.at(u), norm_total(g)}))
              << "unit " << u;
        if (bucket == tiny) {
          EXPECT_EQ(static_cast<int>(reds.size()), n_units);  // one bucket per unit
        } else if (bucket == huge || bucket == (int64_t{25} << 20)) {
          ASSERT_EQ(reds.size(), 1u);  // one bucket per stage: the whole model
          EXPECT_EQ(g.node(reds[0]).units, iota(0, n_units));
        } else {
          EXPECT_GT(static_cast<int>(reds.size()), 1);
          EXPECT_LT(static_cast<int>(reds.size()), n_units);
        }
        // buckets are created (and issued) in the order gradients become ready: last units first
        for (size_t i = 1; i < reds.size(); ++i)
          EXPECT_LT(g.node(reds[i]).units.back(), g.node(reds[i - 1]).units.front());
        const auto progs = lower_all(g, world);
        std::vector<int> comm;
        for (const Instr& in : progs[0].comm) comm.push_back(in.node);
        ASSERT_FALSE(comm.empty());
        EXPECT_EQ(comm.back(), norm_total(g));  // after every bucket it depends on
        comm.pop_back();
        EXPECT_EQ(comm, reds);
        check_plan(mg, make_strategy(m, world, p, bucket), g);
      }
    }
  }
}

// With pipelines, buckets stay within a stage and run on that stage's ranks.
TEST(DataParallel, BucketsPerStageWithAPipeline) {
  const config::ModelConfig m = small_model("M*-M*-M-");
  const ModelGraph mg = make_model_graph(m);
  Par p;
  p.dp = 2;
  p.pp = 2;
  p.mb = 4;
  for (int64_t bucket : {int64_t{1}, int64_t{1} << 40}) {
    SCOPED_TRACE("bucket_bytes " + std::to_string(bucket));
    const Strategy s = make_strategy(m, 4, p, bucket);
    const Graph g = build(mg, s);
    ASSERT_NO_THROW(verify(g, mg));
    const auto stage = stages_of_units(g, static_cast<int>(mg.units.size()));
    const auto reds = nodes_of(g, NodeKind::ALLREDUCE);
    if (bucket == 1) {
      EXPECT_EQ(reds.size(), mg.units.size());
    } else {
      ASSERT_EQ(reds.size(), 2u);  // one per stage, the last stage's first
      EXPECT_EQ(g.node(reds[0]).tags.stage, 1);
      EXPECT_EQ(g.node(reds[1]).tags.stage, 0);
    }
    std::set<int> covered;
    for (int id : reds) {
      const Node& n = g.node(id);
      for (int u : n.units) {
        EXPECT_EQ(stage[static_cast<size_t>(u)], n.tags.stage) << "unit " << u;
        EXPECT_TRUE(covered.insert(u).second);
      }
      // stage 0 on ranks 0,1 (pp coordinate rank / 2), stage 1 on 2,3
      EXPECT_EQ(n.devices, n.tags.stage == 0 ? (std::vector<int>{0, 1}) : (std::vector<int>{2, 3}));
    }
    EXPECT_EQ(covered.size(), mg.units.size());
    check_plan(mg, s, g);
  }
}

// ---- ZeRO ---------------------------------------------------------------------------------------

TEST(Zero, Stages1And2ReduceThenGatherParametersAfterTheUpdates) {
  const config::ModelConfig m = small_model("M*-M-");
  const ModelGraph mg = make_model_graph(m);
  const int n_units = static_cast<int>(mg.units.size());
  for (int zero : {0, 1, 2}) {
    for (bool sb : {false, true}) {
      for (int64_t bucket : {int64_t{1}, int64_t{25} << 20}) {
        Par p;
        p.dp = 2;
        p.mb = 2;
        p.zero = zero;
        p.split_backward = sb;
        SCOPED_TRACE(name(p) + " bucket_bytes " + std::to_string(bucket));
        const Graph g = build(mg, make_strategy(m, 2, p, bucket));
        ASSERT_NO_THROW(verify(g, mg));
        const auto ar = nodes_of(g, NodeKind::ALLREDUCE);
        const auto rs = nodes_of(g, NodeKind::REDUCE_SCATTER);
        const auto ag = nodes_of(g, NodeKind::ALLGATHER);
        const auto& reds = zero == 2 ? rs : ar;
        EXPECT_TRUE((zero == 2 ? ar : rs).empty()) << "zero 2 reduce-scatters, zero 0/1 all-reduce";
        EXPECT_EQ(reds.size(), bucket == 1 ? static_cast<size_t>(n_units) : 1u);
        if (zero == 0) {
          EXPECT_TRUE(ag.empty());
        } else {
          // one ALLGATHER of the updated parameters per bucket, after every UPD of the bucket
          ASSERT_EQ(ag.size(), reds.size());
          for (size_t i = 0; i < ag.size(); ++i) {
            const Node& gather = g.node(ag[i]);
            const Node& red = g.node(reds[i]);
            EXPECT_EQ(gather.units, red.units);
            EXPECT_EQ(gather.payload, Payload::PAYLOAD_PARAMS);
            EXPECT_EQ(gather.group, GroupDim::GROUP_DP);
            EXPECT_EQ(gather.stream, Stream::STREAM_COMM);
            EXPECT_EQ(gather.devices, (std::vector<int>{0, 1}));
            EXPECT_EQ(gather.tags.microbatch, -1);
            EXPECT_EQ(gather.bytes, grad_bytes(mg, gather.units));
            std::set<int> upds;
            for (int u : gather.units) upds.insert(find_node(g, NodeKind::UPD, u, -1));
            EXPECT_EQ(data_preds(g, ag[i]), upds);
          }
        }
        for (int id : reds) {
          EXPECT_EQ(g.node(id).payload, Payload::PAYLOAD_WGRAD);
          std::set<int> want;
          for (int u : g.node(id).units)
            for (int mb = 0; mb < p.mb; ++mb) want.insert(last_grad(g, u, mb, sb));
          EXPECT_EQ(data_preds(g, id), want);
        }
        check_plan(mg, make_strategy(m, 2, p, bucket), g);
      }
    }
  }
}

// ZeRO-3 gathers the parameters in the type the units compute with: 2 bytes a value under bf16,
// while the gradients are reduce-scattered in f32 (and ZeRO-1's updated shards gathered in f32).
TEST(Zero, Stage3GathersInTheComputeTypeAndReducesInF32) {
  for (const char* precision : {"fp32", "bf16"}) {
    Par p;
    p.dp = 2;
    p.mb = 2;
    p.zero = 3;
    config::Config c = make_config("M*-", p);
    c.train.precision = precision;
    const Plan plan = compile(c, 2);
    const int64_t elem = std::string(precision) == "bf16" ? 2 : 4;
    EXPECT_EQ(plan.strategy.compute_elem_bytes, elem);
    int gathers = 0;
    for (const Node& n : plan.graph.nodes()) {
      if (n.kind == NodeKind::ALLGATHER) {
        EXPECT_EQ(n.bytes, grad_bytes(plan.model, n.units) / 4 * elem) << precision;
        ++gathers;
      }
      if (n.kind == NodeKind::REDUCE_SCATTER) {
        EXPECT_EQ(n.bytes, grad_bytes(plan.model, n.units)) << precision;
      }
    }
    EXPECT_EQ(gathers, static_cast<int>(plan.model.units.size()) * 2 * 2) << precision;
  }
}

// ZeRO-3: gradients reduce-scattered, and each unit's parameters gathered before each use: one
// ALLGATHER per (unit, microbatch) before the forward, one before the backward.
TEST(Zero, Stage3GathersParametersBeforeEveryForwardAndBackward) {
  const config::ModelConfig m = small_model("M*-M-");
  const ModelGraph mg = make_model_graph(m);
  const int n_units = static_cast<int>(mg.units.size());
  for (int world : {2, 4}) {
    for (int pp : {1, 2}) {
      if (pp == 2 && world == 2) continue;
      for (bool sb : {false, true}) {
        Par p;
        p.dp = world / pp;
        p.pp = pp;
        p.mb = 3;
        p.zero = 3;
        p.split_backward = sb;
        SCOPED_TRACE("world " + std::to_string(world) + " " + name(p));
        const Strategy s = make_strategy(m, world, p);
        const Graph g = build(mg, s);
        ASSERT_NO_THROW(verify(g, mg));
        EXPECT_TRUE(nodes_of(g, NodeKind::ALLREDUCE).empty());
        EXPECT_EQ(nodes_of(g, NodeKind::REDUCE_SCATTER).size(), static_cast<size_t>(pp));  // one bucket per stage
        const auto stage = stages_of_units(g, n_units);
        std::map<std::tuple<int, int, Pass>, int> gather;  // (unit, mb, F or B) -> node
        for (int id : nodes_of(g, NodeKind::ALLGATHER)) {
          const Node& n = g.node(id);
          ASSERT_EQ(n.units.size(), 1u);
          EXPECT_GE(n.tags.microbatch, 0) << "no gather after the updates with zero 3";
          EXPECT_TRUE(n.tags.pass == Pass::PASS_F || n.tags.pass == Pass::PASS_B);
          EXPECT_EQ(n.tags.unit, n.units[0]);
          EXPECT_EQ(n.payload, Payload::PAYLOAD_PARAMS);
          EXPECT_EQ(n.group, GroupDim::GROUP_DP);
          EXPECT_EQ(n.stream, Stream::STREAM_COMM);
          EXPECT_EQ(n.bytes, grad_bytes(mg, n.units));
          EXPECT_TRUE(gather.emplace(std::make_tuple(n.units[0], n.tags.microbatch, n.tags.pass), id).second);
        }
        EXPECT_EQ(gather.size(), static_cast<size_t>(n_units * p.mb * 2));
        for (int mb = 0; mb < p.mb; ++mb) {
          for (int u = 0; u < n_units; ++u) {
            SCOPED_TRACE("unit " + std::to_string(u) + " mb" + std::to_string(mb));
            const int f = find_node(g, NodeKind::FWD, u, mb);
            const int gf = gather.at({u, mb, Pass::PASS_F});
            const int gb = gather.at({u, mb, Pass::PASS_B});
            EXPECT_EQ(g.node(gf).devices, g.node(f).devices);
            EXPECT_EQ(g.node(gb).devices, g.node(f).devices);
            // forward gather: feeds the forward; prefetched once the unit two before (same stage) ran
            EXPECT_EQ(data_succs(g, gf), std::set<int>{f});
            std::set<int> want_pred;
            if (u >= 2 && stage[static_cast<size_t>(u - 2)] == stage[static_cast<size_t>(u)])
              want_pred.insert(find_node(g, NodeKind::FWD, u - 2, mb));
            EXPECT_EQ(data_preds(g, gf), want_pred);
            // backward gather: after the unit's forward, feeding every backward half of the unit
            EXPECT_EQ(data_preds(g, gb), std::set<int>{f});
            std::set<int> want_succ;
            if (!sb) {
              want_succ.insert(find_node(g, NodeKind::BWD, u, mb));
            } else {
              if (u > 0) want_succ.insert(find_node(g, NodeKind::BWD_I, u, mb));
              want_succ.insert(find_node(g, NodeKind::BWD_W, u, mb));
            }
            EXPECT_EQ(data_succs(g, gb), want_succ);
          }
        }
        check_plan(mg, s, g);
      }
    }
  }
}

// ---- pipelines -------------------------------------------------------------------------------

TEST(Pipeline, TwoRanksSendActivationsDownAndGradientsUp) {
  const ModelGraph mg = make_model_graph(small_model("M*-M*-M-"));
  for (bool sb : {false, true}) {
    Par p;
    p.pp = 2;
    p.mb = 4;
    p.split_backward = sb;
    SCOPED_TRACE(name(p));
    const Plan plan = compile(make_config("M*-M*-M-", p), 2);
    const Graph& g = plan.graph;
    const auto stage = stages_of_units(g, static_cast<int>(mg.units.size()));
    int cut = 0;  // the first unit of stage 1
    while (stage[static_cast<size_t>(cut)] == 0) ++cut;
    ASSERT_GT(cut, 0);
    for (const Node& n : g.nodes())
      if (is_compute(n.kind)) {
        EXPECT_EQ(n.devices, std::vector<int>{n.tags.stage});
      }
    EXPECT_EQ(nodes_of(g, NodeKind::SEND).size(), static_cast<size_t>(2 * p.mb));
    for (int mb = 0; mb < p.mb; ++mb) {
      // FWD(cut-1) -> SEND on 0 to 1 -> RECV on 1 from 0 -> FWD(cut)
      const auto down = data_succs(g, find_node(g, NodeKind::FWD, cut - 1, mb));
      int send = -1;
      for (int id : down)
        if (g.node(id).kind == NodeKind::SEND) send = id;
      ASSERT_GE(send, 0) << "mb" << mb;
      EXPECT_EQ(g.node(send).devices, std::vector<int>{0});
      EXPECT_EQ(g.node(send).peers, std::vector<int>{1});
      EXPECT_EQ(g.node(send).payload, Payload::PAYLOAD_ACTIVATION);
      const int recv = *data_succs(g, send).begin();
      EXPECT_EQ(g.node(recv).devices, std::vector<int>{1});
      EXPECT_EQ(g.node(recv).peers, std::vector<int>{0});
      EXPECT_EQ(data_succs(g, recv), std::set<int>{find_node(g, NodeKind::FWD, cut, mb)});
      // BWD(cut) -> SEND on 1 to 0 -> RECV on 0 from 1 -> BWD(cut-1)
      const NodeKind bi = sb ? NodeKind::BWD_I : NodeKind::BWD;
      int gsend = -1;
      for (int id : data_succs(g, find_node(g, bi, cut, mb)))
        if (g.node(id).kind == NodeKind::SEND) gsend = id;
      ASSERT_GE(gsend, 0);
      EXPECT_EQ(g.node(gsend).devices, std::vector<int>{1});
      EXPECT_EQ(g.node(gsend).peers, std::vector<int>{0});
      EXPECT_EQ(g.node(gsend).payload, Payload::PAYLOAD_GRADIENT);
      const int grecv = *data_succs(g, gsend).begin();
      EXPECT_EQ(g.node(grecv).devices, std::vector<int>{0});
      EXPECT_EQ(g.node(grecv).peers, std::vector<int>{1});
      EXPECT_EQ(data_succs(g, grecv),
                std::set<int>{find_node(g, sb ? (cut - 1 == 0 ? NodeKind::BWD_W : NodeKind::BWD_I) : NodeKind::BWD,
                                        cut - 1, mb)});
    }
    check_plan(plan);
  }
}

// dp 2 x pp 2 on 4 ranks, grid tp-dp-pp: pp coordinate rank / 2, dp coordinate rank % 2.
TEST(Pipeline, FourRanksPairPeersWithTheSameDataParallelCoordinate) {
  for (const std::string order : {"tp-dp-pp", "pp-dp-tp"}) {
    Par p;
    p.dp = 2;
    p.pp = 2;
    p.mb = 4;
    SCOPED_TRACE(order);
    config::Config cfg = make_config("M*-M*-M-", p);
    const ModelGraph mg = make_model_graph(cfg.model);
    Strategy s = expand(cfg, 4);
    s.grid_order = order;
    const Graph g = build(mg, s);
    ASSERT_NO_THROW(verify(g, mg));
    // tp-dp-pp: stage 0 on {0, 1}, stage 1 on {2, 3}; pp-dp-tp (pp fastest): stage 0 on {0, 2}
    const std::vector<int> s0 = order == "tp-dp-pp" ? std::vector<int>{0, 1} : std::vector<int>{0, 2};
    const std::vector<int> s1 = order == "tp-dp-pp" ? std::vector<int>{2, 3} : std::vector<int>{1, 3};
    for (const Node& n : g.nodes())
      if (is_compute(n.kind)) {
        EXPECT_EQ(n.devices, n.tags.stage == 0 ? s0 : s1);
      }
    int sends = 0;
    for (int id : nodes_of(g, NodeKind::SEND)) {
      const Node& n = g.node(id);
      ++sends;
      if (n.payload == Payload::PAYLOAD_ACTIVATION) {
        EXPECT_EQ(n.devices, s0);
        EXPECT_EQ(n.peers, s1);
      } else {
        EXPECT_EQ(n.devices, s1);
        EXPECT_EQ(n.peers, s0);
      }
    }
    EXPECT_EQ(sends, 2 * p.mb);
    check_plan(mg, s, g);
  }
}

// 1F1B on pp 2 with 4 microbatches: rank 0 warms up with two forwards before any backward,
// rank 1 alternates from the start.
TEST(Pipeline, OneFOneBWarmUpOnRankZero) {
  Par p;
  p.pp = 2;
  p.mb = 4;
  const Plan plan = compile(make_config("M*-M*-M-", p), 2);
  for (int r : {0, 1}) {
    const Program prog = lower(plan.graph, r);
    std::vector<std::pair<Pass, int>> ops;  // (pass, mb) of each run of one stage's units
    for (const Instr& in : prog.compute) {
      if (in.kind == NodeKind::UPD || in.kind == NodeKind::NORM) continue;
      const std::pair<Pass, int> op{in.pass, in.microbatch};
      if (ops.empty() || ops.back() != op) ops.push_back(op);
    }
    const Pass F = Pass::PASS_F, B = Pass::PASS_B;
    if (r == 0) {
      EXPECT_EQ(ops, (std::vector<std::pair<Pass, int>>{{F, 0}, {F, 1}, {B, 0}, {F, 2}, {B, 1}, {F, 3}, {B, 2}, {B, 3}}));
    } else {
      EXPECT_EQ(ops, (std::vector<std::pair<Pass, int>>{{F, 0}, {B, 0}, {F, 1}, {B, 1}, {F, 2}, {B, 2}, {F, 3}, {B, 3}}));
    }
    // the first two forwards (every unit of the stage) precede any backward
    size_t first_b = prog.compute.size();
    for (size_t i = 0; i < prog.compute.size(); ++i)
      if (prog.compute[i].kind == NodeKind::BWD) {
        first_b = i;
        break;
      }
    std::set<int> fwd_mbs;
    for (size_t i = 0; i < first_b; ++i) fwd_mbs.insert(prog.compute[i].microbatch);
    EXPECT_EQ(fwd_mbs, r == 0 ? (std::set<int>{0, 1}) : (std::set<int>{0}));
  }
}

struct GridCase {
  int world, dp, pp;
};

// Every (grid, schedule, split, ZeRO stage, microbatches) this file builds on 2, 4 and 8 ranks.
std::vector<std::pair<int, Par>> every_multi_rank_case() {
  std::vector<std::pair<int, Par>> cases;
  for (const GridCase& gr : {GridCase{2, 1, 2}, GridCase{4, 2, 2}, GridCase{4, 1, 4}, GridCase{8, 2, 4}, GridCase{8, 4, 2}})
    for (const std::string sched : {"gpipe", "1f1b", "interleaved", "zbh1", "dualpipev"})
      for (bool sb : {false, true}) {
        if ((sched == "zbh1" || sched == "dualpipev") && !sb) continue;
        for (int zero : {0, 1, 2, 3}) {
          if (gr.dp == 1 && zero > 0) continue;
          for (int mb : {2 * gr.pp, 3 * gr.pp}) {
            Par p;
            p.dp = gr.dp;
            p.pp = gr.pp;
            p.zero = zero;
            p.mb = mb;
            p.schedule = sched;
            p.split_backward = sb;
            p.vs = sched == "interleaved" ? 2 : 1;
            cases.emplace_back(gr.world, p);
          }
        }
      }
  return cases;
}

// Every schedule builds, verifies and lowers on 2, 4 and 8 ranks, with every ZeRO stage: the
// programs' waits, peers, collective order and compute order (the schedule) are right.
TEST(Pipeline, EveryScheduleVerifiesAndLowersOnEveryGrid) {
  int plans = 0;
  for (const auto& [world, p] : every_multi_rank_case()) {
    SCOPED_TRACE("world " + std::to_string(world) + " " + name(p));
    Plan plan;
    try {
      plan = compile(make_config("M*-M*-M-", p), world);  // 10 units
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    ++plans;
    EXPECT_EQ(plan.graph.world_size(), world);
    std::set<int> stages;
    for (const Node& n : plan.graph.nodes()) stages.insert(n.tags.stage);
    const int chunks = p.schedule == "interleaved" || p.schedule == "dualpipev" ? 2 : 1;
    EXPECT_EQ(static_cast<int>(stages.size()), p.pp * chunks);
    check_plan(plan, /*play=*/false);
    if (::testing::Test::HasFailure()) return;  // one failing plan is enough to read
  }
  EXPECT_GT(plans, 100);
}

// The same plans, every rank's program played together by the Player's rules (compile's
// verify_play): none deadlocks.
//
// lower() places a communication node as soon as its inputs are ready, so a
// message never waits in the stream behind one produced later (with a single
// ready queue, every pp=4 plan here deadlocked).
TEST(Lower, ProgramsPlayedTogetherDoNotDeadlock) {
  std::vector<std::string> deadlocked;
  for (const auto& [world, p] : every_multi_rank_case()) {
    try {
      compile(make_config("M*-M*-M-", p), world);
    } catch (const VerifyError& e) {
      deadlocked.push_back("world " + std::to_string(world) + " " + name(p));
      if (deadlocked.size() <= 4) std::printf("[ deadlock ] %-45s %s\n", deadlocked.back().c_str(), e.what());
    }
  }
  EXPECT_TRUE(deadlocked.empty()) << deadlocked.size() << " of " << every_multi_rank_case().size()
                                  << " plans deadlock, the first: " << (deadlocked.empty() ? "" : deadlocked.front());
}

// ---- expert parallelism --------------------------------------------------------------------------

// An MoE block at ep 2 of dp 4: its forward is four segments joined by the counts exchange, the
// dispatch and the combine, ALLTOALL nodes over the ep group on every rank of the stage, with the
// balanced-routing sizes; its backward moves the rows' gradients there and back. With tp 2 the
// routing weights' gradient is summed over tp first. The rows travel in the activations' storage
// type (2 bytes a value under bf16), the counts and the sums in f32. Every schedule's programs verify
// and play.
TEST(ExpertParallel, DispatchAndCombineAreAllToAllNodesOverTheEpGroup) {
  for (int tp : {1, 2})
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(std::string("tp ") + std::to_string(tp) + " " + precision);
    Par p;
    p.dp = 4;
    p.mb = 2;
    config::Config c = make_config("M-E", p);
    c.parallel.ep = 2;
    c.parallel.tp = tp;
    c.train.precision = precision;
    const int64_t elem = std::string(precision) == "bf16" ? 2 : 4;
    const int world = 4 * tp;
    const Plan plan = compile(c, world);
    const int moe = 3;  // embed, layers.0 (M), layers.1 (-), layers.2 (E)
    const int64_t rows = c.train.global_batch / (p.dp * p.mb) * c.train.seq_len, D = c.model.d_model;
    std::map<std::pair<Pass, int>, const Node*> points;  // (pass, segment) -> the collective after it
    for (const Node& n : plan.graph.nodes())
      if (n.tags.unit == moe && n.tags.microbatch == 0 && n.payload == Payload::PAYLOAD_UNIT) points[{n.tags.pass, n.tags.segment}] = &n;
    ASSERT_EQ(points.size(), tp > 1 ? 4u + 4u : 3u + 2u) << "tp " << tp;  // forward, backward
    const Node& counts = *points.at({Pass::PASS_F, 0});
    EXPECT_EQ(counts.kind, NodeKind::ALLTOALL);
    EXPECT_EQ(counts.group, GroupDim::GROUP_EP);
    EXPECT_EQ(counts.bytes, c.model.n_experts * 4);
    EXPECT_EQ(counts.devices, iota(0, world));
    for (int k : {1, 2}) {
      EXPECT_EQ(points.at({Pass::PASS_F, k})->kind, NodeKind::ALLTOALL);
      EXPECT_EQ(points.at({Pass::PASS_F, k})->bytes, rows * c.model.top_k * D * elem);  // balanced routing
    }
    const int b0 = tp > 1 ? 1 : 0;  // the backward's first all-to-all
    if (tp > 1) {
      EXPECT_EQ(points.at({Pass::PASS_F, 3})->group, GroupDim::GROUP_TP);
      EXPECT_EQ(points.at({Pass::PASS_B, 0})->kind, NodeKind::ALLREDUCE);
      EXPECT_EQ(points.at({Pass::PASS_B, 0})->bytes, rows * c.model.top_k * 4);  // the routing weights' gradient
    }
    EXPECT_EQ(points.at({Pass::PASS_B, b0})->group, GroupDim::GROUP_EP);
    EXPECT_EQ(points.at({Pass::PASS_B, b0 + 1})->group, GroupDim::GROUP_EP);
    EXPECT_EQ(points.at({Pass::PASS_B, b0})->bytes, rows * c.model.top_k * D * elem);
    // The ep groups of a dp group of 4: dp coordinates {0, 1} and {2, 3}.
    const ParallelDims dims = plan.strategy.dims();
    EXPECT_EQ(dims.group(0, Axis::EP), (std::vector<int>{0, tp}));
    EXPECT_EQ(dims.expert_data_group(0), (std::vector<int>{0, 2 * tp}));
  }
  for (const char* schedule : {"1f1b", "gpipe", "zbh1", "dualpipev", "interleaved"}) {
    Par p;
    p.dp = 2, p.pp = 2, p.mb = 4, p.schedule = schedule, p.vs = std::string(schedule) == "interleaved" ? 2 : 1;
    config::Config c = make_config("M-EM*EE", p);
    c.parallel.ep = 2;
    c.parallel.pairs = std::string(schedule) == "dualpipev";
    EXPECT_NO_THROW(compile(c, 4)) << schedule;
  }
}

// ---- stage balancing (tests/unit/ir/test_balance.cpp checks the partition itself) --------------

// The two stages of a built plan differ in work (ir::unit_costs, what ir::expand balances) by at
// most the largest unit's: moving the unit at the cut to the lighter stage would otherwise lower
// the heavier.
TEST(Balance, TwoStagesDifferByAtMostTheLargestUnit) {
  for (const std::string pattern : {"M*-M*-M-", "M*-M-", "MMMM-", "-*-*-*-*", "M---------"}) {
    SCOPED_TRACE(pattern);
    const config::ModelConfig m = small_model(pattern);
    const ModelGraph mg = make_model_graph(m);
    Par p;
    p.pp = 2;
    p.mb = 2;
    const Graph g = build(mg, make_strategy(m, 2, p));
    ASSERT_NO_THROW(verify(g, mg));
    const auto stage = stages_of_units(g, static_cast<int>(mg.units.size()));
    const std::vector<double> work = unit_costs(m, mg, config::TrainConfig{}.seq_len);
    double cost[2] = {0, 0};
    for (size_t u = 0; u < mg.units.size(); ++u) cost[stage[u]] += work[u];
    const double largest = *std::max_element(work.begin(), work.end());
    std::printf("[ balance ] %-12s stage FLOPs %.4g | %.4g, largest unit %.4g\n", pattern.c_str(), cost[0], cost[1],
                largest);
    EXPECT_GT(cost[0], 0.0);
    EXPECT_GT(cost[1], 0.0);
    EXPECT_LE(std::abs(cost[0] - cost[1]), largest);
  }
}

// Interleaved and DualPipeV stages: 2 chunks per rank, stages in model order on the layout's ranks.
TEST(Balance, ChunkedLayoutsPutStagesOnTheLayoutsRanks) {
  const config::ModelConfig m = small_model("M*-M*-M-");
  const ModelGraph mg = make_model_graph(m);
  for (const std::string sched : {"interleaved", "dualpipev"}) {
    Par p;
    p.pp = 2;
    p.mb = 4;
    p.vs = 2;
    p.schedule = sched;
    p.split_backward = sched == "dualpipev";
    SCOPED_TRACE(sched);
    const Graph g = build(mg, make_strategy(m, 2, p));
    ASSERT_NO_THROW(verify(g, mg));
    const auto stage = stages_of_units(g, static_cast<int>(mg.units.size()));
    EXPECT_EQ(stage.front(), 0);
    EXPECT_EQ(stage.back(), 3);
    for (size_t u = 1; u < stage.size(); ++u) EXPECT_LE(stage[u] - stage[u - 1], 1);
    // LOOP: stage s on rank s % 2 (0 1 0 1); V: 0 1 1 0
    const std::vector<int> rank_of_stage = sched == "interleaved" ? std::vector<int>{0, 1, 0, 1} : std::vector<int>{0, 1, 1, 0};
    for (const Node& n : g.nodes())
      if (is_compute(n.kind)) {
        EXPECT_EQ(n.devices, std::vector<int>{rank_of_stage[static_cast<size_t>(n.tags.stage)]});
      }
    // DualPipeV's middle stages share rank 1: no SEND/RECV between them
    int sends = static_cast<int>(nodes_of(g, NodeKind::SEND).size());
    EXPECT_EQ(sends, (sched == "interleaved" ? 3 : 2) * 2 * p.mb);
  }
}

// ---- plan hash -------------------------------------------------------------------------------

TEST(PlanHash, DataAndPipelineParallelPlansDiffer) {
  Par dp;
  dp.dp = 2;
  dp.mb = 4;
  Par pp;
  pp.pp = 2;
  pp.mb = 4;
  const uint64_t h_dp = compile(make_config("M*-M*-M-", dp), 2).hash;
  const uint64_t h_pp = compile(make_config("M*-M*-M-", pp), 2).hash;
  EXPECT_EQ(h_dp, compile(make_config("M*-M*-M-", dp), 2).hash);
  EXPECT_EQ(h_pp, compile(make_config("M*-M*-M-", pp), 2).hash);
  EXPECT_NE(h_dp, h_pp);
  std::printf("[ hash ] dp2 %016llx pp2 %016llx\n", static_cast<unsigned long long>(h_dp),
              static_cast<unsigned long long>(h_pp));
  // ZeRO stages, the grid order and the bucket size all change the plan
  std::set<uint64_t> hashes = {h_dp, h_pp};
  for (int zero : {1, 2, 3}) {
    Par z = dp;
    z.zero = zero;
    EXPECT_TRUE(hashes.insert(compile(make_config("M*-M*-M-", z), 2).hash).second) << "zero " << zero;
  }
  Par both;
  both.dp = 2;
  both.pp = 2;
  both.mb = 4;
  const config::Config cfg = make_config("M*-M*-M-", both);
  const ModelGraph mg = make_model_graph(cfg.model);
  Strategy a = expand(cfg, 4), b = a, c = a;
  b.grid_order = "pp-dp-tp";
  c.replicate.bucket_bytes = 1;
  const uint64_t ha = plan_hash(build(mg, a), mg), hb = plan_hash(build(mg, b), mg), hc = plan_hash(build(mg, c), mg);
  EXPECT_EQ(ha, compile(cfg, 4).hash);
  EXPECT_TRUE(hashes.insert(ha).second);
  EXPECT_TRUE(hashes.insert(hb).second);
  EXPECT_TRUE(hashes.insert(hc).second);
}

}  // namespace
}  // namespace piper::ir

namespace piper::ir {
namespace {

config::Config subset_config(const std::string& directives) {
  const std::string model =
      "model: {pattern: \"M*-M*-M-\", vocab_size: 32, d_model: 16, n_heads: 4, n_kv_heads: 2, ffn_hidden: 24, "
      "d_state: 8, head_dim: 8, n_groups: 2}\n";
  return config::parse(model + "directives:\n" + directives, "subset.yaml");
}

// split_backward {kind: "*"} under 1f1b at pp 2: the attention blocks' backwards are BWD_I + BWD_W,
// every other unit's one fused BWD, and each rank's program runs them in the schedule's BI slots.
TEST(SubsetSplit, OnlyTheSelectedUnitsSplitTheirBackward) {
  const config::Config cfg = subset_config("  - split: {microbatches: 2}\n  - place: {pp: 2}\n"
                                           "  - split_backward: {kind: \"*\"}\n");
  ASSERT_NO_THROW(ir::validate(cfg, 2));
  const Plan p = compile(cfg, 2);  // verified
  std::map<std::pair<int, int>, std::set<NodeKind>> passes;  // (unit, mb) -> backward kinds
  for (const Node& n : p.graph.nodes())
    if (n.kind == NodeKind::BWD || n.kind == NodeKind::BWD_I || n.kind == NodeKind::BWD_W)
      passes[{n.tags.unit, n.tags.microbatch}].insert(n.kind);
  for (const UnitSpec& u : p.model.units)
    for (int mb = 0; mb < 2; ++mb) {
      const std::set<NodeKind> want = u.kind == UnitKind::UNIT_ATTENTION ? std::set<NodeKind>{NodeKind::BWD_I, NodeKind::BWD_W}
                                                                         : std::set<NodeKind>{NodeKind::BWD};
      EXPECT_EQ(passes[std::make_pair(u.index, mb)], want) << u.name << " mb" << mb;
    }
  // The programs hold every backward once.
  size_t backwards = 0;
  for (int r = 0; r < 2; ++r)
    for (const Instr& in : lower(p.graph, r).compute)
      backwards += in.kind == NodeKind::BWD || in.kind == NodeKind::BWD_I || in.kind == NodeKind::BWD_W;
  EXPECT_EQ(backwards, (p.model.units.size() + 2) * 2);  // a backward per unit, 2 for each of the 2 attention blocks; 2 mb
}

// ZeRO-3 for the embedding and the head only, at dp 2: their gradients reduce-scatter and their
// parameters gather before each use; the blocks' gradients all-reduce; no bucket mixes the two.
TEST(SubsetZero, BucketsHoldOneZeroStage) {
  const config::Config cfg = subset_config("  - split: {microbatches: 2}\n  - replicate: {dp: 2, bucket_mb: 1}\n"
                                           "  - replicate: {shard_optimizer: true, shard_grads: true, "
                                           "shard_params: true, kind: [embed, head]}\n");
  ASSERT_NO_THROW(ir::validate(cfg, 2));
  const Plan p = compile(cfg, 2);
  const int head = static_cast<int>(p.model.units.size()) - 1;
  std::set<int> gathered, scattered, reduced;
  for (const Node& n : p.graph.nodes()) {
    if (n.kind == NodeKind::REDUCE_SCATTER) scattered.insert(n.units.begin(), n.units.end());
    if (n.kind == NodeKind::ALLREDUCE && n.payload == Payload::PAYLOAD_WGRAD) reduced.insert(n.units.begin(), n.units.end());
    if (n.kind == NodeKind::ALLGATHER) {
      EXPECT_GE(n.tags.microbatch, 0) << "a gather after the updates: no unit is at ZeRO 1 or 2";
      gathered.insert(n.units.begin(), n.units.end());
    }
  }
  EXPECT_EQ(scattered, (std::set<int>{0, head}));
  EXPECT_EQ(gathered, (std::set<int>{0, head}));
  std::set<int> blocks;
  for (int u = 1; u < head; ++u) blocks.insert(u);
  EXPECT_EQ(reduced, blocks);
}

}  // namespace
}  // namespace piper::ir
