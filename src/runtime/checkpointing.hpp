// checkpointing.hpp — saving and restoring a rank's training state through the
// virtual parameter space (src/state) and HDF5 checkpoints (src/checkpoint):
// every rank writes the elements it owns and reads the elements its layout
// holds, so a checkpoint written under one strategy loads under any other.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

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
  ~Checkpointer();  // waits for a save in flight
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Collective: writes checkpoint.dir/step_<steps_done>.h5 (temporary name,
  // rename, then `latest`), keeps the newest checkpoint.keep. Returns the path.
  // With checkpoint.async the state is copied to staging buffers and the write
  // goes on in the background; the next save (or wait()) waits for it.
  std::string save(int64_t steps_done);
  // Waits for a background save to finish (collective when one is in flight).
  void wait();
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
  MPI_Comm comm_ = MPI_COMM_NULL;  // checkpoint traffic, apart from training's
  std::thread writer_;             // a background save in flight
  std::string error_;              // what the background save threw, reported by wait()
  // Staging: what the background save writes.
  std::vector<std::vector<float>> staged_;
};

}  // namespace piper::runtime
