// fit.hpp — does the run fit in memory? Checked once by `train`, after the
// plan is compiled and before the model is allocated: this rank's peak memory
// as the simulator predicts it (sim::simulate on the analytic cost model of
// this host: parameters, gradients and Adam moments per ZeRO stage, the
// activations the schedule holds, communication and scratch buffers), summed
// over the ranks of each host, against the memory the host has available
// (docs/config.md, "Memory check").
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "config/config.hpp"
#include "ir/compile.hpp"
#include "runtime/mpi_env.hpp"

namespace piper::runtime {

// The memory available to this host's ranks, and where the figure came from.
struct HostMemory {
  double bytes = 0;    // 0 when nothing could be read
  std::string source;  // e.g. "MemAvailable in /proc/meminfo"
};
// MemAvailable from /proc/meminfo (memory that can be allocated without
// swapping, reclaimable page cache included), lowered to what a cgroup memory
// limit leaves; sysconf(_SC_AVPHYS_PAGES) x page size when /proc/meminfo
// cannot be read.
HostMemory host_memory();

// This rank's estimated peak memory, by the simulator's categories.
struct RankMemory {
  std::array<double, 5> peak{};  // params, grads, optimizer, activations, buffers (each category's own peak)
  double input_bytes = 0;        // the step's token ids (inputs and targets) the trainer holds
  double total = 0;              // the simulator's peak of the sum, plus input_bytes
  int peak_microbatches = 0;     // most microbatches with activations alive at once
};
RankMemory estimate_rank_memory(const config::Config& cfg, const ir::Plan& plan, int rank);

// The margin the check adds to the estimate: need = estimate x (1 + kFitMargin)
// + kFitPerRankBytes for each rank of the host (the binary, MPI, thread stacks,
// the plan and programs, which the estimate does not count).
inline constexpr double kFitMargin = 0.10;
inline constexpr double kFitPerRankBytes = 128.0 * 1024 * 1024;
// Every rank plays the whole plan for the estimate (some 300k instructions a
// second): beyond this many instructions over all ranks the check is skipped.
inline constexpr int64_t kFitMaxInstructions = int64_t{1} << 21;

// The result of the check on this rank.
struct MemoryFit {
  RankMemory rank;         // this rank's estimate
  double host_need = 0;    // with the margin, all ranks of this host
  HostMemory host;         // what this host has
  int ranks_on_host = 1;
};

// Estimates every rank's memory, sums it per host and compares it with the
// host's available memory. When any host falls short, every rank throws the
// same UserError (rank 0 prints it): the host and rank, the figure needed
// against the figure available, the keys of the largest contributors (e.g.
// model.vocab_size x model.d_model for the embedding) and what would make it
// fit. Collective: every rank calls it at the same point. A plan too large
// to play in seconds (kFitMaxInstructions), or one the simulator cannot
// time, is not checked: rank 0 prints "piper: memory check skipped"
// and the reason, and the result is empty.
MemoryFit check_memory_fit(const config::Config& cfg, const ir::Plan& plan, const MpiEnv& env);

// What `train` does with a std::bad_alloc (the model, the optimiser state or
// a step's activations did not get their memory after all): on one rank it
// throws a UserError "out of memory" with the estimate of the last
// check_memory_fit and the memory the host had (exit code 2); under mpirun
// this rank prints that message itself and aborts every rank with code 2, so
// no rank waits for it.
[[noreturn]] void out_of_memory(const MpiEnv& env);

}  // namespace piper::runtime
