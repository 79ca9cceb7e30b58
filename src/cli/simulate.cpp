// simulate.cpp — `piper simulate`: the plan played on a cost model.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "config/config.hpp"
#include "ir/compile.hpp"
#include "ir/validate.hpp"
#include "sim/cost_model.hpp"
#include "sim/hardware.hpp"
#include "sim/simulator.hpp"
#include "trace/svg.hpp"
#include "trace/trace.hpp"

namespace piper::cli {

namespace {

std::string mib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", bytes / (1 << 20));
  return b;
}

sim::CostModel cost_for(const SimulateArgs& a, const config::Config& cfg, int world) {
  if (!a.cost.empty() && !a.hardware.empty())
    throw config::ConfigError("simulate: give --cost FILE or --hardware NAME, not both");
  if (!a.cost.empty()) {
    try {
      return sim::load_cost(a.cost);
    } catch (const std::invalid_argument& e) {
      throw config::ConfigError(e.what());
    }
  }
  if (!a.hardware.empty()) {
    try {
      const sim::Hardware hw = sim::resolve_hardware(a.hardware);
      const ir::Strategy s = ir::expand(cfg, world);
      const sim::CostCoverage covers = sim::coverage_of(s.dims());
      return sim::analytic_cost(cfg.model, cfg.train.seq_len, static_cast<int>(s.compute_elem_bytes), hw, covers.tps,
                                covers.group_sizes);
    } catch (const std::invalid_argument& e) {
      throw config::ConfigError(std::string("simulate: ") + e.what());
    }
  }
  throw config::ConfigError(
      "simulate: no cost model; give --cost FILE (from `piper calibrate CONFIG -o FILE`, or written by hand, "
      "docs/calibration.md) or --hardware NAME (an analytic model, docs/hardware.md)");
}

// The world size and instruction count the simulator plays in bounded time and memory
// (sim::kMaxWorld, sim::kMaxInstructions; docs/simulator.md, "Limits").
const char* kLimitsWhy =
    "docs/simulator.md, \"Limits\": lowering every rank's program reads the whole training DAG, so time grows as "
    "ranks x instructions";

void check_world(const SimulateArgs& a, const config::Config& cfg) {
  const auto& p = cfg.parallel;
  const std::string range = "allowed: 1 to " + std::to_string(sim::kMaxWorld) + " ranks; " + kLimitsWhy;
  if (a.world > sim::kMaxWorld || a.world < 0)
    throw config::ConfigError("simulate: --world " + std::to_string(a.world) + " is outside what the simulator plays (" +
                              range + ")");
  // Without --world, the config's own grid (each factor at most 2^16, so the product fits in a double exactly).
  const double grid = static_cast<double>(p.tp) * static_cast<double>(p.dp) * static_cast<double>(p.pp);
  if (a.world == 0 && grid > sim::kMaxWorld)
    throw config::ConfigError(a.config + ": parallel.dp x parallel.tp x parallel.pp = " + std::to_string(p.dp) + " x " +
                              std::to_string(p.tp) + " x " + std::to_string(p.pp) + " = " +
                              std::to_string(static_cast<long long>(grid)) +
                              " ranks is above what the simulator plays (" + range +
                              "); simulate a smaller strategy, e.g. fewer data-parallel replicas");
}

[[noreturn]] void too_many_instructions(int world, double count, bool at_least) {
  throw config::ConfigError(
      "simulate: --world " + std::to_string(world) + " with this config plays " + (at_least ? "at least " : "") +
      std::to_string(static_cast<long long>(count)) + " instructions over all ranks" +
      (at_least ? " (ranks per pipeline stage x units x microbatches x 2 passes)" : "") +
      ", above the simulator's limit of " + std::to_string(sim::kMaxInstructions) + " (" + kLimitsWhy +
      "); use fewer ranks (--world, parallel.dp, parallel.tp), microbatches (parallel.microbatches) or blocks "
      "(model.pattern)");
}

// Before compiling: every unit runs a forward and a backward for every microbatch on each of the
// ranks of its pipeline stage (world / pp of them), so this many instructions at least.
void check_instructions_before(const config::Config& cfg, int world) {
  const ir::Strategy s = ir::expand(cfg, world);
  const double units = static_cast<double>(cfg.model.n_blocks() + 2);
  const double at_least = static_cast<double>(world / std::max(1, s.place.pp)) * units *
                          static_cast<double>(s.split.microbatches) * 2;
  if (at_least > static_cast<double>(sim::kMaxInstructions)) too_many_instructions(world, at_least, true);
}

}  // namespace

