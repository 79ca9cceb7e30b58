// placement.hpp — the rules of a stage per unit: which units a stage filter selects (by the
// units' tags: block index and kind), and that stages run along the model. Pure: the model graph
// names the units, the caller names the places (a config's file positions, or plain words).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "ir/model_graph.hpp"

namespace piper::ir {

// "layers.3 (block 3, 'M')", "embed", "head": a unit as the placement rules name it.
std::string unit_description(const UnitSpec& unit);

// Whether stage filter `f` selects `unit`: every filter given matches (block filters never select
// embed or head; a kind is a block symbol, "embed" or "head").
bool selects(const config::StageFilter& f, const UnitSpec& unit);

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
std::vector<int64_t> resolve_stages(const ModelGraph& model, const std::vector<config::StageFilter>& stages,
                                    const std::string& base, const config::Positions& at,
                                    std::vector<std::string>& errors);

// The problems of a place directive at `path` (its stage_of_unit or stages key): the units it
// leaves on no stage or on two, a stage_of_unit list that is not one per unit, stages that do not
// run along the model. Empty when it has none.
std::vector<std::string> placement_problems(const ModelGraph& model, const config::EffectiveStrategy& e);

}  // namespace piper::ir
