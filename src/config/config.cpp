// config.cpp — reads a run config from YAML plus --set overrides, validates it, and writes it back out.
#include "config/config.hpp"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>
#include <variant>

#include "config/checked.hpp"
#include "io/regular_file.hpp"

namespace piper::config {
namespace {

// ---- the key table ------------------------------------------------------------
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

#define PIPER_FIELD(sec, k, doc) \
  Field { #sec, #k, doc, [](Config& c) -> FieldRef { return &c.sec.k; } }

const std::vector<Field>& fields() {
  static const std::vector<Field> table = {
      PIPER_FIELD(model, pattern, "one symbol per block: M mamba2, * attention, - mlp"),
      PIPER_FIELD(model, vocab_size, "V"),
      PIPER_FIELD(model, d_model, "D"),
      PIPER_FIELD(model, n_heads, "attention heads H"),
      PIPER_FIELD(model, n_kv_heads, "attention key/value heads, n_heads % n_kv_heads == 0"),
      PIPER_FIELD(model, ffn_hidden, "MLP hidden size F"),
      PIPER_FIELD(model, d_state, "Mamba-2 state size N"),
      PIPER_FIELD(model, head_dim, "Mamba-2 head dim P"),
      PIPER_FIELD(model, expand, "d_inner = expand * d_model"),
      PIPER_FIELD(model, n_groups, "Mamba-2 B/C groups G"),
      PIPER_FIELD(model, d_conv, "Mamba-2 conv width K"),
      PIPER_FIELD(model, rope_theta, "RoPE base"),
      PIPER_FIELD(model, ssd_chunk, "SSD scan chunk length (speed only)"),
      PIPER_FIELD(train, steps, "optimiser steps"),
      PIPER_FIELD(train, global_batch, "sequences per step, all ranks and microbatches"),
      PIPER_FIELD(train, seq_len, "tokens per sequence T"),
      PIPER_FIELD(train, lr, "peak learning rate"),
      PIPER_FIELD(train, min_lr_ratio, "cosine decays to lr * min_lr_ratio"),
      PIPER_FIELD(train, weight_decay, "AdamW decoupled weight decay"),
      PIPER_FIELD(train, beta1, "Adam beta1"),
      PIPER_FIELD(train, beta2, "Adam beta2"),
      PIPER_FIELD(train, eps, "Adam epsilon"),
      PIPER_FIELD(train, grad_clip, "global-norm clip; 0 = off"),
      PIPER_FIELD(train, warmup_steps, "linear warmup steps"),
      PIPER_FIELD(train, seed, "initialisation seed"),
      PIPER_FIELD(train, log_every, "progress line every N steps"),
      PIPER_FIELD(train, sample_every, "text sample every N steps; 0 = off"),
      PIPER_FIELD(train, sample_tokens, "length of a text sample"),
      PIPER_FIELD(train, threads, "OpenMP threads per rank; 0 = default"),
      PIPER_FIELD(data, path, "token file"),
      PIPER_FIELD(checkpoint, dir, "checkpoint folder; empty = no checkpoints"),
      PIPER_FIELD(checkpoint, every, "save every N steps; 0 = at the end and on a signal only"),
      PIPER_FIELD(checkpoint, keep, "newest checkpoints kept"),
      PIPER_FIELD(checkpoint, async, "write checkpoints in the background"),
      PIPER_FIELD(checkpoint, direct_io, "write whole pages with O_DIRECT (no page cache) where possible"),
      PIPER_FIELD(checkpoint, on_error, "a save that fails: stop (exit 3) | continue (warn and train on)"),
      PIPER_FIELD(parallel, dp, "data-parallel replicas"),
      PIPER_FIELD(parallel, tp, "tensor-parallel ranks"),
      PIPER_FIELD(parallel, pp, "pipeline stages"),
      PIPER_FIELD(parallel, zero, "ZeRO stage 0..3"),
      PIPER_FIELD(parallel, schedule, "gpipe | 1f1b | interleaved | zbh1 | dualpipev"),
      PIPER_FIELD(parallel, microbatches, "microbatches per replica and step"),
      PIPER_FIELD(parallel, virtual_stages, "model chunks per pipeline rank"),
      PIPER_FIELD(parallel, split_backward, "BWD_I + BWD_W instead of fused BWD"),
      PIPER_FIELD(parallel, order, "rank grid order, first varies fastest"),
      PIPER_FIELD(parallel, bucket_mb, "data-parallel gradient bucket size, MiB"),
      PIPER_FIELD(parallel, comm_timeout_s, "seconds before a pending communication aborts the job"),
  };
  return table;
}
#undef PIPER_FIELD

const std::vector<std::string> kSections = {"model", "train", "data", "checkpoint", "parallel"};
constexpr const char* kDirectives = "directives";  // the one section that is a list, not keys
const std::vector<std::string> kSchedules = {"gpipe", "1f1b", "interleaved", "zbh1", "dualpipev"};
constexpr const char* kOverrideWhere = "--set";

const Field* find_field(std::string_view section, std::string_view key) {
  for (const Field& f : fields())
    if (section == f.section && key == f.key) return &f;
  return nullptr;
}

bool is_section(std::string_view s) {
  return std::find(kSections.begin(), kSections.end(), s) != kSections.end();
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

// ---- suggestions --------------------------------------------------------------

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      size_t sub = diag + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({up + 1, row[j - 1] + 1, sub});
      diag = up;
    }
  }
  return row[b.size()];
}

// The candidate closest to `word`, or "" when none is close enough to be a typo.
std::string closest(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  size_t limit = std::max<size_t>(2, std::min(word.size(), best.size()) / 3);
  return best_d <= limit ? best : std::string();
}

std::vector<std::string> keys_of(std::string_view section) {
  std::vector<std::string> out;
  for (const Field& f : fields())
    if (section == f.section) out.push_back(f.key);
  return out;
}

std::string unknown_section_message(const std::string& section) {
  std::string msg = "unknown section '" + section + "'";
  std::vector<std::string> owners;
  for (const Field& f : fields())
    if (section == f.key) owners.push_back(f.name());
  if (!owners.empty())
    return msg + "; did you mean '" + owners[0] + "'? keys go inside their section (" +
           std::string(owners[0].substr(0, owners[0].find('.'))) + ":)";
  std::vector<std::string> all = kSections;
  all.push_back(kDirectives);
  std::string near = closest(section, all);
  if (!near.empty()) msg += "; did you mean '" + near + "'?";
  return msg + " (sections are " + join(all, ", ") + ")";
}

std::string unknown_key_message(const std::string& section, const std::string& key) {
  std::string msg = "unknown key '" + section + "." + key + "'";
  std::string near = closest(key, keys_of(section));
  if (!near.empty()) return msg + "; did you mean '" + near + "'?";
  for (const Field& f : fields())
    if (key == f.key) return msg + "; did you mean '" + f.name() + "'? (it is in section '" + f.section + "')";
  return msg + "; valid keys of '" + section + "' are " + join(keys_of(section), ", ");
}

// ---- scalars ------------------------------------------------------------------

std::string where(const std::string& source, const YAML::Mark& m) {
  if (m.is_null()) return source;
  return source + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null: return "an empty value";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Scalar: return "'" + n.Scalar() + "'";
    default: return "nothing";
  }
}

const char* expected(const FieldRef& r) {
  switch (r.index()) {
    case 0: return "an integer";
    case 1: return "a non-negative integer";
    case 2: return "a number";
    case 3: return "a string";
    default: return "true or false";
  }
}

std::string_view strip_plus(std::string_view s) {
  return (s.size() > 1 && s[0] == '+' && s[1] != '-') ? s.substr(1) : s;
}

bool parse_int(std::string_view s, int64_t& out) {
  s = strip_plus(s);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

bool parse_uint(std::string_view s, uint64_t& out) {
  s = strip_plus(s);
  if (s.empty() || s[0] == '-') return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

bool parse_double(std::string_view s, double& out) {
  s = strip_plus(s);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty() && std::isfinite(out);
}

bool parse_bool(std::string_view s, bool& out) {
  static const std::vector<std::string> yes = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
  static const std::vector<std::string> no = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
  if (std::find(yes.begin(), yes.end(), s) != yes.end()) return out = true, true;
  if (std::find(no.begin(), no.end(), s) != no.end()) return out = false, true;
  return false;
}

// Stores the scalar `n` into field `f` of `cfg`; returns "" or "expected X, found Y".
std::string assign(const Field& f, Config& cfg, const YAML::Node& n) {
  FieldRef r = f.ref(cfg);
  std::string bad = std::string("expected ") + expected(r) + ", found " + describe(n);
  if (!n.IsScalar()) return bad;
  const std::string& s = n.Scalar();
  bool ok = std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int64_t>) return parse_int(s, *p);
        else if constexpr (std::is_same_v<T, uint64_t>) return parse_uint(s, *p);
        else if constexpr (std::is_same_v<T, double>) return parse_double(s, *p);
        else if constexpr (std::is_same_v<T, bool>) return parse_bool(s, *p);
        else return (*p = s, true);
      },
      r);
  return ok ? std::string() : bad;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20 || ch == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", ch);
      out += buf;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

