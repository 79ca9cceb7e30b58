// tracing.cpp — recording steps for `piper train --trace`, gathering the
// records to rank 0 and turning them into trace events.
#include "runtime/tracing.hpp"

#include <mpi.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <set>
#include <stdexcept>
#include <string_view>

#include "runtime/trainer.hpp"

namespace piper::runtime {

namespace {

// Records are reserved for this many steps at most; a longer trace grows.
constexpr int64_t kReservedSteps = 256;

bool parse_step(std::string_view s, int64_t& out) {
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && out >= 0;
}

}  // namespace

TraceSteps parse_trace_steps(const std::string& text) {
  if (text.empty()) return {};
  const size_t colon = text.find(':');
  TraceSteps s;
  if (colon == std::string::npos || !parse_step(std::string_view(text).substr(0, colon), s.first) ||
      !parse_step(std::string_view(text).substr(colon + 1), s.last) || s.first > s.last ||
      s.last > std::numeric_limits<int32_t>::max())
    throw UserError("--trace-steps: expected A:B, the first and last step to record (0-based, inclusive, "
                    "A <= B), e.g. --trace-steps 10:12; got '" + text + "'");
  return s;
}

TraceRecorder::TraceRecorder(TraceSteps steps, int64_t run_first, int64_t run_last, size_t per_step) : steps_(steps) {
  const int64_t n = std::min(steps.last, run_last) - std::max(steps.first, run_first) + 1;
  if (n > 0) records_.reserve(static_cast<size_t>(std::min(n, kReservedSteps)) * per_step);
}

TraceClock::time_point trace_origin(comm::Communicator& world) {
  MPI_Comm host;  // the ranks sharing this host (and its steady clock), in world order
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
  world.barrier();
  int64_t ticks = TraceClock::now().time_since_epoch().count();
  MPI_Bcast(&ticks, 1, MPI_INT64_T, 0, host);
  MPI_Comm_free(&host);
  return TraceClock::time_point(TraceClock::duration(ticks));
}

trace::Trace gather_trace(const TraceRecorder& rec, const ir::Plan& plan, int rank, int world) {
  // Counts first, then every rank's records as bytes in one Gatherv.
  const auto& mine = rec.records();
  const int n = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<size_t>(world), 0), displs(static_cast<size_t>(world), 0);
  MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Datatype record_type;
  MPI_Type_contiguous(static_cast<int>(sizeof(TraceRecord)), MPI_BYTE, &record_type);
  MPI_Type_commit(&record_type);
  int total = 0;
  for (int r = 0; r < world; ++r) displs[static_cast<size_t>(r)] = total, total += counts[static_cast<size_t>(r)];
  std::vector<TraceRecord> all(rank == 0 ? static_cast<size_t>(total) : 0);
  MPI_Gatherv(mine.data(), n, record_type, all.data(), counts.data(), displs.data(), record_type, 0, MPI_COMM_WORLD);
  MPI_Type_free(&record_type);

  trace::Trace t;
  t.ranks = world;
  if (rank != 0) return t;
  std::vector<std::string> unit_names;
  for (const auto& u : plan.model.units) unit_names.push_back(u.name);
  t.events.reserve(all.size());
  for (int r = 0; r < world; ++r)
    for (int i = 0; i < counts[static_cast<size_t>(r)]; ++i) {
      const TraceRecord& x = all[static_cast<size_t>(displs[static_cast<size_t>(r)] + i)];
      ir::Node node = plan.graph.node(x.node);
      // A point-to-point node lists one peer per device: name this rank's.
      for (size_t d = 0; d < node.devices.size() && !node.peers.empty(); ++d)
        if (node.devices[d] == r) node.peers = {node.peers[d]};
      trace::Event e;
      e.rank = r;
      e.lane = node.stream == ir::Stream::STREAM_COMPUTE ? trace::Lane::LANE_COMPUTE : trace::Lane::LANE_COMM;
      e.kind = ir::node_kind_name(node.kind);
      e.name = ir::describe(node, unit_names);
      e.node = x.node;
      e.step = x.step;
      e.microbatch = node.tags.microbatch;
      e.stage = node.tags.stage;
      e.unit = node.tags.unit;
      e.start_us = x.start_us;
      e.end_us = x.end_us;
      e.bytes = node.stream == ir::Stream::STREAM_COMM ? node.bytes : 0;
      t.events.push_back(std::move(e));
    }
  return t;
}

int64_t trace_step_count(const trace::Trace& t) {
  std::set<int> steps;
  for (const auto& e : t.events) steps.insert(e.step);
  return static_cast<int64_t>(steps.size());
}

void write_trace(const TraceRecorder& rec, const ir::Plan& plan, const std::string& config_source,
                 const std::string& path, int rank, int world) {
  trace::Trace t = gather_trace(rec, plan, rank, world);
  if (rank != 0) return;
  t.title = "measured: " + config_source + " (" + std::to_string(world) + " ranks)";
  try {
    trace::write_chrome(t, path);
  } catch (const std::runtime_error& e) {
    throw UserError(std::string("--trace: ") + e.what());
  }
  std::printf("trace: wrote %zu events of %lld steps to %s\n", t.events.size(),
              static_cast<long long>(trace_step_count(t)), path.c_str());
  std::fflush(stdout);
}

}  // namespace piper::runtime
