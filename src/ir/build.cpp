// build.cpp — the DAG builder: directives rewrite the model graph into the
// global training DAG (split, backward split, place, replicate, order).
#include "ir/build.hpp"

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>

#include "ir/parallel_dims.hpp"
#include "ir/pipeline_schedules.hpp"
#include "ir/placement.hpp"
#include "ir/unit_passes.hpp"

namespace piper::ir {

namespace {

// The nodes of one unit pass: its compute segments in order, and the node
// whose completion gives the pass's result (the last segment, or the
// collective that ends the pass).
struct PassNodes {
  std::vector<int> segments;
  int out = -1;
  bool exists() const { return !segments.empty(); }
  int first() const { return segments.front(); }
  int last() const { return segments.back(); }
};

struct Builder {
  const ModelGraph& model;
  const Strategy& strategy;
  Graph g;
  ParallelDims grid;
  PipeSchedule sched;
  int n_units = 0, n_mb = 0, n_stages = 1;
  std::vector<int> stage_of_unit;
  std::vector<std::vector<int>> devices_of_stage;
  // Pass nodes by [unit][microbatch]; empty where a unit has no such pass.
  std::vector<std::vector<PassNodes>> fwd, bwd, bwd_i, bwd_w;
  std::vector<std::vector<int>> recomp;  // RECOMP node by [unit][microbatch], -1 where the unit is not recomputed
  std::vector<int> upd;
  std::vector<int> norm_of_pp;  // NORM node per pipeline rank

  Builder(const ModelGraph& m, const Strategy& s)
      : model(m),
        strategy(s),
        grid(s.dims()) {}

  void place() {
    n_units = static_cast<int>(model.units.size());
    n_mb = strategy.split.microbatches;
    if (n_mb < 1) throw BuildError("split: microbatches must be >= 1, got " + std::to_string(n_mb));
    try {
      // A hand-written order (order: {ranks: ...}) replaces the schedule function.
      sched = strategy.order.custom.empty()
                  ? make_schedule(strategy.order.schedule, strategy.place.pp, strategy.place.virtual_stages, n_mb,
                                  strategy.any_split_backward())
                  : custom_schedule(strategy);
    } catch (const std::invalid_argument& e) {
      throw BuildError(std::string("order: ") + e.what());
    }
    n_stages = sched.stages();
    if (n_units < n_stages)
      throw BuildError("place: the model has " + std::to_string(n_units) + " units (embedding, " +
                       std::to_string(n_units - 2) + " blocks, head), too few for " + std::to_string(n_stages) +
                       " pipeline stages (pp " + std::to_string(strategy.place.pp) + " x " +
                       std::to_string(sched.chunks) + " chunks per rank)");
    stage_of_unit = strategy.place.stage_of_unit;
    per_unit("place: stage_of_unit", stage_of_unit.size());
    per_unit("split_backward", strategy.split_backward_of_unit.size());
    per_unit("replicate: zero", strategy.replicate.zero_of_unit.size());
    const std::vector<int64_t> stages(stage_of_unit.begin(), stage_of_unit.end());
    if (const auto problem = stage_problem(model, stages, n_stages))
      throw BuildError("place: " + problem->message);
    devices_of_stage.resize(static_cast<size_t>(n_stages));
    for (int s = 0; s < n_stages; ++s) {
      const int p = sched.rank_of(s);
      for (int r = 0; r < strategy.world_size; ++r)
        if (grid.coord(r, Axis::PP) == p) devices_of_stage[static_cast<size_t>(s)].push_back(r);
    }
  }

  // A per-unit field of the strategy has a value for every unit.
  void per_unit(const std::string& field, size_t given) const {
    if (static_cast<int>(given) != n_units)
      throw BuildError(field + " lists " + std::to_string(given) + " units, the model has " + std::to_string(n_units) +
                       " (a Strategy holds every unit's value; ir::expand gives them)");
  }

  const std::vector<int>& devices_of_unit(int u) const {
    return devices_of_stage[static_cast<size_t>(stage_of_unit[static_cast<size_t>(u)])];
  }

  Node compute_node(NodeKind kind, Pass pass, int u, int mb) const {
    const UnitSpec& us = model.units[static_cast<size_t>(u)];
    Node n;
    n.kind = kind;
    n.tags = {stage_of_unit[static_cast<size_t>(u)], mb, pass, u, us.block, unit_symbol(us.kind)};
    n.devices = devices_of_unit(u);
    return n;
  }