std::string format_double(double v) {
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, ec == std::errc() ? p : buf);
  if (s.find_first_not_of("-0123456789") == std::string::npos) s += ".0";
  return s;
}

std::string format_value(const FieldRef& r) {
  return std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, double>) return format_double(*p);
        else if constexpr (std::is_same_v<T, bool>) return *p ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::string>) return quote(*p);
        else return std::to_string(*p);
      },
      r);
}

// ---- directives: names, keys and value grammar ----------------------------------

struct DirectiveSpec {
  DirectiveKind kind;
  const char* name;
  std::vector<std::string> keys;  // empty: the value is a scalar (split_backward: BOOL)
};

const std::vector<DirectiveSpec>& directive_specs() {
  static const std::vector<DirectiveSpec> table = {
      {DirectiveKind::SPLIT, "split", {"microbatches"}},
      {DirectiveKind::SPLIT_BACKWARD, "split_backward", {}},
      {DirectiveKind::PLACE, "place", {"pp", "virtual_stages", "stage_of_unit", "stages"}},
      {DirectiveKind::REPLICATE, "replicate", {"dp", "shard_optimizer", "shard_grads", "shard_params", "bucket_mb"}},
      {DirectiveKind::SHARD, "shard", {"tp"}},
      {DirectiveKind::ORDER, "order", {"schedule", "ranks"}},
      {DirectiveKind::GRID, "grid", {"order"}},
  };
  return table;
}

const DirectiveSpec& spec_of(DirectiveKind k) {
  for (const DirectiveSpec& s : directive_specs())
    if (s.kind == k) return s;
  return directive_specs().front();
}

std::vector<std::string> directive_names() {
  std::vector<std::string> out;
  for (const DirectiveSpec& s : directive_specs()) out.push_back(s.name);
  return out;
}

const std::vector<std::string> kStageFilterKeys = {"blocks", "kind"};
const std::vector<std::string> kKinds = {"M", "*", "-", "E", "embed", "head"};
constexpr const char* kOpGrammar =
    "an op: F, B, BI or BW, then the microbatch, then .chunk when a rank holds several model chunks "
    "(F3, B3, BI3, BW3, F3.1)";

std::string dpath(size_t i) { return "directives[" + std::to_string(i) + "]"; }

// "F3" / "BI12.1" -> op; "" on success, else what is wrong.
std::string parse_op(const std::string& text, OrderOp& op) {
  std::string_view s = text;
  size_t p = 0;
  if (s.substr(0, 2) == "BI" || s.substr(0, 2) == "BW") p = 2;
  else if (!s.empty() && (s[0] == 'B' || s[0] == 'F')) p = 1;
  if (p == 0) return "expected " + std::string(kOpGrammar) + "; found '" + text + "'";
  op.pass = std::string(s.substr(0, p));
  auto number = [&](int64_t& out) {
    size_t q = p;
    while (q < s.size() && s[q] >= '0' && s[q] <= '9') ++q;
    if (q == p) return false;
    auto [end, ec] = std::from_chars(s.data() + p, s.data() + q, out);
    p = q;
    return ec == std::errc() && end == s.data() + q;
  };
  if (!number(op.microbatch))
    return "'" + text + "' names no microbatch: expected " + std::string(kOpGrammar);
  op.chunk = 0;
  if (p < s.size() && s[p] == '.') {
    ++p;
    if (!number(op.chunk)) return "'" + text + "' names no chunk after '.': expected " + std::string(kOpGrammar);
  }
  if (p != s.size()) return "expected " + std::string(kOpGrammar) + "; found '" + text + "'";
  return "";
}

// One item of `blocks:`: 3 or "3-7". "" on success.
std::string parse_block_range(const YAML::Node& n, std::pair<int64_t, int64_t>& out) {
  const std::string bad = "expected a block index (3), a range (\"3-7\") or a list of them, found " + describe(n);
  if (!n.IsScalar()) return bad;
  const std::string& s = n.Scalar();
  int64_t a = 0, b = 0;
  if (parse_int(s, a)) {
    if (a < 0) return "block indices start at 0; found " + s;
    out = {a, a};
    return "";
  }
  size_t dash = s.find('-', 1);
  if (dash == std::string::npos || !parse_int(s.substr(0, dash), a) || !parse_int(s.substr(dash + 1), b) || a < 0 ||
      b < 0 || s[dash + 1] == '-' || s[dash + 1] == '+')
    return bad;
  if (b < a) return "the range " + s + " runs backwards; write " + std::to_string(b) + "-" + std::to_string(a);
  out = {a, b};
  return "";
}

std::string read_int(const YAML::Node& n, std::optional<int64_t>& out) {
  int64_t v = 0;
  if (n.IsScalar() && parse_int(n.Scalar(), v)) return out = v, "";
  return "expected an integer, found " + describe(n);
}
std::string read_bool(const YAML::Node& n, std::optional<bool>& out) {
  bool v = false;
  if (n.IsScalar() && parse_bool(n.Scalar(), v)) return out = v, "";
  return "expected true or false, found " + describe(n);
}
std::string read_double(const YAML::Node& n, std::optional<double>& out) {
  double v = 0;
  if (n.IsScalar() && parse_double(n.Scalar(), v)) return out = v, "";
  return "expected a number, found " + describe(n);
}
std::string read_string(const YAML::Node& n, std::optional<std::string>& out) {
  if (n.IsScalar()) return out = n.Scalar(), "";
  return "expected a string, found " + describe(n);
}

// One directive as a YAML flow map, e.g. "place: {pp: 2, stages: [{blocks: \"0-2\"}, ...]}".
std::string emit_directive(const Directive& d) {
  const DirectiveSpec& spec = spec_of(d.kind);
  if (d.kind == DirectiveKind::SPLIT_BACKWARD)
    return std::string(spec.name) + ": " + (d.split_backward.value_or(false) ? "true" : "false");
  std::vector<std::string> kv;
  auto i = [&](const char* k, const std::optional<int64_t>& v) {
    if (v) kv.push_back(std::string(k) + ": " + std::to_string(*v));
  };
  auto b = [&](const char* k, const std::optional<bool>& v) {
    if (v) kv.push_back(std::string(k) + ": " + (*v ? "true" : "false"));
  };
  auto str = [&](const char* k, const std::optional<std::string>& v) {
    if (v) kv.push_back(std::string(k) + ": " + quote(*v));
  };
  i("microbatches", d.microbatches);
  i("pp", d.pp);
  i("virtual_stages", d.virtual_stages);
  if (d.stage_of_unit) {
    std::vector<std::string> v;
    for (int64_t s : *d.stage_of_unit) v.push_back(std::to_string(s));
    kv.push_back("stage_of_unit: [" + join(v, ", ") + "]");
  }
  if (d.stages) {
    std::vector<std::string> stages;
    for (const StageFilter& f : *d.stages) {
      std::vector<std::string> keys;
      if (!f.blocks.empty()) {
        std::vector<std::string> r;
        for (auto [a, z] : f.blocks)
          r.push_back(a == z ? std::to_string(a) : quote(std::to_string(a) + "-" + std::to_string(z)));
        keys.push_back("blocks: " + (r.size() == 1 ? r[0] : "[" + join(r, ", ") + "]"));
      }
      if (!f.kinds.empty()) {
        std::vector<std::string> k;
        for (const std::string& s : f.kinds) k.push_back(quote(s));
        keys.push_back("kind: " + (k.size() == 1 ? k[0] : "[" + join(k, ", ") + "]"));
      }
      stages.push_back("{" + join(keys, ", ") + "}");
    }
    kv.push_back("stages: [" + join(stages, ", ") + "]");
  }
  i("dp", d.dp);
  b("shard_optimizer", d.shard_optimizer);
  b("shard_grads", d.shard_grads);
  b("shard_params", d.shard_params);
  if (d.bucket_mb) kv.push_back("bucket_mb: " + format_double(*d.bucket_mb));
  i("tp", d.tp);
  str("schedule", d.schedule);
  if (d.ranks) {
    bool chunks = false;
    for (const auto& r : *d.ranks)
      for (const OrderOp& op : r) chunks |= op.chunk != 0;
    std::vector<std::string> ranks;
    for (const auto& r : *d.ranks) {
      std::vector<std::string> ops;
      for (const OrderOp& op : r) ops.push_back(op.name(chunks));
      ranks.push_back("[" + join(ops, ", ") + "]");
    }
    kv.push_back("ranks: [" + join(ranks, ", ") + "]");
  }
  if (d.grid_order) kv.push_back("order: " + quote(*d.grid_order));
  return std::string(spec.name) + ": {" + join(kv, ", ") + "}";
}

// ---- reading a document -------------------------------------------------------

class Reader {
 public:
  explicit Reader(const std::string& source) : source_(source) { cfg_.source = source; }

