// cost.cpp — the cost model a search runs on: a calibrated cost file or a hardware's analytic model.
#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/model_graph.hpp"
#include "sim/hardware.hpp"
#include "tune/tune.hpp"

namespace piper::tune {

namespace {

// The analytic model covering every tp the search may try (those that divide the model's sizes)
// and every group size of the world.
sim::CostModel analytic_for(const config::Config& cfg, int world, const sim::Hardware& hw) {
  std::vector<int> tps, groups;
  const int kept_bytes = config::storage_bytes(config::precision_of(cfg.train));
  for (int tp = 1; tp <= std::min(kMaxTp, world); ++tp) {
    if (world % tp != 0) continue;
    try {
      (void)sim::analytic_cost(cfg.model, cfg.train.seq_len, kept_bytes, hw, {tp}, {});
      tps.push_back(tp);
    } catch (const std::invalid_argument&) {
      // the model's sizes do not split over tp: the search's validation refuses it too
    }
  }
  for (int g = 2; g <= world; ++g)
    if (world % g == 0) groups.push_back(g);
  return sim::analytic_cost(cfg.model, cfg.train.seq_len, kept_bytes, hw, tps, groups);
}

}  // namespace

sim::CostModel cost_model(const config::Config& cfg, int world, const std::string& cost_file,
                          const std::string& hardware, double* memory_bytes) {
  try {
    if (!cost_file.empty()) {
      sim::CostModel c = sim::load_cost(cost_file);
      std::set<char> missing;
      for (const ir::UnitSpec& u : ir::make_model_graph(cfg.model).units) {
        try {
          (void)c.op(ir::unit_symbol(u.kind), 1);
        } catch (const std::out_of_range&) {
          missing.insert(ir::unit_symbol(u.kind));
        }
      }
      if (!missing.empty()) {
        std::string kinds;
        for (char k : missing) kinds += (kinds.empty() ? "'" : ", '") + std::string(1, k) + "'";
        throw TuneError("tune: the cost file " + cost_file + " has no entry for unit kind(s) " + kinds + ", which " +
                        cfg.source + "'s model.pattern \"" + cfg.model.pattern + "\" uses; measure them with `piper "
                        "calibrate " + cfg.source + " -o " + cost_file + "`");
      }
      return c;
    }
    const sim::Hardware hw = sim::resolve_hardware(hardware);
    *memory_bytes = hw.memory_bytes;
    return analytic_for(cfg, world, hw);
  } catch (const std::invalid_argument& e) {
    throw TuneError(std::string("tune: ") + e.what());
  }
}

}  // namespace piper::tune
