// graph.hpp — the global training DAG: nodes (compute, optimiser and
// communication), data and ordering edges, and the tags directives filter on.
// Pure data: no MPI, no backend, no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace piper::ir {

enum class NodeKind : uint8_t {
  FWD,             // forward of one unit for one microbatch
  BWD_I,           // input-gradient half of a backward (zero-bubble split)
  BWD_W,           // weight-gradient half of a backward
  BWD,             // fused backward (input and weight gradients)
  UPD,             // optimiser update of one unit's parameters
  NORM,            // the squared L2 norm of a pipeline rank's gradients, for clipping
  RECOMP,          // activation recomputation of one unit for one microbatch, right before its backward
  SEND,
  RECV,
  ALLREDUCE,
  REDUCE_SCATTER,
  ALLGATHER,
  ALLTOALL,
};
constexpr int kNodeKindCount = 13;

// The pass a node belongs to, as directive filters name it.
enum class Pass : uint8_t { PASS_F, PASS_B, PASS_BI, PASS_BW, PASS_U, PASS_COMM, PASS_R };

// Activation recomputation of a block (Megatron's): selective drops the
// attention and Mamba-2 mixers' inner activations after the forward and
// recomputes them from the saved normalised input; full drops all the
// block's saved state and recomputes it from the block's input.
enum class Recompute : uint8_t { RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL };
const std::vector<std::string>& recompute_names();  // "none", "selective", "full", in enum order
const char* recompute_name(Recompute r);

enum class EdgeKind : uint8_t {
  EDGE_DATA,   // dst consumes a value src produces
  EDGE_ORDER,  // dst runs after src on the same device and stream (a schedule)
};

// The logical streams of a device. Compute and communication nodes on
// different streams may overlap; nodes on one stream run in program order.
enum class Stream : uint8_t { STREAM_COMPUTE, STREAM_COMM };

struct Tags {
  int stage = 0;        // pipeline stage (model chunk) holding the unit
  int microbatch = -1;  // -1 for per-step nodes (UPD)
  Pass pass = Pass::PASS_F;
  int unit = -1;        // ModelGraph unit index
  int block = -1;       // global block index in the pattern, -1 for embed/head
  char block_kind = '?';  // unit_symbol(): 'e', 'M', '*', '-', 'E', 'h'
  // A unit pass is split at its communication points (ir/unit_passes.hpp):
  // a compute node runs segment `segment` of its pass, a collective of
  // payload PAYLOAD_UNIT moves the buffer of point `segment`, between
  // segments `segment` and `segment + 1`.
  int segment = 0;
};

// What a communication node moves.
enum class Payload : uint8_t {
  PAYLOAD_NONE,
  PAYLOAD_ACTIVATION,  // SEND/RECV: a unit's output, forward
  PAYLOAD_GRADIENT,    // SEND/RECV: the gradient w.r.t. a unit's input, backward
  PAYLOAD_WGRAD,       // ALLREDUCE / REDUCE_SCATTER: weight gradients of `units`
  PAYLOAD_PARAMS,      // ALLGATHER: parameters of `units`
  PAYLOAD_UNIT,        // a unit pass's buffer at a communication point (tensor-parallel partial sums, row maxima)
  PAYLOAD_NORM,        // ALLREDUCE: the squared gradient norm (one double)
};

// The process-group dimension a collective runs over, within each group of
// the rank grid that the node's devices contain.
// GROUP_EP: the ep group (ParallelDims), an MoE block's dispatch and combine.
enum class GroupDim : uint8_t { GROUP_NONE, GROUP_DP, GROUP_TP, GROUP_WORLD, GROUP_EP };
const char* group_name(GroupDim g);  // "", "dp", "tp", "world", "ep"

struct Node {
  int id = -1;
  NodeKind kind = NodeKind::FWD;
  Tags tags;
  // Ranks executing the node. A replicated node (data or tensor parallel) runs
  // on every rank of its set, each on its own shard; a collective runs within
  // each `group` of the set.
  std::vector<int> devices;
  Stream stream = Stream::STREAM_COMPUTE;
  std::vector<int> peers;    // SEND/RECV: peers[i] is the other side of devices[i]
  int tag = -1;              // SEND/RECV: message tag, the SEND's node id
  GroupDim group = GroupDim::GROUP_NONE;
  Payload payload = Payload::PAYLOAD_NONE;
  std::vector<int> units;    // collectives: the units whose parameters or gradients move
  int64_t bytes = 0;         // payload per rank
  Recompute recompute = Recompute::RECOMPUTE_NONE;  // RECOMP: what it recomputes
};

struct Edge {
  int src = -1;
  int dst = -1;
  EdgeKind kind = EdgeKind::EDGE_DATA;
};

class Graph {
 public:
  int add_node(Node n);  // assigns and returns the id
  void add_edge(int src, int dst, EdgeKind kind);

  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Edge>& edges() const { return edges_; }
  const Node& node(int id) const { return nodes_.at(static_cast<size_t>(id)); }
  Node& node_mut(int id) { return nodes_.at(static_cast<size_t>(id)); }
  // Edge indices into and out of each node (built on demand, cached).
  const std::vector<std::vector<int>>& in_edges() const;
  const std::vector<std::vector<int>>& out_edges() const;

  // Total number of ranks referenced by node device sets.
  int world_size() const;

 private:
  void index() const;
  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  mutable bool indexed_ = false;
  mutable std::vector<std::vector<int>> in_, out_;
};

const char* node_kind_name(NodeKind k);  // "FWD", "BWD_I", ...
const char* pass_name(Pass p);           // "F", "B", "BI", "BW", "U", "C", "R"
bool is_compute(NodeKind k);             // FWD / BWD* / RECOMP / UPD / NORM
bool is_p2p(NodeKind k);                 // SEND / RECV

// "FWD layers.3 mb1", "RECOMP layers.3 mb1 full", "ALLREDUCE tp layers.3 mb1 F.0" — a node as users read it.
std::string describe(const Node& n, const std::vector<std::string>& unit_names);
// describe() of node `id` and its place in the schedule:
// "FWD layers.3 mb1 (pass F, microbatch 1, stage 0)".
std::string describe_at(const Graph& g, int id, const std::vector<std::string>& unit_names);

}  // namespace piper::ir
