// placement.hpp — the rules of a stage per unit: the balanced default, the stages that filters
// give (ir/filter.hpp), and that stages run along the model. Pure: the model graph
// names the units, the caller names the places (a config's file positions, or plain words).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "ir/graph.hpp"
#include "ir/model_graph.hpp"

namespace piper::ir {

// "layers.3 (block 3, 'M')", "embed", "head": a unit as the placement rules name it.
std::string unit_description(const UnitSpec& unit);

// A contiguous partition of n units into `stages` non-empty stages minimising the largest
// value(c, u) of its stages, stage [c, u) holding units c..u-1: the stage of every unit, and that
// largest value. Of equal partitions, the one with the smallest cut before the last stage, and so
// on towards the first.
struct Partition {
  std::vector<int> stage_of;
  double most = 0.0;
};

template <class Value>
Partition min_max_partition(int n, int stages, const Value& value) {
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][u]: the smallest largest value putting units [0, u) on s stages; cut[s][u]: where the last starts.
  std::vector<std::vector<double>> best(static_cast<size_t>(stages) + 1, std::vector<double>(static_cast<size_t>(n) + 1, inf));
  std::vector<std::vector<int>> cut(best.size(), std::vector<int>(static_cast<size_t>(n) + 1, 0));
  best[0][0] = 0.0;
  for (int s = 1; s <= stages; ++s)
    for (int u = s; u <= n - (stages - s); ++u)
      for (int c = s - 1; c < u; ++c) {
        const double v = std::max(best[s - 1][c], value(c, u));
        if (v < best[s][u]) best[s][u] = v, cut[s][u] = c;
      }
  Partition p{std::vector<int>(static_cast<size_t>(n), 0), best[stages][n]};
  for (int s = stages, u = n; s > 0; --s) {
    const int c = cut[s][u];
    for (int i = c; i < u; ++i) p.stage_of[static_cast<size_t>(i)] = s - 1;
    u = c;
  }
  return p;
}

// The stage of every unit when no directive says: a contiguous partition of the units, unit u
// costing cost_of_unit[u] (ir::unit_costs, or simulated times), into `stages` non-empty stages
// that minimises the most expensive stage (exact, by dynamic programming). The first unit (the
// embedding) is on stage 0 and the last (the head) on the last stage. Of partitions whose most
// expensive stages cost the same, the one whose largest stage holds the fewest units; then the
// one with the most units on the last stage, the units before it split the same way. Throws
// std::invalid_argument for stages outside 1..units or a cost that is negative or not finite.
std::vector<int> balance_stages(const std::vector<double>& cost_of_unit, int stages);

// The first problem of a stage per unit (stages 0..n_stages-1 along the model, each a contiguous
// non-empty run), at unit `unit`, or nullopt.
struct StageProblem {
  int unit = 0;
  std::string message;
};
std::optional<StageProblem> stage_problem(const ModelGraph& model, const std::vector<int64_t>& stage_of_unit,
                                          int64_t n_stages);

// The stage of every unit that the filters `stages` (stage i holds what stages[i] selects) give;
// the embedding goes with the first stage and the head with the last when no filter names them.
// Problems are appended to `errors`, each at `at(path)` of the filter it concerns (paths
// `base[i]`, and `base` for the whole list); then the result is empty.
std::vector<int64_t> resolve_stages(const ModelGraph& model, const std::vector<config::Filter>& stages,
                                    const std::string& base, const config::Positions& at,
                                    std::vector<std::string>& errors);

// The problems of a place directive at `path` (its stage_of_unit or stages key): the units it
// leaves on no stage or on two, a stage_of_unit list that is not one per unit, stages that do not
// run along the model. Empty when it has none.
std::vector<std::string> placement_problems(const ModelGraph& model, const config::EffectiveStrategy& e);

// Whether a block of kind `k` has mixer inner activations that selective recomputation drops
// (attention and Mamba-2; an MLP block has none).
bool has_inner_activations(UnitKind k);

// The recomputation of every unit: parallel.recompute over every block, then each recompute directive
// of `e` in order over the blocks it selects (`stage_of_unit`: the stage of every unit); selective
// on a block without inner activations is none. Problems are appended to `errors`, each at
// the position of the key it concerns (an unknown mode, the embedding or head named, a block or stage
// that does not exist, a filter selecting no block, selective over MLP blocks only); then the result
// is empty.
std::vector<Recompute> resolve_recompute(const ModelGraph& model, const config::EffectiveStrategy& e,
                                         const std::vector<int>& stage_of_unit, std::vector<std::string>& errors);

}  // namespace piper::ir
