// directive_reader.cpp — the `directives:` section read into Directives: names, keys, filters
// and hand-written orders, each problem at its file position (docs/directives.md).
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <functional>

#include "config/internal.hpp"
#include "config/reader.hpp"

namespace piper::config::detail {
namespace {

// The filter keys of one stage of `place: {stages: [...]}`: a stage is a set of units.
const std::vector<std::string> kStageFilterKeys = {"unit", "blocks", "kind"};
const std::vector<std::string> kKinds = {"M", "*", "-", "E", "embed", "head"};
const std::vector<std::string> kPasses = {"F", "B", "BI", "BW"};
constexpr const char* kOpGrammar =
    "an op: F, B, BI or BW, then the microbatch, then .chunk when a rank holds several model chunks, then "
    "/first-last for a range of the stage's units (F3, B3, BI3, BW3, F3.1, F3/2-4, B3.1/7)";

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
  if (p < s.size() && s[p] == '/') {
    ++p;
    if (!number(op.first_unit)) return "'" + text + "' names no unit after '/': expected " + std::string(kOpGrammar);
    op.last_unit = op.first_unit;
    if (p < s.size() && s[p] == '-') {
      ++p;
      if (!number(op.last_unit))
        return "'" + text + "' names no last unit after '-': expected " + std::string(kOpGrammar);
    }
    if (op.last_unit < op.first_unit)
      return "'" + text + "': the unit range runs backwards; write " + std::to_string(op.last_unit) + "-" +
             std::to_string(op.first_unit);
  }
  if (p != s.size()) return "expected " + std::string(kOpGrammar) + "; found '" + text + "'";
  return "";
}

// One item of an index key (blocks, stage, microbatch): 3 or "3-7". "" on success.
std::string parse_range(const YAML::Node& n, const std::string& noun, std::pair<int64_t, int64_t>& out) {
  const std::string bad = "expected a " + noun + " index (3), a range (\"3-7\") or a list of them, found " + describe(n);
  if (!n.IsScalar()) return bad;
  const std::string& s = n.Scalar();
  int64_t a = 0, b = 0;
  if (parse_int(s, a)) {
    if (a < 0) return noun + " indices start at 0; found " + s;
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

// One item of a word key (pass, kind, unit) into `out`. "" on success.
std::string parse_word(const YAML::Node& n, const std::string& key, std::vector<std::string>& out) {
  const auto in = [&](const std::vector<std::string>& words) {
    return n.IsScalar() && std::find(words.begin(), words.end(), n.Scalar()) != words.end();
  };
  if (key == "pass" && !in(kPasses)) return "expected a pass F, B, BI or BW; found " + describe(n);
  if (key == "kind" && !in(kKinds))
    return "expected a block kind M, \"*\", \"-\", E (quote * and -), or embed, head; found " + describe(n);
  if (key == "unit" && (!n.IsScalar() || n.Scalar().empty()))
    return "expected a unit index as `piper plan` lists them (0) or a unit name (embed, layers.3, head); found " +
           describe(n);
  out.push_back(n.Scalar());
  return "";
}

// One value of filter key `key` (a single item or a list of them) into f. "" on success, else
// (where, what is wrong) of the first bad item.
std::pair<std::string, std::string> parse_filter_value(const std::string& key, const YAML::Node& v,
                                                       const std::function<std::string(const YAML::Node&)>& at,
                                                       Filter& f) {
  std::vector<YAML::Node> items;
  if (v.IsSequence()) {
    for (size_t q = 0; q < v.size(); ++q) items.push_back(v[q]);
    if (items.empty()) return {at(v), "expected at least one value, found an empty list"};
  } else {
    items.push_back(v);
  }
  for (const YAML::Node& it : items) {
    std::string err;
    std::pair<int64_t, int64_t> r;
    if (key == "stage" || key == "microbatch" || key == "blocks") {
      err = parse_range(it, key == "blocks" ? "block" : key, r);
      Filter::Ranges& out = key == "stage" ? f.stages : key == "microbatch" ? f.microbatches : f.blocks;
      if (err.empty()) out.push_back(r);
    } else {
      err = parse_word(it, key, key == "pass" ? f.passes : key == "unit" ? f.units : f.kinds);
    }
    if (!err.empty()) return {at(it), err};
  }
  return {"", ""};
}

bool contains(const std::vector<std::string>& list, const std::string& word) {
  return std::find(list.begin(), list.end(), word) != list.end();
}

bool has_filter_key(const YAML::Node& map) {
  if (!map.IsMap()) return false;
  for (const auto& kv : map)
    if (kv.first.IsScalar() && contains(filter_keys(), kv.first.Scalar())) return true;
  return false;
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

}  // namespace

// `directives:` — a list of one-key maps, each read into a Directive.
void Reader::read_directives(const YAML::Node& key, const YAML::Node& list) {
  cfg_.directives.present = true;
  cfg_.locations[scope_ + kDirectives] = where(source_, key.Mark());
  if (list.IsNull()) return;
  if (!list.IsSequence()) {
    fail(where(source_, list.Mark()) + ": " + scope_ + "directives: expected a list of directives (- split: {microbatches: 4}, "
         "- place: {pp: 2}, ...), found " + describe(list));
    return;
  }
  for (size_t i = 0; i < list.size(); ++i) read_directive(i, list[i]);
}

void Reader::read_directive(size_t i, const YAML::Node& item) {
  const std::string path = scope_ + dpath(i);
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
  if (spec->keys.empty()) {  // split_backward: BOOL, or a filter: the units whose backward is split
    if (has_filter_key(v)) {
      d.split_backward = true;
      if (!read_inline_filter(*spec, v, base, d.filter)) return;
    } else {
      std::string err = read_bool(v, d.split_backward);
      if (!err.empty())
        return fail((v.IsNull() ? at : where(source_, v.Mark())) + ": " + base + ": " + err +
                    " (or a filter over " + join(spec->filter_keys, ", ") + ", such as {kind: \"*\"})");
    }
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
    if (contains(filter_keys(), name)) continue;  // read with the whole filter, below
    if (std::find(spec->keys.begin(), spec->keys.end(), name) == spec->keys.end()) {
      std::vector<std::string> known = spec->keys;
      known.insert(known.end(), spec->filter_keys.begin(), spec->filter_keys.end());
      std::string near = closest(name, known);
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
  ok &= read_inline_filter(*spec, v, base, d.filter);
  // Keys that exclude each other within one directive.
  auto both = [&](const char* a, const char* b, const std::string& why) {
    fail(cfg_.locations[base + "." + b] + ": " + base + ": give " + a + " or " + b + ", not both; " + why);
    ok = false;
  };
  if (d.stage_of_unit && d.stages) both("stage_of_unit", "stages", "both say which stage holds each unit");
  if (d.schedule && d.ranks) both("schedule", "ranks", "ranks is a hand-written schedule");
  if (d.pairs && d.ranks) both("pairs", "ranks", "a hand-written order groups its ops itself ([F3, B1])");
  if (d.kind == DirectiveKind::RECOMPUTE) cfg_.locations[base] = at;  // messages about what it selects point here
  if (d.kind == DirectiveKind::RECOMPUTE && !d.mode && ok) {
    fail(at + ": " + base + ": a recompute directive needs its mode: key (mode: full, for one)");
    ok = false;
  }
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
  if (!d.filter.empty() && d.kind == DirectiveKind::REPLICATE && !d.shard_optimizer && !d.shard_grads &&
      !d.shard_params) {
    fail(cfg_.locations[base + ".filter"] + ": " + base +
         ": a filter selects the units the directive's ZeRO keys apply to; give shard_optimizer, shard_grads or "
         "shard_params beside it");
    ok = false;
  }
  if (ok) cfg_.directives.list.push_back(std::move(d));
}

// The filter keys written beside a directive's own keys (or as the whole map of split_backward),
// refused next to a parallel degree: those are uniform over the model.
bool Reader::read_inline_filter(const DirectiveSpec& spec, const YAML::Node& map, const std::string& base,
                                Filter& f) {
  std::string first;  // the first filter key written
  for (const auto& kv : map)
    if (first.empty() && kv.first.IsScalar() && contains(filter_keys(), kv.first.Scalar()))
      first = kv.first.Scalar(), cfg_.locations[base + ".filter"] = where(source_, kv.first.Mark());
  if (first.empty()) return true;
  bool ok = true;
  for (const auto& kv : map) {
    const std::string name = kv.first.IsScalar() ? kv.first.Scalar() : "";
    if (spec.keys.empty() && !contains(filter_keys(), name)) {
      std::string near = closest(name, spec.filter_keys);
      fail(where(source_, kv.first.Mark()) + ": " + base + ": unknown key '" + name + "'" +
           (near.empty() ? "" : "; did you mean '" + near + "'?") + "; " + spec.name +
           " takes true, false or a filter (" + join(spec.filter_keys, ", ") + ")");
      ok = false;
      continue;
    }
    if (!contains(degree_keys(), name)) continue;
    fail(where(source_, kv.first.Mark()) + ": " + base + "." + name + ": " + name +
         " applies to the whole model: the parallel degrees and the schedule are uniform over it, so they take no "
         "filter (" + first + " at " + cfg_.locations[base + ".filter"] + "); set " + name +
         " in a directive without filter keys");
    ok = false;
  }
  return ok && read_filter(map, base, spec.name, spec.filter_keys, f);
}

// The filter keys of the map `m` into f, each at `path.key`. `allowed` are the keys its owner (a
// directive, or a place stage) takes; keys that are no filter key are left to the caller.
bool Reader::read_filter(const YAML::Node& m, const std::string& path, const std::string& owner,
                         const std::vector<std::string>& allowed, Filter& f) {
  bool ok = true;
  std::map<std::string, YAML::Mark> seen;
  for (const auto& kv : m) {
    const YAML::Node k = kv.first, v = kv.second;
    if (!k.IsScalar() || !contains(filter_keys(), k.Scalar())) continue;
    const std::string& name = k.Scalar();
    const std::string kat = where(source_, k.Mark());
    if (!contains(allowed, name)) {
      const bool of_passes = name == "microbatch" || name == "pass";
      fail(kat + ": " + path + "." + name + ": " +
           (allowed.empty() ? owner + " takes no filter (filters go on split_backward, replicate, recompute and place's stages)"
                            : "the filter of " + owner + " takes " + join(allowed, ", ") + ", not " + name +
                                  (of_passes ? " (microbatch and pass select passes; " + owner + " acts on units)"
                                             : "")));
      ok = false;
      continue;
    }
    if (!first_time(seen, name, k.Mark(), kat, "filter key '" + path + "." + name + "'")) {
      ok = false;
      continue;
    }
    auto at = [&](const YAML::Node& n) { return n.IsNull() ? kat : where(source_, n.Mark()); };
    const auto [wat, err] = parse_filter_value(name, v, at, f);
    if (!err.empty()) {
      fail(wat + ": " + path + "." + name + ": " + err);
      ok = false;
      continue;
    }
    cfg_.locations[path + "." + name] = kat;
  }
  return ok;
}

// Reads one key of a directive into d; reports and returns false when the value is wrong.
bool Reader::read_directive_key(Directive& d, const std::string& name, const YAML::Node& v, const std::string& path,
                                 const std::string& vat) {
  std::string err;
  if (name == "microbatches") err = read_int(v, d.microbatches);
  else if (name == "pp") err = read_int(v, d.pp);
  else if (name == "virtual_stages") err = read_int(v, d.virtual_stages);
  else if (name == "dp") err = read_int(v, d.dp);
  else if (name == "tp") err = read_int(v, d.tp);
  else if (name == "ep") err = read_int(v, d.ep);
  else if (name == "shard_optimizer") err = read_bool(v, d.shard_optimizer);
  else if (name == "shard_grads") err = read_bool(v, d.shard_grads);
  else if (name == "shard_params") err = read_bool(v, d.shard_params);
  else if (name == "bucket_mb") err = read_double(v, d.bucket_mb);
  else if (name == "schedule") err = read_string(v, d.schedule);
  else if (name == "pairs") err = read_bool(v, d.pairs);
  else if (name == "order") err = read_string(v, d.grid_order);
  else if (name == "mode") err = read_string(v, d.mode);
  else if (name == "stage_of_unit")
    return read_int_list(d.stage_of_unit, "stage numbers, one per unit (embed, blocks, head)", v, path, vat);
  else if (name == "stages") return read_stages(d, v, path, vat);
  else if (name == "ranks" && d.kind == DirectiveKind::PLACE)
    return read_int_list(d.rank_of_stage, "pipeline ranks, one per stage", v, path, vat);
  else if (name == "ranks") return read_ranks(d, v, path, vat);
  if (!err.empty()) fail(vat + ": " + path + ": " + err);
  return err.empty();
}

bool Reader::read_int_list(std::optional<std::vector<int64_t>>& to, const char* what, const YAML::Node& v,
                           const std::string& path, const std::string& vat) {
  if (!v.IsSequence()) {
    fail(vat + ": " + path + ": expected a list of " + what + ", found " + describe(v));
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
  to = out;
  return true;
}

bool Reader::read_stages(Directive& d, const YAML::Node& v, const std::string& path, const std::string& vat) {
  if (!v.IsSequence() || v.size() == 0) {
    fail(vat + ": " + path + ": expected a list of stages, each a filter such as {blocks: \"0-3\"} or "
         "{kind: \"*\"}, found " + (v.IsSequence() ? std::string("an empty list") : describe(v)));
    return false;
  }
  std::vector<Filter> out;
  bool ok = true;
  for (size_t j = 0; j < v.size(); ++j) {
    const YAML::Node e = v[j];
    const std::string epath = path + "[" + std::to_string(j) + "]";
    const std::string eat = where(source_, e.Mark());
    cfg_.locations[epath] = eat;
    if (!e.IsMap() || e.size() == 0) {
      fail(eat + ": " + epath + ": expected a filter over the units' tags (unit:, blocks:, kind:), found " +
           (e.IsMap() ? std::string("an empty map") : describe(e)));
      ok = false;
      continue;
    }
    Filter f;
    for (const auto& kv : e) {
      const std::string name = kv.first.IsScalar() ? kv.first.Scalar() : describe(kv.first);
      if (contains(filter_keys(), name)) continue;
      std::string near = closest(name, kStageFilterKeys);
      fail(where(source_, kv.first.Mark()) + ": " + epath + ": unknown filter '" + name + "'" +
           (near.empty() ? "" : "; did you mean '" + near + "'?") + " (a stage's filters are " +
           join(kStageFilterKeys, ", ") + ")");
      ok = false;
    }
    ok &= read_filter(e, epath, "a stage", kStageFilterKeys, f);
    out.push_back(f);
  }
  if (ok) d.stages = out;
  return ok;
}

bool Reader::read_ranks(Directive& d, const YAML::Node& v, const std::string& path, const std::string& vat) {
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
    // A rank is a list of op strings and groups (lists of op strings), or one string of ops
    // separated by spaces or commas.
    struct Text {
      std::string op, at;
      bool grouped;
    };
    std::vector<Text> texts;
    auto scalar = [&](const YAML::Node& n, const std::string& npath, bool grouped) {
      if (n.IsScalar()) return texts.push_back({n.Scalar(), where(source_, n.Mark()), grouped}), true;
      fail(where(source_, n.Mark()) + ": " + npath + ": expected " + kOpGrammar + (grouped ? "" : ", or a group of them ([F3, B1])") +
           "; found " + describe(n));
      return false;
    };
    if (rv.IsSequence()) {
      for (size_t q = 0; q < rv.size(); ++q) {
        const std::string qpath = rpath + "[" + std::to_string(q) + "]";
        if (!rv[q].IsSequence()) {
          ok = scalar(rv[q], qpath, false) && ok;
          continue;
        }
        if (rv[q].size() < 2) {
          fail(where(source_, rv[q].Mark()) + ": " + qpath + ": a group runs two or more ops interleaved ([F3, B1]); found a group of " +
               std::to_string(rv[q].size()) + " op");
          ok = false;
          continue;
        }
        for (size_t j = 0; j < rv[q].size(); ++j)
          ok = scalar(rv[q][j], qpath + "[" + std::to_string(j) + "]", j > 0) && ok;
      }
    } else if (rv.IsScalar()) {
      std::string word;
      for (char ch : rv.Scalar() + " ") {
        if (ch == ' ' || ch == ',' || ch == '\t' || ch == '\n') {
          if (!word.empty()) texts.push_back({word, rat, false});
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
      std::string err = parse_op(texts[q].op, op);
      if (!err.empty()) {
        fail(texts[q].at + ": " + opath + " (rank " + std::to_string(r) + "): " + err);
        ok = false;
        continue;
      }
      op.grouped = texts[q].grouped;
      cfg_.locations[opath] = texts[q].at;
      ops.push_back(op);
    }
    out.push_back(ops);
  }
  if (ok) d.ranks = out;
  return ok;
}

}  // namespace piper::config::detail
