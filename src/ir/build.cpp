// build.cpp — the DAG builder: directives rewrite the model graph into the
// global training DAG.
#include "ir/build.hpp"

#include <string>

#include "ir/schedule.hpp"

namespace piper::ir {

namespace {

struct Builder {
  const ModelGraph& model;
  const Strategy& strategy;
  Graph g;
  int n_units = 0, n_mb = 0, n_stages = 1;
  std::vector<int> stage_of_unit, rank_of_stage;
  // Node ids by [unit][microbatch]; -1 where a unit has no such node.
  std::vector<std::vector<int>> fwd, bwd, bwd_i, bwd_w;
  std::vector<int> upd;

  Builder(const ModelGraph& m, const Strategy& s) : model(m), strategy(s) {}

  int rank_of_unit(int u) const {
    return rank_of_stage[static_cast<size_t>(stage_of_unit[static_cast<size_t>(u)])];
  }

  void place() {
    n_units = static_cast<int>(model.units.size());
    n_mb = strategy.split.microbatches;
    if (n_mb < 1) throw BuildError("split: microbatches must be >= 1, got " + std::to_string(n_mb));
    stage_of_unit = strategy.place.stage_of_unit;
    if (stage_of_unit.empty()) stage_of_unit.assign(static_cast<size_t>(n_units), 0);
    if (static_cast<int>(stage_of_unit.size()) != n_units)
      throw BuildError("place: stage_of_unit lists " + std::to_string(stage_of_unit.size()) +
                       " units, the model has " + std::to_string(n_units));
    for (int u = 0; u < n_units; ++u) {
      int s = stage_of_unit[static_cast<size_t>(u)];
      if (s < 0 || (u > 0 && s < stage_of_unit[static_cast<size_t>(u - 1)]))
        throw BuildError("place: unit " + model.units[static_cast<size_t>(u)].name +
                         " is on stage " + std::to_string(s) +
                         "; stages must be non-negative and non-decreasing along the model");
      n_stages = std::max(n_stages, s + 1);
    }
    rank_of_stage = strategy.place.rank_of_stage;
    if (rank_of_stage.empty())
      for (int s = 0; s < n_stages; ++s) rank_of_stage.push_back(s);
    if (static_cast<int>(rank_of_stage.size()) != n_stages)
      throw BuildError("place: " + std::to_string(rank_of_stage.size()) + " ranks for " +
                       std::to_string(n_stages) + " stages");
    for (int r : rank_of_stage)
      if (r < 0 || r >= strategy.world_size)
        throw BuildError("place: rank " + std::to_string(r) + " outside world size " +
                         std::to_string(strategy.world_size));
  }

  Node compute_node(NodeKind kind, Pass pass, int u, int mb) const {
    const UnitSpec& us = model.units[static_cast<size_t>(u)];
    Node n;
    n.kind = kind;
    n.tags = {stage_of_unit[static_cast<size_t>(u)], mb, pass, u, us.block, unit_symbol(us.kind)};
    n.devices = {rank_of_unit(u)};
    return n;
  }

  // A data edge from src to dst; SEND/RECV in between when they are on different ranks.
  void connect(int src, int dst) {
    const Node& a = g.node(src);
    const Node& b = g.node(dst);
    if (a.devices == b.devices) {
      g.add_edge(src, dst, EdgeKind::EDGE_DATA);
      return;
    }
    Node send = a, recv = b;
    send.kind = NodeKind::SEND;
    recv.kind = NodeKind::RECV;
    send.tags.pass = recv.tags.pass = Pass::PASS_COMM;
    send.stream = recv.stream = Stream::STREAM_COMM;
    send.peer = b.devices.front();
    recv.peer = a.devices.front();
    int s = g.add_node(send);
    int r = g.add_node(recv);
    g.add_edge(src, s, EdgeKind::EDGE_DATA);
    g.add_edge(s, r, EdgeKind::EDGE_DATA);
    g.add_edge(r, dst, EdgeKind::EDGE_DATA);
  }