int run_simulate(const SimulateArgs& a) {
  if (a.hardware == "help") {
    std::fputs(sim::hardware_help().c_str(), stdout);
    return 0;
  }
  config::Config cfg = config::load(a.config, a.sets);
  const auto& p = cfg.parallel;
  check_world(a, cfg);
  const int world = a.world > 0 ? a.world : static_cast<int>(p.tp * p.dp * p.pp);
  ir::validate(cfg, world);
  check_instructions_before(cfg, world);
  const sim::CostModel cost = cost_for(a, cfg, world);
  const auto t0 = std::chrono::steady_clock::now();
  const ir::Plan plan = ir::compile(cfg, world);
  if (const int64_t n = sim::instructions(plan); n > sim::kMaxInstructions)
    too_many_instructions(world, static_cast<double>(n), false);
  sim::SimOptions opts;
  opts.timeline = !a.svg.empty() || !a.trace.empty();
  opts.ranks_per_host = a.ranks_per_host;
  opts.title = "simulated: " + a.config + " (" + std::to_string(world) + " ranks, " + cost.source + " costs)";
  sim::SimResult r;
  try {
    r = sim::simulate(plan, cfg, cost, opts);
  } catch (const std::out_of_range& e) {
    throw config::ConfigError(std::string("simulate: ") + e.what());
  } catch (const sim::SimError& e) {
    throw config::ConfigError(std::string("simulate: ") + e.what());
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!a.trace.empty()) trace::write_chrome(r.trace, a.trace);
  if (!a.svg.empty()) {
    trace::SvgOptions so;
    write_file(a.svg, trace::schedule_svg(r.trace, so));
  }
  if (a.json) {
    nlohmann::json ranks = nlohmann::json::array();
    for (const auto& rr : r.ranks) {
      nlohmann::json mem;
      for (int c = 0; c < sim::kMemCount; ++c) mem[sim::mem_name(static_cast<sim::Mem>(c))] = rr.peak[static_cast<size_t>(c)];
      ranks.push_back({{"rank", rr.rank},
                       {"finish_ms", rr.finish_ms},
                       {"compute_ms", rr.compute_ms},
                       {"comm_ms", rr.comm_ms},
                       {"bubble_ms", rr.bubble_ms},
                       {"peak_mem_bytes", rr.peak_total},
                       {"mem_bytes", mem},
                       {"peak_microbatches", rr.peak_microbatches}});
    }
    const nlohmann::json j = {{"step_ms", r.step_ms}, {"bubble", r.bubble}, {"world", world},
                              {"cost_source", cost.source}, {"simulated_in_s", took}, {"nodes", r.nodes},
                              {"ranks", ranks}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("piper simulate: %s on %d rank%s, %s costs (%s)\n", a.config.c_str(), world, world == 1 ? "" : "s",
              cost.source.c_str(), cost.hardware.c_str());
  std::printf("step %.2f ms, bubble %.1f%%, %lld instructions simulated in %.2f s\n", r.step_ms, 100 * r.bubble,
              static_cast<long long>(r.nodes), took);
  std::printf("%6s %10s %10s %10s %10s  %10s %8s %8s %8s %8s %8s %4s\n", "rank", "finish ms", "compute", "comm",
              "bubble", "peak MiB", "params", "grads", "optim", "acts", "buffers", "mbs");
  const size_t shown = std::min<size_t>(r.ranks.size(), 64);
  for (size_t i = 0; i < shown; ++i) {
    const auto& rr = r.ranks[i];
    std::printf("%6d %10.2f %10.2f %10.2f %10.2f  %10s %8s %8s %8s %8s %8s %4d\n", rr.rank, rr.finish_ms, rr.compute_ms,
                rr.comm_ms, rr.bubble_ms, mib(rr.peak_total).c_str(), mib(rr.peak[0]).c_str(), mib(rr.peak[1]).c_str(),
                mib(rr.peak[2]).c_str(), mib(rr.peak[3]).c_str(), mib(rr.peak[4]).c_str(), rr.peak_microbatches);
  }
  if (shown < r.ranks.size()) std::printf("  ... %zu more ranks (--json prints all)\n", r.ranks.size() - shown);
  return 0;
}

}  // namespace piper::cli
