// directive_reader.cpp — the `directives:` section read into Directives: names, keys, stage
// filters and hand-written orders, each problem at its file position (docs/directives.md).
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>

#include "config/internal.hpp"
#include "config/reader.hpp"

namespace piper::config::detail {
namespace {

const std::vector<std::string> kStageFilterKeys = {"blocks", "kind"};
const std::vector<std::string> kKinds = {"M", "*", "-", "E", "embed", "head"};
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

}  // namespace

// `directives:` — a list of one-key maps, each read into a Directive.
void Reader::read_directives(const YAML::Node& key, const YAML::Node& list) {
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

void Reader::read_directive(size_t i, const YAML::Node& item) {
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
  if (ok) cfg_.directives.list.push_back(std::move(d));
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
  else if (name == "shard_optimizer") err = read_bool(v, d.shard_optimizer);
  else if (name == "shard_grads") err = read_bool(v, d.shard_grads);
  else if (name == "shard_params") err = read_bool(v, d.shard_params);
  else if (name == "bucket_mb") err = read_double(v, d.bucket_mb);
  else if (name == "schedule") err = read_string(v, d.schedule);
  else if (name == "pairs") err = read_bool(v, d.pairs);
  else if (name == "order") err = read_string(v, d.grid_order);
  else if (name == "mode") err = read_string(v, d.mode);
  else if (name == "blocks" || name == "kind" || name == "stage")
    return read_filter_key(d.filter.units, &d.filter.stages, name, v, path.substr(0, path.rfind('.')), vat);
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
      ok &= read_filter_key(f, nullptr, name, fv, epath, kat);
    }
    out.push_back(f);
  }
  if (ok) d.stages = out;
  return ok;
}

bool Reader::read_filter_key(StageFilter& f, std::vector<int64_t>* stages, const std::string& name,
                             const YAML::Node& fv, const std::string& path, const std::string& kat) {
  const std::string fat = fv.IsNull() ? kat : where(source_, fv.Mark());
  std::vector<YAML::Node> items;
  if (fv.IsSequence()) {
    for (size_t q = 0; q < fv.size(); ++q) items.push_back(fv[q]);
  } else {
    items.push_back(fv);
  }
  bool ok = true;
  if (items.empty()) {
    fail(fat + ": " + path + "." + name + ": expected at least one value, found an empty list");
    ok = false;
  }
  for (const YAML::Node& it : items) {
    const std::string iat = it.IsNull() ? fat : where(source_, it.Mark());
    if (name == "blocks") {
      std::pair<int64_t, int64_t> r;
      std::string err = parse_block_range(it, r);
      if (!err.empty()) {
        fail(iat + ": " + path + ".blocks: " + err);
        ok = false;
      } else {
        f.blocks.push_back(r);
      }
    } else if (name == "stage" && stages) {
      std::optional<int64_t> st;
      std::string err = read_int(it, st);
      if (err.empty() && *st < 0) err = "stage indices start at 0; found " + it.Scalar();
      if (!err.empty()) {
        fail(iat + ": " + path + ".stage: " + err);
        ok = false;
      } else {
        stages->push_back(*st);
      }
    } else if (!it.IsScalar() || std::find(kKinds.begin(), kKinds.end(), it.Scalar()) == kKinds.end()) {
      fail(iat + ": " + path + ".kind: expected a block kind M, \"*\", \"-\", E (quote * and -), or embed, "
           "head; found " + describe(it));
      ok = false;
    } else {
      f.kinds.push_back(it.Scalar());
    }
  }
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