  // The rank of `to_devices` with the same tp and dp coordinates as `rank`.
  int partner(int rank, const std::vector<int>& to_devices) const {
    Coords coords = grid.coords(rank);
    coords.pp = grid.coord(to_devices.front(), Axis::PP);
    return grid.rank_of(coords);
  }

  int64_t d_model() const { return strategy.activation_bytes / std::max<int64_t>(1, 4 * strategy.microbatch_rows); }

  // A collective over the unit's tp group at communication point k of a pass.
  Node tp_collective(const CommPoint& point, const Node& segment, int k) const {
    Node n = segment;
    n.kind = point.kind;
    n.tags.segment = k;
    n.stream = Stream::STREAM_COMM;
    n.group = GroupDim::GROUP_TP;
    n.payload = Payload::PAYLOAD_UNIT;
    // As every collective node: the whole buffer each member holds afterwards.
    n.bytes = point.floats_per_row * strategy.microbatch_rows * 4 *
              (point.kind == NodeKind::ALLGATHER ? strategy.shard.tp : 1);
    return n;
  }

  // One unit pass: its segments chained through the collectives between them.
  PassNodes add_pass(NodeKind kind, Pass pass, int u, int mb) {
    const PassShape shape =
        pass_shape(model.units[static_cast<size_t>(u)].kind, kind, strategy.shard.tp, d_model());
    PassNodes p;
    for (int k = 0; k < shape.segments; ++k) {
      Node seg = compute_node(kind, pass, u, mb);
      seg.tags.segment = k;
      const int c = g.add_node(seg);
      if (p.out >= 0) g.add_edge(p.out, c, EdgeKind::EDGE_DATA);
      p.segments.push_back(c);
      p.out = c;
      if (static_cast<size_t>(k) < shape.points.size()) {
        const int x = g.add_node(tp_collective(shape.points[static_cast<size_t>(k)], seg, k));
        g.add_edge(c, x, EdgeKind::EDGE_DATA);
        p.out = x;
      }
    }
    return p;
  }

  // A data edge from src to dst; SEND/RECV in between when they run on different ranks.
  // Returns the node dst receives from: src, or the RECV.
  int connect(int src, int dst, Payload payload) {
    const Node a = g.node(src);
    const Node b = g.node(dst);
    if (a.devices == b.devices) {
      g.add_edge(src, dst, EdgeKind::EDGE_DATA);
      return src;
    }
    Node send, recv;
    send.kind = NodeKind::SEND;
    recv.kind = NodeKind::RECV;
    send.tags = recv.tags = a.tags;  // what moves: the producer's output
    send.tags.pass = recv.tags.pass = Pass::PASS_COMM;
    send.stream = recv.stream = Stream::STREAM_COMM;
    send.payload = recv.payload = payload;
    send.bytes = recv.bytes = strategy.activation_bytes;
    send.devices = a.devices;
    recv.devices = b.devices;
    for (int r : a.devices) send.peers.push_back(partner(r, b.devices));
    for (int r : b.devices) recv.peers.push_back(partner(r, a.devices));
    const int s = g.add_node(send);
    const int r = g.add_node(recv);
    g.node_mut(s).tag = g.node_mut(r).tag = s;
    g.add_edge(src, s, EdgeKind::EDGE_DATA);
    g.add_edge(s, r, EdgeKind::EDGE_DATA);
    g.add_edge(r, dst, EdgeKind::EDGE_DATA);
    return r;
  }

  // A Strategy made in code may ask for what cannot be recomputed.
  void check_recompute() const {
    if (!strategy.recompute.empty() && static_cast<int>(strategy.recompute.size()) != n_units)
      throw BuildError("recompute: lists " + std::to_string(strategy.recompute.size()) + " units, the model has " +
                       std::to_string(n_units));
    for (int u = 0; u < n_units; ++u) {
      const Recompute mode = strategy.recompute_of(u);
      const UnitSpec& us = model.units[static_cast<size_t>(u)];
      if (mode != Recompute::RECOMPUTE_NONE && us.block < 0)
        throw BuildError("recompute: unit " + unit_description(us) + " has recompute " + recompute_name(mode) +
                         ", but the embedding and the head are never recomputed; give it none");
      if (mode == Recompute::RECOMPUTE_SELECTIVE && !has_inner_activations(us.kind))
        throw BuildError("recompute: unit " + unit_description(us) +
                         " is selectively recomputed, but its mixer has no inner activations; use full or none");
    }
  }

