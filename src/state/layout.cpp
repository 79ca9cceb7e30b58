// layout.cpp — runs of the virtual parameter space per rank, write ownership,
// and the transfer planner between two layouts (docs/state.md).
#include "state/layout.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <utility>

#include "ir/grid.hpp"

namespace piper::state {

// ---- runs --------------------------------------------------------------------------

std::vector<Run> normalise(std::vector<Run> runs) {
  runs.erase(std::remove_if(runs.begin(), runs.end(), [](const Run& r) { return r.end <= r.begin; }), runs.end());
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.begin < b.begin; });
  std::vector<Run> out;
  out.reserve(runs.size());
  for (const Run& r : runs) {
    if (!out.empty() && r.begin <= out.back().end)
      out.back().end = std::max(out.back().end, r.end);
    else
      out.push_back(r);
  }
  return out;
}

std::vector<Run> intersect(const std::vector<Run>& a, const std::vector<Run>& b) {
  std::vector<Run> out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t lo = std::max(a[i].begin, b[j].begin), hi = std::min(a[i].end, b[j].end);
    if (lo < hi) {
      if (!out.empty() && out.back().end == lo)
        out.back().end = hi;
      else
        out.push_back({lo, hi});
    }
    if (a[i].end < b[j].end)
      ++i;
    else
      ++j;
  }
  return out;
}

std::vector<Run> subtract(const std::vector<Run>& a, const std::vector<Run>& b) {
  std::vector<Run> out;
  size_t j = 0;
  for (const Run& r : a) {
    int64_t cur = r.begin;
    while (j < b.size() && b[j].end <= cur) ++j;
    size_t k = j;
    while (k < b.size() && b[k].begin < r.end) {
      if (b[k].begin > cur) out.push_back({cur, b[k].begin});
      cur = std::max(cur, b[k].end);
      if (b[k].end >= r.end) break;
      ++k;
    }
    if (cur < r.end) out.push_back({cur, r.end});
  }
  return out;
}

std::vector<Run> unite(const std::vector<Run>& a, const std::vector<Run>& b) {
  std::vector<Run> all(a);
  all.insert(all.end(), b.begin(), b.end());
  return normalise(std::move(all));
}

int64_t total(const std::vector<Run>& runs) {
  int64_t n = 0;
  for (const Run& r : runs) n += r.size();
  return n;
}

// ---- layouts -----------------------------------------------------------------------

LayoutParams layout_params(const ir::Plan& plan) {
  LayoutParams lp;
  lp.world = plan.strategy.world_size;
  lp.dp = plan.strategy.replicate.dp;
  lp.tp = plan.strategy.shard.tp;
  lp.zero = plan.strategy.replicate.zero;
  lp.grid_order = plan.strategy.grid_order;
  lp.pp = plan.strategy.place.pp;
  lp.devices_of_unit = plan.devices_of_unit;
  return lp;
}

const char* state_kind_name(StateKind k) {
  switch (k) {
    case StateKind::STATE_PARAM: return "param";
    case StateKind::STATE_EXP_AVG: return "exp_avg";
    case StateKind::STATE_EXP_AVG_SQ: return "exp_avg_sq";
  }
  return "?";
}

std::string dataset_name(StateKind kind, const std::string& param_name) {
  switch (kind) {
    case StateKind::STATE_PARAM: return "/model/" + param_name;
    case StateKind::STATE_EXP_AVG: return "/optim/exp_avg/" + param_name;
    case StateKind::STATE_EXP_AVG_SQ: return "/optim/exp_avg_sq/" + param_name;
  }
  throw std::invalid_argument("unknown state kind");
}

void local_to_global_runs(const ir::ParamSpec& spec, int tp_rank, int tp, int64_t lo, int64_t hi,
                          std::vector<Run>& runs, std::vector<int64_t>& local_start) {
  runs.clear();
  local_start.clear();
  if (lo >= hi) return;
  if (spec.tp_dim < 0 || tp == 1) {
    runs.push_back({lo, hi});
    local_start.push_back(lo);
    return;
  }
  const auto local = ir::tp_local_shape(spec, tp);
  const size_t d = static_cast<size_t>(spec.tp_dim);
  int64_t inner = 1;
  for (size_t k = d + 1; k < local.size(); ++k) inner *= local[k];
  const int64_t n_local = local[d];
  std::vector<int64_t> parts = spec.tp_parts;
  if (parts.empty()) parts.push_back(spec.shape[d]);
  // Local elements stay globally contiguous within one part's piece of one
  // outer index: inner * piece elements.
  for (int64_t i = lo; i < hi;) {
    const int64_t outer = i / (inner * n_local), c = (i / inner) % n_local;
    int64_t local_part_start = 0, piece = 0;
    for (int64_t p : parts) {
      piece = p / tp;
      if (c < local_part_start + piece) break;
      local_part_start += piece;
    }
    const int64_t block_end = (outer * n_local + local_part_start + piece) * inner;
    const int64_t end = std::min(hi, block_end);
    const int64_t g = ir::tp_global_index(spec, tp_rank, tp, i);
    if (!runs.empty() && runs.back().end == g)
      runs.back().end += end - i;
    else {
      runs.push_back({g, g + (end - i)});
      local_start.push_back(i);
    }
    i = end;
  }
}

