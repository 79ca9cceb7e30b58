// filter.hpp — what a directive's filter (config::Filter, docs/directives.md) selects: units by
// their tags (stage, unit index or name, block, kind), nodes by theirs (those, the microbatch and
// the pass). Pure: the model graph names the units, the caller gives their stages.
#pragma once

#include <string>
#include <vector>

#include "config/config.hpp"
#include "ir/graph.hpp"
#include "ir/model_graph.hpp"

namespace piper::ir {

// Whether `f` selects `unit`, held by stage `stage`: it passes every unit key given (stage, unit,
// blocks, kind). Block keys never select the embedding or the head. The microbatch and pass keys
// select among a unit's passes, so they are not a unit's to pass: they take no part here.
bool selects(const config::Filter& f, const UnitSpec& unit, int stage);

// Whether `f` selects the node tagged `t` (a unit pass, or a collective of a unit) of `model`: its
// unit passes the unit keys, and its microbatch and pass the microbatch and pass keys.
bool selects(const config::Filter& f, const Tags& t, const ModelGraph& model);

// The units `f` selects; stage_of_unit[u] is unit u's stage (-1 where none is known yet).
std::vector<int> selected_units(const config::Filter& f, const ModelGraph& model, const std::vector<int>& stage_of_unit);

// What is wrong with `f` over `model` with `n_stages` stages: a block, unit or stage that does not
// exist, or a filter that selects no unit, saying what the model has (e.g. "kind '*' selects no
// unit: the pattern \"M-M-M-\" has no attention block"). "" when it selects some units.
std::string filter_problem(const config::Filter& f, const ModelGraph& model, const std::vector<int>& stage_of_unit,
                           int n_stages);

}  // namespace piper::ir