  // recompute: unit u's saved state for microbatch mb, dropped after its forward, computed again
  // from the input activation (received from `input`) before the backward. Local: no collective.
  void add_recompute(int u, int mb, int input) {
    const Recompute mode = strategy.recompute_of(u);
    if (mode == Recompute::RECOMPUTE_NONE) return;
    Node n = compute_node(NodeKind::RECOMP, Pass::PASS_R, u, mb);
    n.recompute = mode;
    const int id = g.add_node(n);
    g.add_edge(fwd[u][mb].last(), id, EdgeKind::EDGE_DATA);
    g.add_edge(input, id, EdgeKind::EDGE_DATA);
    recomp[u][mb] = id;
  }

  // split + backward split: the per-microbatch sub-DAGs; a split unit's backward is BWD_I + BWD_W.
  void split() {
    auto table = [&] {
      return std::vector<std::vector<PassNodes>>(static_cast<size_t>(n_units), std::vector<PassNodes>(static_cast<size_t>(n_mb)));
    };
    fwd = table(), bwd = table(), bwd_i = table(), bwd_w = table();
    check_recompute();
    recomp.assign(static_cast<size_t>(n_units), std::vector<int>(static_cast<size_t>(n_mb), -1));
    for (int mb = 0; mb < n_mb; ++mb) {
      for (int u = 0; u < n_units; ++u) {
        fwd[u][mb] = add_pass(NodeKind::FWD, Pass::PASS_F, u, mb);
        if (u == 0) continue;
        add_recompute(u, mb, connect(fwd[u - 1][mb].out, fwd[u][mb].first(), Payload::PAYLOAD_ACTIVATION));
      }
      for (int u = n_units - 1; u >= 0; --u) {
        // The embedding has no input gradient: only its weight half exists.
        const bool has_input_grad = u > 0;
        // The input gradient of the unit after, and the saved state of this one's forward.
        const int upstream =
            u + 1 < n_units ? (strategy.split_backward(u + 1) ? bwd_i[u + 1][mb].out : bwd[u + 1][mb].out) : -1;
        // The saved state: the forward's, or the recomputation's.
        const int saved = recomp[u][mb] >= 0 ? recomp[u][mb] : fwd[u][mb].last();
        if (!strategy.split_backward(u)) {
          bwd[u][mb] = add_pass(NodeKind::BWD, Pass::PASS_B, u, mb);
          g.add_edge(saved, bwd[u][mb].first(), EdgeKind::EDGE_DATA);
          if (upstream >= 0) connect(upstream, bwd[u][mb].first(), Payload::PAYLOAD_GRADIENT);
          continue;
        }
        int w_src = saved;
        if (has_input_grad) {
          bwd_i[u][mb] = add_pass(NodeKind::BWD_I, Pass::PASS_BI, u, mb);
          g.add_edge(saved, bwd_i[u][mb].first(), EdgeKind::EDGE_DATA);
          if (upstream >= 0) connect(upstream, bwd_i[u][mb].first(), Payload::PAYLOAD_GRADIENT);
          w_src = bwd_i[u][mb].last();
        }
        bwd_w[u][mb] = add_pass(NodeKind::BWD_W, Pass::PASS_BW, u, mb);
        g.add_edge(w_src, bwd_w[u][mb].first(), EdgeKind::EDGE_DATA);
        if (!has_input_grad && upstream >= 0) connect(upstream, bwd_w[u][mb].first(), Payload::PAYLOAD_GRADIENT);
      }
    }
  }

  int last_grad_node(int u, int mb) const { return (strategy.split_backward(u) ? bwd_w[u][mb] : bwd[u][mb]).last(); }

  Node collective(NodeKind kind, Payload payload, const std::vector<int>& units, int mb) const {
    const int u0 = units.front();
    Node n;
    n.kind = kind;
    n.tags = {stage_of_unit[static_cast<size_t>(u0)], mb, Pass::PASS_COMM, u0, -1, '?'};
    n.devices = devices_of_unit(u0);
    n.stream = Stream::STREAM_COMM;
    n.group = GroupDim::GROUP_DP;
    n.payload = payload;
    n.units = units;
    for (int u : units) n.bytes += model.units[static_cast<size_t>(u)].param_count() * 4;
    return n;
  }

