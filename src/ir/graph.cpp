// graph.cpp — the global training DAG container and its names.
#include "ir/graph.hpp"

#include <algorithm>
#include <stdexcept>

namespace piper::ir {

int Graph::add_node(Node n) {
  n.id = static_cast<int>(nodes_.size());
  nodes_.push_back(std::move(n));
  indexed_ = false;
  return nodes_.back().id;
}

void Graph::add_edge(int src, int dst, EdgeKind kind) {
  edges_.push_back({src, dst, kind});
  indexed_ = false;
}

void Graph::index() const {
  if (indexed_) return;
  in_.assign(nodes_.size(), {});
  out_.assign(nodes_.size(), {});
  for (size_t e = 0; e < edges_.size(); ++e) {
    const Edge& ed = edges_[e];
    if (ed.src < 0 || ed.dst < 0 || static_cast<size_t>(ed.src) >= nodes_.size() ||
        static_cast<size_t>(ed.dst) >= nodes_.size())
      continue;  // the verifier reports dangling edges
    out_[static_cast<size_t>(ed.src)].push_back(static_cast<int>(e));
    in_[static_cast<size_t>(ed.dst)].push_back(static_cast<int>(e));
  }
  indexed_ = true;
}

const std::vector<std::vector<int>>& Graph::in_edges() const {
  index();
  return in_;
}
const std::vector<std::vector<int>>& Graph::out_edges() const {
  index();
  return out_;
}

int Graph::world_size() const {
  int w = 0;
  for (const auto& n : nodes_)
    for (int d : n.devices) w = std::max(w, d + 1);
  return w;
}

const char* node_kind_name(NodeKind k) {
  switch (k) {
    case NodeKind::FWD: return "FWD";
    case NodeKind::BWD_I: return "BWD_I";
    case NodeKind::BWD_W: return "BWD_W";
    case NodeKind::BWD: return "BWD";
    case NodeKind::UPD: return "UPD";
    case NodeKind::NORM: return "NORM";
    case NodeKind::RECOMP: return "RECOMP";
    case NodeKind::SEND: return "SEND";
    case NodeKind::RECV: return "RECV";
    case NodeKind::ALLREDUCE: return "ALLREDUCE";
    case NodeKind::REDUCE_SCATTER: return "REDUCE_SCATTER";
    case NodeKind::ALLGATHER: return "ALLGATHER";
    case NodeKind::ALLTOALL: return "ALLTOALL";
  }
  return "?";
}

const char* pass_name(Pass p) {
  switch (p) {
    case Pass::PASS_F: return "F";
    case Pass::PASS_B: return "B";
    case Pass::PASS_BI: return "BI";
    case Pass::PASS_BW: return "BW";
    case Pass::PASS_U: return "U";
    case Pass::PASS_COMM: return "C";
    case Pass::PASS_R: return "R";
  }
  return "?";
}

const std::vector<std::string>& recompute_names() {
  static const std::vector<std::string> names = {"none", "selective", "full"};
  return names;
}

const char* recompute_name(Recompute r) {
  const auto i = static_cast<size_t>(r);
  return i < recompute_names().size() ? recompute_names()[i].c_str() : "?";
}

bool is_compute(NodeKind k) {
  return k == NodeKind::FWD || k == NodeKind::BWD_I || k == NodeKind::BWD_W ||
         k == NodeKind::BWD || k == NodeKind::RECOMP || k == NodeKind::UPD || k == NodeKind::NORM;
}

bool is_p2p(NodeKind k) { return k == NodeKind::SEND || k == NodeKind::RECV; }

const char* group_name(GroupDim g) {
  switch (g) {
    case GroupDim::GROUP_NONE: return "";
    case GroupDim::GROUP_DP: return "dp";
    case GroupDim::GROUP_TP: return "tp";
    case GroupDim::GROUP_WORLD: return "world";
    case GroupDim::GROUP_EP: return "ep";
  }
  return "?";
}

std::string describe(const Node& n, const std::vector<std::string>& unit_names) {
  std::string s = node_kind_name(n.kind);
  if (!is_compute(n.kind) && !is_p2p(n.kind)) (s += ' ') += group_name(n.group);
  if (n.tags.unit >= 0) {
    s += ' ';
    s += static_cast<size_t>(n.tags.unit) < unit_names.size()
             ? unit_names[static_cast<size_t>(n.tags.unit)]
             : "unit" + std::to_string(n.tags.unit);
  }
  if (n.tags.microbatch >= 0) s += " mb" + std::to_string(n.tags.microbatch);
  if (n.kind == NodeKind::RECOMP) (s += ' ') += recompute_name(n.recompute);
  if (n.payload == Payload::PAYLOAD_UNIT) s += std::string(" ") + pass_name(n.tags.pass) + "." + std::to_string(n.tags.segment);
  else if (is_compute(n.kind) && n.tags.segment > 0) s += " part " + std::to_string(n.tags.segment);
  if (!n.peers.empty()) s += (n.kind == NodeKind::SEND ? " to rank " : " from rank ") + std::to_string(n.peers.front());
  if (!n.units.empty()) {
    s += " units " + std::to_string(n.units.front());
    if (n.units.size() > 1) s += ".." + std::to_string(n.units.back());
  }
  return s;
}

std::string describe_at(const Graph& g, int id, const std::vector<std::string>& unit_names) {
  const Node& n = g.node(id);
  std::string s = describe(n, unit_names) + " (pass " + pass_name(n.tags.pass);
  if (n.tags.microbatch >= 0) s += ", microbatch " + std::to_string(n.tags.microbatch);
  return s + ", stage " + std::to_string(n.tags.stage) + ")";
}

}  // namespace piper::ir