  // split + backward split: the per-microbatch sub-DAGs.
  void split() {
    const bool sb = strategy.split_backward;
    auto table = [&] {
      return std::vector<std::vector<int>>(static_cast<size_t>(n_units),
                                           std::vector<int>(static_cast<size_t>(n_mb), -1));
    };
    fwd = table(), bwd = table(), bwd_i = table(), bwd_w = table();
    for (int mb = 0; mb < n_mb; ++mb) {
      for (int u = 0; u < n_units; ++u) {
        int f = g.add_node(compute_node(NodeKind::FWD, Pass::PASS_F, u, mb));
        fwd[u][mb] = f;
        if (u > 0) connect(fwd[u - 1][mb], f);
      }
      for (int u = n_units - 1; u >= 0; --u) {
        // The embedding has no input gradient: only its weight half exists.
        const bool has_input_grad = u > 0;
        int upstream = u + 1 < n_units ? (sb ? bwd_i[u + 1][mb] : bwd[u + 1][mb]) : -1;
        if (!sb) {
          int b = g.add_node(compute_node(NodeKind::BWD, Pass::PASS_B, u, mb));
          bwd[u][mb] = b;
          g.add_edge(fwd[u][mb], b, EdgeKind::EDGE_DATA);
          if (upstream >= 0) connect(upstream, b);
          continue;
        }
        int w_src = fwd[u][mb];
        if (has_input_grad) {
          int bi = g.add_node(compute_node(NodeKind::BWD_I, Pass::PASS_BI, u, mb));
          bwd_i[u][mb] = bi;
          g.add_edge(fwd[u][mb], bi, EdgeKind::EDGE_DATA);
          if (upstream >= 0) connect(upstream, bi);
          w_src = bi;
        }
        int bw = g.add_node(compute_node(NodeKind::BWD_W, Pass::PASS_BW, u, mb));
        bwd_w[u][mb] = bw;
        g.add_edge(w_src, bw, EdgeKind::EDGE_DATA);
        if (!has_input_grad && upstream >= 0) connect(upstream, bw);
      }
    }
  }

  // One optimiser update per unit, after every microbatch's weight gradients.
  void updates() {
    upd.assign(static_cast<size_t>(n_units), -1);
    for (int u = 0; u < n_units; ++u) {
      int id = g.add_node(compute_node(NodeKind::UPD, Pass::PASS_U, u, -1));
      upd[u] = id;
      for (int mb = 0; mb < n_mb; ++mb)
        g.add_edge(strategy.split_backward ? bwd_w[u][mb] : bwd[u][mb], id, EdgeKind::EDGE_DATA);
    }
  }

  // order: the schedule's op list per stage, expanded over the stage's units
  // and chained with ordering edges; updates last.
  void order() {
    std::vector<std::vector<StageOp>> ops;
    try {
      ops = schedule_ops(strategy.order.schedule, n_stages, n_mb, strategy.split_backward);
    } catch (const std::invalid_argument& e) {
      throw BuildError(std::string("order: ") + e.what());
    }
    for (int s = 0; s < n_stages; ++s) {
      std::vector<int> units;
      for (int u = 0; u < n_units; ++u)
        if (stage_of_unit[static_cast<size_t>(u)] == s) units.push_back(u);
      std::vector<int> seq;
      for (const StageOp& op : ops[static_cast<size_t>(s)]) {
        auto& table = op.pass == Pass::PASS_F    ? fwd
                      : op.pass == Pass::PASS_B  ? bwd
                      : op.pass == Pass::PASS_BI ? bwd_i
                                                 : bwd_w;
        if (op.pass == Pass::PASS_F) {
          for (int u : units) seq.push_back(table[u][op.microbatch]);
        } else {
          for (auto it = units.rbegin(); it != units.rend(); ++it)
            if (table[*it][op.microbatch] >= 0) seq.push_back(table[*it][op.microbatch]);
        }
      }
      for (int u : units) seq.push_back(upd[u]);
      for (size_t i = 1; i < seq.size(); ++i) g.add_edge(seq[i - 1], seq[i], EdgeKind::EDGE_ORDER);
    }
  }
};

}  // namespace

Graph build(const ModelGraph& model, const Strategy& strategy) {
  Builder b(model, strategy);
  b.place();
  b.split();
  b.updates();
  b.order();
  return std::move(b.g);
}

}  // namespace piper::ir
