// plot.hpp — metrics plots: the per-step JSONL that `piper train --metrics`
// writes (src/runtime/trainer.cpp), read back and drawn as a self-contained
// SVG with two panels, loss over steps (the training loss and, where the run
// evaluated, the held-out loss beside it) and throughput over steps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace piper::trace {

// One line of the metrics file. The trainer writes more keys (grad_norm, lr,
// tokens, peak_mem_bytes, ranks); the plots use these.
struct MetricsRow {
  int64_t step = 0;          // "step", from 0
  double loss = 0;           // "loss"; NaN when the file has null (a diverged step)
  double tokens_per_s = 0;   // "tokens_per_s"; NaN when null
  double step_ms = 0;        // "step_ms"; NaN when absent
  double eval_loss = 0;      // "eval_loss", the held-out loss after the step; NaN when absent (no evaluation) or null
};

// Parses JSONL text (one JSON object per line; blank lines are skipped).
// Every line needs "step" (an integer), "loss" and "tokens_per_s" (numbers or
// null). Throws TraceError "ORIGIN:LINE: what is wrong".
std::vector<MetricsRow> parse_metrics(const std::string& text, const std::string& origin);
// parse_metrics of the file at `path`; throws TraceError naming the path (and
// the line) when it cannot be read, is malformed or holds no steps.
std::vector<MetricsRow> read_metrics(const std::string& path);

struct PlotOptions {
  int width_px = 900;
  std::string title;  // shown above the panels; empty: "training metrics"
};

// Two stacked panels with axes, ticks and labels: loss against step (with
// the held-out loss as a second line through the steps that have one, and a
// legend, when any has), and throughput (tokens/s, with a dashed line at its
// median) against step.
// Throws TraceError when `rows` is empty.
std::string metrics_svg(const std::vector<MetricsRow>& rows, const PlotOptions& o = {});

}  // namespace piper::trace
