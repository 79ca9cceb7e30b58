// switching.hpp — moving a running job's training state from one strategy's
// runtime to another's in memory (docs/switching.md): parameter values, both
// Adam moments, the Adam steps and the data position, between layouts that
// may differ in every degree and in the set of ranks.
//
// The move follows the planner's steps (state::plan_switch): block by block
// (a unit's values, exp_avg or exp_avg_sq buffer), the new block is allocated,
// pieces this process holds under both layouts are copied locally, the rest
// arrive in rounds of point-to-point messages of at most one chunk (each
// process sends one and receives one per round, so no order deadlocks), and
// the old block is freed as soon as its pieces have left. Staging is one
// outgoing and one incoming chunk; the gradient buffers are freed before the
// move and allocated again after it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "ir/compile.hpp"
#include "runtime/rank_runtime.hpp"

namespace piper::runtime {

// One process's account of a move.
struct MoveFigures {
  int64_t bytes_sent = 0, bytes_received = 0, bytes_local = 0;
  int64_t peak_bytes = 0;  // the most the backend held while the state moved, all categories
  int rounds = 0;          // of the whole plan
  double plan_ms = 0, build_ms = 0, move_ms = 0;
};

// The two sides of a move. Processes are the group ranks of `members`;
// `procs[i]` is the process of the layout's rank i.
struct MoveSide {
  const ir::Plan* plan = nullptr;
  std::vector<int> procs;
};

// Collective over `members`: every process of either layout, and those in
// reserve under both. `old_rt` is this process's runtime under `from` (null on
// a process joining or in reserve); `new_world` the communicator of `to`'s
// ranks (null on a process leaving or staying in reserve), over which the new
// runtime of `to_cfg` and `to.plan` is built. Returns it (null without
// `new_world`) holding the old runtime's state, position and Adam steps; the
// old runtime keeps no state buffers and is dropped by the caller.
// `buffer_bytes` is the staging of one process (one chunk out, one in).
std::unique_ptr<RankRuntime> move_state(RankRuntime* old_rt, const MoveSide& from, const config::Config& to_cfg,
                                        const MoveSide& to, comm::Communicator* new_world,
                                        comm::Communicator& members, int64_t buffer_bytes, MoveFigures& figures);

}  // namespace piper::runtime