namespace {

constexpr StateKind kKinds[] = {StateKind::STATE_PARAM, StateKind::STATE_EXP_AVG, StateKind::STATE_EXP_AVG_SQ};

ir::RankGrid grid_of(const LayoutParams& lp) {
  return ir::RankGrid(lp.world, lp.grid_order, {{"tp", lp.tp}, {"dp", lp.dp}, {"pp", lp.pp}});
}

std::vector<Piece> pieces(const ir::ModelGraph& graph, const LayoutParams& lp, int rank, bool owned) {
  if (lp.devices_of_unit.size() != graph.units.size())
    throw std::invalid_argument("layout: devices_of_unit has " + std::to_string(lp.devices_of_unit.size()) +
                                " units, the model " + std::to_string(graph.units.size()));
  if (rank < 0 || rank >= lp.world)
    throw std::out_of_range("layout: rank " + std::to_string(rank) + " outside world " + std::to_string(lp.world));
  const ir::RankGrid grid = grid_of(lp);
  const int tr = grid.coord(rank, "tp"), dr = grid.coord(rank, "dp"), pr = grid.coord(rank, "pp");
  const int64_t dp = std::max(1, lp.dp);
  std::vector<Piece> out;
  std::vector<Run> runs;
  std::vector<int64_t> starts;
  for (size_t u = 0; u < graph.units.size(); ++u) {
    const auto& devs = lp.devices_of_unit[u];
    if (std::find(devs.begin(), devs.end(), rank) == devs.end()) continue;
    if (owned && grid.coord(devs.front(), "pp") != pr) continue;
    const ir::UnitSpec& spec = graph.units[u];
    std::vector<int64_t> offs, numels;
    int64_t numel = 0;
    for (const auto& p : spec.params) {
      if (!ir::tp_divides(p, lp.tp))
        throw std::invalid_argument(p.name + ": its split dimension does not divide by tp " + std::to_string(lp.tp));
      int64_t n = 1;
      for (int64_t x : ir::tp_local_shape(p, lp.tp)) n *= x;
      offs.push_back(numel);
      numels.push_back(n);
      numel += n;
    }
    const int64_t shard_len = (numel + dp - 1) / dp, shard_off = dr * shard_len;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const ir::ParamSpec& p = spec.params[i];
      if (owned && p.tp_dim < 0 && tr != 0) continue;  // replicated over tp: tp rank 0 writes
      for (StateKind kind : kKinds) {
        const bool sharded = kind == StateKind::STATE_PARAM ? lp.zero >= 3 : lp.zero >= 1;
        // The range of the unit's flat local buffer concerned, then of this param's piece.
        int64_t b_lo = sharded ? shard_off : 0, b_hi = sharded ? shard_off + shard_len : numel;
        if (owned) b_lo = std::max(b_lo, shard_off), b_hi = std::min(b_hi, shard_off + shard_len);
        const int64_t lo = std::max<int64_t>(0, b_lo - offs[i]), hi = std::min(numels[i], b_hi - offs[i]);
        if (lo >= hi) continue;
        local_to_global_runs(p, tr, lp.tp, lo, hi, runs, starts);
        Piece pc;
        pc.kind = kind;
        pc.param = p.name;
        pc.unit = static_cast<int>(u);
        pc.runs = runs;
        const int64_t base = sharded ? shard_off : 0;
        pc.local_offsets.reserve(starts.size());
        for (int64_t s : starts) pc.local_offsets.push_back(offs[i] + s - base);
        out.push_back(std::move(pc));
      }
    }
  }
  return out;
}

}  // namespace

std::vector<Piece> held(const ir::ModelGraph& graph, const LayoutParams& lp, int rank) {
  return pieces(graph, lp, rank, false);
}

std::vector<Piece> owned_for_write(const ir::ModelGraph& graph, const LayoutParams& lp, int rank) {
  return pieces(graph, lp, rank, true);
}

std::vector<Transfer> plan_transfers(const ir::ModelGraph& graph, const LayoutParams& from, const LayoutParams& to) {
  std::map<std::pair<StateKind, std::string>, std::vector<std::pair<int, std::vector<Run>>>> sources;
  for (int s = 0; s < from.world; ++s)
    for (Piece& pc : owned_for_write(graph, from, s)) sources[{pc.kind, pc.param}].emplace_back(s, std::move(pc.runs));
  std::vector<Transfer> out;
  for (int d = 0; d < to.world; ++d)
    for (const Piece& pc : held(graph, to, d)) {
      auto it = sources.find({pc.kind, pc.param});
      if (it == sources.end()) continue;
      for (const auto& [s, runs] : it->second) {
        std::vector<Run> r = intersect(pc.runs, runs);
        if (!r.empty()) out.push_back({pc.kind, pc.param, s, d, std::move(r)});
      }
    }
  return out;
}

std::vector<int64_t> locate(const Piece& piece, const std::vector<Run>& runs) {
  std::vector<int64_t> out;
  out.reserve(runs.size());
  for (const Run& r : runs) {
    auto it = std::upper_bound(piece.runs.begin(), piece.runs.end(), r.begin,
                               [](int64_t v, const Run& x) { return v < x.begin; });
    if (it == piece.runs.begin() || r.end > std::prev(it)->end || r.begin >= std::prev(it)->end)
      throw std::out_of_range("locate: run [" + std::to_string(r.begin) + ", " + std::to_string(r.end) +
                              ") is not inside one run of " + piece.param);
    const size_t k = static_cast<size_t>(std::prev(it) - piece.runs.begin());
    out.push_back(piece.local_offsets[k] + (r.begin - piece.runs[k].begin));
  }
  return out;
}

}  // namespace piper::state
