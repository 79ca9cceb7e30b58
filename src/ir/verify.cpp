// verify.cpp — the DAG verifier: structure, completeness, order, acyclicity.
#include "ir/verify.hpp"

#include <algorithm>
#include <map>
#include <queue>
#include <set>
#include <tuple>

#include "ir/world_play.hpp"

namespace piper::ir {

namespace {

std::vector<std::string> unit_names(const ModelGraph& model) {
  std::vector<std::string> names;
  for (const auto& u : model.units) names.push_back(u.name);
  return names;
}

// "0,1", or "<none>".
std::string devices(const Node& n) {
  std::string ranks;
  for (size_t i = 0; i < n.devices.size(); ++i) ranks += (i ? "," : "") + std::to_string(n.devices[i]);
  return ranks.empty() ? "<none>" : ranks;
}

std::string where(const Node& n, const std::vector<std::string>& names) {
  return describe(n, names) + " on rank " + devices(n);
}

// Follows data edges backwards through SEND/RECV and the tensor-parallel
// collective ending a pass to the compute node producing a value.
int producer(const Graph& g, int edge) {
  int src = g.edges()[static_cast<size_t>(edge)].src;
  while (is_p2p(g.node(src).kind) || g.node(src).payload == Payload::PAYLOAD_UNIT) {
    int next = -1;
    for (int e : g.in_edges()[static_cast<size_t>(src)])
      if (g.edges()[static_cast<size_t>(e)].kind == EdgeKind::EDGE_DATA) next = e;
    if (next < 0) return -1;
    src = g.edges()[static_cast<size_t>(next)].src;
  }
  return src;
}

void check_edges(const Graph& g, const std::vector<std::string>& names) {
  const int n = static_cast<int>(g.nodes().size());
  for (const Node& nd : g.nodes())
    if (nd.devices.empty()) throw VerifyError(describe(nd, names) + " is placed on no rank");
  for (const Edge& e : g.edges()) {
    if (e.src < 0 || e.src >= n || e.dst < 0 || e.dst >= n)
      throw VerifyError("edge " + std::to_string(e.src) + " -> " + std::to_string(e.dst) +
                        " names a node that does not exist (graph has " + std::to_string(n) +
                        " nodes)");
    const Node& a = g.node(e.src);
    const Node& b = g.node(e.dst);
    // A value moves between ranks by a SEND/RECV pair, or within a collective
    // whose ranks include those of the node on the other side.
    auto within = [](const Node& part, const Node& whole) {
      return !is_compute(whole.kind) && !is_p2p(whole.kind) &&
             std::includes(whole.devices.begin(), whole.devices.end(), part.devices.begin(), part.devices.end());
    };
    if (e.kind == EdgeKind::EDGE_DATA && a.devices != b.devices &&
        !(a.kind == NodeKind::SEND && b.kind == NodeKind::RECV) && !within(a, b) && !within(b, a))
      throw VerifyError("data edge from " + where(a, names) + " to " + where(b, names) +
                        " crosses ranks without a SEND/RECV pair or a collective over both");
    if (e.kind == EdgeKind::EDGE_ORDER && (a.devices != b.devices || a.stream != b.stream))
      throw VerifyError("ordering edge from " + where(a, names) + " to " + where(b, names) +
                        " joins different ranks or streams; an order applies within one rank");
  }
  for (const Node& nd : g.nodes()) {
    if (nd.kind != NodeKind::SEND && nd.kind != NodeKind::RECV) continue;
    int partners = 0;
    const auto& edges = nd.kind == NodeKind::SEND ? g.out_edges() : g.in_edges();
    for (int e : edges[static_cast<size_t>(nd.id)]) {
      const Edge& ed = g.edges()[static_cast<size_t>(e)];
      const Node& other = g.node(nd.kind == NodeKind::SEND ? ed.dst : ed.src);
      if (ed.kind == EdgeKind::EDGE_DATA &&
          other.kind == (nd.kind == NodeKind::SEND ? NodeKind::RECV : NodeKind::SEND)) {
        ++partners;
        bool agree = nd.peers.size() == nd.devices.size() && other.peers.size() == other.devices.size();
        for (size_t i = 0; agree && i < nd.devices.size(); ++i) {
          auto it = std::find(other.devices.begin(), other.devices.end(), nd.peers[i]);
          agree = it != other.devices.end() &&
                  other.peers[static_cast<size_t>(it - other.devices.begin())] == nd.devices[i];
        }
        if (!agree)
          throw VerifyError(where(nd, names) + " and its partner " + where(other, names) +
                            " disagree about their peers");
      }
    }
    if (partners != 1)
      throw VerifyError(where(nd, names) + " has " + std::to_string(partners) + " matching " +
                        (nd.kind == NodeKind::SEND ? "RECV" : "SEND") + " nodes; expected 1");
  }
}

// Every (unit, microbatch) has its forward and backward, every unit its
// update, and each compute node's inputs come from the right producers: the
// first segment of a pass from the passes before it (a recomputed unit's
// backward from its RECOMP), every later segment from the one before it.
void check_complete(const Graph& g, const ModelGraph& model, const std::vector<std::string>& names) {
  const int n_units = static_cast<int>(model.units.size());
  std::map<std::tuple<NodeKind, int, int, int>, int> segment;  // (kind, unit, mb, segment) -> node
  std::map<std::tuple<NodeKind, int, int>, int> index;  // (kind, unit, mb) -> its last segment's node
  int n_mb = 0;
  for (const Node& nd : g.nodes()) {
    if (!is_compute(nd.kind) || nd.kind == NodeKind::NORM) continue;
    if (nd.tags.unit < 0 || nd.tags.unit >= n_units)
      throw VerifyError(where(nd, names) + " names unit " + std::to_string(nd.tags.unit) +
                        "; the model has units 0.." + std::to_string(n_units - 1));
    if (!segment.emplace(std::make_tuple(nd.kind, nd.tags.unit, nd.tags.microbatch, nd.tags.segment), nd.id).second)
      throw VerifyError(where(nd, names) + " appears twice in the graph");
    auto key = std::make_tuple(nd.kind, nd.tags.unit, nd.tags.microbatch);
    auto it = index.find(key);
    if (it == index.end() || g.node(it->second).tags.segment < nd.tags.segment) index[key] = nd.id;
    n_mb = std::max(n_mb, nd.tags.microbatch + 1);
  }
  auto has = [&](NodeKind k, int u, int mb) { return index.count({k, u, mb}) > 0; };
  for (int mb = 0; mb < n_mb; ++mb) {
    for (int u = 0; u < n_units; ++u) {
      const std::string what = model.units[static_cast<size_t>(u)].name + " mb" + std::to_string(mb);
      if (!has(NodeKind::FWD, u, mb)) throw VerifyError("missing FWD " + what);
      bool fused = has(NodeKind::BWD, u, mb);
      bool split = has(NodeKind::BWD_W, u, mb) && (u == 0 || has(NodeKind::BWD_I, u, mb));
      if (!fused && !split) throw VerifyError("missing backward (BWD or BWD_I + BWD_W) of " + what);
    }
  }
  for (int u = 0; u < n_units; ++u)
    if (!has(NodeKind::UPD, u, -1))
      throw VerifyError("missing UPD " + model.units[static_cast<size_t>(u)].name);

  // Inputs: FWD(u) needs FWD(u-1); a backward of u needs FWD(u) and the input
  // gradient of u+1.
  for (const Node& nd : g.nodes()) {
    if (nd.kind == NodeKind::UPD || nd.kind == NodeKind::NORM || !is_compute(nd.kind)) continue;
    const int u = nd.tags.unit, mb = nd.tags.microbatch;
    std::set<int> producers;
    for (int e : g.in_edges()[static_cast<size_t>(nd.id)])
      if (g.edges()[static_cast<size_t>(e)].kind == EdgeKind::EDGE_DATA)
        producers.insert(producer(g, e));
    if (nd.tags.segment > 0) {
      auto prev = segment.find(std::make_tuple(nd.kind, u, mb, nd.tags.segment - 1));
      if (prev == segment.end() || !producers.count(prev->second))
        throw VerifyError(where(nd, names) + ": input not produced: segment " + std::to_string(nd.tags.segment - 1) +
                          " of its pass is not connected to it");
      continue;
    }
    auto need = [&](NodeKind k, int pu, const char* what) {
      auto it = index.find({k, pu, mb});
      if (it == index.end() || !producers.count(it->second))
        throw VerifyError(where(nd, names) + ": input not produced: " + what + " (" +
                          node_kind_name(k) + " " + model.units[static_cast<size_t>(pu)].name +
                          " mb" + std::to_string(mb) + ") is not connected to it");
    };
    if (nd.kind == NodeKind::FWD) {
      if (u > 0) need(NodeKind::FWD, u - 1, "the previous unit's activations");
      continue;
    }
    if (nd.kind == NodeKind::RECOMP) {
      if (model.units[static_cast<size_t>(u)].block < 0)
        throw VerifyError(where(nd, names) + ": the embedding and the head are never recomputed");
      need(NodeKind::FWD, u, "its own forward");
      need(NodeKind::FWD, u - 1, "its input activation");
      continue;
    }
    if (nd.kind == NodeKind::BWD_W && u > 0) {
      need(NodeKind::BWD_I, u, "its input-gradient half");
    } else if (has(NodeKind::RECOMP, u, mb)) {
      need(NodeKind::RECOMP, u, "its recomputed state");
    } else {
      need(NodeKind::FWD, u, "its own forward");
    }
    if (u + 1 < n_units && !(nd.kind == NodeKind::BWD_W && u > 0))
      need(has(NodeKind::BWD, u + 1, mb) ? NodeKind::BWD : NodeKind::BWD_I, u + 1,
           "the next unit's input gradient");
  }
}

// Ordering edges per rank must chain every compute node once: one chain,
// each node with at most one predecessor and one successor in the order.
void check_order(const Graph& g, const std::vector<std::string>& names) {
  // Replicated nodes share one order: group compute nodes by their device set.
  std::map<std::vector<int>, std::vector<int>> compute_of_set;
  for (const Node& nd : g.nodes())
    if (is_compute(nd.kind)) compute_of_set[nd.devices].push_back(nd.id);
  auto order_degree = [&](const std::vector<int>& edges) {
    int d = 0;
    for (int e : edges) d += g.edges()[static_cast<size_t>(e)].kind == EdgeKind::EDGE_ORDER;
    return d;
  };
  for (const auto& [devices, ids] : compute_of_set) {
    const int rank = devices.front();
    int linked = 0, heads = 0;
    for (int id : ids) {
      const int in = order_degree(g.in_edges()[static_cast<size_t>(id)]);
      const int out = order_degree(g.out_edges()[static_cast<size_t>(id)]);
      linked += in + out > 0;
      heads += in == 0;
      if (in > 1 || out > 1)
        throw VerifyError("the schedule of rank " + std::to_string(rank) + " orders " +
                          where(g.node(id), names) + " after " + std::to_string(in) + " and before " +
                          std::to_string(out) + " operations; an order is one sequence");
    }
    if (linked == 0 || ids.size() < 2) continue;  // no schedule on this rank: topological order decides
    for (int id : ids)
      if (order_degree(g.in_edges()[static_cast<size_t>(id)]) + order_degree(g.out_edges()[static_cast<size_t>(id)]) == 0)
        throw VerifyError("the schedule of rank " + std::to_string(rank) + " misses " + where(g.node(id), names));
    if (heads > 1)  // none at all is a cycle: check_acyclic names it
      throw VerifyError("the schedule of rank " + std::to_string(rank) + " is split into " +
                        std::to_string(heads) + " separate sequences; an order is one sequence");
  }
}

// Kahn's algorithm over data and ordering edges; a leftover node lies on a
// cycle or behind one. Walking back from it through leftover predecessors
// reaches a cycle, which the message spells out.
void check_acyclic(const Graph& g, const std::vector<std::string>& names) {
  const size_t n = g.nodes().size();
  std::vector<int> indeg(n, 0);
  for (const Edge& e : g.edges()) ++indeg[static_cast<size_t>(e.dst)];
  std::queue<int> ready;
  for (size_t i = 0; i < n; ++i)
    if (indeg[i] == 0) ready.push(static_cast<int>(i));
  size_t seen = 0;
  while (!ready.empty()) {
    int v = ready.front();
    ready.pop();
    ++seen;
    for (int e : g.out_edges()[static_cast<size_t>(v)]) {
      int d = g.edges()[static_cast<size_t>(e)].dst;
      if (--indeg[static_cast<size_t>(d)] == 0) ready.push(d);
    }
  }
  if (seen == n) return;
  auto left = [&](int v) { return indeg[static_cast<size_t>(v)] > 0; };
  int v = static_cast<int>(std::find_if(indeg.begin(), indeg.end(), [](int d) { return d > 0; }) - indeg.begin());
  std::vector<int> step(n, -1);  // where the walk went back to from each node
  while (step[static_cast<size_t>(v)] < 0) {
    for (int e : g.in_edges()[static_cast<size_t>(v)])
      if (left(g.edges()[static_cast<size_t>(e)].src)) step[static_cast<size_t>(v)] = g.edges()[static_cast<size_t>(e)].src;
    v = step[static_cast<size_t>(v)];
  }
  auto at = [&](int id) { return describe_at(g, id, names) + " on rank " + devices(g.node(id)); };
  constexpr int kShown = 12;
  int length = 1;
  for (int u = step[static_cast<size_t>(v)]; u != v; u = step[static_cast<size_t>(u)]) ++length;
  std::string cycle = at(v);
  int shown = 1;
  for (int u = step[static_cast<size_t>(v)]; u != v && shown < kShown; u = step[static_cast<size_t>(u)], ++shown)
    cycle += ",\n    which waits for " + at(u);
  if (shown < length) cycle += ",\n    ... " + std::to_string(length - shown) + " more";
  cycle += ",\n    which waits for " + describe(g.node(v), names) + " again";
  throw VerifyError("the schedule can deadlock: a cycle of data and ordering edges (" + std::to_string(n - seen) +
                    " nodes can never run):\n    " + cycle);
}

std::string ranks_of(const std::vector<int>& ranks) {
  constexpr size_t kListed = 8;
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < kListed; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > kListed) s += ", ... (" + std::to_string(ranks.size()) + " ranks)";
  return s;
}

// The collectives of each group in the order every member issues them, checked against its first member's.
void check_collective_order(const WorldPlay& w, const Graph& g, const std::vector<std::string>& names) {
  auto sequence = [&](int r, GroupDim d) {
    std::vector<int> seq;
    for (const Instr& c : w.program(r).comm)
      if (!is_p2p(c.kind) && c.group == d) seq.push_back(c.node);
    return seq;
  };
  auto issues = [&](const std::vector<int>& seq, size_t i) {
    return i < seq.size() ? describe_at(g, seq[i], names) : std::string("nothing more");
  };
  auto position = [&](const std::vector<int>& seq, int node) {
    auto it = std::find(seq.begin(), seq.end(), node);
    return it == seq.end() ? std::string("never issues it")
                           : "issues it at position " + std::to_string(it - seq.begin());
  };
  for (GroupDim d : kCollectiveGroups)
    for (int r = 0; r < w.world(); ++r) {
      const std::vector<int>& members = w.members(r, d);
      if (members.front() != r) continue;
      const std::vector<int> first = sequence(r, d);
      for (size_t mi = 1; mi < members.size(); ++mi) {
        const int m = members[mi];
        const std::vector<int> seq = sequence(m, d);
        if (seq == first) continue;
        const size_t i = static_cast<size_t>(std::mismatch(first.begin(), first.end(), seq.begin(), seq.end()).first -
                                             first.begin());
        // The member that issues something there waits for the other, which issues it elsewhere or never.
        const bool mine = i < seq.size();
        const int waiter = mine ? m : r, other = mine ? r : m;
        const std::vector<int>& waiting = mine ? seq : first;
        const std::vector<int>& others = mine ? first : seq;
        throw VerifyError(std::string("the collectives of the ") + group_name(d) + " group of ranks " +
                          ranks_of(members) + " are issued in different orders: at position " + std::to_string(i) +
                          " rank " + std::to_string(r) + " issues " + issues(first, i) + " and rank " +
                          std::to_string(m) + " issues " + issues(seq, i) + "; rank " + std::to_string(waiter) +
                          "'s " + describe_at(g, waiting[i], names) + " waits on rank " + std::to_string(other) +
                          ", which " + position(others, waiting[i]) +
                          ". Every member must issue a group's collectives in one order");
      }
    }
}

}  // namespace

void verify_play(const Graph& g, const ModelGraph& model, const ParallelDims& dims) {
  const auto names = unit_names(model);
  const std::vector<Program> programs = lower_all(g, dims.world_size());
  WorldPlay w(programs, dims);
  check_collective_order(w, g, names);
  const std::vector<int> left = w.play_abstract();
  if (left.empty()) return;
  throw VerifyError("the ranks' programs deadlock when played (docs/architecture.md, \"Deadlock freedom\"): " +
                    w.stuck(left.front(), g, names) + "\n  " + std::to_string(left.size()) +
                    " rank(s) cannot finish: " + ranks_of(left));
}

void verify(const Graph& g, const ModelGraph& model) {
  const auto names = unit_names(model);
  check_edges(g, names);
  check_complete(g, model, names);
  check_order(g, names);
  check_acyclic(g, names);
}

}  // namespace piper::ir