  void read_root(const YAML::Node& root) {
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
      if (!is_section(section)) {
        fail(at + ": " + unknown_section_message(section));
        continue;
      }
      if (!first_time(seen, section, k.Mark(), at, "section '" + section + "'")) continue;
      if (v.IsNull()) continue;  // "model:" with nothing under it
      if (!v.IsMap()) {
        fail(where(source_, v.Mark()) + ": section '" + section + "': expected a map of keys (" +
             join(keys_of(section), ", ") + "), found " + describe(v));
        continue;
      }
      read_section(section, v);
    }
  }

  void apply_override(const std::string& text) {
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

  void fail(const std::string& msg) { errors_.push_back(msg); }
  const std::vector<std::string>& errors() const { return errors_; }
  Config& config() { return cfg_; }

 private:
  // `directives:` — a list of one-key maps, each read into a Directive.
  void read_directives(const YAML::Node& key, const YAML::Node& list) {
    cfg_.directives.present = true;
    cfg_.locations["directives"] = where(source_, key.Mark());
    if (list.IsNull()) return;
    if (!list.IsSequence()) {
      fail(where(source_, list.Mark()) + ": directives: expected a list of directives (- split: {microbatches: 4}, "
           "- place: {pp: 2}, ...), found " + describe(list));
      return;
    }
    for (size_t i = 0; i < list.size(); ++i) read_directive(i, list[i]);
  }

  void read_directive(size_t i, const YAML::Node& item) {
    const std::string path = dpath(i);
    if (!item.IsMap() || item.size() != 1) {
      std::string found = describe(item);
      if (item.IsMap()) {
        std::vector<std::string> keys;
        for (const auto& kv : item) keys.push_back(kv.first.IsScalar() ? kv.first.Scalar() : describe(kv.first));
        found = item.size() == 0 ? "an empty map"
                                 : "a map with " + std::to_string(item.size()) + " keys (" + join(keys, ", ") +
                                       "); write each directive as its own list item, and indent its keys under it";
      }
      fail(where(source_, item.Mark()) + ": " + path +
           ": expected one directive, a one-key map such as 'split: {microbatches: 4}'; found " + found);
      return;
    }
    const YAML::Node k = item.begin()->first, v = item.begin()->second;
    const std::string at = where(source_, k.Mark());
    if (!k.IsScalar()) return fail(at + ": " + path + ": expected a directive name, found " + describe(k));
    const DirectiveSpec* spec = nullptr;
    for (const DirectiveSpec& s : directive_specs())
      if (k.Scalar() == s.name) spec = &s;
    if (!spec) {
      std::string near = closest(k.Scalar(), directive_names());
      return fail(at + ": " + path + ": unknown directive '" + k.Scalar() + "'" +
                  (near.empty() ? "" : "; did you mean '" + near + "'?") + " (directives are " +
                  join(directive_names(), ", ") + ")");
    }
    cfg_.locations[path] = at;
    Directive d;
    d.kind = spec->kind;
    const std::string base = path + "." + spec->name;
    if (spec->keys.empty()) {  // split_backward: BOOL
      std::string err = read_bool(v, d.split_backward);
      if (!err.empty()) return fail((v.IsNull() ? at : where(source_, v.Mark())) + ": " + base + ": " + err);
      cfg_.locations[base] = at;
      cfg_.directives.list.push_back(d);
      return;
    }
    if (!v.IsMap())
      return fail((v.IsNull() ? at : where(source_, v.Mark())) + ": " + base + ": expected a map of keys (" +
                  join(spec->keys, ", ") + "), found " + describe(v));
    std::map<std::string, YAML::Mark> seen;
    bool ok = true;
    for (const auto& kv : v) {
      const YAML::Node kk = kv.first, vv = kv.second;
      const std::string kat = where(source_, kk.Mark());
      if (!kk.IsScalar()) {
        fail(kat + ": " + base + ": expected a key name, found " + describe(kk));
        ok = false;
        continue;
      }
      const std::string& name = kk.Scalar();
      if (std::find(spec->keys.begin(), spec->keys.end(), name) == spec->keys.end()) {
        std::string near = closest(name, spec->keys);
        fail(kat + ": " + base + ": unknown key '" + name + "' in directive " + spec->name +
             (near.empty() ? "" : "; did you mean '" + near + "'?") + " (its keys are " + join(spec->keys, ", ") + ")");
        ok = false;
        continue;
      }
      if (!first_time(seen, name, kk.Mark(), kat, "key '" + base + "." + name + "'")) {
        ok = false;
        continue;
      }
      const std::string kpath = base + "." + name;
      const std::string vat = vv.IsNull() ? kat : where(source_, vv.Mark());
      if (read_directive_key(d, name, vv, kpath, vat)) {
        cfg_.locations[kpath] = kat;
      } else {
        ok = false;
      }
    }
    // Keys that exclude each other within one directive.
    auto both = [&](const char* a, const char* b, const std::string& why) {
      fail(cfg_.locations[base + "." + b] + ": " + base + ": give " + a + " or " + b + ", not both; " + why);
      ok = false;
    };
    if (d.stage_of_unit && d.stages) both("stage_of_unit", "stages", "both say which stage holds each unit");
    if (d.schedule && d.ranks) both("schedule", "ranks", "ranks is a hand-written schedule");
    if (d.shard_params.value_or(false) && !d.shard_grads.value_or(false)) {
      fail(cfg_.locations[base + ".shard_params"] + ": " + base +
           ": shard_params (ZeRO-3) also shards the gradients; add shard_grads: true");
      ok = false;
    }
    if ((d.shard_grads.value_or(false) || d.shard_params.value_or(false)) && d.shard_optimizer == false) {
      fail(cfg_.locations[base + ".shard_optimizer"] + ": " + base +
           ": shard_grads and shard_params also shard the optimiser state; use shard_optimizer: true or leave it out");
      ok = false;
    }
    if (ok) cfg_.directives.list.push_back(std::move(d));
  }

  // Reads one key of a directive into d; reports and returns false when the value is wrong.
  bool read_directive_key(Directive& d, const std::string& name, const YAML::Node& v, const std::string& path,
                          const std::string& vat) {
    std::string err;
    if (name == "microbatches") err = read_int(v, d.microbatches);
    else if (name == "pp") err = read_int(v, d.pp);
    else if (name == "virtual_stages") err = read_int(v, d.virtual_stages);
    else if (name == "dp") err = read_int(v, d.dp);
    else if (name == "tp") err = read_int(v, d.tp);
    else if (name == "shard_optimizer") err = read_bool(v, d.shard_optimizer);
    else if (name == "shard_grads") err = read_bool(v, d.shard_grads);
    else if (name == "shard_params") err = read_bool(v, d.shard_params);
    else if (name == "bucket_mb") err = read_double(v, d.bucket_mb);
    else if (name == "schedule") err = read_string(v, d.schedule);
    else if (name == "order") err = read_string(v, d.grid_order);
    else if (name == "stage_of_unit") return read_stage_of_unit(d, v, path, vat);
    else if (name == "stages") return read_stages(d, v, path, vat);
    else if (name == "ranks") return read_ranks(d, v, path, vat);
    if (!err.empty()) fail(vat + ": " + path + ": " + err);
    return err.empty();
  }

  bool read_stage_of_unit(Directive& d, const YAML::Node& v, const std::string& path, const std::string& vat) {
    if (!v.IsSequence()) {
      fail(vat + ": " + path + ": expected a list of stage numbers, one per unit (embed, blocks, head), found " +
           describe(v));
      return false;
    }
    std::vector<int64_t> out;
    for (size_t i = 0; i < v.size(); ++i) {
      std::optional<int64_t> s;
      std::string err = read_int(v[i], s);
      if (!err.empty()) {
        fail(where(source_, v[i].Mark()) + ": " + path + "[" + std::to_string(i) + "]: " + err);
        return false;
      }
      out.push_back(*s);
    }
    d.stage_of_unit = out;
    return true;
  }

  bool read_stages(Directive& d, const YAML::Node& v, const std::string& path, const std::string& vat) {
    if (!v.IsSequence() || v.size() == 0) {
      fail(vat + ": " + path + ": expected a list of stages, each a filter such as {blocks: \"0-3\"} or "
           "{kind: \"*\"}, found " + (v.IsSequence() ? std::string("an empty list") : describe(v)));
      return false;
    }
    std::vector<StageFilter> out;
    bool ok = true;
    for (size_t j = 0; j < v.size(); ++j) {
      const YAML::Node e = v[j];
      const std::string epath = path + "[" + std::to_string(j) + "]";
      const std::string eat = where(source_, e.Mark());
      cfg_.locations[epath] = eat;
      if (!e.IsMap() || e.size() == 0) {
        fail(eat + ": " + epath + ": expected a filter over node tags (blocks: and/or kind:), found " +
             (e.IsMap() ? std::string("an empty map") : describe(e)));
        ok = false;
        continue;
      }
      StageFilter f;
      std::map<std::string, YAML::Mark> seen;
      for (const auto& kv : e) {
        const YAML::Node fk = kv.first, fv = kv.second;
        const std::string kat = where(source_, fk.Mark());
        const std::string name = fk.IsScalar() ? fk.Scalar() : describe(fk);
        if (std::find(kStageFilterKeys.begin(), kStageFilterKeys.end(), name) == kStageFilterKeys.end()) {
          std::string near = closest(name, kStageFilterKeys);
          fail(kat + ": " + epath + ": unknown filter '" + name + "'" +
               (near.empty() ? "" : "; did you mean '" + near + "'?") + " (filters are blocks, kind)");
          ok = false;
          continue;
        }
        if (!first_time(seen, name, fk.Mark(), kat, "filter '" + epath + "." + name + "'")) {
          ok = false;
          continue;
        }
        const std::string fat = fv.IsNull() ? kat : where(source_, fv.Mark());
        std::vector<YAML::Node> items;
        if (fv.IsSequence()) {
          for (size_t q = 0; q < fv.size(); ++q) items.push_back(fv[q]);
        } else {
          items.push_back(fv);
        }
        if (items.empty()) {
          fail(fat + ": " + epath + "." + name + ": expected at least one value, found an empty list");
          ok = false;
        }
        for (const YAML::Node& it : items) {
          const std::string iat = it.IsNull() ? fat : where(source_, it.Mark());
          if (name == "blocks") {
            std::pair<int64_t, int64_t> r;
            std::string err = parse_block_range(it, r);
            if (!err.empty()) {
              fail(iat + ": " + epath + ".blocks: " + err);
              ok = false;
            } else {
              f.blocks.push_back(r);
            }
          } else if (!it.IsScalar() || std::find(kKinds.begin(), kKinds.end(), it.Scalar()) == kKinds.end()) {
            fail(iat + ": " + epath + ".kind: expected a block kind M, \"*\", \"-\", E (quote * and -), or embed, "
                 "head; found " + describe(it));
            ok = false;
          } else {
            f.kinds.push_back(it.Scalar());
          }
        }
      }
      out.push_back(f);
    }
    if (ok) d.stages = out;
    return ok;
  }

  bool read_ranks(Directive& d, const YAML::Node& v, const std::string& path, const std::string& vat) {
    if (!v.IsSequence() || v.size() == 0) {
      fail(vat + ": " + path + ": expected a list with the ops of each pipeline rank, e.g. [[F0, F1, B0, B1], "
           "[F0, B0, F1, B1]], found " + (v.IsSequence() ? std::string("an empty list") : describe(v)));
      return false;
    }
    std::vector<std::vector<OrderOp>> out;
    bool ok = true;
    for (size_t r = 0; r < v.size(); ++r) {
      const YAML::Node rv = v[r];
      const std::string rpath = path + "[" + std::to_string(r) + "]";
      const std::string rat = where(source_, rv.Mark());
      cfg_.locations[rpath] = rat;
      // A rank is a list of op strings, or one string of ops separated by spaces or commas.
      std::vector<std::pair<std::string, std::string>> texts;  // (op text, where)
      if (rv.IsSequence()) {
        for (size_t q = 0; q < rv.size(); ++q) {
          if (!rv[q].IsScalar()) {
            fail(where(source_, rv[q].Mark()) + ": " + rpath + "[" + std::to_string(q) + "]: expected " +
                 kOpGrammar + "; found " + describe(rv[q]));
            ok = false;
            continue;
          }
          texts.emplace_back(rv[q].Scalar(), where(source_, rv[q].Mark()));
        }
      } else if (rv.IsScalar()) {
        std::string word;
        for (char ch : rv.Scalar() + " ") {
          if (ch == ' ' || ch == ',' || ch == '\t' || ch == '\n') {
            if (!word.empty()) texts.emplace_back(word, rat);
            word.clear();
          } else {
            word += ch;
          }
        }
      } else {
        fail(rat + ": " + rpath + ": expected the ops of pipeline rank " + std::to_string(r) +
             " (a list such as [F0, F1, B0, B1]), found " + describe(rv));
        ok = false;
        continue;
      }
      std::vector<OrderOp> ops;
      for (size_t q = 0; q < texts.size(); ++q) {
        OrderOp op;
        const std::string opath = rpath + "[" + std::to_string(q) + "]";
        std::string err = parse_op(texts[q].first, op);
        if (!err.empty()) {
          fail(texts[q].second + ": " + opath + " (rank " + std::to_string(r) + "): " + err);
          ok = false;
          continue;
        }
        cfg_.locations[opath] = texts[q].second;
        ops.push_back(op);
      }
      out.push_back(ops);
    }
    if (ok) d.ranks = out;
    return ok;
  }

  void read_section(const std::string& section, const YAML::Node& map) {
    std::map<std::string, YAML::Mark> seen;
    for (const auto& kv : map) {
      YAML::Node k = kv.first, v = kv.second;
      std::string at = where(source_, k.Mark());
      if (!k.IsScalar()) {
        fail(at + ": section '" + section + "': expected a key name, found " + describe(k));
        continue;
      }
      const std::string& key = k.Scalar();
      const Field* f = find_field(section, key);
      if (!f) {
        fail(at + ": " + unknown_key_message(section, key));
        continue;
      }
      if (!first_time(seen, key, k.Mark(), at, "key '" + f->name() + "'")) continue;
      std::string err = assign(*f, cfg_, v);
      if (!err.empty()) {
        // yaml-cpp marks an empty value at the next token; the key is clearer.
        std::string vat = v.IsNull() ? at : where(source_, v.Mark());
        fail(vat + ": " + f->name() + ": " + err);
        continue;
      }
      cfg_.locations[f->name()] = at;
    }
  }

  bool first_time(std::map<std::string, YAML::Mark>& seen, const std::string& name, const YAML::Mark& m,
                  const std::string& at, const std::string& what) {
    auto [it, fresh] = seen.emplace(name, m);
    if (!fresh)
      fail(at + ": duplicate " + what + " (first at " + where(source_, it->second) + "); keep one of them");
    return fresh;
  }

  std::string source_;
  Config cfg_;
  std::vector<std::string> errors_;
};