  // Gradient buckets per stage, last unit first (the order gradients are ready
  // in), each at least bucket_bytes unless the stage runs out; a bucket holds
  // units of one ZeRO stage.
  std::vector<std::vector<int>> buckets() const {
    std::vector<std::vector<int>> out;
    for (int s = n_stages - 1; s >= 0; --s) {
      std::vector<int> cur;
      int64_t bytes = 0;
      for (int u = n_units - 1; u >= 0; --u) {
        if (stage_of_unit[static_cast<size_t>(u)] != s) continue;
        if (!cur.empty() && strategy.replicate.zero(cur.front()) != strategy.replicate.zero(u))
          out.push_back(cur), cur.clear(), bytes = 0;
        cur.insert(cur.begin(), u);
        bytes += model.units[static_cast<size_t>(u)].param_count() * 4;
        if (bytes >= strategy.replicate.bucket_bytes) out.push_back(cur), cur.clear(), bytes = 0;
      }
      if (!cur.empty()) out.push_back(cur);
    }
    return out;
  }

  // Updates, and with data parallelism the gradient reduction before them and
  // (ZeRO 1 and 2) the parameter all-gather after; units at ZeRO-3 gather
  // their parameters before every use instead, one unit ahead.
  void updates() {
    upd.assign(static_cast<size_t>(n_units), -1);
    for (int u = 0; u < n_units; ++u) upd[u] = g.add_node(compute_node(NodeKind::UPD, Pass::PASS_U, u, -1));
    norms();
    auto norm_of = [&](int u) { return norm_of_pp[static_cast<size_t>(sched.rank_of(stage_of_unit[static_cast<size_t>(u)]))]; };
    if (strategy.replicate.dp <= 1) {
      for (int u = 0; u < n_units; ++u)
        for (int mb = 0; mb < n_mb; ++mb) {
          g.add_edge(last_grad_node(u, mb), upd[u], EdgeKind::EDGE_DATA);
          g.add_edge(last_grad_node(u, mb), norm_of(u), EdgeKind::EDGE_DATA);
        }
      return;
    }
    for (const auto& bucket : buckets()) {
      const int zero = strategy.replicate.zero(bucket.front());
      const NodeKind k = zero >= 2 ? NodeKind::REDUCE_SCATTER : NodeKind::ALLREDUCE;
      const int red = g.add_node(collective(k, Payload::PAYLOAD_WGRAD, bucket, -1));
      g.add_edge(red, norm_of(bucket.front()), EdgeKind::EDGE_DATA);
      for (int u : bucket) {
        for (int mb = 0; mb < n_mb; ++mb) g.add_edge(last_grad_node(u, mb), red, EdgeKind::EDGE_DATA);
        g.add_edge(red, upd[u], EdgeKind::EDGE_DATA);
      }
      if (zero == 1 || zero == 2) {
        const int ag = g.add_node(collective(NodeKind::ALLGATHER, Payload::PAYLOAD_PARAMS, bucket, -1));
        for (int u : bucket) g.add_edge(upd[u], ag, EdgeKind::EDGE_DATA);
      }
    }
    gather_before_use();
  }

  // Gradient clipping: each pipeline rank sums the squares of its gradients
  // once they are final (NORM), the world adds the sums (an all-reduce of
  // one double), and every update waits for the total.
  void norms() {
    norm_of_pp.assign(static_cast<size_t>(sched.ranks), -1);
    for (int p = 0; p < sched.ranks; ++p) {
      Node n;
      n.kind = NodeKind::NORM;
      n.tags = {sched.stage_of(p, 0), -1, Pass::PASS_U, -1, -1, '?'};
      n.devices = devices_of_stage[static_cast<size_t>(sched.stage_of(p, 0))];
      norm_of_pp[static_cast<size_t>(p)] = g.add_node(n);
    }
    int total = -1;
    if (strategy.world_size > 1) {
      Node n;
      n.kind = NodeKind::ALLREDUCE;
      n.tags = {0, -1, Pass::PASS_COMM, -1, -1, '?'};
      for (int r = 0; r < strategy.world_size; ++r) n.devices.push_back(r);
      n.stream = Stream::STREAM_COMM;
      n.group = GroupDim::GROUP_WORLD;
      n.payload = Payload::PAYLOAD_NORM;
      n.bytes = sizeof(double);
      total = g.add_node(n);
      for (int id : norm_of_pp) g.add_edge(id, total, EdgeKind::EDGE_DATA);
    }
    for (int u = 0; u < n_units; ++u)
      g.add_edge(total >= 0 ? total : norm_of_pp[static_cast<size_t>(sched.rank_of(stage_of_unit[static_cast<size_t>(u)]))],
                 upd[static_cast<size_t>(u)], EdgeKind::EDGE_DATA);
  }

