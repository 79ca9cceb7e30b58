// strategy.cpp — the `parallel:` shorthand expanded into directives.
#include "ir/strategy.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "config/checked.hpp"
#include "ir/filter.hpp"
#include "ir/model_graph.hpp"
#include "ir/placement.hpp"
#include "ir/work.hpp"

namespace piper::ir {

ScheduleKind parse_schedule(const std::string& name) {
  const std::vector<std::string>& names = schedule_names();
  for (size_t k = 0; k < names.size(); ++k)
    if (name == names[k]) return static_cast<ScheduleKind>(k);
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown schedule '" + name + "' (expected one of " + list + ")");
}

const char* schedule_name(ScheduleKind k) {
  const std::vector<std::string>& names = schedule_names();
  const auto i = static_cast<size_t>(k);
  return i < names.size() ? names[i].c_str() : "?";
}

namespace {

void throw_errors(const std::vector<std::string>& errors) {
  if (errors.empty()) return;
  std::string text;
  for (const std::string& err : errors) text += (text.empty() ? "" : "\n") + err;
  throw config::ConfigError(text);
}

// The stage of every unit: a place directive's stage_of_unit or stage filters, else balanced by
// the units' work over pp x chunks stages (left empty when there are fewer units than stages:
// ir::build says so).
std::vector<int> unit_stages(const config::Config& cfg, const ModelGraph& model, const config::EffectiveStrategy& e,
                             int chunks, int pp) {
  std::vector<int64_t> given = e.stage_of_unit;
  if (!e.stage_filters.empty()) {
    std::vector<std::string> errors;
    given = resolve_stages(model, e.stage_filters, e.place_path, e.positions, errors);
    throw_errors(errors);
  }
  if (!given.empty()) return std::vector<int>(given.begin(), given.end());
  const int64_t n_stages = static_cast<int64_t>(pp) * chunks;
  if (n_stages < 1 || n_stages > static_cast<int64_t>(model.units.size())) return {};
  return balance_stages(unit_costs(cfg.model, model, cfg.train.seq_len), static_cast<int>(n_stages));
}

// A value per unit: `uniform` for all, then each subset's value for the units its filter selects.
// A filter that does not resolve is reported in `errors` at its file position.
std::vector<int> per_unit(const ModelGraph& model, const std::vector<int>& stage_of_unit, int64_t uniform,
                          const std::vector<config::EffectiveStrategy::Subset>& subsets,
                          const config::EffectiveStrategy& e, std::vector<std::string>& errors) {
  std::vector<int> out(model.units.size(), static_cast<int>(uniform));
  const int n_stages =
      stage_of_unit.empty() ? 0 : *std::max_element(stage_of_unit.begin(), stage_of_unit.end()) + 1;
  for (const config::EffectiveStrategy::Subset& sub : subsets) {
    if (const std::string problem = filter_problem(sub.filter, model, stage_of_unit, n_stages); !problem.empty()) {
      errors.push_back(e.positions.at(sub.path + ".filter") + ": " + problem);
      continue;
    }
    for (int u : selected_units(sub.filter, model, stage_of_unit)) out[static_cast<size_t>(u)] = static_cast<int>(sub.value);
  }
  return out;
}

// A schedule that needs split backwards (zbh1, dualpipev, a hand-written order with BI/BW) splits
// every unit's, unless directives split some: then the rest stay fused, their BI ops the fused BWD.
void split_every_backward_unless_some(Strategy& s) {
  if (!s.any_split_backward()) s.split_backward_of_unit.assign(s.split_backward_of_unit.size(), true);
}

}  // namespace

bool Strategy::any_split_backward() const {
  return std::find(split_backward_of_unit.begin(), split_backward_of_unit.end(), true) != split_backward_of_unit.end();
}

int ReplicateDirective::max_zero() const {
  return zero_of_unit.empty() ? 0 : *std::max_element(zero_of_unit.begin(), zero_of_unit.end());
}

Strategy expand(const config::Config& cfg, int world_size) {
  // The shorthand with the directives applied in order (config does the YAML side: names, filters).
  const config::EffectiveStrategy e = config::effective_strategy(cfg);
  const config::ParallelConfig& p = e.parallel;
  const bool custom = !e.order_ranks.empty();
  Strategy s;
  s.world_size = world_size;
  s.grid_order = p.order;
  s.split.microbatches = static_cast<int>(p.microbatches);
  // A custom order replaces the named schedule, which stays at its default.
  s.order.schedule = custom ? ScheduleKind::SCHEDULE_1F1B : parse_schedule(p.schedule);
  s.place.pp = static_cast<int>(p.pp);
  s.place.virtual_stages = s.order.schedule == ScheduleKind::SCHEDULE_DUALPIPEV ? 2
                                                                               : static_cast<int>(p.virtual_stages);
  for (int64_t r : e.rank_of_stage) s.place.rank_of_stage.push_back(static_cast<int>(r));
  // An explicit placement says how many stages each rank holds.
  if (!s.place.rank_of_stage.empty() && s.place.pp > 0)
    s.place.virtual_stages = static_cast<int>(s.place.rank_of_stage.size()) / s.place.pp;
  s.order.pairs = p.pairs;
  const ModelGraph model = make_model_graph(cfg.model);
  const int chunks = custom ? s.place.virtual_stages : schedule_chunks(s.order.schedule, s.place.virtual_stages);
  s.place.stage_of_unit = unit_stages(cfg, model, e, chunks, s.place.pp);
  std::vector<std::string> errors;
  const std::vector<int> split = per_unit(model, s.place.stage_of_unit, p.split_backward, e.split_subsets, e, errors);
  s.replicate.zero_of_unit = per_unit(model, s.place.stage_of_unit, p.zero, e.zero_subsets, e, errors);
  s.recompute = resolve_recompute(model, e, s.place.stage_of_unit, errors);
  throw_errors(errors);
  s.split_backward_of_unit.assign(split.begin(), split.end());
  // Zero-bubble schedules need the backward split into its two halves: of every unit, unless some are split.
  const bool zero_bubble = s.order.schedule == ScheduleKind::SCHEDULE_ZBH1 ||
                           s.order.schedule == ScheduleKind::SCHEDULE_DUALPIPEV;
  if (zero_bubble) split_every_backward_unless_some(s);
  s.replicate.dp = static_cast<int>(p.dp);
  // At least one byte: a bucket_mb above 0 but below half a byte (1e-310) would round to 0, and the directives
  // printed for the plan (bucket_mb: 0) would be refused.
  s.replicate.bucket_bytes = std::max<int64_t>(1, std::llround(p.bucket_mb * (1 << 20)));
  s.shard.tp = static_cast<int>(p.tp);
  s.shard.ep = static_cast<int>(p.ep);
  if (custom) {
    for (const auto& rank : e.order_ranks) {
      std::vector<PipeOp>& ops = s.order.custom.emplace_back();
      for (const config::OrderOp& op : rank) {
        const Pass pass = op.pass == "F"    ? Pass::PASS_F
                          : op.pass == "B"  ? Pass::PASS_B
                          : op.pass == "BI" ? Pass::PASS_BI
                                            : Pass::PASS_BW;
        // An order written with BI/BW splits the backward.
        if (pass == Pass::PASS_BI || pass == Pass::PASS_BW) split_every_backward_unless_some(s);
        ops.push_back({pass, static_cast<int>(op.microbatch), static_cast<int>(op.chunk),
                       static_cast<int>(op.first_unit), static_cast<int>(op.last_unit), op.grouped});
      }
    }
    s.order.chunks = s.place.virtual_stages;
  }
  const int64_t per_microbatch =
      cfg.train.global_batch /
      std::max<int64_t>(1, config::size_product({p.dp, p.microbatches}, "parallel.dp x parallel.microbatches"));
  // The executor checks every message against the tensor it lands in.
  s.compute_elem_bytes = config::storage_bytes(config::precision_of(cfg.train));
  s.activation_bytes = config::size_product(
      {per_microbatch, cfg.train.seq_len, cfg.model.d_model, s.compute_elem_bytes},
      "the activation of one microbatch, train.global_batch / (dp x microbatches) x train.seq_len x model.d_model "
      "x its element's bytes");
  s.microbatch_rows = per_microbatch * cfg.train.seq_len;  // a factor of activation_bytes: fits
  return s;
}

namespace {

// The hand-written order of s, placed by s.place (the loop layout when it gives no ranks).
PipeSchedule custom_schedule(const Strategy& s) {
  const auto& custom = s.order.custom;
  PipeSchedule sched;
  sched.kind = s.order.schedule;
  sched.ranks = s.place.pp;
  sched.chunks = s.order.chunks;
  sched.microbatches = s.split.microbatches;
  if (s.order.chunks < 1 || s.order.chunks != s.place.virtual_stages)
    throw std::invalid_argument("the hand-written order has " + std::to_string(s.order.chunks) +
                                " chunk(s) per rank, but place has virtual_stages " +
                                std::to_string(s.place.virtual_stages));
  sched.rank_of_stage = s.place.rank_of_stage.empty() ? loop_placement(s.place.pp, s.order.chunks)
                                                      : s.place.rank_of_stage;
  // Plain words for the places and values the order's rules speak of.
  OrderNames names;
  names.op = [](int rank, int op) { return "op " + std::to_string(op) + " of rank " + std::to_string(rank); };
  names.value = [&](const std::string& key) {
    if (key == "parallel.pp") return "place pp " + std::to_string(s.place.pp);
    if (key == "parallel.microbatches") return "split microbatches " + std::to_string(s.split.microbatches);
    if (key == "parallel.virtual_stages") return "place virtual_stages " + std::to_string(s.place.virtual_stages);
    return std::string("split_backward");
  };
  if (const std::optional<OrderProblem> problem = order_problem(custom, s.place.pp, s.order.chunks,
                                                               s.split.microbatches, s.any_split_backward(), names)) {
    const std::string where = problem->rank < 0  ? "the hand-written order"
                              : problem->op < 0 ? "rank " + std::to_string(problem->rank) + " of the hand-written order"
                                                : names.op(problem->rank, problem->op) + " of the hand-written order";
    throw std::invalid_argument(where + ": " + problem->message);
  }
  // A Strategy made in code says it splits the backward when its order does (expand sets it so).
  for (const auto& ops : custom)
    for (const PipeOp& op : ops)
      if (!s.any_split_backward() && (op.pass == Pass::PASS_BI || op.pass == Pass::PASS_BW))
        throw std::invalid_argument("the hand-written order runs " + pipe_op_name(op, s.order.chunks) +
                                    ", a backward half, but the backward is fused (no split_backward)");
  sched.ops = custom;
  return sched;
}

}  // namespace

PipeSchedule schedule_of(const Strategy& s) {
  const std::vector<int>& placed = s.place.rank_of_stage;
  if (!placed.empty()) {
    if (const std::string problem = placement_problem(placed, s.place.pp); !problem.empty())
      throw std::invalid_argument("place ranks: " + problem);
  }
  if (!s.order.custom.empty()) return custom_schedule(s);
  PipeSchedule sched = make_schedule(s.order.schedule, s.place.pp, s.place.virtual_stages, s.split.microbatches,
                                     s.any_split_backward(), s.order.pairs);
  if (!placed.empty() && placed != sched.rank_of_stage) {
    std::string own;
    for (int r : sched.rank_of_stage) own += (own.empty() ? "" : ", ") + std::to_string(r);
    throw std::invalid_argument(std::string("place ranks: ") + schedule_name(s.order.schedule) +
                                " orders its ops for its own layout, stages on ranks [" + own +
                                "]; another placement needs a hand-written order (order: {ranks: ...})");
  }
  return sched;
}

namespace {

// A scalar YAML reads back as the same string: plain when safe, else double-quoted.
std::string scalar(const std::string& v) {
  bool plain = !v.empty() && std::isalpha(static_cast<unsigned char>(v[0]));
  for (char ch : v) plain &= std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_';
  for (const char* word : {"true", "false", "yes", "no", "on", "off", "null", "y", "n"}) {
    std::string lower;
    for (char ch : v) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    plain &= lower != word;
  }
  if (plain) return v;
  std::string out = "\"";
  for (unsigned char ch : v) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (ch < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", ch);
      out += buf;
      continue;
    }
    out += static_cast<char>(ch);
  }
  return out + "\"";
}

// The shortest text that reads back as the same double.
std::string shortest(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, ec == std::errc() ? end : buf);
}

