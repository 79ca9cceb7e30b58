// filter.cpp — directive filters matched against the tags of units and nodes.
#include "ir/filter.hpp"

#include <algorithm>

namespace piper::ir {
namespace {

bool in_ranges(const config::Filter::Ranges& rs, int64_t v) {
  for (auto [lo, hi] : rs)
    if (v >= lo && v <= hi) return true;
  return false;
}

bool has(const std::vector<std::string>& words, const std::string& w) {
  return std::find(words.begin(), words.end(), w) != words.end();
}

// The kind a filter names a unit by: its block symbol, "embed" or "head".
std::string kind_word(const UnitSpec& u) {
  if (u.kind == UnitKind::UNIT_EMBED) return "embed";
  if (u.kind == UnitKind::UNIT_HEAD) return "head";
  return std::string(1, unit_symbol(u.kind));
}

std::string pattern_of(const ModelGraph& model) {
  std::string pattern;
  for (const UnitSpec& u : model.units)
    if (u.block >= 0) pattern += unit_symbol(u.kind);
  return pattern;
}

std::string range_text(std::pair<int64_t, int64_t> r) {
  return r.first == r.second ? std::to_string(r.first) : std::to_string(r.first) + "-" + std::to_string(r.second);
}

// What the model has of the units a kind filter names (the block kinds missing from the pattern).
std::string missing_kinds(const config::Filter& f, const ModelGraph& model) {
  std::vector<std::string> names;
  for (const std::string& k : f.kinds)
    for (UnitKind uk : {UnitKind::UNIT_MAMBA, UnitKind::UNIT_ATTENTION, UnitKind::UNIT_MLP, UnitKind::UNIT_MOE})
      if (k == std::string(1, unit_symbol(uk))) names.push_back(unit_kind_name(uk));
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return "the pattern \"" + pattern_of(model) + "\" has no " + text + " block";
}

}  // namespace

bool selects(const config::Filter& f, const UnitSpec& unit, int stage) {
  if (!f.stages.empty() && !in_ranges(f.stages, stage)) return false;
  if (!f.units.empty() && !has(f.units, unit.name) && !has(f.units, std::to_string(unit.index))) return false;
  if (!f.blocks.empty() && (unit.block < 0 || !in_ranges(f.blocks, unit.block))) return false;
  if (!f.kinds.empty() && !has(f.kinds, kind_word(unit))) return false;
  return true;
}

bool selects(const config::Filter& f, const Tags& t, const ModelGraph& model) {
  if (t.unit < 0 || static_cast<size_t>(t.unit) >= model.units.size()) return false;
  if (!f.microbatches.empty() && (t.microbatch < 0 || !in_ranges(f.microbatches, t.microbatch))) return false;
  if (!f.passes.empty() && !has(f.passes, pass_name(t.pass))) return false;
  return selects(f, model.units[static_cast<size_t>(t.unit)], t.stage);
}

std::vector<int> selected_units(const config::Filter& f, const ModelGraph& model, const std::vector<int>& stage_of_unit) {
  std::vector<int> out;
  for (const UnitSpec& u : model.units) {
    const size_t i = static_cast<size_t>(u.index);
    if (selects(f, u, i < stage_of_unit.size() ? stage_of_unit[i] : -1)) out.push_back(u.index);
  }
  return out;
}

std::string filter_problem(const config::Filter& f, const ModelGraph& model, const std::vector<int>& stage_of_unit,
                           int n_stages) {
  const int64_t n_blocks = static_cast<int64_t>(model.units.size()) - 2;
  for (auto r : f.blocks)
    if (r.second >= n_blocks)
      return "block " + std::to_string(r.second) + " does not exist; the pattern \"" + pattern_of(model) +
             "\" has blocks 0.." + std::to_string(n_blocks - 1);
  for (auto r : f.stages)
    if (r.second >= n_stages)
      return "stage " + std::to_string(r.second) + " does not exist; there are " + std::to_string(n_stages) +
             " stages (0.." + std::to_string(n_stages - 1) + ")";
  for (const std::string& name : f.units) {
    bool found = false;
    for (const UnitSpec& u : model.units) found |= name == u.name || name == std::to_string(u.index);
    if (!found)
      return "unit '" + name + "' does not exist; the units are 0.." + std::to_string(model.units.size() - 1) +
             " (embed, layers.0 .. layers." + std::to_string(n_blocks - 1) + ", head, as `piper plan` lists them)";
  }
  if (!selected_units(f, model, stage_of_unit).empty()) return "";
  config::Filter kinds_only;
  kinds_only.kinds = f.kinds;
  if (!f.kinds.empty() && selected_units(kinds_only, model, stage_of_unit).empty()) {
    std::string words;
    for (const std::string& k : f.kinds) words += (words.empty() ? "'" : ", '") + k + "'";
    return "kind " + words + " selects no unit: " + missing_kinds(f, model);
  }
  // Each key selects some unit, but not the same one.
  std::vector<std::string> keys;
  auto ranges = [&](const char* key, const config::Filter::Ranges& rs) {
    for (auto r : rs) keys.push_back(std::string(key) + " " + range_text(r));
  };
  ranges("stage", f.stages);
  for (const std::string& u : f.units) keys.push_back("unit " + u);
  ranges("block", f.blocks);
  for (const std::string& k : f.kinds) keys.push_back("kind '" + k + "'");
  std::string text;
  for (const std::string& k : keys) text += (text.empty() ? "" : ", ") + k;
  return "the filter (" + text + ") selects no unit: no unit of the pattern \"" + pattern_of(model) +
         "\" passes all of its keys";
}

}  // namespace piper::ir
