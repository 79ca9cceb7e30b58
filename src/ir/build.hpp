// build.hpp — applies a Strategy's directives to the model graph, producing
// the global training DAG every rank compiles identically.
#pragma once

#include <stdexcept>
#include <string>

#include "ir/graph.hpp"
#include "ir/model_graph.hpp"
#include "ir/strategy.hpp"

namespace piper::ir {

// Thrown when directives cannot be applied (a bad placement, a schedule whose
// constraints fail); the message names the directive and what would be right.
class BuildError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A rule of an order that the DAG breaks, at op `op` (counting the ops of a
// group one each) of pipeline rank `rank`; op -1: the rank's whole list.
// what() names both in words; ir::validate puts `detail` at the op's file
// position.
class OrderError : public BuildError {
 public:
  OrderError(int rank, int op, const std::string& detail);
  int rank = -1, op = -1;
  std::string detail;
};

// Directives are applied in order: split (one sub-DAG per microbatch),
// backward split (BWD -> BWD_I + BWD_W), place (stages on ranks, SEND/RECV on
// cross-rank edges), update nodes, order (the schedule's ordering edges).
Graph build(const ModelGraph& model, const Strategy& strategy);

}  // namespace piper::ir
