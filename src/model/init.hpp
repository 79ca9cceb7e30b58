// init.hpp — deterministic initialisation: every initial value is a pure
// function of (seed, parameter name, global element index), so every parallel
// layout starts from bit-identical weights (docs/model.md, "Initialisation").
#pragma once

#include <cstdint>

#include "ir/model_graph.hpp"

namespace piper::model {

// The initial value of element `index` (row-major, global) of parameter `spec`.
float init_value(uint64_t seed, const ir::ParamSpec& spec, int64_t index);

// Fills out[0..count) with elements [first, first + count) of `spec`.
void init_range(uint64_t seed, const ir::ParamSpec& spec, int64_t first, int64_t count, float* out);

}  // namespace piper::model
