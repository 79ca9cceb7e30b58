// tracing.hpp — `piper train --trace`: every rank records each instruction it
// executes (node id, step, start and end from a time origin shared after a
// barrier) into a preallocated vector; at the end rank 0 gathers the records
// of every rank in one MPI_Gatherv, rebuilds kinds, names, stages and bytes
// from the plan's global graph and writes one Chrome trace (trace/trace.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "ir/compile.hpp"
#include "trace/trace.hpp"

namespace piper::runtime {

using TraceClock = std::chrono::steady_clock;

// The steps to record, inclusive, 0-based.
struct TraceSteps {
  int64_t first = 0;
  int64_t last = std::numeric_limits<int64_t>::max();
};

// "A:B" (A <= B) -> {A, B}; "" -> every step. Throws UserError naming
// --trace-steps and the expected form.
TraceSteps parse_trace_steps(const std::string& text);

// One executed instruction on this rank. 24 bytes, sent as bytes.
struct TraceRecord {
  int32_t node = -1;     // id in the global DAG
  int32_t step = 0;
  double start_us = 0;   // from the origin
  double end_us = 0;
};

class TraceRecorder {
 public:
  // `per_step` bounds the records of one step (the program's instructions);
  // room is reserved for a bounded number of steps so recording does not allocate.
  TraceRecorder(TraceSteps steps, int64_t run_first, int64_t run_last, size_t per_step);

  // The time origin, from trace_origin on every rank.
  void set_origin(TraceClock::time_point t) { origin_ = t; }
  bool traces(int64_t step) const { return step >= steps_.first && step <= steps_.last; }
  void add(int node, int64_t step, TraceClock::time_point start, TraceClock::time_point end) {
    records_.push_back({node, static_cast<int32_t>(step), us(start), us(end)});
  }
  const std::vector<TraceRecord>& records() const { return records_; }

 private:
  double us(TraceClock::time_point t) const {
    return std::chrono::duration<double, std::micro>(t - origin_).count();
  }
  TraceSteps steps_;
  TraceClock::time_point origin_ = TraceClock::now();
  std::vector<TraceRecord> records_;
};

// Collective: the time origin of every rank's events, taken as the ranks
// leave one barrier of `world`. Ranks on one host take the host's lowest
// rank's reading of the one steady clock they share, so their events line up
// exactly; across hosts the origins differ by how far apart the hosts' lowest
// ranks left the barrier.
TraceClock::time_point trace_origin(comm::Communicator& world);

// Collective over MPI_COMM_WORLD: gathers every rank's records to rank 0.
// On rank 0 returns the trace (events of rank 0, then 1, ...; names, kinds,
// lanes, stages and bytes from `plan`'s global graph); elsewhere an empty trace.
trace::Trace gather_trace(const TraceRecorder& rec, const ir::Plan& plan, int rank, int world);

// Distinct steps among a trace's events.
int64_t trace_step_count(const trace::Trace& t);

// Collective: gather_trace, then rank 0 writes `path` titled "measured:
// <config_source> (<world> ranks)" and prints "trace: wrote N events of S
// steps to PATH". Throws UserError on rank 0 when the file cannot be written.
void write_trace(const TraceRecorder& rec, const ir::Plan& plan, const std::string& config_source,
                 const std::string& path, int rank, int world);

}  // namespace piper::runtime