  // ZeRO-3: an all-gather of unit u's parameters before each forward and each
  // backward that needs them, issued once the unit two before has run.
  void gather_before_use() {
    for (int mb = 0; mb < n_mb; ++mb)
      for (int u = 0; u < n_units; ++u) {
        if (strategy.replicate.zero(u) < 3) continue;
        const int f = g.add_node(collective(NodeKind::ALLGATHER, Payload::PAYLOAD_PARAMS, {u}, mb));
        g.node_mut(f).tags.pass = Pass::PASS_F;
        // Every segment of a pass reads the parameters.
        for (int seg : fwd[u][mb].segments) g.add_edge(f, seg, EdgeKind::EDGE_DATA);
        if (u >= 2 && stage_of_unit[u - 2] == stage_of_unit[u]) g.add_edge(fwd[u - 2][mb].last(), f, EdgeKind::EDGE_DATA);
        const int b = g.add_node(collective(NodeKind::ALLGATHER, Payload::PAYLOAD_PARAMS, {u}, mb));
        g.node_mut(b).tags.pass = Pass::PASS_B;
        for (const PassNodes* pass : {&bwd[u][mb], &bwd_i[u][mb], &bwd_w[u][mb]})
          for (int seg : pass->segments) g.add_edge(b, seg, EdgeKind::EDGE_DATA);
        if (recomp[u][mb] >= 0) g.add_edge(b, recomp[u][mb], EdgeKind::EDGE_DATA);
        g.add_edge(fwd[u][mb].last(), b, EdgeKind::EDGE_DATA);
      }
  }

  // The nodes a schedule op's pass runs of unit u: a BI op runs the fused
  // backward of a unit whose backward is not split, and its BW op nothing.
  const PassNodes& pass_nodes(Pass pass, int u, int mb) const {
    static const PassNodes none;
    const bool split = strategy.split_backward(u);
    const auto at = [&](const std::vector<std::vector<PassNodes>>& table) -> const PassNodes& {
      return table[static_cast<size_t>(u)][static_cast<size_t>(mb)];
    };
    switch (pass) {
      case Pass::PASS_F: return at(fwd);
      case Pass::PASS_B: return at(bwd);
      case Pass::PASS_BI: return split ? at(bwd_i) : at(bwd);
      case Pass::PASS_BW: return split ? at(bwd_w) : none;
      default: return none;
    }
  }

  // order: each pipeline rank's schedule expanded over the units of the
  // stage each op names, chained with ordering edges; updates last.
  void order() {
    for (int r = 0; r < sched.ranks; ++r) {
      std::vector<int> seq;
      for (const PipeOp& op : sched.ops[static_cast<size_t>(r)]) {
        const int s = sched.stage_of(r, op.chunk);
        std::vector<int> units;
        for (int u = 0; u < n_units; ++u)
          if (stage_of_unit[static_cast<size_t>(u)] == s) units.push_back(u);
        auto append = [&](int u) {
          const PassNodes& p = pass_nodes(op.pass, u, op.microbatch);
          // A recomputed unit's RECOMP right before its backward's first segment (B, or BI: BWD_I or a fused BWD).
          const int rc = recomp[static_cast<size_t>(u)][static_cast<size_t>(op.microbatch)];
          if (rc >= 0 && (op.pass == Pass::PASS_B || op.pass == Pass::PASS_BI)) seq.push_back(rc);
          seq.insert(seq.end(), p.segments.begin(), p.segments.end());
        };
        if (op.pass == Pass::PASS_F) {
          for (int u : units) append(u);
        } else {
          for (auto it = units.rbegin(); it != units.rend(); ++it) append(*it);
        }
      }
      seq.push_back(norm_of_pp[static_cast<size_t>(r)]);
      for (int u = 0; u < n_units; ++u)
        if (sched.rank_of(stage_of_unit[static_cast<size_t>(u)]) == r) seq.push_back(upd[u]);
      for (size_t i = 1; i < seq.size(); ++i) g.add_edge(seq[i - 1], seq[i], EdgeKind::EDGE_ORDER);
    }
  }
};

}  // namespace

Graph build(const ModelGraph& model, const Strategy& strategy) {
  std::unique_ptr<Builder> b;
  try {
    b = std::make_unique<Builder>(model, strategy);
  } catch (const std::invalid_argument& e) {
    throw BuildError(std::string("grid: ") + e.what());
  }
  b->place();
  b->split();
  b->updates();
  b->order();
  return std::move(b->g);
}

}  // namespace piper::ir
