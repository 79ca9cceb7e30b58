// plan_switch.cpp — `piper plan-switch`: the plan of an online strategy switch between two configs
// of one model, and its predicted time on the analytic hardware model (docs/switching.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "config/config.hpp"
#include "ir/compile.hpp"
#include "ir/validate.hpp"
#include "sim/hardware.hpp"
#include "sim/switch_cost.hpp"
#include "state/layout.hpp"
#include "state/switch_plan.hpp"

namespace piper::cli {

namespace {

// "key: value" of each key of the model section as config::to_yaml writes it.
std::vector<std::pair<std::string, std::string>> model_keys(const config::Config& c) {
  std::vector<std::pair<std::string, std::string>> keys;
  std::istringstream in(config::to_yaml(c));
  bool in_model = false;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != ' ') in_model = line == "model:";
    if (!in_model || line.rfind("  ", 0) != 0) continue;
    const size_t colon = line.find(':');
    std::string value = line.substr(colon + 1);
    value = value.substr(0, value.find("  #"));
    value.erase(0, value.find_first_not_of(' '));
    value.erase(value.find_last_not_of(' ') + 1);
    keys.emplace_back(line.substr(2, colon - 2), value);
  }
  return keys;
}

// "FROM (run.yaml, at run.yaml:3:3)", "TO (run.yaml, from --set)", "TO (run.yaml, default)".
std::string where(const char* side, const std::string& path, const config::Config& c, const std::string& key) {
  auto it = c.locations.find(key);
  const std::string at = it == c.locations.end() ? "default" : it->second == "--set" ? "from --set" : "at " + it->second;
  return std::string(side) + " (" + path + ", " + at + ")";
}

// A switch moves one model's state: refuses two configs whose model sections differ, naming the key.
void check_same_model(const PlanSwitchArgs& a, const config::Config& from, const config::Config& to) {
  if (from.model == to.model) return;
  const auto kf = model_keys(from), kt = model_keys(to);
  for (size_t i = 0; i < kf.size() && i < kt.size(); ++i)
    if (kf[i].second != kt[i].second) {
      const std::string key = "model." + kf[i].first;
      throw config::ConfigError("plan-switch: the two configs describe different models: " + key + " is " +
                                kf[i].second + " in " + where("FROM", a.from, from, key) + " and " + kt[i].second +
                                " in " + where("TO", a.to, to, key) +
                                "; a switch moves the state of one model between strategies: give both configs the "
                                "same model section");
    }
  throw config::ConfigError("plan-switch: " + a.from + " and " + a.to +
                            " describe different models; give both configs the same model section");
}

// "tp8 pp8 dp8 zero1" (+ " ep2"; the ZeRO stages of the units, "zero1/3", where they differ).
std::string strategy_label(const ir::Plan& plan) {
  const ir::ParallelDims& d = plan.strategy.dims();
  std::string s = "tp" + std::to_string(d.degree(ir::Axis::TP)) + " pp" + std::to_string(d.degree(ir::Axis::PP)) +
                  " dp" + std::to_string(d.degree(ir::Axis::DP));
  if (d.degree(ir::Axis::EP) > 1) s += " ep" + std::to_string(d.degree(ir::Axis::EP));
  const std::set<int> zeros(plan.strategy.replicate.zero_of_unit.begin(), plan.strategy.replicate.zero_of_unit.end());
  std::string z;
  for (int v : zeros) z += (z.empty() ? "" : "/") + std::to_string(v);
  return s + " zero" + z;
}

struct Side {
  config::Config cfg;
  ir::Plan plan;
  std::string label;
};

Side load_side(const char* side, const std::string& path, const std::vector<std::string>& sets, int world) {
  Side s;
  s.cfg = config::load(path, sets);
  try {
    ir::validate(s.cfg, world);
  } catch (const config::ConfigError& e) {
    throw config::ConfigError(std::string("plan-switch: ") + side + " (" + path + ") at --world-" +
                              (side[0] == 'F' ? "from " : "to ") + std::to_string(world) + ": " + e.what());
  }
  s.plan = ir::compile(s.cfg, world);
  s.label = strategy_label(s.plan);
  return s;
}

std::vector<int> first_processes(int n) {
  std::vector<int> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[static_cast<size_t>(i)] = i;
  return p;
}