// ---- validation ---------------------------------------------------------------

class Checker {
 public:
  // `names` shows a key under another name: "parallel.dp" set by a directive
  // reads "directives[2].replicate.dp".
  explicit Checker(const Config& c, std::map<std::string, std::string> names = {})
      : c_(c), names_(std::move(names)) {}

  std::string shown(const std::string& key) const {
    auto it = names_.find(key);
    return it == names_.end() ? key : it->second;
  }

  // "file:line:col: key=value" / "--set key=value" / "key=value": the start of
  // a message about one key.
  std::string head(const std::string& key, const std::string& shown) const {
    auto it = c_.locations.find(key);
    if (it == c_.locations.end()) return shown;
    if (it->second == kOverrideWhere) return std::string(kOverrideWhere) + " " + shown;
    return it->second + ": " + shown;
  }
  std::string head(const std::string& key) const { return head(key, shown(key) + "=" + value(key)); }

  // "key=value (at file:line:col)" / "(from --set)" / "(default)": a second key in a message.
  std::string ref(const std::string& key) const {
    auto it = c_.locations.find(key);
    std::string origin = it == c_.locations.end()        ? "default"
                         : it->second == kOverrideWhere ? "from --set"
                                                        : "at " + it->second;
    return shown(key) + "=" + value(key) + " (" + origin + ")";
  }

  std::string value(const std::string& key) const {
    size_t dot = key.find('.');
    const Field* f = find_field(key.substr(0, dot), key.substr(dot + 1));
    Config copy = c_;
    return format_value(f->ref(copy));
  }

  // "file:line:col: path" for a directive path (Config::locations), or "path".
  std::string at(const std::string& path) const {
    auto it = c_.locations.find(path);
    return it == c_.locations.end() ? path : it->second + ": " + path;
  }

  void fail(const std::string& msg) { errors_.push_back(msg); }
  const std::vector<std::string>& errors() const { return errors_; }

