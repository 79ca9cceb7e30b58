// report.cpp — what `piper tune` writes: the tuned config with its header, and
// the cost breakdown of --explain (docs/tuner.md).
#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "ir/compile.hpp"
#include "ir/work.hpp"
#include "tune/tune.hpp"

namespace piper::tune {

namespace {

std::string fmt(const char* f, double a) {
  char b[64];
  std::snprintf(b, sizeof b, f, a);
  return b;
}

std::string summary(const Evaluated& e) {
  return "step " + fmt("%.2f", e.step_ms) + " ms, bubble " + fmt("%.1f", 100 * e.bubble) + "%, exposed comm " +
         fmt("%.2f", e.exposed_comm_ms) + " ms, peak " + bytes_text(e.peak_mem_bytes) + " per rank";
}

// Each line of `text` as a comment.
std::string commented(const std::string& text) {
  std::istringstream in(text);
  std::string out, line;
  while (std::getline(in, line)) out += "#" + (line.empty() ? "" : " " + line) + "\n";
  return out;
}

}  // namespace

std::string tuned_config_yaml(const config::Config& cfg, const Request& req, const Result& r) {
  const Evaluated& c = r.chosen;
  std::ostringstream h;
  h << "piper tune: " << cfg.source << " on " << req.world << " ranks, " << req.cost.source << " costs ("
    << req.cost.hardware << "), memory limit " << bytes_text(req.mem_limit_bytes) << " per rank\n";
  h << "chosen: " << c.label << "\n";
  h << "  predicted " << summary(c) << "\n";
  h << "  lower bound " << fmt("%.2f", c.lower_bound_ms) << " ms (the step's compute spread evenly over the ranks): "
    << fmt("%.3f", c.step_ms / c.lower_bound_ms) << "x of it\n";
  h << "baselines (pipelines of equal blocks per stage, and no pipeline; each at its best degrees under the same "
       "limit):\n";
  for (int b = 0; b < kBaselines; ++b) {
    const auto& e = r.baselines[static_cast<size_t>(b)];
    h << "  " << baseline_name(static_cast<Baseline>(b)) << ": ";
    if (!e) {
      h << "nothing fits\n";
      continue;
    }
    h << e->label << "\n    " << summary(*e) << "; the chosen strategy is " << fmt("%.3f", e->step_ms / c.step_ms)
      << "x faster\n";
  }
  h << "search: " << r.candidates << " degree sets, " << r.simulations << " simulations"
    << (r.budget_hit ? ", ended by the time budget (--time-budget-s)" : ", every bound reached") << "\n";
  h << "run it: mpirun -n " << req.world << " piper train THIS_FILE";
  std::string out = commented(h.str());
  out += config::to_yaml(degrees_config(cfg, c.degrees));
  out += ir::directives_yaml(c.strategy, ir::make_model_graph(cfg.model));
  return out;
}

std::string explain(const config::Config& cfg, const Request& req, const Evaluated& e) {
  const Degrees& d = e.degrees;
  const ir::Plan plan = ir::compile(cfg.model, e.strategy);
  const int64_t rows = cfg.train.global_batch / (d.dp * d.microbatches) * cfg.train.seq_len;
  std::ostringstream o;
  o << "cost breakdown of " << e.label << " (" << req.world << " ranks)\n";
  // FLOPs per unit kind over the whole job's step: every microbatch of every replica, every tp rank.
  std::map<char, std::pair<int, double>> flops;  // kind -> units, FLOPs
  double total = 0;
  for (const ir::UnitSpec& u : plan.model.units) {
    const char k = ir::unit_symbol(u.kind);
    double f = 0;
    for (ir::Pass p : {ir::Pass::PASS_F, ir::Pass::PASS_B})
      f += ir::unit_work(cfg.model, k, p, rows, cfg.train.seq_len, d.tp).flops();
    const ir::Recompute rec = e.strategy.recompute_of(u.index);
    if (rec != ir::Recompute::RECOMPUTE_NONE)
      f += ir::recompute_share(cfg.model, k, rec, rows, cfg.train.seq_len, d.tp).time *
           ir::unit_work(cfg.model, k, ir::Pass::PASS_F, rows, cfg.train.seq_len, d.tp).flops();
    f *= static_cast<double>(d.tp) * d.dp * d.microbatches;
    flops[k].first += 1, flops[k].second += f;
    total += f;
  }
  o << "FLOPs per step, by unit kind (forward, backward and recomputation; all ranks):\n";
  for (const auto& [k, v] : flops)
    o << "  " << k << "  " << v.first << " unit(s)  " << fmt("%10.4g", v.second) << " FLOPs  "
      << fmt("%5.1f", 100 * v.second / total) << "%\n";
  o << "  total " << fmt("%.4g", total) << " FLOPs\n";
  // Bytes each rank sends or contributes per step, by the group they move over.
  const ir::Degrees n = e.strategy.dims().degrees();
  std::map<std::string, double> volume;
  for (const ir::Node& nd : plan.graph.nodes()) {
    if (nd.kind == ir::NodeKind::RECV || ir::is_compute(nd.kind)) continue;
    double bytes = static_cast<double>(nd.bytes);
    if (!nd.units.empty()) {
      bytes = 0;
      for (int u : nd.units)
        for (const ir::FlatPart& p : ir::flat_parts(plan.model.units[static_cast<size_t>(u)], n, {}))
          bytes += 4.0 * static_cast<double>(p.zero.padded);
    }
    const std::string g = nd.kind == ir::NodeKind::SEND ? "pp (send/recv)" : ir::group_name(nd.group);
    volume[g] += bytes * static_cast<double>(nd.devices.size()) / req.world;
  }
  o << "communication per rank and step, by group (bytes each rank contributes, averaged over ranks):\n";
  for (const auto& [g, b] : volume) o << "  " << g << "  " << fmt("%.2f", b / (1 << 20)) << " MiB\n";
  // Memory by category on the rank that holds the most.
  sim::SimOptions so;
  so.ranks_per_host = req.ranks_per_host;
  const sim::SimResult r = sim::simulate(plan, degrees_config(cfg, d), req.cost, so);
  const auto top = std::max_element(r.ranks.begin(), r.ranks.end(),
                                    [](const auto& a, const auto& b) { return a.peak_total < b.peak_total; });
  o << "memory on rank " << top->rank << " (the most: " << bytes_text(top->peak_total) << " of "
    << bytes_text(req.mem_limit_bytes) << "), each category's own peak:\n";
  for (int c = 0; c < sim::kMemCount; ++c)
    o << "  " << sim::mem_name(static_cast<sim::Mem>(c)) << "  " << bytes_text(top->peak[static_cast<size_t>(c)]) << "\n";
  return o.str();
}

}  // namespace piper::tune
