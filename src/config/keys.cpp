// keys.cpp — the key table of a config, the scalar grammar of its values, and the positions of
// the keys for messages.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "config/internal.hpp"

namespace piper::config {
namespace detail {

#define PIPER_FIELD(sec, k, doc) \
  Field { #sec, #k, doc, [](Config& c) -> FieldRef { return &c.sec.k; } }

const std::vector<Field>& fields() {
  static const std::vector<Field> table = {
      PIPER_FIELD(model, pattern, "one symbol per block: M mamba2, * attention, - mlp, E moe"),
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
      PIPER_FIELD(model, n_experts, "MoE experts E per block"),
      PIPER_FIELD(model, top_k, "MoE experts per token K, <= n_experts"),
      PIPER_FIELD(model, moe_ffn_hidden, "MoE expert hidden size F"),
      PIPER_FIELD(model, moe_aux_coef, "weight of the MoE sequence-wise balance loss"),
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
      PIPER_FIELD(train, device, "where tensors live and ops run: cpu | cuda | cpu_detached"),
      PIPER_FIELD(train, device_comm, "how a device's tensors travel: auto | nccl | mpi (host staging)"),
      PIPER_FIELD(train, precision, "fp32 | tf32 | bf16 (bf16 parameters, products and stored activations; fp32 master weights)"),
      PIPER_FIELD(train, eval_every, "held-out loss after every N steps and the last; 0 = off"),
      PIPER_FIELD(train, eval_batches, "held-out batches of global_batch sequences per evaluation"),
      PIPER_FIELD(train, switch_file, "strategy file read at each step boundary; empty = none"),
      PIPER_FIELD(train, switch_buffer_mb, "staging memory per rank for a switch, MiB"),
      PIPER_FIELD(train, standby, "the last N ranks start in reserve, for a grow"),
      PIPER_FIELD(train, switch_hardware, "the tuner's hardware for a switch without a strategy"),
      PIPER_FIELD(train, switch_cost, "or the tuner's cost file (piper calibrate)"),
      PIPER_FIELD(train, switch_tune_s, "the tuner's time budget for such a switch, seconds"),
      PIPER_FIELD(data, path, "token file"),
      PIPER_FIELD(data, eval_fraction, "share of the token file's last sequences held out for evaluation"),
      PIPER_FIELD(data, eval_path, "or a token file of held-out sequences; empty = none"),
      PIPER_FIELD(checkpoint, dir, "checkpoint folder; empty = no checkpoints"),
      PIPER_FIELD(checkpoint, every, "save every N steps; 0 = at the end and on a signal only"),
      PIPER_FIELD(checkpoint, keep, "newest checkpoints kept"),
      PIPER_FIELD(checkpoint, async, "write checkpoints in the background"),
      PIPER_FIELD(checkpoint, direct_io, "write whole pages with O_DIRECT (no page cache) where possible"),
      PIPER_FIELD(checkpoint, on_error, "a save that fails: stop (exit 3) | continue (warn and train on)"),
      PIPER_FIELD(parallel, dp, "data-parallel replicas"),
      PIPER_FIELD(parallel, tp, "tensor-parallel ranks"),
      PIPER_FIELD(parallel, pp, "pipeline stages"),
      PIPER_FIELD(parallel, ep, "expert-parallel ranks, carved out of dp (ep divides dp)"),
      PIPER_FIELD(parallel, zero, "ZeRO stage 0..3"),
      PIPER_FIELD(parallel, schedule, "gpipe | 1f1b | interleaved | zbh1 | dualpipev"),
      PIPER_FIELD(parallel, microbatches, "microbatches per replica and step"),
      PIPER_FIELD(parallel, virtual_stages, "model chunks per pipeline rank"),
      PIPER_FIELD(parallel, split_backward, "BWD_I + BWD_W instead of fused BWD"),
      PIPER_FIELD(parallel, pairs, "the schedule's forward/backward pairs run interleaved, hiding each one's communication"),
      PIPER_FIELD(parallel, order, "rank grid order, first varies fastest"),
      PIPER_FIELD(parallel, bucket_mb, "data-parallel gradient bucket size, MiB"),
      PIPER_FIELD(parallel, comm_timeout_s, "seconds before a pending communication aborts the job"),
      PIPER_FIELD(parallel, recompute, "activation recomputation of the blocks: none | selective | full"),
  };
  return table;
}
#undef PIPER_FIELD

const std::vector<std::string> kSections = {"model", "train", "data", "checkpoint", "parallel"};

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
  all.push_back(kSwitch);
  std::string near = closest(section, all);
  if (!near.empty()) msg += "; did you mean '" + near + "'?";
  return msg + " (sections are " + join(all, ", ") + ")";
}

std::string unknown_key_message(const std::string& section, const std::string& key, const std::string& scope) {
  std::string msg = "unknown key '" + scope + section + "." + key + "'";
  std::string near = closest(key, keys_of(section));
  if (!near.empty()) return msg + "; did you mean '" + near + "'?";
  for (const Field& f : fields())
    if (scope.empty() && key == f.key)
      return msg + "; did you mean '" + f.name() + "'? (it is in section '" + f.section + "')";
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

namespace {

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

}  // namespace

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

std::string read_int(const YAML::Node& n, std::optional<int64_t>& out) {
  int64_t v = 0;
  if (n.IsScalar() && parse_int(n.Scalar(), v)) return out = v, "";
  return "expected an integer, found " + describe(n);
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

}  // namespace detail

using namespace detail;

// ---- suggestions --------------------------------------------------------------

namespace {

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

}  // namespace

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  size_t limit = std::max<size_t>(2, std::min(word.size(), best.size()) / 3);
  return best_d <= limit ? best : std::string();
}

// ---- positions ----------------------------------------------------------------

Positions::Positions(Config effective, std::map<std::string, std::string> names)
    : c_(std::move(effective)), names_(std::move(names)) {}

std::string Positions::shown(const std::string& key) const {
  auto it = names_.find(key);
  return it == names_.end() ? key : it->second;
}

std::string Positions::value(const std::string& key) const {
  size_t dot = key.find('.');
  const Field* f = find_field(key.substr(0, dot), key.substr(dot + 1));
  Config copy = c_;
  return format_value(f->ref(copy));
}

std::string Positions::head(const std::string& key, const std::string& shown_as) const {
  auto it = c_.locations.find(key);
  if (it == c_.locations.end()) return shown_as;
  if (it->second == kOverrideWhere) return std::string(kOverrideWhere) + " " + shown_as;
  return it->second + ": " + shown_as;
}

std::string Positions::head(const std::string& key) const { return head(key, shown(key) + "=" + value(key)); }

std::string Positions::ref(const std::string& key) const {
  auto it = c_.locations.find(key);
  std::string origin = it == c_.locations.end()        ? "default"
                       : it->second == kOverrideWhere ? "from --set"
                                                      : "at " + it->second;
  return shown(key) + "=" + value(key) + " (" + origin + ")";
}

std::string Positions::at(const std::string& path, const std::string& shown_as) const {
  auto it = c_.locations.find(path);
  return it == c_.locations.end() ? shown_as : it->second + ": " + shown_as;
}

std::string Positions::at(const std::string& path) const { return at(path, path); }

}  // namespace piper::config
