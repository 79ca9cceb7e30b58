// calibrate.hpp — `piper calibrate`: measures the cost model the simulator
// plays the training DAG on (sim::CostModel, docs/calibration.md) on this
// machine, for the model and strategy of a config: every unit kind's forward,
// backward halves and activation memory over microbatch sizes, the optimiser
// update per element, the per-step overhead outside the program, and each
// collective over group sizes and message sizes through the same
// communicators training uses.
#pragma once

#include "config/config.hpp"
#include "runtime/mpi_env.hpp"
#include "sim/cost_model.hpp"

namespace piper::runtime {

struct CalibrateOptions {
  bool quick = false;  // fewer sizes and repetitions (tests): rough numbers in seconds
  bool quiet = false;  // no table of measurements
};

// Validates `cfg` for its own strategy's world size (the job may have more or
// fewer ranks: compute is measured on rank 0, and on the first tp ranks when
// the strategy has tp > 1 and the job that many ranks; communication over
// groups of 2, 4, ... and all ranks of the job). Collective: every rank calls
// it. Returns the fitted model, complete on rank 0. Throws config::ConfigError
// for a bad config.
sim::CostModel calibrate(const config::Config& cfg, const CalibrateOptions& opts, const MpiEnv& env);

}  // namespace piper::runtime