  bool at_least(const std::string& key, int64_t v, int64_t lo) {
    if (v >= lo) return true;
    fail(head(key) + ": must be at least " + std::to_string(lo));
    return false;
  }
  // lo <= v <= hi; `why` says what the upper bound protects.
  bool within(const std::string& key, int64_t v, int64_t lo, int64_t hi, const std::string& why) {
    if (!at_least(key, v, lo)) return false;
    if (v <= hi) return true;
    fail(head(key) + ": must be at most " + std::to_string(hi) + " (" + why + "; docs/config.md, Bounds)");
    return false;
  }
  // The product of `factors` (label, value) is at most `limit`, computed in
  // checked arithmetic; else one message from `key` naming every factor and
  // the figure, with the other keys involved as references.
  bool product_within(const std::string& key, const std::vector<std::string>& others, const std::string& what,
                      const std::vector<std::pair<std::string, int64_t>>& factors, int64_t limit,
                      const std::string& limit_text) {
    std::vector<int64_t> values;
    std::string labels, numbers;
    for (const auto& [label, v] : factors) {
      values.push_back(v);
      labels += (labels.empty() ? "" : " x ") + label;
      numbers += (numbers.empty() ? "" : " x ") + std::to_string(v);
    }
    const std::optional<int64_t> p = checked_product(values);
    if (p && *p <= limit) return true;
    std::vector<std::string> refs;
    for (const std::string& k : others) refs.push_back(ref(k));
    fail(head(key) + ": " + what + " " + labels + " = " + numbers + " = " +
         (p ? std::to_string(*p) : std::string("more than 2^63")) + " is above the bound " + limit_text +
         (refs.empty() ? std::string() : " (" + join(refs, ", ") + ")") +
         "; use smaller values (docs/config.md, Bounds)");
    return false;
  }
  void real(const std::string& key, double v, double lo, bool lo_open, double hi, bool hi_open,
            const std::string& range) {
    bool ok = (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
    if (!ok) fail(head(key) + ": must be " + range);
  }

 private:
  Config c_;
  std::map<std::string, std::string> names_;
  std::vector<std::string> errors_;
};

std::string multiples_hint(int64_t v, int64_t m) {
  const int64_t lo = v / m * m;
  if (lo > std::numeric_limits<int64_t>::max() - m) return std::to_string(lo);  // no multiple above fits
  const int64_t hi = lo + m;
  return lo > 0 ? std::to_string(lo) + " or " + std::to_string(hi) : std::to_string(hi);
}

// Divisors of n nearest to v, below and above: "32 or 64".
std::string divisors_hint(int64_t n, int64_t v) {
  int64_t below = 0, above = 0;
  for (int64_t d = std::min(v, n); d >= 1; --d)
    if (n % d == 0) { below = d; break; }
  for (int64_t d = std::max<int64_t>(v, 1); d <= n; ++d)
    if (n % d == 0) { above = d; break; }
  if (below && above && below != above) return std::to_string(below) + " or " + std::to_string(above);
  return std::to_string(below ? below : above);
}

// ---- directives applied onto the shorthand --------------------------------------

struct Applied {
  Config cfg;                                // parallel: the shorthand with every directive applied
  std::map<std::string, std::string> names;  // "parallel.dp" -> "directives[2].replicate.dp"
  int place_from = -1;                       // the last place directive giving stage_of_unit or stages
  int order_from = -1;                       // the order directive giving ranks, when the last order does
};

Applied apply_directives(const Config& c) {
  Applied a{c, {}, -1, -1};
  ParallelConfig& p = a.cfg.parallel;
  // Messages about `key` now name the directive's path and point at it.
  auto from = [&](const std::string& key, const std::string& path, const std::string& location_key) {
    a.names[key] = path;
    auto it = c.locations.find(location_key);
    if (it != c.locations.end()) a.cfg.locations[key] = it->second;
    else a.cfg.locations.erase(key);
  };
  for (size_t i = 0; i < c.directives.list.size(); ++i) {
    const Directive& d = c.directives.list[i];
    const std::string base = dpath(i) + "." + spec_of(d.kind).name;
    auto take = [&](const auto& v, auto& field, const char* key, const char* name) {
      if (!v) return;
      field = *v;
      from(std::string("parallel.") + key, base + "." + name, base + "." + name);
    };
    switch (d.kind) {
      case DirectiveKind::SPLIT: take(d.microbatches, p.microbatches, "microbatches", "microbatches"); break;
      case DirectiveKind::SPLIT_BACKWARD:
        if (d.split_backward) p.split_backward = *d.split_backward, from("parallel.split_backward", base, base);
        break;
      case DirectiveKind::PLACE:
        take(d.pp, p.pp, "pp", "pp");
        take(d.virtual_stages, p.virtual_stages, "virtual_stages", "virtual_stages");
        if (d.stage_of_unit || d.stages) a.place_from = static_cast<int>(i);
        break;
      case DirectiveKind::REPLICATE:
        take(d.dp, p.dp, "dp", "dp");
        take(d.bucket_mb, p.bucket_mb, "bucket_mb", "bucket_mb");
        if (d.shard_optimizer || d.shard_grads || d.shard_params) {
          p.zero = d.shard_params.value_or(false)      ? 3
                   : d.shard_grads.value_or(false)     ? 2
                   : d.shard_optimizer.value_or(false) ? 1
                                                       : 0;
          const char* key = d.shard_params ? "shard_params" : d.shard_grads ? "shard_grads" : "shard_optimizer";
          from("parallel.zero", base + ".zero", base + "." + key);
        }
        break;
      case DirectiveKind::SHARD: take(d.tp, p.tp, "tp", "tp"); break;
      case DirectiveKind::ORDER:
        if (d.schedule) a.order_from = -1;
        take(d.schedule, p.schedule, "schedule", "schedule");
        if (d.ranks) a.order_from = static_cast<int>(i);
        break;
      case DirectiveKind::GRID: take(d.grid_order, p.order, "order", "order"); break;
    }
  }
  return a;
}

bool pattern_ok(const std::string& pattern) {
  return !pattern.empty() && pattern.find_first_not_of("M*-") == std::string::npos;
}

// Units as the IR names them: embed (unit 0), layers.<block> (units 1..n), head (unit n+1).
std::string unit_name(const std::string& pattern, size_t u) {
  if (u == 0) return "embed";
  if (u == pattern.size() + 1) return "head";
  return "layers." + std::to_string(u - 1);
}
std::string unit_desc(const std::string& pattern, size_t u) {
  if (u == 0 || u == pattern.size() + 1) return unit_name(pattern, u);
  return unit_name(pattern, u) + " (block " + std::to_string(u - 1) + ", '" + std::string(1, pattern[u - 1]) + "')";
}

bool selects(const StageFilter& f, const std::string& pattern, size_t u) {
  const bool embed = u == 0, head = u == pattern.size() + 1;
  if (!f.blocks.empty()) {
    if (embed || head) return false;
    const auto b = static_cast<int64_t>(u - 1);
    bool in = false;
    for (auto [lo, hi] : f.blocks) in |= b >= lo && b <= hi;
    if (!in) return false;
  }
  if (!f.kinds.empty()) {
    const std::string kind = embed ? "embed" : head ? "head" : std::string(1, pattern[u - 1]);
    if (std::find(f.kinds.begin(), f.kinds.end(), kind) == f.kinds.end()) return false;
  }
  return true;
}

// The first problem of a stage per unit (stages 0..n_stages-1 along the
// model, each a contiguous non-empty run), or "" and bad_unit untouched.
std::string check_stage_sequence(const std::vector<int64_t>& st, int64_t n_stages, const std::string& pattern,
                                 size_t& bad_unit) {
  for (size_t u = 0; u < st.size(); ++u) {
    const int64_t s = st[u], prev = u > 0 ? st[u - 1] : 0;
    const std::string name = unit_desc(pattern, u), stage = std::to_string(s);
    std::string err;
    if (s < 0 || s >= n_stages)
      err = "unit " + name + " is on stage " + stage + ", but there are " + std::to_string(n_stages) + " stages (0.." +
            std::to_string(n_stages - 1) + ")";
    else if (u == 0 && s != 0)
      err = "the first unit, embed, is on stage " + stage + ", so stage 0 holds no unit; stages run along the model";
    else if (s < prev)
      err = "unit " + name + " is on stage " + stage + " but comes after " + unit_name(pattern, u - 1) +
            " on stage " + std::to_string(prev) + "; stages run along the model, each a contiguous run of units";
    else if (s > prev + 1)
      err = "unit " + name + " is on stage " + stage + " right after " + unit_name(pattern, u - 1) + " on stage " +
            std::to_string(prev) + ", so stage " + std::to_string(prev + 1) + " holds no unit";
    else if (u + 1 == st.size() && s != n_stages - 1)
      err = "the last unit, head, is on stage " + stage + ", so stage " + std::to_string(s + 1) +
            (s + 2 < n_stages ? ".." + std::to_string(n_stages - 1) : "") + " holds no unit";
    if (!err.empty()) {
      bad_unit = u;
      return err;
    }
  }
  return "";
}

// The stage of every unit from the `stages:` filters of directive `di`;
// problems are appended to `errors` (then the result is empty).
std::vector<int64_t> resolve_filters(const Config& c, size_t di, std::vector<std::string>& errors) {
  const Checker ck(c);
  const std::vector<StageFilter>& stages = *c.directives.list[di].stages;
  const std::string& pattern = c.model.pattern;
  const std::string base = dpath(di) + ".place.stages";
  const size_t n_units = pattern.size() + 2, before = errors.size();
  const int64_t n_stages = static_cast<int64_t>(stages.size());
  std::vector<int64_t> st(n_units, -1);
  for (size_t j = 0; j < stages.size(); ++j) {
    const std::string path = base + "[" + std::to_string(j) + "]";
    bool range_ok = true;
    for (auto [lo, hi] : stages[j].blocks)
      if (hi >= static_cast<int64_t>(pattern.size())) {
        errors.push_back(ck.at(path) + ": block " + std::to_string(hi) + " does not exist; the pattern \"" + pattern +
                         "\" has blocks 0.." + std::to_string(pattern.size() - 1));
        range_ok = false;
        break;
      }
    size_t count = 0;
    for (size_t u = 0; u < n_units; ++u) {
      if (!selects(stages[j], pattern, u)) continue;
      ++count;
      if (st[u] >= 0) {
        errors.push_back(ck.at(path) + ": unit " + unit_desc(pattern, u) + " is already on stage " +
                         std::to_string(st[u]) + " (" + ck.at(base + "[" + std::to_string(st[u]) + "]") +
                         "); a unit belongs to one stage");
        continue;
      }
      st[u] = static_cast<int64_t>(j);
    }
    if (count == 0 && range_ok)
      errors.push_back(ck.at(path) + ": stage " + std::to_string(j) + " selects no unit of the pattern \"" + pattern +
                       "\"");
  }
  if (st.front() < 0) st.front() = 0;             // the embedding goes with the first stage
  if (st.back() < 0) st.back() = n_stages - 1;    // the head with the last
  for (size_t u = 0; u < n_units; ++u)
    if (st[u] < 0)
      errors.push_back(ck.at(base) + ": unit " + unit_desc(pattern, u) +
                       " is on no stage; every unit must be on exactly one (add it to a stage's blocks)");
  if (errors.size() > before) return {};
  size_t bad = 0;
  std::string err = check_stage_sequence(st, n_stages, pattern, bad);
  if (!err.empty()) {
    // Point at the filter that put the unit there.
    const int64_t s = st[bad];
    bool named = s >= 0 && s < n_stages && selects(stages[static_cast<size_t>(s)], pattern, bad);
    errors.push_back(ck.at(named ? base + "[" + std::to_string(s) + "]" : base) + ": " + err);
    return {};
  }
  return st;
}

// A hand-written order (order: {ranks: ...}) against the effective strategy.
void check_custom_order(const Config& c, const Applied& a, bool dims_ok, Checker& ck) {
  const ParallelConfig& p = a.cfg.parallel;
  const auto& ranks = *c.directives.list[static_cast<size_t>(a.order_from)].ranks;
  const std::string base = dpath(static_cast<size_t>(a.order_from)) + ".order.ranks";
  if (dims_ok && static_cast<int64_t>(ranks.size()) != p.pp)
    ck.fail(ck.at(base) + ": lists the ops of " + std::to_string(ranks.size()) + " rank(s), but there are " +
            std::to_string(p.pp) + " pipeline ranks (" + ck.ref("parallel.pp") + "); give one list per pipeline rank");
  const bool with_chunk = p.virtual_stages > 1;
  std::map<std::tuple<std::string, int64_t, int64_t>, std::string> seen;  // op -> path of its first place
  std::string fused, split;                                               // path of a first B, of a first BI/BW
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string rank = "rank " + std::to_string(r);
    if (ranks[r].empty()) {
      ck.fail(ck.at(base + "[" + std::to_string(r) + "]") + ": " + rank +
              " has no ops; list its forwards and backwards of every microbatch");
      return;
    }
    seen.clear();
    for (size_t q = 0; q < ranks[r].size(); ++q) {
      const OrderOp& op = ranks[r][q];
      const std::string path = base + "[" + std::to_string(r) + "][" + std::to_string(q) + "]";
      const std::string head = ck.at(path) + ": " + rank + " runs " + op.name(with_chunk || op.chunk != 0);
      if (p.microbatches >= 1 && op.microbatch >= p.microbatches)
        return ck.fail(head + ", but there are " + std::to_string(p.microbatches) + " microbatches (0.." +
                       std::to_string(p.microbatches - 1) + "; " + ck.ref("parallel.microbatches") + ")");
      if (p.virtual_stages >= 1 && op.chunk >= p.virtual_stages)
        return ck.fail(head + ", but each rank holds " + std::to_string(p.virtual_stages) + " model chunk(s) (0.." +
                       std::to_string(p.virtual_stages - 1) + "; " + ck.ref("parallel.virtual_stages") + ")");
      auto [it, fresh] = seen.emplace(std::make_tuple(op.pass, op.microbatch, op.chunk), path);
      if (!fresh)
        return ck.fail(head + " twice (first as " + ck.at(it->second) + "); each op runs once per step");
      if (op.pass == "F") continue;
      std::string& mine = op.pass == "B" ? fused : split;
      if (mine.empty()) mine = path;
      if (!fused.empty() && !split.empty())
        return ck.fail(head + ", but " + ck.at(op.pass == "B" ? split : fused) + " is a " +
                       (op.pass == "B" ? "split" : "fused") +
                       " backward; write fused backwards (B) throughout, or split ones (BI and BW)");
      if (op.pass == "B" && p.split_backward)
        return ck.fail(head + ", a fused backward, but " + ck.ref("parallel.split_backward") +
                       " splits every backward; write BI" + std::to_string(op.microbatch) + " and BW" +
                       std::to_string(op.microbatch) + " instead");
    }
  }
}

