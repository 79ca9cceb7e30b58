// program.cpp — lowering the global DAG to per-rank programs; plan printing and hashing.
#include "ir/program.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <queue>
#include <set>
#include <sstream>

namespace piper::ir {

namespace {

// The slice of `rank`: `nodes` are its nodes, ascending, and slot[id] the
// index of `rank` in node id's device set (-1 for nodes not on it).
Program lower_slice(const Graph& g, int rank, const std::vector<int>& nodes, const std::vector<int>& slot) {
  auto mine = [&](int id) { return slot[static_cast<size_t>(id)] >= 0; };
  std::vector<int> indeg(g.nodes().size(), 0);
  for (int v : nodes)
    for (int e : g.in_edges()[static_cast<size_t>(v)]) indeg[static_cast<size_t>(v)] += mine(g.edges()[static_cast<size_t>(e)].src);
  // Two ready queues, ties broken by node id: communication is placed as soon
  // as its inputs are, so a message never waits behind one produced later.
  using Queue = std::priority_queue<int, std::vector<int>, std::greater<int>>;
  Queue ready_comm, ready_compute;
  auto push = [&](int id) {
    (g.node(id).stream == Stream::STREAM_COMM ? ready_comm : ready_compute).push(id);
  };
  for (int v : nodes)
    if (indeg[static_cast<size_t>(v)] == 0) push(v);
  Program p;
  p.rank = rank;
  while (!ready_comm.empty() || !ready_compute.empty()) {
    Queue& q = ready_comm.empty() ? ready_compute : ready_comm;
    const int v = q.top();
    q.pop();
    const Node& nd = g.node(v);
    Instr in{v, nd.kind, nd.tags.unit, nd.tags.microbatch, nd.tags.pass, nd.tags.segment, -1, nd.tag, nd.group,
             nd.payload, nd.units, nd.bytes, {}};
    if (!nd.peers.empty()) in.peer = nd.peers[static_cast<size_t>(slot[static_cast<size_t>(v)])];
    in.recompute = nd.recompute;
    for (int e : g.in_edges()[static_cast<size_t>(v)]) {
      const Edge& ed = g.edges()[static_cast<size_t>(e)];
      if (ed.kind == EdgeKind::EDGE_DATA && mine(ed.src) && g.node(ed.src).stream != nd.stream)
        in.waits.push_back(ed.src);
    }
    (nd.stream == Stream::STREAM_COMPUTE ? p.compute : p.comm).push_back(std::move(in));
    for (int e : g.out_edges()[static_cast<size_t>(v)]) {
      const int d = g.edges()[static_cast<size_t>(e)].dst;
      if (mine(d) && --indeg[static_cast<size_t>(d)] == 0) push(d);
    }
  }
  return p;
}

}  // namespace

Program lower(const Graph& g, int rank) {
  std::vector<int> slot(g.nodes().size(), -1), nodes;
  for (const Node& nd : g.nodes()) {
    auto it = std::find(nd.devices.begin(), nd.devices.end(), rank);
    if (it == nd.devices.end()) continue;
    slot[static_cast<size_t>(nd.id)] = static_cast<int>(it - nd.devices.begin());
    nodes.push_back(nd.id);
  }
  return lower_slice(g, rank, nodes, slot);
}

Program forward_program(const Program& training) {
  auto forward = [](const Instr& in) { return in.pass == Pass::PASS_F || in.payload == Payload::PAYLOAD_ACTIVATION; };
  std::set<int> kept;
  for (const auto* stream : {&training.compute, &training.comm})
    for (const Instr& in : *stream)
      if (forward(in)) kept.insert(in.node);
  Program p;
  p.rank = training.rank;
  for (auto [from, to] : {std::pair{&training.compute, &p.compute}, std::pair{&training.comm, &p.comm}})
    for (const Instr& in : *from) {
      if (!forward(in)) continue;
      Instr copy = in;
      std::erase_if(copy.waits, [&](int w) { return kept.count(w) == 0; });
      to->push_back(std::move(copy));
    }
  return p;
}

std::vector<Program> lower_all(const Graph& g, int world_size) {
  std::vector<std::vector<std::pair<int, int>>> of(static_cast<size_t>(world_size));  // per rank: (node, slot)
  for (const Node& nd : g.nodes())
    for (size_t i = 0; i < nd.devices.size(); ++i)
      if (nd.devices[i] >= 0 && nd.devices[i] < world_size)
        of[static_cast<size_t>(nd.devices[i])].push_back({nd.id, static_cast<int>(i)});
  std::vector<Program> out;
  out.reserve(of.size());
  std::vector<int> slot(g.nodes().size(), -1), nodes;
  for (int r = 0; r < world_size; ++r) {
    nodes.clear();
    for (auto [id, i] : of[static_cast<size_t>(r)]) slot[static_cast<size_t>(id)] = i, nodes.push_back(id);
    out.push_back(lower_slice(g, r, nodes, slot));
    for (int id : nodes) slot[static_cast<size_t>(id)] = -1;
  }
  return out;
}

namespace {

struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, size_t len) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < len; ++i) {
      h ^= b[i];
      h *= 1099511628211ull;
    }
  }
  template <class T>
  void value(T v) {
    bytes(&v, sizeof v);
  }
};

}  // namespace

