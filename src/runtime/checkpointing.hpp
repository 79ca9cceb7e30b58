// checkpointing.hpp — saving and restoring a rank's training state through the
// virtual parameter space (src/state) and HDF5 checkpoints (src/checkpoint), for
// the state a RankRuntime holds (parameters, moments, Adam steps, position):
// every rank writes the elements it owns and reads the elements its layout
// holds, so a checkpoint written under one strategy loads under any other.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "config/config.hpp"
#include "data/tokenizer.hpp"
#include "runtime/mpi_env.hpp"
#include "runtime/rank_runtime.hpp"

namespace piper::runtime {

class Checkpointer {
 public:
  // `tokenizer`: the one the run's data was made with, recorded in every checkpoint (piper generate
  // decodes with it) and checked on load. It must outlive the checkpointer.
  Checkpointer(const config::Config& cfg, RankRuntime& runtime, const MpiEnv& env, const data::Tokenizer& tokenizer);
  ~Checkpointer();  // waits for a save in flight
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Collective, before any step (a no-op without checkpoint.dir): the folder exists or can be created, every
  // rank can create, write, flush and remove a file in it, and its file system has room for a checkpoint and
  // the temporary of the next one. UserError naming the folder, the rank and the OS error otherwise.
  void preflight();
  // Collective: writes the runtime's state at its position to checkpoint.dir/step_<step>.h5 (temporary name,
  // rename, then `latest`), keeps the
  // newest checkpoint.keep, and says so (rank 0). With checkpoint.async the state is copied to staging
  // buffers and the write goes on in the background; poll() or wait() reports it. A save that fails leaves the
  // folder as it was: with checkpoint.on_error "continue" rank 0 warns and training goes on; with "stop" it
  // throws checkpoint::SaveError on every rank.
  void save();
  // Collective, at a step boundary: reports a background save once every rank's writer has finished.
  void poll();
  // Waits for a background save to finish and reports it (collective when one is in flight).
  void wait();
  // Collective: loads PATH (a file, a folder, or "latest" in checkpoint.dir)
  // into the runtime: values, moments, and the position it records, from
  // which the Adam steps follow. Returns the optimiser steps the checkpoint
  // had completed; -1 when "latest" names nothing yet. UserError when the
  // checkpoint was trained on data of another tokenizer.
  int64_t load(const std::string& where);

 private:
  checkpoint::Meta meta() const;  // of the runtime's state now
  // Save, in steps: this rank's owned elements as pieces (staged with checkpoint.async), then the write.
  std::vector<checkpoint::Piece> pieces_to_write();
  std::function<std::string()> write_job(const std::string& path, std::vector<checkpoint::Piece> mine);
  void write_in_background(const std::string& path, std::function<std::string()> write,
                           std::chrono::steady_clock::time_point t0);
  // Load, in steps: the file WHERE names ("" when "latest" names nothing), the reads into this rank's buffers,
  // and the check that the recorded position fits this config's data order.
  std::string resolve(const std::string& where) const;
  std::vector<checkpoint::Request> read_requests();
  void land_read();  // the staged reads of read_requests() to the device
  void check_position(const std::string& path, const checkpoint::Meta& meta) const;
  void check_tokenizer(const std::string& path, const checkpoint::Meta& meta) const;
  // The outcome of a save: rank 0 says it was saved, or the failure is handled by checkpoint.on_error.
  void report(const std::string& path, const std::string& error, double written_ms);

  const config::Config& cfg_;
  RankRuntime& rt_;
  const MpiEnv& env_;
  const data::Tokenizer& tokenizer_;
  MPI_Comm comm_ = MPI_COMM_NULL;  // checkpoint traffic, apart from training's
  // A background save in flight: its thread, its file, what it threw, when it started, whether it is done.
  std::thread writer_;
  std::string pending_path_;
  std::string error_;
  std::chrono::steady_clock::time_point started_;
  std::atomic<bool> finished_{false};
  // Staging, in the device's host buffers (page-locked on a GPU): what a background save, or a save from a
  // device the host cannot address, writes; and what a load reads for such a device, one buffer per piece.
  std::vector<backend::HostBuffer> staged_, reads_;
};

}  // namespace piper::runtime
