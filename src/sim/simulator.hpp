// simulator.hpp — plays the global training DAG on a cost model: every rank's
// program runs as the runtime's executor runs it (compute in program order,
// communication issued ahead with the same look-ahead, collectives completing
// when every member of the group has issued them, the clipping norm summed
// over the world before the first update), giving each rank's timeline, the
// step time, the compute / exposed communication / bubble split and the peak
// memory by category. A plan compiled at a few data-parallel replicas can be
// priced as one with many (SimOptions::replicas). Depends on ir and cost data only.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "ir/compile.hpp"
#include "ir/player.hpp"
#include "sim/cost_model.hpp"
#include "trace/trace.hpp"

namespace piper::sim {

// Memory categories, as the backend accounts them (backend::MemCategory).
enum class Mem : uint8_t { MEM_PARAMS, MEM_GRADS, MEM_OPTIMIZER, MEM_ACTIVATIONS, MEM_BUFFERS };
constexpr int kMemCount = 5;
const char* mem_name(Mem m);  // "params", "grads", "optimizer", "activations", "buffers"

struct RankResult {
  int rank = 0;
  double finish_ms = 0;   // end of the rank's program (its last communication included)
  double compute_ms = 0;  // sum of compute node times
  double comm_ms = 0;     // exposed: waiting for collectives and sends
  double bubble_ms = 0;   // waiting for another stage's data, and for the slowest rank at the step's end
  std::array<double, kMemCount> peak{};  // bytes, each category's own peak
  double peak_total = 0;                 // bytes, peak of the sum
  std::array<double, kMemCount> state{};  // bytes held between steps (params, grads, optimiser)
  int peak_microbatches = 0;  // most microbatches with activations alive at once
};

struct SimResult {
  double step_ms = 0;      // predicted step time: slowest rank, step overhead and the loss sum
  double bubble = 0;       // idle fraction over all ranks: sum(bubble) / (ranks * step)
  std::vector<RankResult> ranks;
  trace::Trace trace;      // the predicted timeline (when asked for)
  int64_t nodes = 0;       // instructions played
};

struct SimOptions {
  bool timeline = false;   // fill SimResult::trace
  std::string title;       // the trace's title
  // Ranks placed on each host, consecutive ranks together (mpirun's and
  // Slurm's default block placement). When ranks_per_host x the cost model's
  // threads_per_rank exceeds its host_cores, the ranks of a host share its
  // cores: a compute instruction stretches by the average number of busy
  // threads on its host during it over the cores. 0: every rank has its own.
  int ranks_per_host = 0;
  // When set: what each rank's player issued, completed and ran, in order
  // (of the last simulation, with host sharing), to compare with other plays.
  std::vector<std::vector<ir::PlayEvent>>* play_log = nullptr;
  // The plan's data-parallel replicas stand for `replicas` times as many. Every replica (with
  // expert parallelism every group of ep consecutive dp ranks) plays the same program at the same
  // times, so a plan compiled at dp and train.global_batch, simulated with replicas = k, is priced
  // as the same strategy at dp x k and global_batch x k: each data-parallel collective runs over
  // k times its ranks with that strategy's buffers (padding and ZeRO shards at dp x k), the
  // experts' part over k times the expert-data group, the clipping norm and the step's loss
  // all-reduce over world x k; ZeRO-sharded state holds the dp x k shards. Tensor-parallel and ep
  // collectives and point-to-point transfers are unchanged. The results are the plan's ranks' (by
  // symmetry, those of each full-strategy rank with the same tp and pp coordinates and its dp
  // coordinate modulo the plan's dp). At least 1; above 1 needs dp >= 2, ranks_per_host 0 or 1, and
  // dp x k at most kMaxGroupRanks (the bound of parallel.dp).
  int replicas = 1;
};

// What the input makes impossible to simulate: a time that overflows, host
// sharing that does not settle, a plan beyond the limits below. The message
// says what and what would be right; `piper simulate` reports it with exit 2.
struct SimError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Limits of `piper simulate` (docs/simulator.md, "Limits"). Lowering every
// rank's program reads the whole global DAG (ir::lower), so time grows as
// world x instructions: 16384 ranks and 2^22 instructions took 108 s and
// 1.2 GB on one core of the busy 2-core CI machine.
constexpr int kMaxWorld = 16384;
constexpr int64_t kMaxInstructions = int64_t{1} << 22;  // played by all ranks together
constexpr int kMaxSharingRounds = 30;                   // simulations of the host-sharing fixed point
constexpr double kSharingTolerance = 1e-3;              // settled: no factor moves by more than this of itself

// Instructions the ranks of `plan` play: every node once per rank of its device set.
int64_t instructions(const ir::Plan& plan);

// Simulates one training step of `plan` (compiled from `cfg`) on `cost`.
// Throws std::invalid_argument for opts.replicas outside what SimOptions says,
// std::out_of_range when the cost model lacks an entry the plan needs,
// SimError when a time overflows or host sharing does not settle within
// kMaxSharingRounds, std::logic_error when the programs cannot complete (a
// deadlock; the verifier rejects those first).
SimResult simulate(const ir::Plan& plan, const config::Config& cfg, const CostModel& cost,
                   const SimOptions& opts = {});

}  // namespace piper::sim
