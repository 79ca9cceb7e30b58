// program.hpp — a rank's slice of the global DAG: ordered instructions per
// stream, what the runtime executes. Also the plan's printed form and hash.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.hpp"
#include "ir/model_graph.hpp"

namespace piper::ir {

struct Instr {
  int node = -1;  // id in the global DAG
  NodeKind kind = NodeKind::FWD;
  int unit = -1;
  int microbatch = -1;
  Pass pass = Pass::PASS_F;
  int segment = 0;               // segment of a unit pass, or the communication point a collective is

  int peer = -1;                 // SEND/RECV: this rank's partner
  int tag = -1;                  // SEND/RECV: message tag
  GroupDim group = GroupDim::GROUP_NONE;
  Payload payload = Payload::PAYLOAD_NONE;
  std::vector<int> units;        // collectives: the units moved
  int64_t bytes = 0;
  std::vector<int> waits;        // nodes of this rank's other stream to complete first
  Recompute recompute = Recompute::RECOMPUTE_NONE;  // RECOMP: what it recomputes
};

struct Program {
  int rank = 0;
  std::vector<Instr> compute;  // STREAM_COMPUTE, in execution order
  std::vector<Instr> comm;     // STREAM_COMM, in issue order
};

// The slice of rank `rank`: its nodes per stream, in a topological order of
// the edges among them, ties broken by node id (deterministic on every rank).
Program lower(const Graph& g, int rank);
// lower() of every rank 0..world_size-1, reading the graph once rather than
// once per rank.
std::vector<Program> lower_all(const Graph& g, int world_size);

// The forward part of a rank's training program, what an evaluation plays (docs/architecture.md,
// "Evaluation"): every FWD segment, the activations' SEND and RECV, the collectives of the forward
// passes (tensor-parallel sums, the vocab-parallel loss, MoE dispatch and combine) and the ZeRO-3
// gathers before them, in the training program's order; each wait on a dropped instruction is
// dropped with it. Its every stream is a subsequence of the training program's, so it plays
// without deadlock wherever the training program does.
Program forward_program(const Program& training);

// 64-bit FNV-1a of the graph's canonical form; ranks compare it at start.
uint64_t plan_hash(const Graph& g);
// The same, also covering every parameter's name and global shape.
uint64_t plan_hash(const Graph& g, const ModelGraph& model);

// Node and edge counts by kind, stages, microbatches, units.
std::string summary(const Graph& g, const ModelGraph& model);
// One line per instruction: "  3  FWD    layers.2 mb0".
std::string format_program(const Program& p, const ModelGraph& model);

}  // namespace piper::ir
