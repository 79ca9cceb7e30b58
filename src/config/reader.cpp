// reader.cpp — a config file read into a Config: the YAML document, its sections and keys, the
// --set overrides; to_yaml writes it back out.
#include "config/reader.hpp"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <sstream>

#include "config/internal.hpp"
#include "io/regular_file.hpp"

namespace piper::config {
namespace detail {

void Reader::read_root(const YAML::Node& root) {
  if (root.IsNull()) return;
  if (!root.IsMap()) {
    fail(where(source_, root.Mark()) + ": expected a map with the sections " + join(kSections, ", ") +
         "; found " + describe(root));
    return;
  }
  std::map<std::string, YAML::Mark> seen;
  for (const auto& kv : root) {
    YAML::Node k = kv.first, v = kv.second;
    std::string at = where(source_, k.Mark());
    if (!k.IsScalar()) {
      fail(at + ": expected a section name, found " + describe(k));
      continue;
    }
    const std::string& section = k.Scalar();
    if (section == kDirectives) {
      if (first_time(seen, section, k.Mark(), at, "section 'directives'")) read_directives(k, v);
      continue;
    }
    if (section == kSwitch) {
      if (first_time(seen, section, k.Mark(), at, "section 'switch'")) read_switches(v);
      continue;
    }
    if (!is_section(section)) {
      fail(at + ": " + unknown_section_message(section));
      continue;
    }
    if (first_time(seen, section, k.Mark(), at, "section '" + section + "'")) read_section(section, v);
  }
}

void Reader::apply_override(const std::string& text) {
  std::string head = std::string(kOverrideWhere) + " " + text;
  size_t eq = text.find('=');
  std::string name = eq == std::string::npos ? text : text.substr(0, eq);
  name.erase(0, name.find_first_not_of(" \t"));
  name.erase(name.find_last_not_of(" \t") + 1);
  size_t dot = name.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot == 0 || dot + 1 == name.size()) {
    fail(head + ": expected section.key=value, e.g. --set train.steps=10");
    return;
  }
  std::string section = name.substr(0, dot), key = name.substr(dot + 1);
  std::string value = text.substr(eq + 1);
  if (section == kDirectives)
    return fail(head + ": the directives section is a list; write it in the config file (docs/directives.md)");
  if (section == kSwitch)
    return fail(head + ": the switch section is a list; write it in the config file (docs/config.md, switch)");
  if (!is_section(section)) return fail(head + ": " + unknown_section_message(section));
  const Field* f = find_field(section, key);
  if (!f) return fail(head + ": " + unknown_key_message(section, key));
  YAML::Node n;
  try {
    n = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    // A text key takes a value that is not valid YAML as written (e.g. a
    // pattern "*M-", which YAML would read as an alias).
    if (std::holds_alternative<std::string*>(f->ref(cfg_))) {
      *std::get<std::string*>(f->ref(cfg_)) = value;
      cfg_.locations[f->name()] = kOverrideWhere;
      return;
    }
    return fail(head + ": " + f->name() + ": the value is not valid YAML (" + e.msg + ")");
  }
  std::string err = assign(*f, cfg_, n);
  if (!err.empty()) return fail(head + ": " + f->name() + ": " + err);
  cfg_.locations[f->name()] = kOverrideWhere;
}

void Reader::read_section(const std::string& section, const YAML::Node& map) {
  if (map.IsNull()) return;  // "model:" with nothing under it
  if (!map.IsMap()) {
    fail(where(source_, map.Mark()) + ": section '" + scope_ + section + "': expected a map of keys (" +
         join(keys_of(section), ", ") + "), found " + describe(map));
    return;
  }
  std::map<std::string, YAML::Mark> seen;
  for (const auto& kv : map) {
    YAML::Node k = kv.first, v = kv.second;
    std::string at = where(source_, k.Mark());
    if (!k.IsScalar()) {
      fail(at + ": section '" + scope_ + section + "': expected a key name, found " + describe(k));
      continue;
    }
    const std::string& key = k.Scalar();
    const Field* f = find_field(section, key);
    if (!f) {
      fail(at + ": " + unknown_key_message(section, key, scope_));
      continue;
    }
    const std::string name = scope_ + f->name();
    if (!first_time(seen, key, k.Mark(), at, "key '" + name + "'")) continue;
    std::string err = assign(*f, cfg_, v);
    if (!err.empty()) {
      // yaml-cpp marks an empty value at the next token; the key is clearer.
      std::string vat = v.IsNull() ? at : where(source_, v.Mark());
      fail(vat + ": " + name + ": " + err);
      continue;
    }
    cfg_.locations[name] = at;
  }
}

bool Reader::first_time(std::map<std::string, YAML::Mark>& seen, const std::string& name, const YAML::Mark& m,
                         const std::string& at, const std::string& what) {
  auto [it, fresh] = seen.emplace(name, m);
  if (!fresh)
    fail(at + ": duplicate " + what + " (first at " + where(source_, it->second) + "); keep one of them");
  return fresh;
}

}  // namespace detail

using namespace detail;

