// unit_passes.hpp — where a unit's passes communicate. With tensor
// parallelism a pass needs its tp group in the middle (Megatron's all-reduce
// after a row-parallel projection, the vocab-parallel loss's row maxima and
// sums); the DAG holds such a pass as compute segments joined by collective
// nodes, so that the collectives are scheduled, traced and simulated like any
// other communication. This table is the one statement of those points: the
// builder makes nodes from it, the model's units implement its segments.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.hpp"
#include "ir/model_graph.hpp"

namespace piper::ir {

// A collective between two segments of a pass, over the unit's tp group.
struct CommPoint {
  NodeKind kind = NodeKind::ALLREDUCE;  // ALLREDUCE (sum, in place) or ALLGATHER
  int64_t floats_per_row = 0;           // what each rank contributes, per microbatch row
};

// A pass (FWD, BWD_I, BWD_W or BWD) of one unit kind: `segments` compute
// segments, point k between segment k and segment k + 1. When a pass ends
// with a point (points.size() == segments), its result is the collective's.
struct PassShape {
  int segments = 1;
  std::vector<CommPoint> points;
  bool ends_with_point() const { return static_cast<int>(points.size()) == segments; }
};

// The shape of `pass` of a unit of `kind` at tensor-parallel degree `tp`
// (d_model: the activation width). tp 1: one segment, no points.
PassShape pass_shape(UnitKind kind, NodeKind pass, int tp, int64_t d_model);

}  // namespace piper::ir
