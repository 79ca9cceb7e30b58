// checkpointing.hpp — saving and restoring a rank's training state through the
// virtual parameter space (src/state) and HDF5 checkpoints (src/checkpoint):
// every rank writes the elements it owns and reads the elements its layout
// holds, so a checkpoint written under one strategy loads under any other.
#pragma once

#include <cstdint>
#include <string>

#include "config/config.hpp"
#include "ir/compile.hpp"
#include "model/model.hpp"
#include "runtime/executor.hpp"
#include "runtime/mpi_env.hpp"

namespace piper::runtime {

class Checkpointer {
 public:
  Checkpointer(const config::Config& cfg, const ir::Plan& plan, model::Model& model, Executor& exec,
               const MpiEnv& env);

  // Collective: writes checkpoint.dir/step_<steps_done>.h5 (temporary name,
  // rename, then `latest`), keeps the newest checkpoint.keep. Returns the path.
  std::string save(int64_t steps_done);
  // Collective: loads PATH (a file, a folder, or "latest" in checkpoint.dir)
  // into the model and optimiser state. Returns the optimiser steps the
  // checkpoint had completed; -1 when "latest" names nothing yet.
  int64_t load(const std::string& where);

 private:
  const config::Config& cfg_;
  const ir::Plan& plan_;
  model::Model& model_;
  Executor& exec_;
  const MpiEnv& env_;
};

}  // namespace piper::runtime
