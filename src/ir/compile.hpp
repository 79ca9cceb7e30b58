// compile.hpp — the deterministic SPMD compile every rank runs: model graph,
// directives, global DAG, verification, per-rank programs, plan hash.
#pragma once

#include <cstdint>
#include <vector>

#include "config/config.hpp"
#include "ir/build.hpp"
#include "ir/graph.hpp"
#include "ir/model_graph.hpp"
#include "ir/program.hpp"
#include "ir/strategy.hpp"
#include "ir/verify.hpp"

namespace piper::ir {

struct Plan {
  ModelGraph model;
  Strategy strategy;
  Graph graph;
  uint64_t hash = 0;
  std::vector<std::vector<int>> devices_of_unit;  // ranks running each unit, ascending
};

// Builds and verifies the global DAG of a validated config for `world_size`
// ranks. Throws BuildError or VerifyError.
Plan compile(const config::Config& cfg, int world_size);
// The same for a strategy made in code (the tuner's candidates): `s` as
// ir::expand gives it, then edited (stages, placement, order).
Plan compile(const config::ModelConfig& model, Strategy s);

}  // namespace piper::ir
