// strategy_in_code.hpp — a Strategy written by hand in the IR tests holds what ir::expand gives
// every Strategy: the stage, backward split and ZeRO stage of every unit.
#pragma once

#include "ir/placement.hpp"
#include "ir/strategy.hpp"
#include "ir/work.hpp"

namespace piper::testing {

// Gives every unit of the model `m` describes the backward split `split` and ZeRO stage `zero`,
// and, when s has no stage_of_unit, the stages balanced by the units' work (as ir::expand does for
// a config without train.seq_len) over pp x the chunks its order holds (none when the model has
// fewer units than stages: ir::build says so).
inline ir::Strategy with_units(ir::Strategy s, const config::ModelConfig& m, bool split, int zero = 0) {
  const ir::ModelGraph model = ir::make_model_graph(m);
  const size_t n = model.units.size();
  const int chunks =
      s.order.custom.empty() ? ir::schedule_chunks(s.order.schedule, s.place.virtual_stages) : s.order.chunks;
  const int stages = s.place.pp * chunks;
  if (s.place.stage_of_unit.empty() && stages >= 1 && static_cast<size_t>(stages) <= n)
    s.place.stage_of_unit = ir::balance_stages(ir::unit_costs(m, model, config::TrainConfig{}.seq_len), stages);
  s.split_backward_of_unit.assign(n, split);
  s.replicate.zero_of_unit.assign(n, zero);
  return s;
}

}  // namespace piper::testing
