// reader.hpp — reads a YAML config document and --set overrides into a Config, collecting every
// problem with its file position (reader.cpp: sections and keys; directive_reader.cpp: the
// directives section; switch.cpp: the switch list and a switch file).
#pragma once

#include <yaml-cpp/yaml.h>

#include <map>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "config/internal.hpp"

namespace piper::config::detail {

class Reader {
 public:
  // `scope` prefixes the paths it records and names in messages: "switch[1]." reads a `switch:`
  // entry's parallel and directives keys into a Config of their own.
  explicit Reader(const std::string& source, const std::string& scope = "") : source_(source), scope_(scope) {
    cfg_.source = source;
  }

  void read_root(const YAML::Node& root);
  void apply_override(const std::string& text);
  // The keys of one strategy change (`map`, a YAML map) into `t`: a `switch:` entry's, or with
  // `in_file` a switch file's.
  void read_target(const YAML::Node& map, SwitchTarget& t, bool in_file);

  void fail(const std::string& msg) { errors_.push_back(msg); }
  const std::vector<std::string>& errors() const { return errors_; }
  Config& config() { return cfg_; }

 private:
  void read_section(const std::string& section, const YAML::Node& map);
  void read_directives(const YAML::Node& key, const YAML::Node& list);
  void read_switches(const YAML::Node& list);
  void read_switch(size_t i, const YAML::Node& item);
  // One key of a strategy change other than parallel and directives; false when its value is wrong.
  bool read_target_key(SwitchTarget& t, const std::string& name, const YAML::Node& v, const std::string& vat);
  void read_directive(size_t i, const YAML::Node& item);
  bool read_directive_key(Directive& d, const std::string& name, const YAML::Node& v, const std::string& path,
                          const std::string& vat);
  // A list of integers (stage_of_unit, place's ranks) into `to`; `what` names its items in messages.
  bool read_int_list(std::optional<std::vector<int64_t>>& to, const char* what, const YAML::Node& v,
                     const std::string& path, const std::string& vat);
  bool read_stages(Directive& d, const YAML::Node& v, const std::string& path, const std::string& vat);
  bool read_inline_filter(const DirectiveSpec& spec, const YAML::Node& map, const std::string& base, Filter& f);
  bool read_filter(const YAML::Node& m, const std::string& path, const std::string& owner,
                   const std::vector<std::string>& allowed, Filter& f);
  bool read_ranks(Directive& d, const YAML::Node& v, const std::string& path, const std::string& vat);
  // Records `name` in `seen`; reports a duplicate (and returns false) when it is there already.
  bool first_time(std::map<std::string, YAML::Mark>& seen, const std::string& name, const YAML::Mark& m,
                  const std::string& at, const std::string& what);

  std::string source_;
  std::string scope_;
  Config cfg_;
  std::vector<std::string> errors_;
};

}  // namespace piper::config::detail
