// graph_checks.hpp — lookups the IR tests make in a built graph.
#pragma once

#include <gtest/gtest.h>

#include "ir/graph.hpp"

namespace piper::testing {

using ir::Edge;
using ir::EdgeKind;
using ir::Graph;
using ir::Node;
using ir::NodeKind;

// The id of the one node of `kind` for (unit, microbatch); -1 if none (a
// second match fails the calling test).
inline int find_node(const Graph& g, NodeKind kind, int unit, int mb) {
  int found = -1;
  for (const Node& n : g.nodes())
    if (n.kind == kind && n.tags.unit == unit && n.tags.microbatch == mb) {
      EXPECT_EQ(found, -1) << "two nodes " << node_kind_name(kind) << " unit " << unit << " mb" << mb;
      found = n.id;
    }
  return found;
}

inline bool has_edge(const Graph& g, int src, int dst, EdgeKind kind = EdgeKind::EDGE_DATA) {
  for (const Edge& e : g.edges())
    if (e.src == src && e.dst == dst && e.kind == kind) return true;
  return false;
}

}  // namespace piper::testing
