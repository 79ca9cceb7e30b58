// config.cpp — reads a run config from YAML plus --set overrides, validates it, and writes it back out.
#include "config/config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>
#include <variant>

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

const std::vector<std::string> kSections = {"model", "train", "data", "parallel"};
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
  std::string near = closest(section, kSections);
  if (!near.empty()) msg += "; did you mean '" + near + "'?";
  return msg + " (sections are " + join(kSections, ", ") + ")";
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
  explicit Checker(const Config& c) : c_(c) {}

  // "file:line:col: key=value" / "--set key=value" / "key=value": the start of
  // a message about one key.
  std::string head(const std::string& key, const std::string& shown) const {
    auto it = c_.locations.find(key);
    if (it == c_.locations.end()) return shown;
    if (it->second == kOverrideWhere) return std::string(kOverrideWhere) + " " + shown;
    return it->second + ": " + shown;
  }
  std::string head(const std::string& key) const { return head(key, key + "=" + value(key)); }

  // "key=value (at file:line:col)" / "(from --set)" / "(default)": a second key in a message.
  std::string ref(const std::string& key) const {
    auto it = c_.locations.find(key);
    std::string origin = it == c_.locations.end()        ? "default"
                         : it->second == kOverrideWhere ? "from --set"
                                                        : "at " + it->second;
    return key + "=" + value(key) + " (" + origin + ")";
  }

  std::string value(const std::string& key) const {
    size_t dot = key.find('.');
    const Field* f = find_field(key.substr(0, dot), key.substr(dot + 1));
    Config copy = c_;
    return format_value(f->ref(copy));
  }

  void fail(const std::string& msg) { errors_.push_back(msg); }
  const std::vector<std::string>& errors() const { return errors_; }

  bool at_least(const std::string& key, int64_t v, int64_t lo) {
    if (v >= lo) return true;
    fail(head(key) + ": must be at least " + std::to_string(lo));
    return false;
  }
  void real(const std::string& key, double v, double lo, bool lo_open, double hi, bool hi_open,
            const std::string& range) {
    bool ok = (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
    if (!ok) fail(head(key) + ": must be " + range);
  }

 private:
  const Config& c_;
  std::vector<std::string> errors_;
};

