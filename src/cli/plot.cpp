// plot.cpp — `piper plot INPUT -o OUT.svg`: a metrics JSONL (piper train
// --metrics) as loss and throughput plots, or a Chrome trace written by piper
// (train --trace, simulate --trace) as the schedule picture of one step.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "cli/commands.hpp"
#include "trace/plot.hpp"
#include "trace/svg.hpp"
#include "trace/trace.hpp"

#include "io/regular_file.hpp"

namespace piper::cli {

namespace {

// A Chrome trace holds a "traceEvents" key; a metrics line never does.
bool looks_like_trace(const std::string& path) {
  std::string text;
  try {
    text = io::read_regular(path, trace::kMaxTraceFileBytes);
  } catch (const io::FileError& e) {
    throw trace::TraceError("cannot read " + path + ": " + e.what());
  }
  return text.find("\"traceEvents\"") != std::string::npos;
}

}  // namespace

void write_file(const std::string& path, const std::string& text) {
  if (const std::string why = io::why_not_regular(path); !why.empty())
    throw trace::TraceError("cannot write " + path + ": " + why);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw trace::TraceError("cannot write " + path);
  f << text;
  f.close();
  if (!f) throw trace::TraceError("writing " + path + " failed (disk full?)");
}

int run_plot(const PlotArgs& a) {
  if (!a.compare.empty() && !looks_like_trace(a.input))
    throw trace::TraceError(a.input + ": --compare lays two traces side by side; this is a metrics file");
  if (looks_like_trace(a.input)) {
    trace::Trace t = trace::read_chrome(a.input);
    trace::SvgOptions o;
    o.step = a.step;
    if (!a.compare.empty()) {
      if (!looks_like_trace(a.compare)) throw trace::TraceError(a.compare + ": not a Chrome trace written by piper");
      t = trace::stack(t, a.step, trace::read_chrome(a.compare), -1, o.row_labels);
      o.step = 0;
    }
    o.comm_lane = !a.no_comm;
    o.abstract_time = a.time_units;
    if (a.width > 0) o.width_px = a.width;
    std::string svg;
    try {
      svg = trace::schedule_svg(t, o);
    } catch (const trace::TraceError& e) {
      throw trace::TraceError(a.input + ": " + e.what());
    }
    write_file(a.output, svg);
    std::printf("piper plot: wrote the schedule of %s (%d ranks, %zu events) to %s\n", a.input.c_str(), t.ranks,
                t.events.size(), a.output.c_str());
    return 0;
  }
  if (a.step >= 0) throw trace::TraceError(a.input + ": --step picks a step of a trace; this is a metrics file");
  const std::vector<trace::MetricsRow> rows = trace::read_metrics(a.input);
  trace::PlotOptions o;
  o.title = a.input;
  if (a.width > 0) o.width_px = a.width;
  write_file(a.output, trace::metrics_svg(rows, o));
  std::printf("piper plot: wrote loss and throughput of %zu steps of %s to %s\n", rows.size(), a.input.c_str(),
              a.output.c_str());
  return 0;
}

}  // namespace piper::cli
