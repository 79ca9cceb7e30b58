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

// The nodes of one unit pass: its compute segments in order, and the last
// node of the chain so far (a segment, or the collective after it).
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
      sched = schedule_of(strategy);
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

  // A collective over the unit's tp or ep group at communication point k of a pass.
  Node unit_collective(const CommPoint& point, const Node& segment, int k) const {
    Node n = segment;
    n.kind = point.kind;
    n.tags.segment = k;
    n.stream = Stream::STREAM_COMM;
    n.group = point.group;
    n.payload = Payload::PAYLOAD_UNIT;
    // As every collective node: the whole buffer each member holds afterwards.
    const int64_t row_bytes = point.activations ? strategy.compute_elem_bytes : 4;
    n.bytes = (point.per_row * strategy.microbatch_rows * row_bytes + point.fixed * 4) *
              (point.kind == NodeKind::ALLGATHER ? strategy.shard.tp : 1);
    return n;
  }

  // One unit pass: its segments chained through the collectives between them.
  PassNodes add_pass(NodeKind kind, Pass pass, int u, int mb) {
    const PassShape shape = pass_shape(model.units[static_cast<size_t>(u)].kind, kind,
                                       pass_dims(model, strategy.shard.tp, strategy.shard.ep));
    PassNodes p;
    for (int k = 0; k < shape.segments; ++k) {
      Node seg = compute_node(kind, pass, u, mb);
      seg.tags.segment = k;
      const int c = g.add_node(seg);
      if (p.out >= 0) g.add_edge(p.out, c, EdgeKind::EDGE_DATA);
      p.segments.push_back(c);
      p.out = c;
      if (static_cast<size_t>(k) < shape.points.size()) {
        const int x = g.add_node(unit_collective(shape.points[static_cast<size_t>(k)], seg, k));
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
      if (mode != Recompute::RECOMPUTE_NONE && us.kind == UnitKind::UNIT_MOE)
        throw BuildError("recompute: unit " + unit_description(us) + " is an MoE block, which is never recomputed " +
                         "(its forward dispatches tokens over the ep group); give it none");
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

  // ZeRO-3: unit u's parameters gathered for a pass of microbatch mb, in the
  // type the units compute with.
  Node gather_for_compute(int u, int mb) const {
    Node n = collective(NodeKind::ALLGATHER, Payload::PAYLOAD_PARAMS, {u}, mb);
    n.bytes = model.units[static_cast<size_t>(u)].param_count() * strategy.compute_elem_bytes;
    return n;
  }

  // ZeRO-3: an all-gather of unit u's parameters before each forward and each
  // backward that needs them, issued once the unit two before has run.
  void gather_before_use() {
    for (int mb = 0; mb < n_mb; ++mb)
      for (int u = 0; u < n_units; ++u) {
        if (strategy.replicate.zero(u) < 3) continue;
        const int f = g.add_node(gather_for_compute(u, mb));
        g.node_mut(f).tags.pass = Pass::PASS_F;
        // Every segment of a pass reads the parameters.
        for (int seg : fwd[u][mb].segments) g.add_edge(f, seg, EdgeKind::EDGE_DATA);
        if (u >= 2 && stage_of_unit[u - 2] == stage_of_unit[u]) g.add_edge(fwd[u - 2][mb].last(), f, EdgeKind::EDGE_DATA);
        const int b = g.add_node(gather_for_compute(u, mb));
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

  // The compute nodes op `q` of rank r runs, in order: its units' passes
  // (forward along the model, backward against it), segment by segment. Marks
  // what it covers in `covered` (a pass's first node -> the op that runs it).
  std::vector<int> op_nodes(int r, int q, const PipeOp& op, std::vector<int>& covered) {
    const int s = sched.stage_of(r, op.chunk);
    std::vector<int> units;
    for (int u = 0; u < n_units; ++u)
      if (stage_of_unit[static_cast<size_t>(u)] == s) units.push_back(u);
    if (!op.whole() && (op.first_unit < units.front() || op.last_unit > units.back()))
      throw OrderError(r, q, pipe_op_name(op, sched.chunks) + " names units " + std::to_string(op.first_unit) + ".." +
                                 std::to_string(op.last_unit) + ", but its stage " + std::to_string(s) +
                                 " holds units " + std::to_string(units.front()) + ".." +
                                 std::to_string(units.back()));
    if (op.pass != Pass::PASS_F) std::reverse(units.begin(), units.end());
    std::vector<int> seq;
    for (int u : units) {
      if (!op.whole() && (u < op.first_unit || u > op.last_unit)) continue;
      const PassNodes& p = pass_nodes(op.pass, u, op.microbatch);
      if (!p.exists()) continue;
      int& by = covered[static_cast<size_t>(p.first())];
      if (by >= 0)
        throw OrderError(r, q, pipe_op_name(op, sched.chunks) + " runs " + pass_name(op.pass) + " of " +
                                   model.units[static_cast<size_t>(u)].name + " for microbatch " +
                                   std::to_string(op.microbatch) + ", which op " + std::to_string(by) +
                                   " of the rank runs already; each unit pass runs once");
      by = q;
      // A recomputed unit's RECOMP right before its backward's first segment (BI when split).
      const int rc = recomp[static_cast<size_t>(u)][static_cast<size_t>(op.microbatch)];
      if (rc >= 0 && (op.pass == Pass::PASS_B || op.pass == Pass::PASS_BI)) seq.push_back(rc);
      seq.insert(seq.end(), p.segments.begin(), p.segments.end());
    }
    return seq;
  }

  // Whether a data path leads from any of `from` to any of `to`, within their
  // microbatch (the per-step nodes after every backward join all microbatches).
  bool reaches(const std::vector<int>& from, const std::vector<int>& to) const {
    std::vector<char> target(g.nodes().size(), 0), seen(g.nodes().size(), 0);
    for (int v : to) target[static_cast<size_t>(v)] = 1;
    std::vector<int> stack(from.begin(), from.end());
    while (!stack.empty()) {
      const int v = stack.back();
      stack.pop_back();
      if (target[static_cast<size_t>(v)]) return true;
      for (int e : g.out_edges()[static_cast<size_t>(v)]) {
        const int d = g.edges()[static_cast<size_t>(e)].dst;
        if (seen[static_cast<size_t>(d)] || g.node(d).tags.microbatch < 0) continue;
        seen[static_cast<size_t>(d)] = 1;
        stack.push_back(d);
      }
    }
    return false;
  }

  // The ops of a group must be independent: the player runs them at once.
  void check_group(int r, const std::vector<int>& ops, const std::vector<std::vector<int>>& nodes) const {
    const auto& list = sched.ops[static_cast<size_t>(r)];
    for (size_t b = 1; b < ops.size(); ++b)
      for (size_t a = 0; a < b; ++a) {
        const PipeOp& x = list[static_cast<size_t>(ops[a])];
        const PipeOp& y = list[static_cast<size_t>(ops[b])];
        if (x.microbatch != y.microbatch) continue;  // the sub-DAGs of two microbatches share no path
        const bool yx = reaches(nodes[a], nodes[b]), xy = !yx && reaches(nodes[b], nodes[a]);
        if (!yx && !xy) continue;
        const std::string first = pipe_op_name(yx ? x : y, sched.chunks), then = pipe_op_name(yx ? y : x, sched.chunks);
        throw OrderError(r, ops[b], "the group [" + pipe_op_name(x, sched.chunks) + ", " +
                                        pipe_op_name(y, sched.chunks) + "] runs " + then + ", which needs " + first +
                                        " (a data path leads from it); the ops of a group run at once, so they "
                                        "must be independent: group ops of different microbatches");
      }
  }

  // Round robin over the groups' node lists, one node each: while one op's
  // communication is in flight, the next one computes.
  static std::vector<int> interleave(const std::vector<std::vector<int>>& lists) {
    std::vector<int> out;
    for (size_t k = 0;; ++k) {
      bool any = false;
      for (const auto& l : lists)
        if (k < l.size()) out.push_back(l[k]), any = true;
      if (!any) return out;
    }
  }

  // order: each pipeline rank's ops expanded over the units of the stage
  // (or the unit range) each names, groups interleaved, chained with ordering
  // edges; the gradient norm and updates last.
  void order() {
    for (int r = 0; r < sched.ranks; ++r) {
      std::vector<int> covered(g.nodes().size(), -1);
      const auto& ops = sched.ops[static_cast<size_t>(r)];
      std::vector<int> seq;
      for (size_t q = 0; q < ops.size();) {
        std::vector<int> group;
        std::vector<std::vector<int>> nodes;
        do {
          group.push_back(static_cast<int>(q));
          nodes.push_back(op_nodes(r, static_cast<int>(q), ops[q], covered));
        } while (++q < ops.size() && ops[q].grouped);
        check_group(r, group, nodes);
        const std::vector<int> run = interleave(nodes);
        seq.insert(seq.end(), run.begin(), run.end());
      }
      check_covered(r, covered);
      seq.push_back(norm_of_pp[static_cast<size_t>(r)]);
      for (int u = 0; u < n_units; ++u)
        if (sched.rank_of(stage_of_unit[static_cast<size_t>(u)]) == r) seq.push_back(upd[u]);
      for (size_t i = 1; i < seq.size(); ++i) g.add_edge(seq[i - 1], seq[i], EdgeKind::EDGE_ORDER);
    }
  }

  // Every pass of every unit rank r holds is run by one of its ops.
  void check_covered(int r, const std::vector<int>& covered) {
    const std::pair<Pass, const std::vector<std::vector<PassNodes>>*> tables[] = {
        {Pass::PASS_F, &fwd}, {Pass::PASS_B, &bwd}, {Pass::PASS_BI, &bwd_i}, {Pass::PASS_BW, &bwd_w}};
    for (int u = 0; u < n_units; ++u) {
      const int st = stage_of_unit[static_cast<size_t>(u)];
      if (sched.rank_of(st) != r) continue;
      for (int mb = 0; mb < n_mb; ++mb)
        for (const auto& [pass, table] : tables) {
          const PassNodes& p = (*table)[static_cast<size_t>(u)][static_cast<size_t>(mb)];
          if (p.exists() && covered[static_cast<size_t>(p.first())] < 0)
            throw OrderError(r, -1, "no op runs " + std::string(pass_name(pass)) + " of " +
                                        model.units[static_cast<size_t>(u)].name + " (unit " + std::to_string(u) +
                                        ", stage " + std::to_string(st) + ") for microbatch " + std::to_string(mb) +
                                        "; add " + pipe_op_name({pass, mb, sched.chunk_of(st)}, sched.chunks));
        }
    }
  }
};

std::string order_where(int rank, int op) {
  return op < 0 ? "rank " + std::to_string(rank) : "op " + std::to_string(op) + " of rank " + std::to_string(rank);
}

}  // namespace

OrderError::OrderError(int rank_, int op_, const std::string& detail_)
    : BuildError("order: " + order_where(rank_, op_) + ": " + detail_), rank(rank_), op(op_), detail(detail_) {}

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