std::string multiples_hint(int64_t v, int64_t m) {
  int64_t lo = v / m * m, hi = lo + m;
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

void check_model(const ModelConfig& m, Checker& ck) {
  bool sizes_ok = true;
  const std::pair<const char*, int64_t> sizes[] = {
      {"model.vocab_size", m.vocab_size}, {"model.d_model", m.d_model},   {"model.n_heads", m.n_heads},
      {"model.n_kv_heads", m.n_kv_heads}, {"model.ffn_hidden", m.ffn_hidden}, {"model.d_state", m.d_state},
      {"model.head_dim", m.head_dim},     {"model.expand", m.expand},      {"model.n_groups", m.n_groups},
      {"model.d_conv", m.d_conv},         {"model.ssd_chunk", m.ssd_chunk}};
  for (auto [key, v] : sizes) sizes_ok &= ck.at_least(key, v, 1);
  ck.real("model.rope_theta", m.rope_theta, 0, true, HUGE_VAL, false, "> 0 (usually 10000)");

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

  if (m.pattern.find('*') != std::string::npos) {
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
  if (m.pattern.find('M') != std::string::npos) {
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
  ck.at_least("train.steps", t.steps, 1);
  ck.at_least("train.global_batch", t.global_batch, 1);
  ck.at_least("train.seq_len", t.seq_len, 1);
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
  ck.at_least("train.sample_tokens", t.sample_tokens, 1);
  ck.at_least("train.threads", t.threads, 0);
}

void check_parallel(const Config& c, int world_size, Checker& ck) {
  const ParallelConfig& p = c.parallel;
  bool dims_ok = ck.at_least("parallel.dp", p.dp, 1);
  dims_ok &= ck.at_least("parallel.tp", p.tp, 1);
  dims_ok &= ck.at_least("parallel.pp", p.pp, 1);
  bool mb_ok = ck.at_least("parallel.microbatches", p.microbatches, 1);
  bool vs_ok = ck.at_least("parallel.virtual_stages", p.virtual_stages, 1);
  bool zero_ok = p.zero >= 0 && p.zero <= 3;
  if (!zero_ok) ck.fail(ck.head("parallel.zero") + ": must be 0, 1, 2 or 3 (ZeRO stage)");
  if (std::find(kSchedules.begin(), kSchedules.end(), p.schedule) == kSchedules.end()) {
    std::string near = closest(p.schedule, kSchedules);
    ck.fail(ck.head("parallel.schedule") + ": unknown schedule; expected one of " + join(kSchedules, ", ") +
            (near.empty() ? "" : " (did you mean '" + near + "'?)"));
  }

  if (dims_ok && mb_ok && c.train.global_batch >= 1 && c.train.global_batch % (p.dp * p.microbatches) != 0) {
    int64_t m = p.dp * p.microbatches;
    ck.fail(ck.head("train.global_batch") + ": not divisible by dp x microbatches = " + std::to_string(p.dp) +
            " x " + std::to_string(p.microbatches) + " = " + std::to_string(m) + " (" + ck.ref("parallel.dp") +
            ", " + ck.ref("parallel.microbatches") + "); use global_batch " +
            multiples_hint(c.train.global_batch, m));
  }

  if (world_size < 1) ck.fail("world size " + std::to_string(world_size) + " must be at least 1");
  if (dims_ok && world_size >= 1 && p.dp * p.tp * p.pp != world_size) {
    int64_t prod = p.dp * p.tp * p.pp;
    ck.fail("world size " + std::to_string(world_size) + " != dp(" + std::to_string(p.dp) + ") x tp(" +
            std::to_string(p.tp) + ") x pp(" + std::to_string(p.pp) + ") = " + std::to_string(prod) + "; launch " +
            std::to_string(prod) + " ranks (mpirun -n " + std::to_string(prod) + ") or change " +
            ck.ref("parallel.dp") + ", " + ck.ref("parallel.tp") + ", " + ck.ref("parallel.pp") +
            " so that their product is " + std::to_string(world_size));
  }

  if (p.tp > 1)
    ck.fail(ck.head("parallel.tp") + ": tensor parallelism is not available yet in this build; use tp=1 "
            "(data and pipeline parallelism, ZeRO 0-3 and every schedule run)");
  if (zero_ok && p.zero > 0 && dims_ok && p.dp == 1)
    ck.fail(ck.head("parallel.zero") + "=" + std::to_string(p.zero) +
            ": ZeRO shards over data-parallel ranks and " + ck.ref("parallel.dp") + "; use dp >= 2 or zero 0");
  const bool interleaved = p.schedule == "interleaved";
  if (vs_ok && interleaved && p.virtual_stages < 2)
    ck.fail(ck.head("parallel.virtual_stages") + ": the interleaved schedule needs virtual_stages >= 2 (" +
            ck.ref("parallel.schedule") + ")");
  if (vs_ok && !interleaved && p.virtual_stages != 1)
    ck.fail(ck.head("parallel.virtual_stages") + ": only the interleaved schedule uses virtual stages; use 1 "
            "with " + ck.ref("parallel.schedule") + " (dualpipev always holds 2 chunks per rank)");
  ck.real("parallel.bucket_mb", p.bucket_mb, 0, true, HUGE_VAL, false, "> 0 MiB (typical: 25)");
  ck.real("parallel.comm_timeout_s", p.comm_timeout_s, 0, true, HUGE_VAL, false, "> 0 seconds");
  if (p.order.empty()) ck.fail(ck.head("parallel.order") + ": empty; use e.g. tp-dp-pp");
}

std::string read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw ConfigError("cannot open config file " + path + ": " + std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  int err = std::ferror(f) ? errno : 0;
  std::fclose(f);
  if (err) throw ConfigError("cannot read config file " + path + ": " + std::strerror(err));
  return text;
}

}  // namespace

Config parse(const std::string& yaml_text, const std::string& source, const std::vector<std::string>& overrides) {
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(yaml_text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(where(source, e.mark) + ": YAML syntax error: " + e.msg);
  }
  Reader reader(source);
  if (docs.size() > 1)
    reader.fail(where(source, docs[1].Mark()) + ": a second YAML document ('---'); a config is one document");
  if (!docs.empty()) reader.read_root(docs[0]);
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
  Checker ck(cfg);
  check_model(cfg.model, ck);
  check_train(cfg.train, ck);
  if (cfg.data.path.empty()) ck.fail(ck.head("data.path") + ": must name the token file (docs/data.md)");
  check_parallel(cfg, world_size, ck);
  if (!ck.errors().empty()) throw ConfigError(join(ck.errors(), "\n"));
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
  return out;
}

}  // namespace piper::config