// The recompute directives giving `of_unit` (unit u > 0 is block u - 1): every block reset to none, then
// each other mode over the blocks that have it, as ranges; one directive when every block is recomputed fully.
std::string recompute_yaml(const std::vector<Recompute>& of_unit) {
  if (of_unit.size() < 2) return "";
  const std::vector<Recompute> blocks(of_unit.begin() + 1, of_unit.end() - 1);
  if (std::all_of(blocks.begin(), blocks.end(), [](Recompute r) { return r == Recompute::RECOMPUTE_FULL; }))
    return "  - recompute: {mode: full}\n";
  std::string out = "  - recompute: {mode: none}\n";
  for (Recompute mode : {Recompute::RECOMPUTE_SELECTIVE, Recompute::RECOMPUTE_FULL}) {
    std::string ranges;
    for (size_t b = 0; b < blocks.size(); ++b) {
      if (blocks[b] != mode || (b > 0 && blocks[b - 1] == mode)) continue;
      size_t e = b;
      while (e + 1 < blocks.size() && blocks[e + 1] == mode) ++e;
      ranges += (ranges.empty() ? "" : ", ") + (e == b ? std::to_string(b) : "\"" + std::to_string(b) + "-" + std::to_string(e) + "\"");
    }
    if (!ranges.empty()) out += std::string("  - recompute: {mode: ") + recompute_name(mode) + ", blocks: [" + ranges + "]}\n";
  }
  return out;
}

