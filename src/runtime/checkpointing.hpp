// checkpointing.hpp — saving and restoring a rank's training state through the
// virtual parameter space (src/state) and HDF5 checkpoints (src/checkpoint):
// every rank writes the elements it owns and reads the elements its layout
// holds, so a checkpoint written under one strategy loads under any other.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.hpp"
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

  // Collective, before any step (a no-op without checkpoint.dir): the folder exists or can be created, every
  // rank can create, write, flush and remove a file in it, and its file system has room for a checkpoint and
  // the temporary of the next one. UserError naming the folder, the rank and the OS error otherwise.
  void preflight();
  // Collective: writes checkpoint.dir/step_<steps_done>.h5 (temporary name, rename, then `latest`), keeps the
  // newest checkpoint.keep, and says so (rank 0). With checkpoint.async the state is copied to staging
  // buffers and the write goes on in the background; poll() or wait() reports it. A save that fails leaves the
  // folder as it was: with checkpoint.on_error "continue" rank 0 warns and training goes on; with "stop" it
  // throws checkpoint::SaveError on every rank.
  void save(int64_t steps_done);
  // Collective, at a step boundary: reports a background save once every rank's writer has finished.
  void poll();
  // Waits for a background save to finish and reports it (collective when one is in flight).
  void wait();
  // Collective: loads PATH (a file, a folder, or "latest" in checkpoint.dir)
  // into the model and optimiser state. Returns the optimiser steps the
  // checkpoint had completed; -1 when "latest" names nothing yet.
  int64_t load(const std::string& where);

 private:
  checkpoint::Meta meta_at(int64_t steps_done) const;
  // The outcome of a save: rank 0 says it was saved, or the failure is handled by checkpoint.on_error.
  void report(const std::string& path, const std::string& error, double written_ms);

  const config::Config& cfg_;
  const ir::Plan& plan_;
  model::Model& model_;
  Executor& exec_;
  const MpiEnv& env_;
  MPI_Comm comm_ = MPI_COMM_NULL;  // checkpoint traffic, apart from training's
  // A background save in flight: its thread, its file, what it threw, when it started, whether it is done.
  std::thread writer_;
  std::string pending_path_;
  std::string error_;
  std::chrono::steady_clock::time_point started_;
  std::atomic<bool> finished_{false};
  // Staging: what the background save writes.
  std::vector<std::vector<float>> staged_;
};

}  // namespace piper::runtime
