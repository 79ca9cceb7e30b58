// placement.cpp — units balanced over stages, stage filters resolved over the model's units, and
// the stage-sequence rule.
#include "ir/placement.hpp"

#include "ir/filter.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>

namespace piper::ir {

std::string unit_description(const UnitSpec& unit) {
  if (unit.block < 0) return unit.name;
  return unit.name + " (block " + std::to_string(unit.block) + ", '" + std::string(1, unit_symbol(unit.kind)) + "')";
}


namespace {

void check_balance_input(const std::vector<double>& cost_of_unit, int stages) {
  const size_t n = cost_of_unit.size();
  if (stages < 1 || static_cast<size_t>(stages) > n)
    throw std::invalid_argument("ir::balance_stages: " + std::to_string(stages) + " stages for " + std::to_string(n) +
                                " units; expected 1.." + std::to_string(n) + ", each stage holding a unit");
  for (size_t u = 0; u < n; ++u)
    if (const double c = cost_of_unit[u]; !std::isfinite(c) || c < 0) {
      std::ostringstream text;
      text << c;
      throw std::invalid_argument("ir::balance_stages: unit " + std::to_string(u) + " costs " + text.str() +
                                  "; expected a finite cost >= 0");
    }
}

}  // namespace

std::vector<int> balance_stages(const std::vector<double>& cost_of_unit, int stages) {
  check_balance_input(cost_of_unit, stages);
  const size_t n = cost_of_unit.size();
  // run[c][k]: units c..c+k-1, summed from c (equal runs of units sum to equal costs wherever they are).
  std::vector<std::vector<double>> run(n);
  for (size_t c = 0; c < n; ++c) {
    run[c].assign(n - c + 1, 0.0);
    for (size_t k = 1; k <= n - c; ++k) run[c][k] = run[c][k - 1] + cost_of_unit[c + k - 1];
  }
  auto stage_cost = [&](int c, int u) { return run[static_cast<size_t>(c)][static_cast<size_t>(u - c)]; };
  const double most = min_max_partition(static_cast<int>(n), stages, stage_cost).most;
  // Of the partitions no stage of which costs more than that, the fewest units on the largest stage.
  auto stage_units = [&](int c, int u) {
    return stage_cost(c, u) <= most ? static_cast<double>(u - c) : std::numeric_limits<double>::infinity();
  };
  return min_max_partition(static_cast<int>(n), stages, stage_units).stage_of;
}

std::optional<StageProblem> stage_problem(const ModelGraph& model, const std::vector<int64_t>& st, int64_t n_stages) {
  for (size_t u = 0; u < st.size() && u < model.units.size(); ++u) {
    const int64_t s = st[u], prev = u > 0 ? st[u - 1] : 0;
    const std::string name = unit_description(model.units[u]), stage = std::to_string(s);
    const std::string before = u > 0 ? model.units[u - 1].name : std::string();
    std::string err;
    if (s < 0 || s >= n_stages)
      err = "unit " + name + " is on stage " + stage + ", but there are " + std::to_string(n_stages) + " stages (0.." +
            std::to_string(n_stages - 1) + ")";
    else if (u == 0 && s != 0)
      err = "the first unit, embed, is on stage " + stage + ", so stage 0 holds no unit; stages run along the model";
    else if (s < prev)
      err = "unit " + name + " is on stage " + stage + " but comes after " + before + " on stage " +
            std::to_string(prev) + "; stages run along the model, each a contiguous run of units";
    else if (s > prev + 1)
      err = "unit " + name + " is on stage " + stage + " right after " + before + " on stage " +
            std::to_string(prev) + ", so stage " + std::to_string(prev + 1) + " holds no unit";
    else if (u + 1 == st.size() && s != n_stages - 1)
      err = "the last unit, head, is on stage " + stage + ", so stage " + std::to_string(s + 1) +
            (s + 2 < n_stages ? ".." + std::to_string(n_stages - 1) : "") + " holds no unit";
    if (!err.empty()) return StageProblem{static_cast<int>(u), err};
  }
  return std::nullopt;
}

std::vector<int64_t> resolve_stages(const ModelGraph& model, const std::vector<config::Filter>& stages,
                                    const std::string& base, const config::Positions& at,
                                    std::vector<std::string>& errors) {
  const size_t n_units = model.units.size(), before = errors.size();
  const int64_t n_stages = static_cast<int64_t>(stages.size());
  std::vector<int64_t> st(n_units, -1);
  for (size_t j = 0; j < stages.size(); ++j) {
    const std::string path = base + "[" + std::to_string(j) + "]";
    // A stage's filter has no stage key: the units' stages are what it gives.
    if (const std::string problem = filter_problem(stages[j], model, {}, 0); !problem.empty()) {
      errors.push_back(at.at(path) + ": " + problem);
      continue;
    }
    for (int u : selected_units(stages[j], model, {})) {
      if (st[u] >= 0) {
        errors.push_back(at.at(path) + ": unit " + unit_description(model.units[u]) + " is already on stage " +
                         std::to_string(st[u]) + " (" + at.at(base + "[" + std::to_string(st[u]) + "]") +
                         "); a unit belongs to one stage");
        continue;
      }
      st[u] = static_cast<int64_t>(j);
    }
  }
  if (st.front() < 0) st.front() = 0;           // the embedding goes with the first stage
  if (st.back() < 0) st.back() = n_stages - 1;  // the head with the last
  for (size_t u = 0; u < n_units; ++u)
    if (st[u] < 0)
      errors.push_back(at.at(base) + ": unit " + unit_description(model.units[u]) +
                       " is on no stage; every unit must be on exactly one (add it to a stage's blocks)");
  if (errors.size() > before) return {};
  if (const std::optional<StageProblem> problem = stage_problem(model, st, n_stages)) {
    // Point at the filter that put the unit there.
    const int64_t s = st[static_cast<size_t>(problem->unit)];
    const UnitSpec& unit = model.units[static_cast<size_t>(problem->unit)];
    const bool named = s >= 0 && s < n_stages && selects(stages[static_cast<size_t>(s)], unit, -1);
    errors.push_back(at.at(named ? base + "[" + std::to_string(s) + "]" : base) + ": " + problem->message);
    return {};
  }
  return st;
}

std::vector<std::string> placement_problems(const ModelGraph& model, const config::EffectiveStrategy& e) {
  std::vector<std::string> errors;
  if (!e.stage_filters.empty()) {
    resolve_stages(model, e.stage_filters, e.place_path, e.positions, errors);
    return errors;
  }
  if (e.stage_of_unit.empty()) return errors;
  const std::vector<int64_t>& st = e.stage_of_unit;
  const size_t n_units = model.units.size();
  if (st.size() != n_units) {
    errors.push_back(e.positions.at(e.place_path) + ": lists " + std::to_string(st.size()) +
                     " stages, one per unit, but the model has " + std::to_string(n_units) + " units (embed, " +
                     std::to_string(n_units - 2) + " blocks, head)");
    return errors;
  }
  // The stages the list names (a stage beyond every bound is reported by stage_problem, not overflowed).
  const int64_t top = *std::max_element(st.begin(), st.end());
  const int64_t count = top < std::numeric_limits<int64_t>::max() ? top + 1 : top;
  if (const std::optional<StageProblem> problem = stage_problem(model, st, count))
    errors.push_back(e.positions.at(e.place_path) + ": " + problem->message);
  return errors;
}



bool has_inner_activations(UnitKind k) { return k == UnitKind::UNIT_ATTENTION || k == UnitKind::UNIT_MAMBA; }


namespace {

std::string block_pattern(const ModelGraph& model) {
  std::string pattern;
  for (const UnitSpec& u : model.units)
    if (u.block >= 0) pattern += unit_symbol(u.kind);
  return pattern;
}

// A mode name at `where` ("file:line:col: key" of a message), or an error.
std::optional<Recompute> recompute_mode(const std::string& name, const std::string& where,
                                        std::vector<std::string>& errors) {
  const std::vector<std::string>& names = recompute_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (name == names[i]) return static_cast<Recompute>(i);
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  const std::string near = config::closest(name, names);
  errors.push_back(where + ": unknown recompute mode '" + name + "'; expected one of " + list +
                   (near.empty() ? "" : " (did you mean '" + near + "'?)"));
  return std::nullopt;
}

}  // namespace

std::vector<Recompute> resolve_recompute(const ModelGraph& model, const config::EffectiveStrategy& e,
                                         const std::vector<int>& stage_of_unit, std::vector<std::string>& errors) {
  const size_t n_units = model.units.size(), before = errors.size();
  const config::Positions& at = e.positions;
  std::vector<Recompute> out(n_units, Recompute::RECOMPUTE_NONE);
  // A mode over the blocks `chosen` selects: selective only where a mixer has inner activations,
  // and never an MoE block (its forward would dispatch its tokens again).
  auto apply = [&](Recompute mode, const std::vector<size_t>& chosen) {
    for (size_t u : chosen) {
      const UnitKind k = model.units[u].kind;
      out[u] = k == UnitKind::UNIT_MOE || (mode == Recompute::RECOMPUTE_SELECTIVE && !has_inner_activations(k))
                   ? Recompute::RECOMPUTE_NONE
                   : mode;
    }
  };
  std::vector<size_t> blocks;
  for (size_t u = 0; u < n_units; ++u)
    if (model.units[u].block >= 0) blocks.push_back(u);
  if (const auto mode = recompute_mode(e.parallel.recompute, at.head("parallel.recompute"), errors))
    apply(*mode, blocks);
  const int64_t n_blocks = static_cast<int64_t>(blocks.size());
  const int n_stages = stage_of_unit.empty() ? 0 : *std::max_element(stage_of_unit.begin(), stage_of_unit.end()) + 1;
  const std::string pattern = block_pattern(model);
  for (const config::EffectiveStrategy::RecomputeRule& r : e.recompute) {
    const std::optional<Recompute> mode = recompute_mode(r.mode, at.at(r.path + ".mode"), errors);
    bool ok = mode.has_value();
    // The embedding and the head, named by kind or as units.
    for (const UnitSpec& u : model.units) {
      if (u.block >= 0) continue;
      const auto named = [&](const std::vector<std::string>& words, const std::string& w) {
        return std::find(words.begin(), words.end(), w) != words.end();
      };
      const bool by_kind = named(r.filter.kinds, u.name);  // "embed", "head": the kind and the unit name alike
      if (!by_kind && !named(r.filter.units, u.name) && !named(r.filter.units, std::to_string(u.index))) continue;
      errors.push_back(at.at(r.path + (by_kind ? ".kind" : ".unit")) + ": the " +
                       (u.kind == UnitKind::UNIT_EMBED ? "embedding" : "head") +
                       " is never recomputed (its forward saves next to nothing); select blocks: kind M, \"*\" "
                       "or \"-\", or blocks: by index");
      ok = false;
    }
    for (auto [lo, hi] : r.filter.blocks)
      if (hi >= n_blocks) {
        errors.push_back(at.at(r.path + ".blocks") + ": block " + std::to_string(hi) + " does not exist; the pattern \"" +
                         pattern + "\" has blocks 0.." + std::to_string(n_blocks - 1));
        ok = false;
      }
    for (const auto& range : r.filter.stages)
      if (const int64_t st = range.second; st >= n_stages) {
        errors.push_back(at.at(r.path + ".stage") + ": stage " + std::to_string(st) + " does not exist; the placement has " +
                         "stages 0.." + std::to_string(n_stages - 1));
        ok = false;
      }
    if (!ok) continue;
    std::vector<size_t> chosen;
    bool inner = false;
    for (size_t u : blocks)
      if (selects(r.filter, model.units[u], u < stage_of_unit.size() ? stage_of_unit[u] : -1)) {
        chosen.push_back(u);
        inner |= has_inner_activations(model.units[u].kind);
      }
    if (chosen.empty()) {
      errors.push_back(at.at(r.path) + ": selects no block of the pattern \"" + pattern + "\"" +
                       (r.filter.stages.empty() ? "" : " on the stages it names") +
                       "; widen its blocks, kind or stage filter, or drop the directive");
      continue;
    }
    if (*mode == Recompute::RECOMPUTE_SELECTIVE && !inner) {
      errors.push_back(at.at(r.path) + ": selective recomputation drops the inner activations of attention and "
                       "Mamba-2 mixers, and the blocks it selects have none (MLP blocks); use mode: full");
      continue;
    }
    apply(*mode, chosen);
  }
  if (errors.size() > before) return {};
  return out;
}

}  // namespace piper::ir
