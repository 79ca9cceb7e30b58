// verify.cpp — the DAG verifier: structure, completeness, order, acyclicity.
#include "ir/verify.hpp"

#include <algorithm>
#include <map>
#include <queue>
#include <set>
#include <tuple>

namespace piper::ir {

namespace {

std::vector<std::string> unit_names(const ModelGraph& model) {
  std::vector<std::string> names;
  for (const auto& u : model.units) names.push_back(u.name);
  return names;
}

std::string where(const Node& n, const std::vector<std::string>& names) {
  std::string ranks;
  for (size_t i = 0; i < n.devices.size(); ++i) ranks += (i ? "," : "") + std::to_string(n.devices[i]);
  return describe(n, names) + " on rank " + (ranks.empty() ? "<none>" : ranks);
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

// Kahn's algorithm over data and ordering edges; a leftover node lies on a cycle.
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
  for (size_t i = 0; i < n; ++i)
    if (indeg[i] > 0)
      throw VerifyError("the schedule can deadlock: " + where(g.node(static_cast<int>(i)), names) +
                        " waits on a cycle of data and ordering edges (" +
                        std::to_string(n - seen) + " nodes can never run)");
}

}  // namespace

void verify(const Graph& g, const ModelGraph& model) {
  const auto names = unit_names(model);
  check_edges(g, names);
  check_complete(g, model, names);
  check_order(g, names);
  check_acyclic(g, names);
}

}  // namespace piper::ir
