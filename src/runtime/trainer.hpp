// trainer.hpp — the training loop: data, plan, model, executor, progress,
// metrics, samples and the final summary.
#pragma once

#include <stdexcept>
#include <string>

#include "config/config.hpp"
#include "runtime/mpi_env.hpp"

namespace piper::runtime {

struct TrainOptions {
  std::string metrics_path;      // JSON lines, one object per step ("" = none)
  std::string dump_init_path;    // initial parameters in the PIPERPRM format ("" = none)
  std::string dump_final_path;   // parameters after the last step, same format
  bool quiet = false;            // no progress lines
  std::string resume;            // checkpoint to resume from: a file, a folder or "latest" ("" = start fresh)
  std::string trace_path;        // Chrome trace of every rank's instructions, written by rank 0 ("" = none)
  std::string trace_steps;       // "A:B": trace steps A..B only, 0-based inclusive ("" = every step)
};

// A problem with what the user gave (a file, a size): printed without a
// stack trace, exit code 2, before any work.
class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A byte count as the trainer's messages print it: "12.3 MiB".
std::string human_bytes(int64_t bytes);

// Trains the model of `cfg` with its strategy, switching strategies and rank sets as its `switch:`
// list, its switch file and leave notices say (docs/switching.md); `env` follows the ranks that train.
// Throws UserError for bad input.
void train(const config::Config& cfg, const TrainOptions& opts, MpiEnv& env);

}  // namespace piper::runtime