// Stages a place directive gives, against the units and pp x chunks.
void check_placement(const Config& c, const Applied& a, int64_t n_stages, Checker& ck) {
  const size_t di = static_cast<size_t>(a.place_from);
  const Directive& d = c.directives.list[di];
  const std::string base = dpath(di) + ".place";
  const std::string& pattern = c.model.pattern;
  const size_t n_units = pattern.size() + 2;
  const int64_t pp = std::max<int64_t>(1, a.cfg.parallel.pp);
  const std::string stages_text = "pp x chunks per rank = " + std::to_string(pp) + " x " +
                                  std::to_string(n_stages / pp) + " = " + std::to_string(n_stages) + " stages (" +
                                  ck.ref("parallel.pp") + ")";
  if (d.stages) {
    if (n_stages > 0 && static_cast<int64_t>(d.stages->size()) != n_stages)
      ck.fail(ck.at(base + ".stages") + ": lists " + std::to_string(d.stages->size()) + " stages, but " + stages_text);
    std::vector<std::string> errors;
    resolve_filters(c, di, errors);
    for (const std::string& e : errors) ck.fail(e);
    return;
  }
  const std::vector<int64_t>& st = *d.stage_of_unit;
  if (st.size() != n_units)
    return ck.fail(ck.at(base + ".stage_of_unit") + ": lists " + std::to_string(st.size()) +
                   " stages, one per unit, but the model has " + std::to_string(n_units) + " units (embed, " +
                   std::to_string(pattern.size()) + " blocks of \"" + pattern + "\", head)");
  int64_t count = n_stages;
  if (count <= 0) count = st.empty() ? 1 : *std::max_element(st.begin(), st.end()) + 1;
  size_t bad = 0;
  std::string err = check_stage_sequence(st, count, pattern, bad);
  if (!err.empty()) ck.fail(ck.at(base + ".stage_of_unit") + ": " + err);
}

// Upper bounds of the sizes (docs/config.md, "Bounds"): far above any model
// that trains, low enough that every product piper forms from them fits 64
// bits. Whether a model fits in memory is checked by `train` before it
// allocates (src/runtime/fit.cpp).
constexpr int64_t kMaxVocab = 2147483647;            // 2^31 - 1: token ids are 32-bit
constexpr int64_t kMaxWidth = int64_t{1} << 20;      // d_model
constexpr int64_t kMaxFfn = int64_t{1} << 24;        // ffn_hidden
constexpr int64_t kMaxSmall = int64_t{1} << 16;      // heads, groups
constexpr int64_t kMaxState = 4096;                  // d_state, head_dim: a P x N state per Mamba-2 head
constexpr int64_t kMaxExpand = 1024;
constexpr int64_t kMaxConv = 1024;
constexpr int64_t kMaxChunk = 4096;                  // ssd_chunk: a [chunk, chunk] scratch per thread
constexpr int64_t kMaxBlocks = 4096;                 // pattern length
constexpr int64_t kMaxMatrix = int64_t{1} << 40;     // elements of one weight matrix
constexpr const char* kMaxMatrixText = "2^40 = 1099511627776 elements for one weight matrix";
constexpr int64_t kMaxBatch = int64_t{1} << 24;      // global_batch
constexpr int64_t kMaxSeq = int64_t{1} << 24;        // seq_len
constexpr int64_t kMaxStepTokens = int64_t{1} << 36; // global_batch x seq_len
constexpr int64_t kMaxRunTokens = int64_t{1} << 62;  // steps x global_batch x seq_len
constexpr int64_t kMaxSampleTokens = int64_t{1} << 16;  // one forward pass per generated token
constexpr int64_t kMaxThreads = 4096;
constexpr int64_t kMaxRanks = int64_t{1} << 16;      // dp, tp, pp each
constexpr int64_t kMaxMicrobatches = int64_t{1} << 16;
constexpr int64_t kMaxVirtualStages = 4096;
constexpr int64_t kMaxUnitPasses = int64_t{1} << 20;  // (blocks + 2) x microbatches
constexpr double kMaxBucketMb = 1048576.0;           // 1 TiB
constexpr double kMaxCommTimeout = 1e9;              // seconds (~31 years): fits a nanosecond clock