uint64_t plan_hash(const Graph& g) {
  Fnv f;
  f.value<uint64_t>(g.nodes().size());
  for (const Node& n : g.nodes()) {
    f.value<int32_t>(n.id);
    f.value<uint8_t>(static_cast<uint8_t>(n.kind));
    f.value<int32_t>(n.tags.stage);
    f.value<int32_t>(n.tags.microbatch);
    f.value<uint8_t>(static_cast<uint8_t>(n.tags.pass));
    f.value<int32_t>(n.tags.unit);
    f.value<int32_t>(n.tags.block);
    f.value<char>(n.tags.block_kind);
    f.value<int32_t>(n.tags.segment);
    f.value<uint8_t>(static_cast<uint8_t>(n.stream));
    f.value<uint64_t>(n.peers.size());
    for (int q : n.peers) f.value<int32_t>(q);
    f.value<int32_t>(n.tag);
    f.value<uint8_t>(static_cast<uint8_t>(n.group));
    f.value<uint8_t>(static_cast<uint8_t>(n.payload));
    f.value<uint64_t>(n.units.size());
    for (int u : n.units) f.value<int32_t>(u);
    f.value<int64_t>(n.bytes);
    f.value<uint64_t>(n.devices.size());
    for (int d : n.devices) f.value<int32_t>(d);
    if (n.kind == NodeKind::RECOMP) f.value<uint8_t>(static_cast<uint8_t>(n.recompute));
  }
  f.value<uint64_t>(g.edges().size());
  for (const Edge& e : g.edges()) {
    f.value<int32_t>(e.src);
    f.value<int32_t>(e.dst);
    f.value<uint8_t>(static_cast<uint8_t>(e.kind));
  }
  return f.h;
}

uint64_t plan_hash(const Graph& g, const ModelGraph& model) {
  Fnv f;
  f.value<uint64_t>(plan_hash(g));
  for (const UnitSpec& u : model.units) {
    f.value<uint8_t>(static_cast<uint8_t>(u.kind));
    for (const ParamSpec& p : u.params) {
      f.bytes(p.name.data(), p.name.size());
      for (int64_t d : p.shape) f.value<int64_t>(d);
    }
  }
  return f.h;
}

std::string summary(const Graph& g, const ModelGraph& model) {
  int counts[kNodeKindCount] = {};
  std::set<int> stages, mbs;
  int order_edges = 0;
  for (const Node& n : g.nodes()) {
    ++counts[static_cast<int>(n.kind)];
    stages.insert(n.tags.stage);
    if (n.tags.microbatch >= 0) mbs.insert(n.tags.microbatch);
  }
  for (const Edge& e : g.edges()) order_edges += e.kind == EdgeKind::EDGE_ORDER;
  std::ostringstream o;
  char hash[32];
  std::snprintf(hash, sizeof hash, "%016" PRIx64, plan_hash(g, model));
  o << "global DAG: " << g.nodes().size() << " nodes, " << g.edges().size() << " edges ("
    << g.edges().size() - static_cast<size_t>(order_edges) << " data, " << order_edges
    << " order), " << g.world_size() << " rank(s), " << stages.size() << " stage(s), "
    << mbs.size() << " microbatch(es), plan hash " << hash << "\n";
  o << "  nodes by kind:";
  for (int k = 0; k < kNodeKindCount; ++k)
    if (counts[k]) o << ' ' << node_kind_name(static_cast<NodeKind>(k)) << '=' << counts[k];
  o << "\n  units (" << model.units.size() << ", " << model.param_count() << " parameters):";
  for (const auto& u : model.units) o << ' ' << u.name << '[' << unit_symbol(u.kind) << ']';
  o << "\n";
  return o.str();
}

std::string format_program(const Program& p, const ModelGraph& model) {
  std::vector<std::string> names;
  for (const auto& u : model.units) names.push_back(u.name);
  std::ostringstream o;
  o << "rank " << p.rank << ": " << p.compute.size() << " compute, " << p.comm.size()
    << " communication instructions\n";
  auto stream = [&](const char* title, const std::vector<Instr>& v) {
    if (v.empty()) return;
    o << "  stream " << title << ":\n";
    for (size_t i = 0; i < v.size(); ++i) {
      char line[160];
      std::string unit = v[i].unit >= 0 && static_cast<size_t>(v[i].unit) < names.size()
                             ? names[static_cast<size_t>(v[i].unit)]
                             : "";
      std::string mb = v[i].microbatch >= 0 ? "mb" + std::to_string(v[i].microbatch) : "";
      std::string extra;
      if (v[i].peer >= 0) extra = (v[i].kind == NodeKind::SEND ? " to rank " : " from rank ") + std::to_string(v[i].peer);
      if (!v[i].units.empty())
        extra = std::string(" ") + group_name(v[i].group) + " units " + std::to_string(v[i].units.front()) + ".." +
                std::to_string(v[i].units.back());
      else if (!is_p2p(v[i].kind) && !is_compute(v[i].kind))
        extra = std::string(" ") + group_name(v[i].group) + " " + std::to_string(v[i].bytes) + " bytes";
      if (v[i].kind == NodeKind::RECOMP) extra = std::string(" ") + recompute_name(v[i].recompute);
      if (v[i].segment > 0 || v[i].payload == Payload::PAYLOAD_UNIT)
        extra += (is_compute(v[i].kind) ? " part " : " point ") + std::to_string(v[i].segment);
      std::snprintf(line, sizeof line, "    %4zu  %-14s %-12s %-5s node %d%s\n", i,
                    node_kind_name(v[i].kind), unit.c_str(), mb.c_str(), v[i].node, extra.c_str());
      o << line;
    }
  };
  stream("compute", p.compute);
  stream("comm", p.comm);
  return o.str();
}

}  // namespace piper::ir
