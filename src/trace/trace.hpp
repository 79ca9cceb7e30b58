// trace.hpp — timelines of training steps, measured (the runtime's --trace) or
// predicted (the simulator), in one format: Chrome trace-event JSON, which
// Perfetto and chrome://tracing open. Pure data and text; no MPI, no model.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace piper::trace {

// A trace, metrics file or drawing request that cannot be used as given (a
// missing or malformed file, a step the trace lacks): a user error, its
// message names the file and what is wrong.
class TraceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The largest trace or metrics file piper reads: a million ranks' steps fit well below it.
inline constexpr int64_t kMaxTraceFileBytes = int64_t{8} << 30;


// Which of a rank's two streams an event ran on.
enum class Lane : uint8_t { LANE_COMPUTE, LANE_COMM };

// One executed (or predicted) node of the training DAG on one rank.
struct Event {
  int rank = 0;
  Lane lane = Lane::LANE_COMPUTE;
  std::string kind;      // the node kind: "FWD", "BWD_I", "BWD_W", "BWD", "RECOMP", "UPD", "SEND", "RECV",
                         // "ALLREDUCE", "REDUCE_SCATTER", "ALLGATHER", "ALLTOALL"; or "WAIT" (exposed wait)
  std::string name;      // what users read: "FWD layers.3 mb1"
  int node = -1;         // id in the global DAG
  int step = 0;          // optimiser step the event belongs to
  int microbatch = -1;   // -1 for per-step nodes
  int stage = -1;        // pipeline stage (model chunk), -1 when not meaningful
  int unit = -1;         // model unit index, -1 when not meaningful
  double start_us = 0;   // from the trace's time origin
  double end_us = 0;
  int64_t bytes = 0;     // bytes moved (communication), 0 for compute
};

struct Trace {
  std::string title;     // "measured: config/bench.yaml" or "simulated: ..."
  int ranks = 0;         // rows; events name ranks in [0, ranks)
  std::vector<Event> events;
};

// Chrome trace-event JSON ({"traceEvents": [...]}): one process per rank,
// thread 0 compute and thread 1 communication, complete ("X") events with the
// event's fields under "args", process and thread names as metadata events.
std::string chrome_json(const Trace& t);
// Writes chrome_json(t) to `path`; throws TraceError naming the path.
void write_chrome(const Trace& t, const std::string& path);
// Reads a file written by write_chrome (measured or simulated) back.
// Throws TraceError (a std::runtime_error) naming the path and what is wrong.
Trace read_chrome(const std::string& path);

}  // namespace piper::trace