int64_t max_of(const std::vector<int64_t>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

constexpr double kMiB = 1024.0 * 1024.0;

// "512 B", "1.5 KiB", "12.34 GiB".
std::string bytes_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  size_t u = 0;
  while (bytes >= 1024 && u + 1 < std::size(units)) bytes /= 1024, ++u;
  char b[48];
  std::snprintf(b, sizeof b, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return b;
}

}  // namespace

int run_plan_switch(const PlanSwitchArgs& a) {
  if (a.hardware == "help") {
    std::fputs(sim::hardware_help().c_str(), stdout);
    return 0;
  }
  if (a.hardware.empty())
    throw config::ConfigError("plan-switch: no hardware to price the switch on; give --hardware NAME (a table name, "
                              "--hardware help lists them) or a hardware JSON file (docs/hardware.md)");
  sim::Hardware hw;
  try {
    hw = sim::resolve_hardware(a.hardware);
  } catch (const std::invalid_argument& e) {
    throw config::ConfigError(std::string("plan-switch: ") + e.what());
  }
  const int per_host = a.ranks_per_host > 0 ? a.ranks_per_host : hw.devices_per_node;
  const Side from = load_side("FROM", a.from, a.sets_from, a.world_from);
  const Side to = load_side("TO", a.to, a.sets_to, a.world_to);
  check_same_model(a, from.cfg, to.cfg);
  const int64_t chunk = state::chunk_elems(static_cast<int64_t>(a.buffer_mb * kMiB));

  const auto t0 = std::chrono::steady_clock::now();
  const state::SwitchPlan plan =
      state::plan_switch(from.plan.model, state::layout_params(from.plan), first_processes(a.world_from),
                         state::layout_params(to.plan), first_processes(a.world_to), chunk);
  const double planning_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const sim::SwitchTime time = sim::switch_time(plan, hw, per_host);

  int64_t above = 0;
  for (size_t p = 0; p < plan.peak.size(); ++p) above = std::max(above, plan.peak[p] - std::max(plan.before[p], plan.after[p]));
  const double b = static_cast<double>(state::kStateElemBytes);
  if (a.json) {
    const auto side = [&](const std::string& path, int world, const Side& s, const std::vector<int64_t>& held) {
      return nlohmann::json{{"config", path}, {"world", world}, {"strategy", s.label},
                            {"state_bytes_max", static_cast<double>(max_of(held)) * b}};
    };
    const nlohmann::json j = {
        {"from", side(a.from, a.world_from, from, plan.before)},
        {"to", side(a.to, a.world_to, to, plan.after)},
        {"processes", plan.processes},
        {"hardware", hw.name},
        {"ranks_per_host", per_host},
        {"chunk_bytes", static_cast<double>(chunk) * b},
        {"bytes_moved", plan.bytes_moved()},
        {"bytes_local", plan.bytes_local()},
        {"blocks", plan.steps.size()},
        {"rounds", time.rounds},
        {"messages", plan.messages()},
        {"peak_bytes_max", static_cast<double>(max_of(plan.peak)) * b},
        {"peak_above_bytes_max", static_cast<double>(above) * b},
        {"predicted_s", time.seconds()},
        {"network_s", time.network_s},
        {"local_s", time.local_s},
        {"planning_s", planning_s},
    };
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("piper plan-switch: %s (%d ranks, %s) -> %s (%d ranks, %s)\n", a.from.c_str(), a.world_from,
              from.label.c_str(), a.to.c_str(), a.world_to, to.label.c_str());
  std::printf("%d processes (the first %d in both layouts), %s, %d ranks per host\n", plan.processes,
              std::min(a.world_from, a.world_to), hw.name.c_str(), per_host);
  const auto text = [b](int64_t elems) { return bytes_text(static_cast<double>(elems) * b); };
  std::printf("state per rank (max): %s before, %s after; peak %s, %s above max(before, after)\n",
              text(max_of(plan.before)).c_str(), text(max_of(plan.after)).c_str(), text(max_of(plan.peak)).c_str(),
              text(above).c_str());
  std::printf("moved %s over the network, %s copied locally\n",
              bytes_text(static_cast<double>(plan.bytes_moved())).c_str(),
              bytes_text(static_cast<double>(plan.bytes_local())).c_str());
  std::printf("%zu blocks, %zu rounds, %zu messages of at most %s\n", plan.steps.size(), time.rounds,
              plan.messages(), text(chunk).c_str());
  std::printf("predicted switch %.4f s: network %.4f s, local copies %.4f s; planned in %.2f s\n", time.seconds(),
              time.network_s, time.local_s, planning_s);
  return 0;
}

}  // namespace piper::cli
