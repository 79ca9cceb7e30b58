// layout.cpp — runs of the virtual parameter space per rank, write ownership,
// and the transfer planner between two layouts (docs/state.md).
#include "state/layout.hpp"

#include <algorithm>
#include <exception>
#include <iterator>
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

ir::ZeroState zero_state_of(StateKind k) {
  return k == StateKind::STATE_PARAM ? ir::ZeroState::ZERO_PARAMS : ir::ZeroState::ZERO_MOMENTS;
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
  thread_local std::vector<ir::Stretch> stretches;
  ir::PieceStretches(spec, n, at).walk(lo, hi, stretches);
  int64_t i = lo;
  for (const ir::Stretch& st : stretches) {
    if (!runs.empty() && runs.back().end == st.global)
      runs.back().end += st.len;
    else {
      runs.push_back({st.global, st.global + st.len});
      local_start.push_back(i);
    }
    i += st.len;
  }
}

namespace {

constexpr StateKind kKinds[] = {StateKind::STATE_PARAM, StateKind::STATE_EXP_AVG, StateKind::STATE_EXP_AVG_SQ};

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
        Piece pc;
        pc.kind = kind;
        pc.param = p.name;
        pc.unit = spec.index;
        local_to_global_runs(p, n, at, lo, hi, pc.runs, pc.local_offsets);
        // Where the part's elements start in the buffer the rank stores: its shard buffer, or its full buffer.
        const int64_t base = sharded ? part.shard_offset - z.offset : part.full_offset;
        for (int64_t& s : pc.local_offsets) s += base + at_offset;
        out.push_back(std::move(pc));
      }
    }
  }
}

void check_rank(const ir::ModelGraph& graph, const LayoutParams& lp, int rank) {
  if (lp.devices_of_unit.size() != graph.units.size())
    throw std::invalid_argument("layout: devices_of_unit has " + std::to_string(lp.devices_of_unit.size()) +
                                " units, the model " + std::to_string(graph.units.size()));
  if (rank < 0 || rank >= lp.dims.world_size())
    throw std::out_of_range("layout: rank " + std::to_string(rank) + " outside world " +
                            std::to_string(lp.dims.world_size()));
}

// The pieces of unit u on `rank` (none when the rank does not run it, or, owned, is not its writer).
void pieces_of_unit(const ir::ModelGraph& graph, const LayoutParams& lp, int rank, size_t u, bool owned,
                    std::vector<Piece>& out) {
  const auto& devs = lp.devices_of_unit[u];
  if (!std::binary_search(devs.begin(), devs.end(), rank)) return;
  const ir::Coords at = lp.dims.coords(rank);
  if (owned && lp.dims.coord(devs.front(), ir::Axis::PP) != at.pp) return;
  unit_pieces(graph.units[u], lp, at, owned, out);
}

std::vector<Piece> pieces(const ir::ModelGraph& graph, const LayoutParams& lp, int rank, bool owned) {
  check_rank(graph, lp, rank);
  std::vector<Piece> out;
  for (size_t u = 0; u < graph.units.size(); ++u) pieces_of_unit(graph, lp, rank, u, owned, out);
  return out;
}

// Which source writes each element of one tensor: the owned runs of every source, which partition
// it, sorted.
struct Owner {
  int64_t begin = 0, end = 0;
  int src = 0;
};
using Owners = std::vector<Owner>;

// The slot of a piece among its unit's tensors: parameter (spec order) x kind.
size_t slot_of(const Piece& p, const std::map<std::string, size_t>& index) {
  return index.at(p.param) * std::size(kKinds) + static_cast<size_t>(p.kind);
}

// Sorts `o`, made of sorted segments starting at `starts`, by merging neighbouring segments.
void merge_segments(Owners& o, std::vector<size_t> starts) {
  const auto by_begin = [](const Owner& a, const Owner& b) { return a.begin < b.begin; };
  const auto at = [&o](size_t i) { return o.begin() + static_cast<std::ptrdiff_t>(i); };
  starts.push_back(o.size());
  while (starts.size() > 2) {
    std::vector<size_t> next;
    for (size_t i = 0; i + 1 < starts.size(); i += 2) {
      next.push_back(starts[i]);
      if (i + 2 < starts.size()) std::inplace_merge(at(starts[i]), at(starts[i + 1]), at(starts[i + 2]), by_begin);
    }
    next.push_back(o.size());
    starts = std::move(next);
  }
}

// The first owner at or after `j` whose end lies beyond `at`: galloping, since a destination's runs
// come in order and mostly close together.
size_t seek(const Owners& o, size_t j, int64_t at) {
  size_t step = 1, lo = j, hi = j;
  while (hi < o.size() && o[hi].end <= at) lo = hi, hi += step, step *= 2;
  hi = std::min(hi, o.size());
  return static_cast<size_t>(std::partition_point(o.begin() + static_cast<std::ptrdiff_t>(lo),
                                                  o.begin() + static_cast<std::ptrdiff_t>(hi),
                                                  [at](const Owner& x) { return x.end <= at; }) -
                             o.begin());
}

