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

// A collective between two segments of a pass, over the unit's tp group or
// (an MoE block's dispatch and combine) its ep group.
struct CommPoint {
  NodeKind kind = NodeKind::ALLREDUCE;  // ALLREDUCE (sum, in place), ALLGATHER or ALLTOALL
  GroupDim group = GroupDim::GROUP_TP;  // GROUP_TP or GROUP_EP
  // What each rank contributes, in elements: per microbatch row, plus a fixed
  // part. An all-to-all's sizes follow the routing; these are its
  // balanced-routing sizes (each token's top_k rows spread evenly over the
  // experts), what the simulator predicts with.
  int64_t per_row = 0;
  int64_t fixed = 0;
  // Rows of activations (an MoE block's dispatch and return): they travel in
  // the activations' storage type (Strategy::compute_elem_bytes); the rest
  // (sums, counts, routing weights) in f32.
  bool activations = false;
};

// What the points of a pass depend on.
struct PassDims {
  int tp = 1, ep = 1;
  int64_t d_model = 0;
  int64_t top_k = 0, n_experts = 0;  // MoE blocks
};

// A pass (FWD, BWD_I, BWD_W or BWD) of one unit kind: `segments` compute
// segments, point k between segment k and segment k + 1. No pass ends with a
// point: its last segment finishes the result, in the storage type the
// activations travel in between units (a sum over the group is in f32).
struct PassShape {
  int segments = 1;
  std::vector<CommPoint> points;
};

// The shape of `pass` of a unit of `kind`. tp 1 (and ep 1): one segment, no points.
PassShape pass_shape(UnitKind kind, NodeKind pass, const PassDims& d);
PassDims pass_dims(const ModelGraph& model, int tp, int ep);

}  // namespace piper::ir
