// tune.cpp — `piper tune`: the search of src/tune on a cost model, its
// progress line, the tuned config and its summary (docs/tuner.md).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "config/config.hpp"
#include "ir/model_graph.hpp"
#include "ir/validate.hpp"
#include "sim/cost_model.hpp"
#include "sim/hardware.hpp"
#include "tune/tune.hpp"

namespace piper::cli {

namespace {

sim::CostModel cost_for(const TuneArgs& a, const config::Config& cfg, double* memory_bytes) {
  if (a.cost.empty() == a.hardware.empty())
    throw config::ConfigError("tune: give one of --cost FILE (from `piper calibrate CONFIG -o FILE`) or --hardware "
                              "NAME (an analytic model; `piper simulate --hardware help` lists them)");
  return tune::cost_model(cfg, a.world, a.cost, a.hardware, memory_bytes);
}

nlohmann::json result_json(const tune::Evaluated& e) {
  const tune::Degrees& d = e.degrees;
  return {{"label", e.label},
          {"tp", d.tp}, {"pp", d.pp}, {"dp", d.dp}, {"ep", d.ep}, {"zero", d.zero},
          {"microbatches", d.microbatches}, {"virtual_stages", d.virtual_stages},
          {"schedule", ir::schedule_name(d.schedule)}, {"pairs", d.pairs},
          {"recompute", ir::recompute_name(d.recompute)},
          {"stage_of_unit", e.strategy.place.stage_of_unit},
          {"custom_order", !e.strategy.order.custom.empty()},
          {"step_ms", e.step_ms}, {"bubble", e.bubble}, {"exposed_comm_ms", e.exposed_comm_ms},
          {"peak_mem_bytes", e.peak_mem_bytes}, {"lower_bound_ms", e.lower_bound_ms}};
}

// The progress line on stderr, rewritten in place at most every half second.
class ProgressLine {
 public:
  void operator()(const tune::Progress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (p.phase != "done" && shown_ && now - last_ < std::chrono::milliseconds(500)) return;
    last_ = now, shown_ = true;
    char b[400];
    std::snprintf(b, sizeof b, "piper tune: %-10s %d/%d degree sets, %d simulations, %.1f s", p.phase.c_str(),
                  p.candidates_done, p.candidates, p.simulations, p.elapsed_s);
    std::string line = b;
    if (!p.best.empty()) {
      std::snprintf(b, sizeof b, ", best %.2f ms (%s)", p.best_ms, p.best.c_str());
      line += b;
    }
    std::fprintf(stderr, "%s%s", tty_ ? "\r\033[K" : "", line.c_str());
    std::fputs(tty_ && p.phase != "done" ? "" : "\n", stderr);
    std::fflush(stderr);
  }

 private:
  bool tty_ = isatty(2) != 0;
  bool shown_ = false;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace

int run_tune(const TuneArgs& a) {
  config::Config cfg = config::load(a.config, a.sets);
  if (!a.cost.empty() && a.mem_gib <= 0)
    throw config::ConfigError("tune: no memory limit: a cost file does not say how much memory a rank has; give "
                              "--mem-gib X (per rank)");
  tune::Request req;
  double memory = 0;
  req.cost = cost_for(a, cfg, &memory);
  if (a.mem_gib > 0) memory = a.mem_gib * double{1 << 30};
  req.cfg = cfg;
  req.world = a.world;
  req.mem_limit_bytes = memory;
  req.time_budget_s = a.time_budget_s;
  req.ranks_per_host = a.ranks_per_host;
  ProgressLine line;
  if (!a.quiet) req.progress = [&line](const tune::Progress& p) { line(p); };
  const tune::Result r = tune::tune(req);
  write_file(a.output, tune::tuned_config_yaml(cfg, req, r));
  const std::string explained = a.explain ? tune::explain(cfg, req, r.chosen) : std::string();
  if (a.json) {
    nlohmann::json base = nlohmann::json::object();
    for (int b = 0; b < tune::kBaselines; ++b) {
      const auto& e = r.baselines[static_cast<size_t>(b)];
      base[tune::baseline_name(static_cast<tune::Baseline>(b))] = e ? result_json(*e) : nlohmann::json(nullptr);
    }
    nlohmann::json j = {{"config", a.config}, {"world", a.world}, {"cost_source", req.cost.source},
                        {"mem_limit_bytes", memory}, {"search_s", r.search_s}, {"simulations", r.simulations},
                        {"candidates", r.candidates}, {"budget_hit", r.budget_hit}, {"output", a.output},
                        {"chosen", result_json(r.chosen)}, {"baselines", base}};
    if (a.explain) j["explain"] = explained;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("piper tune: wrote %s (%d degree sets, %d simulations in %.1f s%s)\n", a.output.c_str(), r.candidates,
              r.simulations, r.search_s, r.budget_hit ? ", ended by the time budget" : "");
  std::printf("chosen: %s\n  step %.2f ms, bubble %.1f%%, exposed comm %.2f ms, peak %s per rank, "
              "lower bound %.2f ms\n",
              r.chosen.label.c_str(), r.chosen.step_ms, 100 * r.chosen.bubble, r.chosen.exposed_comm_ms,
              tune::bytes_text(r.chosen.peak_mem_bytes).c_str(), r.chosen.lower_bound_ms);
  for (int b = 0; b < tune::kBaselines; ++b) {
    const auto& e = r.baselines[static_cast<size_t>(b)];
    if (!e) {
      std::printf("  %-11s nothing fits\n", tune::baseline_name(static_cast<tune::Baseline>(b)));
      continue;
    }
    std::printf("  %-11s %.2f ms (%s): %.3fx\n", tune::baseline_name(static_cast<tune::Baseline>(b)), e->step_ms,
                e->label.c_str(), e->step_ms / r.chosen.step_ms);
  }
  if (a.explain) std::fputs(explained.c_str(), stdout);
  return 0;
}

}  // namespace piper::cli
