// errors.cpp — how the piper commands end on an exception: a user error is
// one message and exit 2; a failure inside an MPI job is reported by the rank
// that met it, and the whole job stops.
#include <cstdio>

#include "checkpoint/checkpoint.hpp"
#include "cli/commands.hpp"
#include "comm/comm.hpp"
#include "config/config.hpp"
#include "data/token_file.hpp"
#include "ir/compile.hpp"
#include "runtime/trainer.hpp"
#include "trace/trace.hpp"
#include "tune/tune.hpp"

namespace piper::cli {

bool is_user_error(const std::exception& e) {
  return dynamic_cast<const config::ConfigError*>(&e) || dynamic_cast<const runtime::UserError*>(&e) ||
         dynamic_cast<const data::DataError*>(&e) || dynamic_cast<const ir::BuildError*>(&e) ||
         dynamic_cast<const ir::VerifyError*>(&e) || dynamic_cast<const checkpoint::CheckpointError*>(&e) ||
         dynamic_cast<const trace::TraceError*>(&e) || dynamic_cast<const tune::TuneError*>(&e);
}

int job_failed(const std::exception& e, const runtime::MpiEnv& env) {
  // Every rank parses the same input and fails the same way: one prints.
  if (is_user_error(e)) {
    if (env.rank() == 0) std::fprintf(stderr, "piper: error: %s\n", e.what());
    return kExitUsage;
  }
  // A checkpoint save that failed (checkpoint.on_error: stop): every rank agreed on the same message, the
  // folder is as it was; one prints, every rank ends in order.
  if (dynamic_cast<const checkpoint::SaveError*>(&e)) {
    if (env.rank() == 0)
      std::fprintf(stderr, "piper: error: checkpoint save failed: %s; the job stops (checkpoint.on_error: stop), "
                   "the folder holds what it held before this save\n", e.what());
    return kExitFailure;
  }
  // A failure while running (a communication timeout, a dead peer, a bug):
  // this rank says what it was doing, then the whole job stops.
  const bool comm_error = dynamic_cast<const comm::CommError*>(&e) != nullptr;
  std::fprintf(stderr, "piper: %s on rank %d (%s): %s\n", comm_error ? "communication failure" : "internal error",
               env.rank(), env.host().c_str(), e.what());
  std::fflush(stderr);
  if (env.world_size() > 1) env.abort(comm_error ? kExitFailure : 1);
  return comm_error ? kExitFailure : 1;
}

}  // namespace piper::cli