void check_model(const ModelConfig& m, Checker& ck) {
  bool sizes_ok = true;
  const std::tuple<const char*, int64_t, int64_t, const char*> sizes[] = {
      {"model.vocab_size", m.vocab_size, kMaxVocab, "token ids are 32-bit"},
      {"model.d_model", m.d_model, kMaxWidth, "2^20, the largest model width"},
      {"model.n_heads", m.n_heads, kMaxSmall, "2^16"},
      {"model.n_kv_heads", m.n_kv_heads, kMaxSmall, "2^16"},
      {"model.ffn_hidden", m.ffn_hidden, kMaxFfn, "2^24, the largest MLP width"},
      {"model.d_state", m.d_state, kMaxState, "each Mamba-2 head holds a head_dim x d_state state"},
      {"model.head_dim", m.head_dim, kMaxState, "each Mamba-2 head holds a head_dim x d_state state"},
      {"model.expand", m.expand, kMaxExpand, "d_inner = expand x d_model"},
      {"model.n_groups", m.n_groups, kMaxSmall, "2^16"},
      {"model.d_conv", m.d_conv, kMaxConv, "the causal conv width"},
      {"model.ssd_chunk", m.ssd_chunk, kMaxChunk,
       "the SSD scan holds a chunk x chunk scratch per thread; a chunk longer than train.seq_len is one chunk"}};
  for (auto [key, v, hi, why] : sizes) sizes_ok &= ck.within(key, v, 1, hi, why);
  ck.real("model.rope_theta", m.rope_theta, 0, true, HUGE_VAL, false, "> 0 (usually 10000)");
  if (static_cast<int64_t>(m.pattern.size()) > kMaxBlocks) {
    ck.fail(ck.head("model.pattern", "model.pattern") + ": " + std::to_string(m.pattern.size()) +
            " blocks; the pattern may have at most " + std::to_string(kMaxBlocks) +
            " (docs/config.md, Bounds)");
    sizes_ok = false;
  }

  const std::string symbols = "M (Mamba-2), * (attention) or - (MLP)";
  if (m.pattern.empty())
    ck.fail(ck.head("model.pattern") + ": the pattern is empty; it needs one symbol per block: " + symbols);
  for (size_t i = 0; i < m.pattern.size(); ++i) {
    char s = m.pattern[i];
    if (s == 'E') {
      ck.fail(ck.head("model.pattern", "model.pattern") + ": MoE blocks ('E') are not supported yet (pattern \"" +
              m.pattern + "\", block " + std::to_string(i) + "); use " + symbols);
      break;
    }
    if (s != 'M' && s != '*' && s != '-') {
      ck.fail(ck.head("model.pattern") + ": '" + std::string(1, s) + "' (block " + std::to_string(i) +
              ") is not a block symbol; use " + symbols);
      break;
    }
  }
  if (!sizes_ok) return;

  // Weight matrices, in checked arithmetic (the sizes above keep d_inner, the
  // in_proj rows and d_model x d_model far inside 64 bits).
  const bool attn = m.pattern.find('*') != std::string::npos, mamba = m.pattern.find('M') != std::string::npos;
  sizes_ok &= ck.product_within("model.vocab_size", {"model.d_model"}, "the embedding (and head) matrix",
                                {{"vocab_size", m.vocab_size}, {"d_model", m.d_model}}, kMaxMatrix, kMaxMatrixText);
  if (m.pattern.find('-') != std::string::npos)
    sizes_ok &= ck.product_within("model.ffn_hidden", {"model.d_model"}, "the MLP gate/up matrix",
                                  {{"ffn_hidden", m.ffn_hidden}, {"d_model", m.d_model}}, kMaxMatrix, kMaxMatrixText);
  if (mamba)
    sizes_ok &= ck.product_within(
        "model.d_model", {"model.expand", "model.n_groups", "model.d_state", "model.head_dim"},
        "the Mamba-2 in_proj matrix",
        {{"(2 d_inner + 2 n_groups d_state + heads)", m.in_proj_rows()}, {"d_model", m.d_model}}, kMaxMatrix,
        kMaxMatrixText);
  if (!sizes_ok) return;

  if (attn) {
    if (m.d_model % m.n_heads != 0) {
      ck.fail(ck.head("model.d_model") + ": not divisible by " + ck.ref("model.n_heads") +
              "; attention needs whole heads: use d_model " + multiples_hint(m.d_model, m.n_heads) +
              ", or n_heads " + divisors_hint(m.d_model, m.n_heads));
    } else if (m.attn_head_dim() % 2 != 0) {
      ck.fail(ck.head("model.d_model") + ": attention head dim d_model/n_heads = " + std::to_string(m.d_model) +
              "/" + std::to_string(m.n_heads) + " = " + std::to_string(m.attn_head_dim()) +
              " is odd; RoPE rotates pairs of channels, so it must be even (change d_model or " +
              ck.ref("model.n_heads") + ")");
    }
    if (m.n_heads % m.n_kv_heads != 0)
      ck.fail(ck.head("model.n_heads") + ": not divisible by " + ck.ref("model.n_kv_heads") +
              "; grouped-query attention shares each kv head among n_heads/n_kv_heads query heads: use n_kv_heads " +
              divisors_hint(m.n_heads, m.n_kv_heads));
  }
  if (mamba) {
    int64_t di = m.d_inner();
    std::string di_text = "d_inner = expand(" + std::to_string(m.expand) + ") x d_model(" +
                          std::to_string(m.d_model) + ") = " + std::to_string(di);
    if (di % m.head_dim != 0) {
      ck.fail(ck.head("model.head_dim") + ": does not divide " + di_text + "; use head_dim " +
              divisors_hint(di, m.head_dim));
    } else if (m.mamba_heads() % m.n_groups != 0) {
      ck.fail(ck.head("model.n_groups") + ": does not divide the Mamba-2 head count d_inner/head_dim = " +
              std::to_string(di) + "/" + std::to_string(m.head_dim) + " = " + std::to_string(m.mamba_heads()) +
              "; use n_groups " + divisors_hint(m.mamba_heads(), m.n_groups));
    } else if (di % m.n_groups != 0) {
      ck.fail(ck.head("model.n_groups") + ": does not divide " + di_text + "; use n_groups " +
              divisors_hint(di, m.n_groups));
    }
  }
}

void check_train(const TrainConfig& t, Checker& ck) {
  bool sizes_ok = ck.at_least("train.steps", t.steps, 1);
  sizes_ok &= ck.within("train.global_batch", t.global_batch, 1, kMaxBatch, "2^24 sequences per step");
  sizes_ok &= ck.within("train.seq_len", t.seq_len, 1, kMaxSeq, "2^24 tokens per sequence");
  if (sizes_ok &&
      ck.product_within("train.global_batch", {"train.seq_len"}, "the tokens per step",
                        {{"global_batch", t.global_batch}, {"seq_len", t.seq_len}}, kMaxStepTokens,
                        "2^36 = 68719476736 tokens per step"))
    ck.product_within("train.steps", {"train.global_batch", "train.seq_len"}, "the tokens of the run",
                      {{"steps", t.steps}, {"global_batch", t.global_batch}, {"seq_len", t.seq_len}}, kMaxRunTokens,
                      "2^62 tokens (the sample index of the data order is 64-bit)");
  ck.real("train.lr", t.lr, 0, true, HUGE_VAL, false, "> 0 (typical: 1e-4 .. 3e-3)");
  ck.real("train.min_lr_ratio", t.min_lr_ratio, 0, false, 1, false, "in [0, 1]");
  ck.real("train.weight_decay", t.weight_decay, 0, false, HUGE_VAL, false, ">= 0 (0 = none)");
  ck.real("train.beta1", t.beta1, 0, false, 1, true, "in [0, 1) (typical: 0.9)");
  ck.real("train.beta2", t.beta2, 0, false, 1, true, "in [0, 1) (typical: 0.95)");
  ck.real("train.eps", t.eps, 0, true, HUGE_VAL, false, "> 0 (typical: 1e-8)");
  ck.real("train.grad_clip", t.grad_clip, 0, false, HUGE_VAL, false, ">= 0 (0 = no clipping)");
  ck.at_least("train.warmup_steps", t.warmup_steps, 0);
  ck.at_least("train.log_every", t.log_every, 1);
  ck.at_least("train.sample_every", t.sample_every, 0);
  ck.within("train.sample_tokens", t.sample_tokens, 1, kMaxSampleTokens, "2^16 tokens per generated sample, one forward pass each");
  ck.within("train.threads", t.threads, 0, kMaxThreads, "OpenMP threads per rank");
}

