// layout.cpp — runs of the virtual parameter space per rank, write ownership,
// and the transfer planner between two layouts (docs/state.md).
#include "state/layout.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <utility>


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
  return {plan.strategy.dims(), plan.strategy.replicate.zero_of_unit, plan.devices_of_unit};
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

void local_to_global_runs(const ir::ParamSpec& spec, const ir::Degrees& n, const ir::Coords& at, int64_t lo,
                          int64_t hi, std::vector<Run>& runs, std::vector<int64_t>& local_start) {
  runs.clear();
  local_start.clear();
  for (int64_t i = lo; i < hi;) {
    const ir::Stretch st = ir::global_stretch(spec, n, at, i);
    const int64_t len = std::min(st.len, hi - i);
    if (!runs.empty() && runs.back().end == st.global)
      runs.back().end += len;
    else {
      runs.push_back({st.global, st.global + len});
      local_start.push_back(i);
    }
    i += len;
  }
}

namespace {

constexpr StateKind kKinds[] = {StateKind::STATE_PARAM, StateKind::STATE_EXP_AVG, StateKind::STATE_EXP_AVG_SQ};

ir::ZeroState zero_state_of(StateKind k) {
  return k == StateKind::STATE_PARAM ? ir::ZeroState::ZERO_PARAMS : ir::ZeroState::ZERO_MOMENTS;
}

// Whether `rank` writes the elements its piece of `p` holds as far as the
// grid goes: along every axis the parameter is replicated over, coordinate 0
// writes (the data-parallel shard rule picks among dp replicas, the ep
// coordinate of a dense parameter among them).
bool writes_replica(const ir::ParamSpec& p, const ir::Coords& at) {
  for (ir::Axis a : ir::kAxes)
    if (a != ir::Axis::DP && a != ir::Axis::PP && a != ir::Axis::EP && !ir::split_along(p, a) && at[a] != 0)
      return false;
  return true;
}

// The pieces of one unit's parameters on `rank` (held, or owned for writing).
void unit_pieces(const ir::UnitSpec& spec, const LayoutParams& lp, const ir::Coords& at, bool owned,
                 std::vector<Piece>& out) {
  const ir::Degrees n = lp.dims.degrees();
  const int zero = lp.zero_of_unit.at(static_cast<size_t>(spec.index));
  std::vector<Run> runs;
  std::vector<int64_t> starts;
  for (const ir::FlatPart& part : ir::flat_parts(spec, n, at)) {
    const ir::FlatShard& z = part.zero;
    int64_t offset = 0;  // of the parameter's piece in the part
    for (size_t i = part.first; i < part.first + part.count; ++i) {
      const ir::ParamSpec& p = spec.params[i];
      const int64_t numel = ir::local_numel(p, n);
      const int64_t at_offset = offset;
      offset += numel;
      if (owned && !writes_replica(p, at)) continue;
      for (StateKind kind : kKinds) {
        const bool sharded = ir::zero_shards(zero, zero_state_of(kind));
        // The range of the part concerned, then of this param's piece.
        int64_t b_lo = sharded ? z.offset : 0, b_hi = sharded ? z.offset + z.len : z.padded;
        if (owned) b_lo = std::max(b_lo, z.offset), b_hi = std::min(b_hi, z.offset + z.len);
        const int64_t lo = std::max<int64_t>(0, b_lo - at_offset), hi = std::min(numel, b_hi - at_offset);
        if (lo >= hi) continue;
        local_to_global_runs(p, n, at, lo, hi, runs, starts);
        Piece pc;
        pc.kind = kind;
        pc.param = p.name;
        pc.unit = spec.index;
        pc.runs = runs;
        // Where the part's elements start in the buffer the rank stores: its shard buffer, or its full buffer.
        const int64_t base = sharded ? part.shard_offset - z.offset : part.full_offset;
        pc.local_offsets.reserve(starts.size());
        for (int64_t s : starts) pc.local_offsets.push_back(base + at_offset + s);
        out.push_back(std::move(pc));
      }
    }
  }
}

std::vector<Piece> pieces(const ir::ModelGraph& graph, const LayoutParams& lp, int rank, bool owned) {
  if (lp.devices_of_unit.size() != graph.units.size())
    throw std::invalid_argument("layout: devices_of_unit has " + std::to_string(lp.devices_of_unit.size()) +
                                " units, the model " + std::to_string(graph.units.size()));
  if (rank < 0 || rank >= lp.dims.world_size())
    throw std::out_of_range("layout: rank " + std::to_string(rank) + " outside world " +
                            std::to_string(lp.dims.world_size()));
  const ir::Coords at = lp.dims.coords(rank);
  std::vector<Piece> out;
  for (size_t u = 0; u < graph.units.size(); ++u) {
    const auto& devs = lp.devices_of_unit[u];
    if (std::find(devs.begin(), devs.end(), rank) == devs.end()) continue;
    if (owned && lp.dims.coord(devs.front(), ir::Axis::PP) != at.pp) continue;
    unit_pieces(graph.units[u], lp, at, owned, out);
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
  for (int s = 0; s < from.dims.world_size(); ++s)
    for (Piece& pc : owned_for_write(graph, from, s)) sources[{pc.kind, pc.param}].emplace_back(s, std::move(pc.runs));
  std::vector<Transfer> out;
  for (int d = 0; d < to.dims.world_size(); ++d)
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
