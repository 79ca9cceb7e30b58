// layout.hpp — the virtual parameter space: every state tensor in one global coordinate space (docs/state.md).
// Every state tensor (parameter values, Adam exp_avg, exp_avg_sq) has its
// global shape; a strategy maps each rank to the elements of it the rank
// holds, as sorted, disjoint runs of global flat (row-major) indices. From
// that: which rank writes each element (checkpoints), and which rank sends
// what to whom when the strategy changes (restart, online switch). Pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/compile.hpp"
#include "ir/model_graph.hpp"
#include "ir/parallel_dims.hpp"

namespace piper::state {

// ---- runs --------------------------------------------------------------------------

// Global flat elements [begin, end) of one tensor.
struct Run {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Run&) const = default;
};

// Sorts, drops empty runs and merges overlapping or adjacent ones.
std::vector<Run> normalise(std::vector<Run> runs);
// The elements in both / in a but not in b / in either. Inputs normalised.
std::vector<Run> intersect(const std::vector<Run>& a, const std::vector<Run>& b);
std::vector<Run> subtract(const std::vector<Run>& a, const std::vector<Run>& b);
std::vector<Run> unite(const std::vector<Run>& a, const std::vector<Run>& b);
int64_t total(const std::vector<Run>& runs);

// ---- layouts -----------------------------------------------------------------------

// What a layout depends on: the degrees and rank grid, the ZeRO stage of each unit and the units
// each rank runs.
struct LayoutParams {
  ir::ParallelDims dims;
  std::vector<int> zero_of_unit;                  // from ir::Strategy: the ZeRO stage of each unit
  std::vector<std::vector<int>> devices_of_unit;  // from ir::Plan: ranks running each unit, ascending
};
LayoutParams layout_params(const ir::Plan& plan);

enum class StateKind { STATE_PARAM, STATE_EXP_AVG, STATE_EXP_AVG_SQ };
const char* state_kind_name(StateKind k);  // "param", "exp_avg", "exp_avg_sq"
// What ir::zero_shards decides for a kind: the values' state or the moments'.
ir::ZeroState zero_state_of(StateKind k);
// "/model/<name>", "/optim/exp_avg/<name>", "/optim/exp_avg_sq/<name>"
std::string dataset_name(StateKind kind, const std::string& param_name);

// Part of one state tensor on one rank. runs[i] lies in the rank's local
// buffer of the unit at local_offsets[i] .. + runs[i].size(), contiguously.
// The local buffer is the one the rank stores:
//   STATE_PARAM: the unit's full (padded) values/grads buffer for a unit at zero 0-2
//                (ParamStore::values), its shard for one at zero 3 (shard_values);
//   moments:     the full moment buffer for zero 0, the shard for zero >= 1
//                (indexed from the shard start, as runtime::Executor keeps them).
struct Piece {
  StateKind kind = StateKind::STATE_PARAM;
  std::string param;
  int unit = -1;
  std::vector<Run> runs;
  std::vector<int64_t> local_offsets;
};

// Everything rank `rank` stores: per unit it runs, per parameter (spec
// order), the param piece then exp_avg then exp_avg_sq. Empty pieces (a ZeRO
// shard that misses a parameter) are left out.
std::vector<Piece> held(const ir::ModelGraph& graph, const LayoutParams& lp, int rank);

// The unique writer of each element: held() restricted so that every element
// of every tensor belongs to exactly one rank. The rule: the unit's first
// pipeline coordinate (that of devices_of_unit[u].front()); tp rank 0 for a
// parameter replicated over tp (every tp rank its own piece otherwise); and
// the data-parallel rank whose ZeRO shard of the flat local buffer holds the
// element (at every zero level, so writes spread over the dp group).
std::vector<Piece> owned_for_write(const ir::ModelGraph& graph, const LayoutParams& lp, int rank);

// For every destination rank's held pieces under `to`: which source ranks under `from` provide
// them. `local_src[d]` is the rank of `from` on the same process as rank d of `to` (-1: none;
// empty: none for any): what it holds of d's pieces (held, a replica or not) d copies from it;
// every other element comes from the rank that owns it for writing (owned_for_write). Ordered by
// unit, then dst, then the dst's held order, then src. Sources are found through the owners of
// each tensor sorted by element, unit by unit: a destination piece meets only the sources of its
// elements.
struct Transfer {
  StateKind kind = StateKind::STATE_PARAM;
  std::string param;
  int unit = -1;
  int src = 0, dst = 0;
  std::vector<Run> runs;
};
std::vector<Transfer> plan_transfers(const ir::ModelGraph& graph, const LayoutParams& from, const LayoutParams& to,
                                     const std::vector<int>& local_src = {});

// Local offsets (in the piece's buffer) of the first element of each run of
// `runs`, each of which must lie inside one run of the piece; throws
// std::out_of_range otherwise.
std::vector<int64_t> locate(const Piece& piece, const std::vector<Run>& runs);

// The global flat runs of local elements [lo, hi) of the piece of `spec` at
// coordinates `at` (ir::global_stretch), each with its local index
// (local_start[i] is the local index of runs[i].begin). Adjacent runs merge.
void local_to_global_runs(const ir::ParamSpec& spec, const ir::Degrees& n, const ir::Coords& at, int64_t lo,
                          int64_t hi, std::vector<Run>& runs, std::vector<int64_t>& local_start);

}  // namespace piper::state
