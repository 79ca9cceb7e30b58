// build.hpp — applies a Strategy's directives to the model graph, producing
// the global training DAG every rank compiles identically.
#pragma once

#include <stdexcept>

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

// Directives are applied in order: split (one sub-DAG per microbatch),
// backward split (BWD -> BWD_I + BWD_W), place (stages on ranks, SEND/RECV on
// cross-rank edges), update nodes, order (the schedule's ordering edges).
Graph build(const ModelGraph& model, const Strategy& strategy);

}  // namespace piper::ir
