// svg.hpp — schedule pictures: one training step of a Trace drawn as an SVG
// timeline in the style of the pipeline papers' figures (one row per rank,
// one box per pass, microbatch numbers inside, idle time blank), plus the
// small SVG helpers the metrics plots share. Self-contained SVG: no external
// fonts, stylesheets or scripts.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "trace/trace.hpp"

namespace piper::trace {

struct SvgOptions {
  int step = -1;               // the step to draw; -1: the last step present in the trace
  int width_px = 1200;         // width of the whole picture
  bool comm_lane = true;       // draw the thinner communication lane under each rank's compute lane
  bool abstract_time = false;  // costs are abstract (a simulator's F = 1): the axis reads the
                               // start_us/end_us values as "time units", not microseconds
  std::vector<std::string> row_labels;  // one per rank row; empty: "rank 0", "rank 1", ...
};

// Two traces on one time axis, for laying a predicted step beside a measured
// one: step `step_a` of `a` (-1: its last) and step `step_b` of `b`, each
// moved to start at 0, b's ranks below a's. Rows are labelled with each
// title's first word ("measured", "simulated") and the rank. The result's
// events are all step 0. Throws TraceError when a step is missing.
Trace stack(const Trace& a, int step_a, const Trace& b, int step_b, std::vector<std::string>& row_labels);

// The picture of step o.step of `t`: time runs across from the step's earliest
// event, ranks down. Throws TraceError when the trace has no events or lacks
// the step (the message lists the steps it has).
std::string schedule_svg(const Trace& t, const SvgOptions& o = {});

// The fill colour ("#rrggbb") of an event of `kind` on a rank's `chunk`-th
// model chunk (0: its first stage; 1 and up: lighter tints of the same hue).
// Forward blue, input backward green, weight backward purple, fused backward
// teal, optimiser amber, point-to-point red, collectives brown, wait grey.
std::string kind_colour(std::string_view kind, int chunk = 0);

// ---- helpers shared with plot.cpp ----------------------------------------------

// `s` with & < > " ' replaced by XML entities.
std::string xml_escape(std::string_view s);
// About `target` round tick values (1, 2 or 5 times a power of ten) covering
// [lo, hi]: the first tick <= lo, the last >= hi. lo == hi gives a unit range.
std::vector<double> nice_ticks(double lo, double hi, int target = 8);
// A tick label with as many decimals as `step` needs; with `si`, thousands as
// "12k" and millions as "3.4M".
std::string tick_label(double v, double step, bool si = false);
// `s` cut to at most `max_bytes` bytes (on a UTF-8 character boundary) with
// "..." at the end when it was longer: titles that fit the picture.
std::string fit_text(const std::string& s, size_t max_bytes);
// A number for an SVG attribute: fixed point, at most two decimals.
std::string svg_num(double v);

}  // namespace piper::trace
