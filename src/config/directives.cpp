// directives.cpp — the directive table, directives written back as YAML, and the directives
// applied onto the `parallel:` shorthand (docs/directives.md).
#include <algorithm>

#include "config/internal.hpp"

namespace piper::config {
namespace detail {

// ---- directives: names and keys -------------------------------------------------

const std::vector<DirectiveSpec>& directive_specs() {
  static const std::vector<std::string> units = {"stage", "unit", "blocks", "kind"};
  static const std::vector<DirectiveSpec> table = {
      {DirectiveKind::SPLIT, "split", {"microbatches"}, {}},
      {DirectiveKind::SPLIT_BACKWARD, "split_backward", {}, units},
      {DirectiveKind::PLACE, "place", {"pp", "virtual_stages", "stage_of_unit", "stages", "ranks"}, {}},
      {DirectiveKind::REPLICATE, "replicate", {"dp", "shard_optimizer", "shard_grads", "shard_params", "bucket_mb"},
       units},
      {DirectiveKind::SHARD, "shard", {"tp", "ep"}, {}},
      {DirectiveKind::ORDER, "order", {"schedule", "pairs", "ranks"}, {}},
      {DirectiveKind::GRID, "grid", {"order"}, {}},
      {DirectiveKind::RECOMPUTE, "recompute", {"mode"}, units},
  };
  return table;
}

const std::vector<std::string>& filter_keys() {
  static const std::vector<std::string> keys = {"stage", "microbatch", "pass", "unit", "blocks", "kind"};
  return keys;
}

const std::vector<std::string>& degree_keys() {
  static const std::vector<std::string> keys = {"dp", "tp", "ep", "pp", "virtual_stages", "microbatches", "bucket_mb",
                                                "schedule"};
  return keys;
}

std::vector<std::string> emit_filter(const Filter& f) {
  std::vector<std::string> keys;
  auto list = [&](const char* key, const std::vector<std::string>& items) {
    if (!items.empty()) keys.push_back(std::string(key) + ": " + (items.size() == 1 ? items[0] : "[" + join(items, ", ") + "]"));
  };
  auto ranges = [&](const char* key, const Filter::Ranges& rs) {
    std::vector<std::string> r;
    for (auto [a, z] : rs) r.push_back(a == z ? std::to_string(a) : quote(std::to_string(a) + "-" + std::to_string(z)));
    list(key, r);
  };
  auto words = [&](const char* key, const std::vector<std::string>& ws) {
    std::vector<std::string> q;
    for (const std::string& w : ws) q.push_back(quote(w));
    list(key, q);
  };
  ranges("stage", f.stages);
  ranges("microbatch", f.microbatches);
  words("pass", f.passes);
  words("unit", f.units);
  ranges("blocks", f.blocks);
  words("kind", f.kinds);
  return keys;
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

std::string dpath(size_t i) { return "directives[" + std::to_string(i) + "]"; }

// One directive as a YAML flow map, e.g. "place: {pp: 2, stages: [{blocks: \"0-2\"}, ...]}".
std::string emit_directive(const Directive& d) {
  const DirectiveSpec& spec = spec_of(d.kind);
  if (d.kind == DirectiveKind::SPLIT_BACKWARD && d.filter.empty())
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
  auto ints = [&](const char* k, const std::optional<std::vector<int64_t>>& v) {
    if (!v) return;
    std::vector<std::string> items;
    for (int64_t x : *v) items.push_back(std::to_string(x));
    kv.push_back(std::string(k) + ": [" + join(items, ", ") + "]");
  };
  ints("stage_of_unit", d.stage_of_unit);
  if (d.stages) {
    std::vector<std::string> stages;
    for (const Filter& f : *d.stages) stages.push_back("{" + join(emit_filter(f), ", ") + "}");
    kv.push_back("stages: [" + join(stages, ", ") + "]");
  }
  ints("ranks", d.rank_of_stage);
  i("dp", d.dp);
  b("shard_optimizer", d.shard_optimizer);
  b("shard_grads", d.shard_grads);
  b("shard_params", d.shard_params);
  if (d.bucket_mb) kv.push_back("bucket_mb: " + format_double(*d.bucket_mb));
  i("tp", d.tp);
  i("ep", d.ep);
  str("schedule", d.schedule);
  b("pairs", d.pairs);
  if (d.ranks) {
    bool chunks = false;
    for (const auto& r : *d.ranks)
      for (const OrderOp& op : r) chunks |= op.chunk != 0;
    std::vector<std::string> ranks;
    for (const auto& r : *d.ranks) {
      std::vector<std::string> ops;
      std::vector<bool> grouped;
      for (const OrderOp& op : r) ops.push_back(op.name(chunks)), grouped.push_back(op.grouped);
      ranks.push_back("[" + order_text(ops, grouped) + "]");
    }
    kv.push_back("ranks: [" + join(ranks, ", ") + "]");
  }
  if (d.grid_order) kv.push_back("order: " + quote(*d.grid_order));
  str("mode", d.mode);
  for (const std::string& f : emit_filter(d.filter)) kv.push_back(f);
  return std::string(spec.name) + ": {" + join(kv, ", ") + "}";
}

// ---- directives applied onto the shorthand --------------------------------------

Applied apply_directives(const Config& c) {
  Applied a{c, {}, -1, -1, -1, {}, {}};
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
        if (!d.filter.empty()) {
          a.split_subsets.push_back({d.filter, 1, base});
        } else if (d.split_backward) {
          p.split_backward = *d.split_backward, from("parallel.split_backward", base, base);
          a.split_subsets.clear();
        }
        break;
      case DirectiveKind::PLACE:
        take(d.pp, p.pp, "pp", "pp");
        take(d.virtual_stages, p.virtual_stages, "virtual_stages", "virtual_stages");
        if (d.stage_of_unit || d.stages) a.place_from = static_cast<int>(i);
        if (d.rank_of_stage) a.ranks_from = static_cast<int>(i);
        break;
      case DirectiveKind::REPLICATE:
        take(d.dp, p.dp, "dp", "dp");
        take(d.bucket_mb, p.bucket_mb, "bucket_mb", "bucket_mb");
        if (d.shard_optimizer || d.shard_grads || d.shard_params) {
          const int64_t zero = d.shard_params.value_or(false)      ? 3
                               : d.shard_grads.value_or(false)     ? 2
                               : d.shard_optimizer.value_or(false) ? 1
                                                                   : 0;
          if (!d.filter.empty()) {
            a.zero_subsets.push_back({d.filter, zero, base});
            break;
          }
          p.zero = zero;
          a.zero_subsets.clear();
          const char* key = d.shard_params ? "shard_params" : d.shard_grads ? "shard_grads" : "shard_optimizer";
          from("parallel.zero", base + ".zero", base + "." + key);
        }
        break;
      case DirectiveKind::SHARD:
        take(d.tp, p.tp, "tp", "tp");
        take(d.ep, p.ep, "ep", "ep");
        break;
      case DirectiveKind::ORDER:
        if (d.schedule) a.order_from = -1;
        take(d.schedule, p.schedule, "schedule", "schedule");
        take(d.pairs, p.pairs, "pairs", "pairs");
        if (d.ranks) a.order_from = static_cast<int>(i);
        break;
      case DirectiveKind::GRID: take(d.grid_order, p.order, "order", "order"); break;
      case DirectiveKind::RECOMPUTE: break;  // per unit, over parallel.recompute: effective_strategy lists them
    }
  }
  return a;
}

}  // namespace detail

