// switch.cpp — strategy switches: the `switch:` list and a switch file read into SwitchTargets
// (with the section and directive readers of a config), a target applied onto the config it
// switches from, and the list written back as YAML (docs/config.md, docs/switching.md).
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <string_view>

#include "config/internal.hpp"
#include "config/reader.hpp"

namespace piper::config {
namespace detail {
namespace {

const std::vector<std::string> kEntryKeys = {"at_step", "world", "parallel", "directives"};
const std::vector<std::string> kFileKeys = {"parallel", "directives", "world", "leave"};

bool contains(const std::vector<std::string>& list, const std::string& word) {
  return std::find(list.begin(), list.end(), word) != list.end();
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// Why `name` is no key of a strategy change: another place's key, a parallel key written outside
// `parallel:`, or a typo.
std::string misplaced(const std::string& name, bool in_file) {
  if (!in_file && name == "leave")
    return "leave names the ranks that leave when the job runs, so it belongs in the switch file "
           "(train.switch_file); a switch: entry shrinks the job with world: (e.g. world: 2)";
  if (in_file && name == "at_step")
    return "a switch file applies at the next step boundary; at_step belongs in an entry of the config's switch: list";
  const std::vector<std::string>& keys = in_file ? kFileKeys : kEntryKeys;
  const std::string where = in_file ? "a switch file" : "a switch: entry";
  if (find_field("parallel", name))
    return "'" + name + "' is a key of parallel:; write it inside it (parallel: {" + name + ": ...})";
  const std::string near = closest(name, keys);
  return "unknown key '" + name + "' in " + where + (near.empty() ? "" : "; did you mean '" + near + "'?") +
         " (its keys are " + join(keys, ", ") + ")";
}

// Sets field `f` of `to` to its value in `from`.
void copy_field(const Field& f, Config& from, Config& to) {
  std::visit([&](auto* dst) { *dst = *std::get<decltype(dst)>(f.ref(from)); }, f.ref(to));
}

// "switch[1]." for an entry of the list, "" for a switch file: what prefixes the target's locations.
std::string scope_of(const SwitchTarget& t) { return t.path().empty() ? "" : t.path() + "."; }

}  // namespace

std::string spath(size_t i) { return std::string(kSwitch) + "[" + std::to_string(i) + "]"; }

// `switch:` — a list of maps, each read into a SwitchTarget.
void Reader::read_switches(const YAML::Node& list) {
  if (list.IsNull()) return;
  if (!list.IsSequence())
    return fail(where(source_, list.Mark()) + ": switch: expected a list of strategy changes, each a map such as "
                "{at_step: 8, parallel: {dp: 2}}; found " + describe(list));
  for (size_t i = 0; i < list.size(); ++i) read_switch(i, list[i]);
}

void Reader::read_switch(size_t i, const YAML::Node& item) {
  const std::string path = spath(i), at = where(source_, item.Mark());
  if (!item.IsMap() || item.size() == 0)
    return fail(at + ": " + path + ": expected a map with at_step and the strategy from that step on (" +
                join(kEntryKeys, ", ") + "), such as {at_step: 8, parallel: {dp: 2}}; found " +
                (item.IsMap() ? std::string("an empty map") : describe(item)));
  SwitchTarget t;
  Reader entry(source_, path + ".");
  entry.read_target(item, t, false);
  t.locations[path] = at;
  for (const std::string& e : entry.errors()) fail(e);
  if (!item["at_step"])
    fail(at + ": " + path + ": at_step is missing; say from which step the entry runs (at_step: 8: steps 0..7 "
         "run before it)");
  if (entry.errors().empty()) cfg_.switches.push_back(std::move(t));
}

void Reader::read_target(const YAML::Node& map, SwitchTarget& t, bool in_file) {
  const std::vector<std::string>& keys = in_file ? kFileKeys : kEntryKeys;
  const std::string owner = scope_.empty() ? "" : scope_.substr(0, scope_.size() - 1) + ": ";
  std::map<std::string, YAML::Mark> seen;
  bool parallel = false;
  for (const auto& kv : map) {
    const YAML::Node k = kv.first, v = kv.second;
    const std::string at = where(source_, k.Mark());
    if (!k.IsScalar()) {
      fail(at + ": " + owner + "expected a key (" + join(keys, ", ") + "), found " + describe(k));
      continue;
    }
    const std::string& name = k.Scalar();
    if (!contains(keys, name)) {
      fail(at + ": " + owner + misplaced(name, in_file));
      continue;
    }
    if (!first_time(seen, name, k.Mark(), at, "key '" + scope_ + name + "'")) continue;
    if (name == kDirectives) {
      read_directives(k, v);
      continue;
    }
    if (name == "parallel") {
      parallel = true;
      read_section("parallel", v);
    } else if (!read_target_key(t, name, v, v.IsNull() ? at : where(source_, v.Mark()))) {
      continue;
    }
    cfg_.locations[scope_ + name] = at;
  }
  if (parallel) t.parallel = cfg_.parallel;
  t.directives = cfg_.directives;
  t.source = source_;
  t.locations.insert(cfg_.locations.begin(), cfg_.locations.end());
}

bool Reader::read_target_key(SwitchTarget& t, const std::string& name, const YAML::Node& v, const std::string& vat) {
  const std::string path = scope_ + name;
  if (name == "leave") {
    std::optional<std::vector<int64_t>> ranks;
    if (!read_int_list(ranks, "job ranks (as mpirun numbers them)", v, path, vat)) return false;
    t.leave = *ranks;
    return true;
  }
  std::optional<int64_t> n;
  const std::string err = read_int(v, n);
  if (!err.empty()) {
    fail(vat + ": " + path + ": " + err);
    return false;
  }
  if (name == "at_step") t.at_step = *n;
  else t.world = n;
  return true;
}

std::string emit_switches(const std::vector<SwitchTarget>& list) {
  if (list.empty()) return "";
  std::string out = "switch:\n";  // the strategy changes, in step order (docs/switching.md)
  for (const SwitchTarget& t : list) {
    std::vector<std::string> lines = {"at_step: " + std::to_string(t.at_step)};
    if (t.world) lines.push_back("world: " + std::to_string(*t.world));
    if (!t.leave.empty()) {
      std::vector<std::string> ranks;
      for (int64_t r : t.leave) ranks.push_back(std::to_string(r));
      lines.push_back("leave: [" + join(ranks, ", ") + "]");
    }
    if (t.parallel) {
      Config values;
      values.parallel = *t.parallel;
      std::vector<std::string> kv;
      for (const std::string& key : t.parallel_keys())
        kv.push_back(key + ": " + format_value(find_field("parallel", key)->ref(values)));
      lines.push_back("parallel: {" + join(kv, ", ") + "}");
    }
    if (t.directives.present) {
      lines.push_back(std::string("directives:") + (t.directives.list.empty() ? " []" : ""));
      for (const Directive& d : t.directives.list) lines.push_back("  - " + emit_directive(d));
    }
    for (size_t i = 0; i < lines.size(); ++i) out += (i ? "    " : "  - ") + lines[i] + "\n";
  }
  return out;
}

}  // namespace detail

using namespace detail;

std::string SwitchTarget::path() const {
  for (const auto& [key, where] : locations)
    if (starts_with(key, std::string(kSwitch) + "[")) return key.substr(0, key.find(']') + 1);
  return "";
}

std::vector<std::string> SwitchTarget::parallel_keys() const {
  if (!parallel) return {};
  const std::string base = scope_of(*this) + "parallel.";
  std::vector<std::string> out;
  for (const Field& f : fields())
    if (std::string_view(f.section) == "parallel" && locations.count(base + f.key)) out.push_back(f.key);
  return out;
}

bool SwitchTarget::same_settings(const SwitchTarget& o) const {
  return at_step == o.at_step && world == o.world && leave == o.leave && parallel == o.parallel &&
         directives == o.directives && parallel_keys() == o.parallel_keys();
}

Config apply_switch(const Config& current, const SwitchTarget& target) {
  Config c = current;
  const std::string scope = scope_of(target);
  Config from;
  if (target.parallel) from.parallel = *target.parallel;
  for (const std::string& key : target.parallel_keys()) {
    const Field& f = *find_field("parallel", key);
    copy_field(f, from, c);
    c.locations[f.name()] = target.locations.at(scope + f.name());
  }
  std::erase_if(c.locations, [](const auto& kv) { return starts_with(kv.first, kDirectives); });
  c.directives = target.directives;
  for (const auto& [key, where] : target.locations)
    if (starts_with(key, scope + kDirectives)) c.locations[key.substr(scope.size())] = where;
  c.yaml_text = to_yaml(c);
  return c;
}

}  // namespace piper::config