namespace {

constexpr int64_t kMaxConfigBytes = int64_t{16} << 20;  // 16 MiB: a config is a page of text

// The config file's bytes: a regular file of at most kMaxConfigBytes (io::read_regular: a FIFO, a device or a
// directory is refused before it is opened).
std::string read_file(const std::string& path) {
  try {
    return io::read_regular(path, kMaxConfigBytes);
  } catch (const io::FileError& e) {
    const std::string why = e.what(), open = "cannot open: ";
    if (why.rfind(open, 0) == 0) throw ConfigError("cannot open config file " + path + ": " + why.substr(open.size()));
    throw ConfigError("config file " + path + ": " + why + "; give the path of a YAML config (docs/config.md)");
  }
}

// CRLF (Windows) and lone CR (classic Mac OS) line breaks become LF, one for
// one, so line numbers in messages stay those of the file.
std::string normalise_line_breaks(const std::string& text) {
  if (text.find('\r') == std::string::npos) return text;
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\r') {
      out += text[i];
      continue;
    }
    out += '\n';
    if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
  }
  return out;
}

// The YAML documents of a config text: the first loaded, the rest counted (at most 2). yaml-cpp 0.7's
// LoadAll never returns on some malformed text (a ',' outside a flow collection yields an empty document
// again and again, using memory without bound: jbeder/yaml-cpp#1040, fixed in 0.8), so the documents are
// counted by a parser that stops at the second. Syntax errors throw YAML::Exception as LoadAll does.
struct Documents {
  YAML::Node first;
  int count = 0;
  YAML::Mark second;  // where the second document starts, when count > 1
};

Documents load_documents(const std::string& text) {
  struct Counter : YAML::EventHandler {
    int* count;
    YAML::Mark* second;
    void OnDocumentStart(const YAML::Mark& m) override {
      if (++*count == 2) *second = m;
    }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
  };
  Documents d;
  std::stringstream in(text);
  YAML::Parser parser(in);
  Counter counter;
  counter.count = &d.count;
  counter.second = &d.second;
  while (d.count < 2 && parser.HandleNextDocument(counter)) {
  }
  if (d.count > 0) d.first = YAML::Load(text);
  return d;
}

// The documents of a config's or a switch file's text; a syntax error throws ConfigError naming the place.
Documents load_text(const std::string& yaml_text, const std::string& source) {
  try {
    return load_documents(normalise_line_breaks(yaml_text));
  } catch (const YAML::Exception& e) {
    throw ConfigError(where(source, e.mark) + ": YAML syntax error: " + e.msg);
  }
}

}  // namespace

Config parse(const std::string& yaml_text, const std::string& source, const std::vector<std::string>& overrides) {
  const Documents docs = load_text(yaml_text, source);
  Reader reader(source);
  if (docs.count > 1)
    reader.fail(where(source, docs.second) + ": a second YAML document ('---'); a config is one document");
  if (docs.count > 0) reader.read_root(docs.first);
  for (const std::string& o : overrides) reader.apply_override(o);
  if (!reader.errors().empty()) throw ConfigError(join(reader.errors(), "\n"));
  Config cfg = std::move(reader.config());
  cfg.yaml_text = to_yaml(cfg);
  return cfg;
}

SwitchTarget parse_switch(const std::string& yaml_text, const std::string& source) {
  const Documents docs = load_text(yaml_text, source);
  const std::string keys = "parallel, directives, world, leave";
  Reader reader(source);
  SwitchTarget t;
  if (docs.count > 1)
    reader.fail(where(source, docs.second) + ": a second YAML document ('---'); a switch file is one document");
  const YAML::Node& root = docs.first;
  if (docs.count == 0 || root.IsNull() || (root.IsMap() && root.size() == 0))
    reader.fail(source + ": the switch file is empty; write the new strategy as a map of at least one of " + keys +
                " (docs/switching.md)");
  else if (!root.IsMap())
    reader.fail(where(source, root.Mark()) + ": expected a map of the keys " + keys + " (docs/switching.md); found " +
                describe(root));
  else
    reader.read_target(root, t, true);
  if (!reader.errors().empty()) throw ConfigError(join(reader.errors(), "\n"));
  return t;
}

Config load(const std::string& path, const std::vector<std::string>& overrides) {
  return parse(read_file(path), path, overrides);
}

std::string to_yaml(const Config& cfg) {
  Config copy = cfg;
  std::string out = "# piper run config, resolved: every key, defaults included\n";
  std::string section;
  for (const Field& f : fields()) {
    if (section != f.section) {
      section = f.section;
      out += section + ":\n";
    }
    std::string line = std::string("  ") + f.key + ": " + format_value(f.ref(copy));
    if (line.size() < 32) line.resize(32, ' ');
    out += line + "  # " + f.doc + "\n";
  }
  if (cfg.directives.present) {
    out += "directives:";  // applied in order over the parallel values above (docs/directives.md)
    if (cfg.directives.list.empty()) out += " []";
    out += "\n";
    for (const Directive& d : cfg.directives.list) out += "  - " + emit_directive(d) + "\n";
  }
  return out + emit_switches(cfg.switches);
}

}  // namespace piper::config