using namespace detail;

EffectiveStrategy effective_strategy(const Config& cfg) {
  const Applied a = apply_directives(cfg);
  EffectiveStrategy e;
  e.parallel = a.cfg.parallel;
  e.positions = Positions(a.cfg, a.names);
  if (a.place_from >= 0) {
    const Directive& d = cfg.directives.list[static_cast<size_t>(a.place_from)];
    const std::string key = d.stage_of_unit ? "stage_of_unit" : "stages";
    e.place_path = dpath(static_cast<size_t>(a.place_from)) + ".place." + key;
    if (d.stage_of_unit) e.stage_of_unit = *d.stage_of_unit;
    else e.stage_filters = *d.stages;
  }
  if (a.ranks_from >= 0) {
    e.rank_of_stage = *cfg.directives.list[static_cast<size_t>(a.ranks_from)].rank_of_stage;
    e.ranks_path = dpath(static_cast<size_t>(a.ranks_from)) + ".place.ranks";
  }
  e.split_subsets = a.split_subsets;
  e.zero_subsets = a.zero_subsets;
  if (a.order_from >= 0) {
    e.order_ranks = *cfg.directives.list[static_cast<size_t>(a.order_from)].ranks;
    e.order_path = dpath(static_cast<size_t>(a.order_from)) + ".order.ranks";
  }
  for (size_t i = 0; i < cfg.directives.list.size(); ++i) {
    const Directive& d = cfg.directives.list[i];
    if (d.kind == DirectiveKind::RECOMPUTE) e.recompute.push_back({d.mode.value_or(""), d.filter, dpath(i) + ".recompute"});
  }
  return e;
}

const char* directive_name(DirectiveKind k) { return spec_of(k).name; }

std::string order_text(const std::vector<std::string>& ops, const std::vector<bool>& grouped) {
  std::string out;
  for (size_t i = 0; i < ops.size(); ++i) {
    const bool opens = i + 1 < ops.size() && grouped[i + 1] && !grouped[i];
    const bool closes = grouped[i] && (i + 1 == ops.size() || !grouped[i + 1]);
    out += (i ? ", " : "") + std::string(opens ? "[" : "") + ops[i] + (closes ? "]" : "");
  }
  return out;
}

std::string OrderOp::name(bool with_chunk) const {
  std::string s = pass + std::to_string(microbatch);
  if (with_chunk) s += "." + std::to_string(chunk);
  if (first_unit >= 0) {
    s += "/" + std::to_string(first_unit);
    if (last_unit != first_unit) s += "-" + std::to_string(last_unit);
  }
  return s;
}

}  // namespace piper::config