// " unit: [embed, \"layers.3\"]": the units whose value in `of_unit` is `v`.
std::string units_with(const std::vector<std::string>& names, const std::vector<int>& of_unit, int v) {
  std::string out;
  for (size_t u = 0; u < of_unit.size() && u < names.size(); ++u)
    if (of_unit[u] == v) out += (out.empty() ? "" : ", ") + scalar(names[u]);
  return "unit: [" + out + "]";
}

// The value most units have (the smallest of a tie): printed for all, the others as subsets after it.
int most_common(const std::vector<int>& of_unit) {
  int best = of_unit.empty() ? 0 : of_unit.front(), best_count = 0;
  for (int v : of_unit) {
    const int count = static_cast<int>(std::count(of_unit.begin(), of_unit.end(), v));
    if (count > best_count || (count == best_count && v < best)) best = v, best_count = count;
  }
  return best;
}

std::string zero_keys(int zero) {
  auto flag = [](bool b) { return b ? "true" : "false"; };
  return std::string("shard_grads: ") + flag(zero >= 2) + ", shard_params: " + flag(zero >= 3) +
         ", shard_optimizer: " + flag(zero >= 1);
}

}  // namespace

std::string directives_yaml(const Strategy& s, const ModelGraph& model) {
  std::vector<std::string> names;
  for (const UnitSpec& u : model.units) names.push_back(u.name);
  const std::vector<int> split(s.split_backward_of_unit.begin(), s.split_backward_of_unit.end());
  const int split_all = most_common(split), zero_all = most_common(s.replicate.zero_of_unit);
  std::ostringstream o;
  o << "directives:\n";
  o << "  - split: {microbatches: " << s.split.microbatches << "}\n";
  o << "  - split_backward: " << (split_all ? "true" : "false") << "\n";
  if (split_all == 0 && s.any_split_backward()) o << "  - split_backward: {" << units_with(names, split, 1) << "}\n";
  o << "  - place: {pp: " << s.place.pp << ", virtual_stages: " << s.place.virtual_stages;
  if (!s.place.stage_of_unit.empty()) {
    o << ", stage_of_unit: [";
    for (size_t i = 0; i < s.place.stage_of_unit.size(); ++i) o << (i ? ", " : "") << s.place.stage_of_unit[i];
    o << "]";
  }
  // The placement and the order written out in full, so that any schedule can be copied and edited.
  const PipeSchedule sched = schedule_of(s);
  o << ", ranks: [";
  for (size_t i = 0; i < sched.rank_of_stage.size(); ++i) o << (i ? ", " : "") << sched.rank_of_stage[i];
  o << "]}\n";
  o << "  - replicate: {dp: " << s.replicate.dp << ", " << zero_keys(zero_all)
    << ", bucket_mb: " << shortest(static_cast<double>(s.replicate.bucket_bytes) / (1 << 20)) << "}\n";
  for (int zero = 0; zero <= 3; ++zero)
    if (zero != zero_all && std::count(s.replicate.zero_of_unit.begin(), s.replicate.zero_of_unit.end(), zero) > 0)
      o << "  - replicate: {" << zero_keys(zero) << ", " << units_with(names, s.replicate.zero_of_unit, zero) << "}\n";
  o << "  - shard: {tp: " << s.shard.tp << ", ep: " << s.shard.ep << "}\n";
  // The order op by op, one rank per line, like the schedule tables of docs/schedules.md.
  o << "  - order:";
  if (s.order.custom.empty())
    o << "  # " << schedule_name(s.order.schedule) << (s.order.pairs ? " with pairs" : "") << ", op by op";
  o << "\n      ranks:\n";
  for (const auto& ops : sched.ops) o << "        - [" << pipe_ops_text(ops, sched.chunks) << "]\n";
  o << "  - grid: {order: " << scalar(s.grid_order) << "}\n";
  o << recompute_yaml(s.recompute);
  return o.str();
}

}  // namespace piper::ir