void check_parallel(const Config& original, const Applied& a, int world_size, Checker& ck) {
  const Config& c = a.cfg;
  const ParallelConfig& p = c.parallel;
  const bool custom = a.order_from >= 0;
  const std::string ranks_why = "2^16 ranks along one axis of the rank grid";
  bool dims_ok = ck.within("parallel.dp", p.dp, 1, kMaxRanks, ranks_why);
  dims_ok &= ck.within("parallel.tp", p.tp, 1, kMaxRanks, ranks_why);
  dims_ok &= ck.within("parallel.pp", p.pp, 1, kMaxRanks, ranks_why);
  bool mb_ok = ck.within("parallel.microbatches", p.microbatches, 1, kMaxMicrobatches, "2^16 microbatches per step");
  bool vs_ok = ck.within("parallel.virtual_stages", p.virtual_stages, 1, kMaxVirtualStages, "model chunks per rank");
  bool zero_ok = p.zero >= 0 && p.zero <= 3;
  if (!zero_ok) ck.fail(ck.head("parallel.zero") + ": must be 0, 1, 2 or 3 (ZeRO stage)");
  if (std::find(kSchedules.begin(), kSchedules.end(), p.schedule) == kSchedules.end()) {
    std::string near = closest(p.schedule, kSchedules);
    ck.fail(ck.head("parallel.schedule") + ": unknown schedule; expected one of " + join(kSchedules, ", ") +
            (near.empty() ? "" : " (did you mean '" + near + "'?)"));
  }

  // The plan holds a node per unit, microbatch and pass: its size, and the time to build it.
  if (mb_ok && pattern_ok(c.model.pattern))
    ck.product_within("parallel.microbatches", {"model.pattern"}, "the unit passes of a step",
                      {{"(blocks + 2)", static_cast<int64_t>(c.model.pattern.size()) + 2},
                       {"microbatches", p.microbatches}},
                      kMaxUnitPasses, "2^20 = 1048576 (the plan holds nodes for each unit and microbatch)");
  // dims_ok and mb_ok bound these products far inside 64 bits; checked all the same.
  const int64_t dp_mb = checked_product({p.dp, p.microbatches}).value_or(INT64_MAX);
  const int64_t dp_tp_pp = checked_product({p.dp, p.tp, p.pp}).value_or(INT64_MAX);
  if (dims_ok && mb_ok && c.train.global_batch >= 1 && c.train.global_batch % dp_mb != 0) {
    int64_t m = dp_mb;
    ck.fail(ck.head("train.global_batch") + ": not divisible by dp x microbatches = " + std::to_string(p.dp) +
            " x " + std::to_string(p.microbatches) + " = " + std::to_string(m) + " (" + ck.ref("parallel.dp") +
            ", " + ck.ref("parallel.microbatches") + "); use global_batch " +
            multiples_hint(c.train.global_batch, m));
  }

  if (world_size < 1) ck.fail("world size " + std::to_string(world_size) + " must be at least 1");
  if (dims_ok && world_size >= 1 && dp_tp_pp != world_size) {
    int64_t prod = dp_tp_pp;
    ck.fail("world size " + std::to_string(world_size) + " != dp(" + std::to_string(p.dp) + ") x tp(" +
            std::to_string(p.tp) + ") x pp(" + std::to_string(p.pp) + ") = " + std::to_string(prod) + "; launch " +
            std::to_string(prod) + " ranks (mpirun -n " + std::to_string(prod) + ") or change " +
            ck.ref("parallel.dp") + ", " + ck.ref("parallel.tp") + ", " + ck.ref("parallel.pp") +
            " so that their product is " + std::to_string(world_size));
  }

  if (dims_ok && p.tp > 1) {
    // Megatron's rules: whole heads, kv heads, groups and vocabulary rows per tp rank.
    const ModelConfig& m = c.model;
    auto need = [&](const char* what, int64_t n, const std::string& key) {
      if (n % p.tp != 0)
        ck.fail(ck.head("parallel.tp") + ": " + what + " (" + key + " = " +
                std::to_string(n) + ") must divide by tp; use a tp that divides " + std::to_string(n));
    };
    const bool attn = m.pattern.find('*') != std::string::npos, mamba = m.pattern.find('M') != std::string::npos;
    need("the vocabulary (vocab-parallel embedding and head)", m.vocab_size, "model.vocab_size");
    if (attn) need("the attention heads", m.n_heads, "model.n_heads");
    if (attn) need("the key/value heads", m.n_kv_heads, "model.n_kv_heads");
    if (m.pattern.find('-') != std::string::npos) need("the MLP hidden size", m.ffn_hidden, "model.ffn_hidden");
    if (mamba && m.head_dim > 0) need("the Mamba-2 heads", m.mamba_heads(), "d_inner / head_dim");
    if (mamba) need("the Mamba-2 groups", m.n_groups, "model.n_groups");
  }
  if (zero_ok && p.zero > 0 && dims_ok && p.dp == 1)
    ck.fail(ck.head("parallel.zero") +
            ": ZeRO shards over data-parallel ranks and " + ck.ref("parallel.dp") + "; use dp >= 2 or zero 0");
  // A hand-written order holds virtual_stages chunks per rank (stage = chunk x pp + rank); a named
  // schedule has its own rule.
  const bool interleaved = p.schedule == "interleaved", dualpipev = p.schedule == "dualpipev";
  if (vs_ok && !custom && interleaved && p.virtual_stages < 2)
    ck.fail(ck.head("parallel.virtual_stages") + ": the interleaved schedule needs virtual_stages >= 2 (" +
            ck.ref("parallel.schedule") + ")");
  if (vs_ok && !custom && dualpipev && p.virtual_stages > 2)
    ck.fail(ck.head("parallel.virtual_stages") + ": dualpipev holds exactly 2 model chunks per rank; use 1 or 2 "
            "with " + ck.ref("parallel.schedule"));
  if (vs_ok && !custom && !interleaved && !dualpipev && p.virtual_stages != 1)
    ck.fail(ck.head("parallel.virtual_stages") + ": only the interleaved schedule uses virtual stages; use 1 "
            "with " + ck.ref("parallel.schedule") + " (dualpipev always holds 2 chunks per rank; a hand-written "
            "order, any number)");
  if (custom) check_custom_order(original, a, dims_ok, ck);
  if (a.place_from >= 0 && pattern_ok(c.model.pattern)) {
    const int64_t chunks = !custom && dualpipev ? 2 : p.virtual_stages;
    check_placement(original, a, dims_ok && vs_ok ? p.pp * chunks : 0, ck);
  }
  ck.real("parallel.bucket_mb", p.bucket_mb, 0, true, kMaxBucketMb, false,
          "> 0 and at most 1048576 MiB (1 TiB) (typical: 25)");
  ck.real("parallel.comm_timeout_s", p.comm_timeout_s, 0, true, kMaxCommTimeout, false,
          "> 0 and at most 1e9 seconds");
  if (p.order.empty()) ck.fail(ck.head("parallel.order") + ": empty; use e.g. tp-dp-pp");
}

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

}  // namespace

Config parse(const std::string& yaml_text, const std::string& source, const std::vector<std::string>& overrides) {
  Documents docs;
  try {
    docs = load_documents(normalise_line_breaks(yaml_text));
  } catch (const YAML::Exception& e) {
    throw ConfigError(where(source, e.mark) + ": YAML syntax error: " + e.msg);
  }
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

Config load(const std::string& path, const std::vector<std::string>& overrides) {
  return parse(read_file(path), path, overrides);
}

void validate(const Config& cfg, int world_size) {
  // Parallel values are checked as the directives leave them, and named by the directive that set them.
  const Applied a = apply_directives(cfg);
  Checker ck(a.cfg, a.names);
  check_model(cfg.model, ck);
  check_train(cfg.train, ck);
  ck.at_least("checkpoint.every", cfg.checkpoint.every, 0);
  ck.at_least("checkpoint.keep", cfg.checkpoint.keep, 1);
  if (cfg.checkpoint.on_error != "stop" && cfg.checkpoint.on_error != "continue")
    ck.fail(ck.head("checkpoint.on_error") + ": must be 'stop' (end the job, exit 3) or 'continue' (warn and "
            "train on without that checkpoint), not '" + cfg.checkpoint.on_error + "'");
  if (cfg.data.path.empty()) ck.fail(ck.head("data.path") + ": must name the token file (docs/data.md)");
  check_parallel(cfg, a, world_size, ck);
  if (!ck.errors().empty()) throw ConfigError(join(ck.errors(), "\n"));
}

EffectiveStrategy effective_strategy(const Config& cfg) {
  const Applied a = apply_directives(cfg);
  EffectiveStrategy e;
  e.parallel = a.cfg.parallel;
  if (a.place_from >= 0) {
    const Directive& d = cfg.directives.list[static_cast<size_t>(a.place_from)];
    if (d.stage_of_unit) {
      e.stage_of_unit = *d.stage_of_unit;
    } else {
      std::vector<std::string> errors;
      e.stage_of_unit = resolve_filters(cfg, static_cast<size_t>(a.place_from), errors);
      if (!errors.empty()) throw ConfigError(join(errors, "\n"));
    }
  }
  if (a.order_from >= 0) e.order_ranks = *cfg.directives.list[static_cast<size_t>(a.order_from)].ranks;
  return e;
}

const char* directive_name(DirectiveKind k) { return spec_of(k).name; }

std::string OrderOp::name(bool with_chunk) const {
  std::string s = pass + std::to_string(microbatch);
  if (with_chunk) s += "." + std::to_string(chunk);
  return s;
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
  return out;
}

}  // namespace piper::config
