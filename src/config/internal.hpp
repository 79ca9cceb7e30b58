// internal.hpp — what the files of src/config share and nobody else sees: the key table, the
// scalar grammar, the directive table, and the directives applied onto the shorthand. Only
// src/config includes yaml-cpp.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "config/config.hpp"

namespace piper::config::detail {

// ---- the key table (keys.cpp) ------------------------------------------------------------------
// One row per YAML key: section, key, a short doc (emitted as a comment by
// to_yaml), and where the value lives in a Config.

using FieldRef = std::variant<int64_t*, uint64_t*, double*, std::string*, bool*>;

struct Field {
  const char* section;
  const char* key;
  const char* doc;
  FieldRef (*ref)(Config&);

  std::string name() const { return std::string(section) + "." + key; }
};

const std::vector<Field>& fields();
const Field* find_field(std::string_view section, std::string_view key);  // nullptr when there is none
bool is_section(std::string_view s);
std::vector<std::string> keys_of(std::string_view section);

extern const std::vector<std::string> kSections;
constexpr const char* kDirectives = "directives";  // a section that is a list, not keys
constexpr const char* kSwitch = "switch";          // the other one: the strategy changes (switch.cpp)
constexpr const char* kOverrideWhere = "--set";   // Config::locations of a key an override set

std::string join(const std::vector<std::string>& parts, const std::string& sep);
std::string unknown_section_message(const std::string& section);
// `scope` names where the section is ("switch[1]."; "" at the top level), which takes only its own keys.
std::string unknown_key_message(const std::string& section, const std::string& key, const std::string& scope = "");

// ---- scalars (keys.cpp) ------------------------------------------------------------------------

std::string where(const std::string& source, const YAML::Mark& m);  // "file:line:col"
std::string describe(const YAML::Node& n);                          // "a list", "'x'", ...
bool parse_int(std::string_view s, int64_t& out);
bool parse_uint(std::string_view s, uint64_t& out);
bool parse_double(std::string_view s, double& out);
bool parse_bool(std::string_view s, bool& out);
// A scalar integer into `out`; returns "" or "expected an integer, found Y".
std::string read_int(const YAML::Node& n, std::optional<int64_t>& out);
// Stores the scalar `n` into field `f` of `cfg`; returns "" or "expected X, found Y".
std::string assign(const Field& f, Config& cfg, const YAML::Node& n);
std::string quote(const std::string& s);  // a double-quoted YAML string
std::string format_double(double v);
std::string format_value(const FieldRef& r);

// ---- directives (directives.cpp) ---------------------------------------------------------------

struct DirectiveSpec {
  DirectiveKind kind;
  const char* name;
  std::vector<std::string> keys;         // empty: the value is a boolean or a filter (split_backward)
  std::vector<std::string> filter_keys;  // the filter keys it takes beside its own; empty: no filter
};

const std::vector<DirectiveSpec>& directive_specs();
// Every key of a config::Filter, in the order docs/directives.md lists them.
const std::vector<std::string>& filter_keys();
// The keys that set a parallel degree or the schedule: uniform over the model, so never beside a filter.
const std::vector<std::string>& degree_keys();
// The filter keys of `f` as YAML flow-map entries ("blocks: \"0-2\"", "kind: [M, \"*\"]").
std::vector<std::string> emit_filter(const Filter& f);
const DirectiveSpec& spec_of(DirectiveKind k);
std::vector<std::string> directive_names();
std::string dpath(size_t i);  // "directives[i]"
// One directive as a YAML flow map, e.g. "place: {pp: 2, stages: [{blocks: \"0-2\"}, ...]}".
std::string emit_directive(const Directive& d);

struct Applied {
  Config cfg;                                // parallel: the shorthand with every directive applied
  std::map<std::string, std::string> names;  // "parallel.dp" -> "directives[2].replicate.dp"
  int place_from = -1;                       // the last place directive giving stage_of_unit or stages
  int order_from = -1;                       // the order directive giving ranks, when the last order does
  int ranks_from = -1;                       // the last place directive giving ranks (the stages' pipeline ranks)
  std::vector<EffectiveStrategy::Subset> split_subsets, zero_subsets;  // directives with a filter, in order
};
Applied apply_directives(const Config& c);

// ---- switches (switch.cpp) ---------------------------------------------------------------------

std::string spath(size_t i);  // "switch[i]"
// The `switch:` list as to_yaml writes it; "" when there is none.
std::string emit_switches(const std::vector<SwitchTarget>& list);

}  // namespace piper::config::detail