// Appends `r` to the runs of source `src` among `by_src`, merging it with the last when adjacent.
void add_run(std::vector<std::pair<int, std::vector<Run>>>& by_src, int src, Run r) {
  auto it = std::find_if(by_src.begin(), by_src.end(), [src](const auto& e) { return e.first == src; });
  if (it == by_src.end()) it = by_src.insert(by_src.end(), {src, {}});
  if (!it->second.empty() && it->second.back().end == r.begin)
    it->second.back().end = r.end;
  else
    it->second.push_back(r);
}

// The sources of one destination piece: what `local` (the piece the local source holds, or null)
// has of it, then every other element from its owner.
std::vector<std::pair<int, std::vector<Run>>> sources_of(Piece& pc, const Owners& owners, int local_src,
                                                         const Piece* local) {
  std::vector<std::pair<int, std::vector<Run>>> by_src;
  if (local && local->runs == pc.runs) {  // a replica kept: all of it
    by_src.emplace_back(local_src, std::move(pc.runs));
    return by_src;
  }
  std::vector<Run> rest;
  if (local) {
    std::vector<Run> mine = intersect(pc.runs, local->runs);
    if (!mine.empty()) {
      rest = subtract(pc.runs, mine);
      by_src.push_back({local_src, std::move(mine)});
    }
  }
  size_t j = 0;
  for (const Run& r : by_src.empty() ? pc.runs : rest)
    for (int64_t at = r.begin; at < r.end;) {
      j = seek(owners, j, at);
      if (j == owners.size() || owners[j].begin > at)
        throw std::logic_error("plan_transfers: element " + std::to_string(at) + " of " + pc.param + " has no owner");
      const int64_t hi = std::min(r.end, owners[j].end);
      add_run(by_src, owners[j].src, {at, hi});
      at = hi;
    }
  std::sort(by_src.begin(), by_src.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return by_src;
}

// The transfers of unit u, destination by destination.
void unit_transfers(const ir::ModelGraph& graph, const LayoutParams& from, const LayoutParams& to,
                    const std::vector<int>& local_src, size_t u, std::vector<Transfer>& out) {
  const ir::UnitSpec& unit = graph.units[u];
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < unit.params.size(); ++i) index[unit.params[i].name] = i;
  std::vector<Owners> owners(unit.params.size() * std::size(kKinds));
  std::vector<std::vector<size_t>> segments(owners.size());  // where each source's sorted runs start
  std::vector<Piece> ps;
  for (int s : from.devices_of_unit[u]) {
    ps.clear();
    pieces_of_unit(graph, from, s, u, true, ps);
    for (const Piece& p : ps) {
      Owners& o = owners[slot_of(p, index)];
      segments[slot_of(p, index)].push_back(o.size());
      for (const Run& r : p.runs) o.push_back({r.begin, r.end, s});
    }
  }
  for (size_t k = 0; k < owners.size(); ++k) merge_segments(owners[k], segments[k]);
  std::vector<Piece> mine, local;
  std::vector<const Piece*> local_of(owners.size());
  for (int d : to.devices_of_unit[u]) {
    mine.clear(), local.clear();
    pieces_of_unit(graph, to, d, u, false, mine);
    const int ls = local_src.empty() ? -1 : local_src[static_cast<size_t>(d)];
    if (ls >= 0) pieces_of_unit(graph, from, ls, u, false, local);
    std::fill(local_of.begin(), local_of.end(), nullptr);
    for (const Piece& p : local) local_of[slot_of(p, index)] = &p;
    for (Piece& pc : mine)
      for (auto& [s, runs] : sources_of(pc, owners[slot_of(pc, index)], ls, local_of[slot_of(pc, index)]))
        out.push_back({pc.kind, pc.param, unit.index, s, d, std::move(runs)});
  }
}

}  // namespace

std::vector<Piece> held(const ir::ModelGraph& graph, const LayoutParams& lp, int rank) {
  return pieces(graph, lp, rank, false);
}

std::vector<Piece> owned_for_write(const ir::ModelGraph& graph, const LayoutParams& lp, int rank) {
  return pieces(graph, lp, rank, true);
}

std::vector<Transfer> plan_transfers(const ir::ModelGraph& graph, const LayoutParams& from, const LayoutParams& to,
                                     const std::vector<int>& local_src) {
  check_rank(graph, from, 0);
  check_rank(graph, to, 0);
  if (!local_src.empty() && local_src.size() != static_cast<size_t>(to.dims.world_size()))
    throw std::invalid_argument("plan_transfers: local_src has " + std::to_string(local_src.size()) +
                                " entries, the destination layout " + std::to_string(to.dims.world_size()) + " ranks");
  for (int s : local_src)
    if (s < -1 || s >= from.dims.world_size())
      throw std::out_of_range("plan_transfers: local source " + std::to_string(s) + " outside the source world " +
                              std::to_string(from.dims.world_size()));
  // Unit by unit, in parallel; joined in unit order, so the plan does not depend on the threads.
  std::vector<std::vector<Transfer>> of_unit(graph.units.size());
  std::exception_ptr failed;
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t u = 0; u < graph.units.size(); ++u) {
    try {
      unit_transfers(graph, from, to, local_src, u, of_unit[u]);
    } catch (...) {
#pragma omp critical
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  size_t n = 0;
  for (const auto& v : of_unit) n += v.size();
  std::vector<Transfer> out;
  out.reserve(n);
  for (auto& v : of_unit) std::move(v.begin(), v.end(), std::back_inserter(out));
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
