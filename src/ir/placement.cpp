// placement.cpp — stage filters resolved over the model's units, and the stage-sequence rule.
#include "ir/placement.hpp"

#include <algorithm>
#include <limits>

namespace piper::ir {

std::string unit_description(const UnitSpec& unit) {
  if (unit.block < 0) return unit.name;
  return unit.name + " (block " + std::to_string(unit.block) + ", '" + std::string(1, unit_symbol(unit.kind)) + "')";
}

bool selects(const config::StageFilter& f, const UnitSpec& unit) {
  const bool embed = unit.kind == UnitKind::UNIT_EMBED, head = unit.kind == UnitKind::UNIT_HEAD;
  if (!f.blocks.empty()) {
    if (embed || head) return false;
    bool in = false;
    for (auto [lo, hi] : f.blocks) in |= unit.block >= lo && unit.block <= hi;
    if (!in) return false;
  }
  if (!f.kinds.empty()) {
    const std::string kind = embed ? "embed" : head ? "head" : std::string(1, unit_symbol(unit.kind));
    if (std::find(f.kinds.begin(), f.kinds.end(), kind) == f.kinds.end()) return false;
  }
  return true;
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

std::vector<int64_t> resolve_stages(const ModelGraph& model, const std::vector<config::StageFilter>& stages,
                                    const std::string& base, const config::Positions& at,
                                    std::vector<std::string>& errors) {
  const size_t n_units = model.units.size(), before = errors.size();
  const int64_t n_blocks = static_cast<int64_t>(n_units) - 2;
  const int64_t n_stages = static_cast<int64_t>(stages.size());
  std::string pattern;
  for (const UnitSpec& u : model.units)
    if (u.block >= 0) pattern += unit_symbol(u.kind);
  std::vector<int64_t> st(n_units, -1);
  for (size_t j = 0; j < stages.size(); ++j) {
    const std::string path = base + "[" + std::to_string(j) + "]";
    bool range_ok = true;
    for (auto [lo, hi] : stages[j].blocks)
      if (hi >= n_blocks) {
        errors.push_back(at.at(path) + ": block " + std::to_string(hi) + " does not exist; the pattern \"" + pattern +
                         "\" has blocks 0.." + std::to_string(n_blocks - 1));
        range_ok = false;
        break;
      }
    size_t count = 0;
    for (size_t u = 0; u < n_units; ++u) {
      if (!selects(stages[j], model.units[u])) continue;
      ++count;
      if (st[u] >= 0) {
        errors.push_back(at.at(path) + ": unit " + unit_description(model.units[u]) + " is already on stage " +
                         std::to_string(st[u]) + " (" + at.at(base + "[" + std::to_string(st[u]) + "]") +
                         "); a unit belongs to one stage");
        continue;
      }
      st[u] = static_cast<int64_t>(j);
    }
    if (count == 0 && range_ok)
      errors.push_back(at.at(path) + ": stage " + std::to_string(j) + " selects no unit of the pattern \"" + pattern +
                       "\"");
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
    const bool named = s >= 0 && s < n_stages && selects(stages[static_cast<size_t>(s)], unit);
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

}  // namespace piper::ir
