// test_layout.cpp — the virtual parameter space (src/state/layout.hpp): run utilities; for many
// strategies and world sizes (1, 2, 3, 4, 8: dp, tp, pp, zero 0-3 and combinations) that write
// ownership partitions every tensor, that held covers it (and dp replicas agree where they must),
// that held matches what model::ParamStore really stores; and that transfer plans between layouts
// cover exactly the destination's held runs.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "config/config.hpp"
#include "ir/compile.hpp"
#include "ir/parallel_dims.hpp"
#include "ir/model_graph.hpp"
#include "model/init.hpp"
#include "model/params.hpp"
#include "state/layout.hpp"
#include "unit/state/layouts.hpp"
#include "unit/test_configs.hpp"

namespace piper::state {
namespace {

using Runs = std::vector<Run>;
using Key = std::pair<StateKind, std::string>;

// ---- run utilities ------------------------------------------------------------------

TEST(Runs, Normalise) {
  EXPECT_EQ(normalise({{5, 7}, {0, 2}, {2, 3}, {6, 9}, {4, 4}}), (Runs{{0, 3}, {5, 9}}));
  EXPECT_EQ(normalise({}), Runs{});
}

TEST(Runs, IntersectSubtractUnite) {
  const Runs a{{0, 10}, {20, 30}}, b{{5, 25}, {28, 40}};
  EXPECT_EQ(intersect(a, b), (Runs{{5, 10}, {20, 25}, {28, 30}}));
  EXPECT_EQ(subtract(a, b), (Runs{{0, 5}, {25, 28}}));
  EXPECT_EQ(subtract(b, a), (Runs{{10, 20}, {30, 40}}));
  EXPECT_EQ(unite(a, b), (Runs{{0, 40}}));
  EXPECT_EQ(subtract(a, {}), a);
  EXPECT_EQ(subtract(a, a), Runs{});
  EXPECT_EQ(subtract(Runs{{0, 10}}, Runs{{2, 3}, {5, 6}, {9, 12}}), (Runs{{0, 2}, {3, 5}, {6, 9}}));
  EXPECT_EQ(intersect(Runs{{0, 5}, {5, 10}}, Runs{{3, 7}}), (Runs{{3, 7}}));
  EXPECT_EQ(total(a), 20);
}

TEST(Runs, DatasetNames) {
  EXPECT_EQ(dataset_name(StateKind::STATE_PARAM, "embed.weight"), "/model/embed.weight");
  EXPECT_EQ(dataset_name(StateKind::STATE_EXP_AVG, "x"), "/optim/exp_avg/x");
  EXPECT_EQ(dataset_name(StateKind::STATE_EXP_AVG_SQ, "x"), "/optim/exp_avg_sq/x");
}

ir::ParamSpec spec_of(std::vector<int64_t> shape, int dim, std::vector<int64_t> parts = {}) {
  ir::ParamSpec p;
  p.name = "w";
  p.shape = std::move(shape);
  p.shards = {{dim, ir::Axis::TP, std::move(parts)}};
  return p;
}

// local_to_global_runs agrees with ir::global_index element by element, and merges.
TEST(Runs, LocalToGlobalMatchesGlobalIndex) {
  std::vector<ir::ParamSpec> specs = {
      spec_of({6, 8}, 0),             // row split: one run
      spec_of({6, 8}, 1),             // column split: a run per row
      spec_of({12, 4}, 0, {4, 6, 2}),  // packed parts
      spec_of({3, 8, 4}, 1, {4, 4}),
  };
  // Experts over ep, then rows over tp: a run per part of an expert.
  specs.push_back(spec_of({4, 6, 2}, 1));
  specs.back().shards.insert(specs.back().shards.begin(), {0, ir::Axis::EP, {}});
  for (const auto& s : specs)
    for (int tp : {1, 2}) {
      const ir::Degrees n{.tp = tp, .ep = ir::split_along(s, ir::Axis::EP) ? 2 : 1};
      const int64_t local = ir::local_numel(s, n);
      for (int r = 0; r < tp; ++r)
        for (auto [lo, hi] : std::vector<std::pair<int64_t, int64_t>>{{0, local}, {3, local - 5}, {7, 8}}) {
          const ir::Coords at{.tp = r, .ep = n.ep - 1};
          Runs runs;
          std::vector<int64_t> starts;
          local_to_global_runs(s, n, at, lo, hi, runs, starts);
          ASSERT_EQ(runs.size(), starts.size());
          int64_t i = lo;
          for (size_t k = 0; k < runs.size(); ++k) {
            ASSERT_EQ(starts[k], i);
            if (k > 0) {
              EXPECT_LT(runs[k - 1].end, runs[k].begin);  // sorted, disjoint, merged
            }
            for (int64_t g = runs[k].begin; g < runs[k].end; ++g, ++i) ASSERT_EQ(g, ir::global_index(s, n, at, i));
          }
          EXPECT_EQ(i, hi);
        }
    }
  Runs runs;
  std::vector<int64_t> starts;
  local_to_global_runs(specs[0], {.tp = 2}, {.tp = 1}, 0, 24, runs, starts);
  EXPECT_EQ(runs, (Runs{{24, 48}}));
  local_to_global_runs(specs[1], {.tp = 2}, {.tp = 1}, 0, 24, runs, starts);
  EXPECT_EQ(runs.size(), 6u);
  local_to_global_runs(specs[2], {.tp = 2}, {.tp = 1}, 0, 24, runs, starts);
  EXPECT_EQ(runs, (Runs{{8, 16}, {28, 40}, {44, 48}}));
}

TEST(Runs, MillionElementsFast) {
  const ir::ParamSpec col = spec_of({1000, 1000}, 1), packed = spec_of({2000, 500}, 0, {1000, 400, 400, 200});
  const auto t0 = std::chrono::steady_clock::now();
  Runs runs;
  std::vector<int64_t> starts;
  local_to_global_runs(col, {.tp = 4}, {.tp = 3}, 0, 250000, runs, starts);
  EXPECT_EQ(runs.size(), 1000u);
  EXPECT_EQ(total(runs), 250000);
  local_to_global_runs(packed, {.tp = 2}, {.tp = 1}, 0, 500000, runs, starts);
  EXPECT_EQ(runs.size(), 4u);
  EXPECT_EQ(total(runs), 500000);
  local_to_global_runs(col, {}, {}, 0, 1000000, runs, starts);
  EXPECT_EQ(runs, (Runs{{0, 1000000}}));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("  1000 + 4 + 1 runs of 1.75e6 elements in %.3f s (limit 0.5 s)\n", s);
  EXPECT_LT(s, 0.5);
}

// ---- strategies (layouts.hpp) -------------------------------------------------------

std::vector<Strat> strategies() {
  std::vector<Strat> v;
  v.push_back({});
  for (int z = 0; z <= 3; ++z) {
    v.push_back({2, 1, 1, z});
    v.push_back({3, 1, 1, z});
    v.push_back({2, 2, 1, z});
    v.push_back({2, 1, 2, z});
    v.push_back({2, 2, 2, z});
    v.push_back({8, 1, 1, z});
  }
  v.push_back({1, 2, 1, 0});
  v.push_back({1, 1, 2, 0});
  v.push_back({1, 1, 3, 0});
  v.push_back({1, 2, 2, 0});
  v.push_back({4, 1, 1, 1});
  v.push_back({4, 1, 2, 2});
  v.push_back({1, 2, 4, 0});
  v.push_back({2, 2, 2, 1, "dp-tp-pp"});
  v.push_back({2, 2, 2, 3, "pp-dp-tp"});
  for (int z = 0; z <= 3; ++z) {  // the experts over ep, their replicas over the expert-data group
    v.push_back({2, 1, 1, z, "tp-dp-pp", 2});
    v.push_back({4, 1, 1, z, "tp-dp-pp", 2});
    v.push_back({4, 2, 2, z, "pp-dp-tp", 4});
  }
  v.push_back({8, 1, 1, 2, "tp-dp-pp", 2});
  return v;
}

std::map<Key, int64_t> tensor_sizes() {
  std::map<Key, int64_t> n;
  for (const auto& u : graph().units)
    for (const auto& p : u.params)
      for (StateKind k : {StateKind::STATE_PARAM, StateKind::STATE_EXP_AVG, StateKind::STATE_EXP_AVG_SQ})
        n[{k, p.name}] = p.numel();
  return n;
}

std::map<Key, Runs> by_key(const std::vector<Piece>& ps) {
  std::map<Key, Runs> m;
  for (const Piece& p : ps) {
    EXPECT_TRUE(m.emplace(Key{p.kind, p.param}, p.runs).second) << "two pieces of " << p.param;
    EXPECT_EQ(p.runs, normalise(p.runs)) << p.param;
    EXPECT_EQ(p.runs.size(), p.local_offsets.size()) << p.param;
  }
  return m;
}

// (1) owned_for_write partitions every tensor exactly; (2) held covers it, dp replicas agree.
TEST(Layout, OwnershipPartitionsAndHeldCovers) {
  const auto sizes = tensor_sizes();
  for (const Strat& s : strategies()) {
    SCOPED_TRACE(s.name());
    const LayoutParams lp = layout_of(s);
    const ir::ParallelDims& grid = lp.dims;
    const int world = grid.world_size();
    ASSERT_EQ(world, s.world());
    std::map<Key, Runs> all;
    std::map<Key, int64_t> counted;
    std::vector<std::map<Key, Runs>> held_of(static_cast<size_t>(world));
    size_t n_pieces = 0;
    for (int r = 0; r < world; ++r) {
      const auto owned = by_key(owned_for_write(graph(), lp, r));
      held_of[static_cast<size_t>(r)] = by_key(held(graph(), lp, r));
      const auto& h = held_of[static_cast<size_t>(r)];
      n_pieces += h.size();
      for (const auto& [k, runs] : owned) {
        all[k] = unite(all[k], runs);
        counted[k] += total(runs);
        auto it = h.find(k);
        ASSERT_NE(it, h.end()) << k.second;
        EXPECT_EQ(subtract(runs, it->second), Runs{}) << "rank " << r << " writes what it does not hold: " << k.second;
      }
    }
    ASSERT_EQ(all.size(), sizes.size());
    for (const auto& [k, n] : sizes) {
      EXPECT_EQ(counted[k], n) << dataset_name(k.first, k.second) << ": elements written more than once or missing";
      EXPECT_EQ(all[k], (Runs{{0, n}})) << dataset_name(k.first, k.second);
    }
    // Replicas hold the same runs where the state is replicated: over dp as the ZeRO level says,
    // over tp as the parameter's shard description says; tp ranks of a split parameter hold disjoint pieces.
    std::map<std::string, const ir::ParamSpec*> spec_of_name;
    for (const auto& u : graph().units)
      for (const auto& p : u.params) spec_of_name[p.name] = &p;
    for (int r = 0; r < world; ++r) {
      ir::Coords c = grid.coords(r);
      c.dp = 0;
      const int r_dp0 = grid.rank_of(c);
      c.dp = grid.coord(r, ir::Axis::EP);  // expert-data coordinate 0: the first rank holding the same experts
      const int r_edp0 = grid.rank_of(c);
      c = grid.coords(r);
      c.tp = 0;
      const int r_tp0 = grid.rank_of(c);
      for (const auto& [k, runs] : held_of[static_cast<size_t>(r)]) {
        const ir::ZeroState zs = k.first == StateKind::STATE_PARAM ? ir::ZeroState::ZERO_PARAMS
                                                                   : ir::ZeroState::ZERO_MOMENTS;
        const bool experts = ir::split_along(*spec_of_name.at(k.second), ir::Axis::EP);
        const int replica = experts ? r_edp0 : r_dp0;
        if (!ir::zero_shards(s.zero, zs)) {
          EXPECT_EQ(runs, held_of[static_cast<size_t>(replica)].at(k)) << "rank " << r << " vs " << replica << " " << k.second;
        }
        if (experts && !ir::zero_shards(s.zero, zs) && r != r_dp0 && grid.coord(r, ir::Axis::EP) != 0) {
          auto& ep0 = held_of[static_cast<size_t>(r_dp0)];  // ep coordinate 0: other experts
          if (ep0.count(k)) {
            EXPECT_EQ(intersect(runs, ep0.at(k)), Runs{}) << "rank " << r << " " << k.second;
          }
        }
        auto& tp0 = held_of[static_cast<size_t>(r_tp0)];
        if (!ir::split_along(*spec_of_name.at(k.second), ir::Axis::TP)) {
          EXPECT_EQ(runs, tp0[k]) << "rank " << r << " vs " << r_tp0 << " " << k.second;
        } else if (r != r_tp0 && tp0.count(k)) {
          EXPECT_EQ(intersect(runs, tp0.at(k)), Runs{}) << "rank " << r << " " << k.second;
        }
      }
    }
    std::printf("[layout] %-24s world %d: %zu held pieces\n", s.name().c_str(), world, n_pieces);
  }
}

// (3) held matches what model::ParamStore stores, element by element; moment offsets fit the
// moment buffers runtime::Executor allocates.
TEST(Layout, HeldMatchesParamStore) {
  const uint64_t seed = 1234;
  for (const Strat& s : strategies()) {
    SCOPED_TRACE(s.name());
    const LayoutParams lp = layout_of(s);
    const ir::ParallelDims& grid = lp.dims;
    for (int r = 0; r < grid.world_size(); ++r) {
      std::vector<int> units;
      for (size_t u = 0; u < lp.devices_of_unit.size(); ++u)
        for (int d : lp.devices_of_unit[u])
          if (d == r) units.push_back(static_cast<int>(u));
      model::ParamStore ps(graph(), units, backend::cpu(),
                           {grid.coord(r, ir::Axis::DP), grid.degree(ir::Axis::DP), lp.zero_of_unit,
                            grid.coord(r, ir::Axis::TP), grid.degree(ir::Axis::TP), grid.coord(r, ir::Axis::EP),
                            grid.degree(ir::Axis::EP)});
      ps.init(seed);
      // The store shards a unit's state as the layout says for that unit.
      const auto sharded = [&](int u, ir::ZeroState z) { return ir::zero_shards(lp.zero_of_unit.at(u), z); };
      std::map<int, int64_t> param_elems;
      for (const Piece& p : held(graph(), lp, r)) {
        const model::ParamRef& ref = ps.find(p.param);
        ASSERT_EQ(ref.unit, p.unit);
        const bool params_sharded = sharded(p.unit, ir::ZeroState::ZERO_PARAMS);
        const bool moments_sharded = sharded(p.unit, ir::ZeroState::ZERO_MOMENTS);
        const int64_t buf_len = p.kind == StateKind::STATE_PARAM
                                    ? (params_sharded ? ps.shard_len(p.unit) : ps.padded_numel(p.unit))
                                    : (moments_sharded ? ps.shard_len(p.unit) : ps.padded_numel(p.unit));
        for (size_t k = 0; k < p.runs.size(); ++k) {
          ASSERT_GE(p.local_offsets[k], 0);
          ASSERT_LE(p.local_offsets[k] + p.runs[k].size(), buf_len) << p.param;
        }
        if (p.kind != StateKind::STATE_PARAM) continue;
        param_elems[p.unit] += total(p.runs);
        const float* buf = params_sharded ? ps.shard_values(p.unit) : ps.values(p.unit);
        for (size_t k = 0; k < p.runs.size(); ++k)
          for (int64_t g = p.runs[k].begin; g < p.runs[k].end; ++g)
            ASSERT_EQ(buf[p.local_offsets[k] + (g - p.runs[k].begin)], model::init_value(seed, *ref.spec, g))
                << "rank " << r << " " << p.param << " element " << g;
      }
      // Moments sit where the parameter's values do, in the moment buffer's indexing: the same
      // offsets when both are sharded alike, shifted by the shard start when only moments are.
      std::map<std::string, const Piece*> values;
      const auto pieces = held(graph(), lp, r);
      for (const Piece& p : pieces)
        if (p.kind == StateKind::STATE_PARAM) values[p.param] = &p;
      for (const Piece& p : pieces) {
        if (p.kind == StateKind::STATE_PARAM) continue;
        auto it = values.find(p.param);
        if (it == values.end()) {
          EXPECT_TRUE(sharded(p.unit, ir::ZeroState::ZERO_PARAMS)) << p.param << ": moments without values";
          continue;
        }
        const bool moments_only = sharded(p.unit, ir::ZeroState::ZERO_MOMENTS) && !sharded(p.unit, ir::ZeroState::ZERO_PARAMS);
        // From the part's place in the full buffer to its shard's place in the shard buffer.
        const ir::FlatPart& part = ps.parts(p.unit)[ps.find(p.param).part];
        const int64_t shift = moments_only ? part.full_offset + part.zero.offset - part.shard_offset : 0;
        std::vector<int64_t> expect = locate(*it->second, p.runs);
        for (auto& e : expect) e -= shift;
        EXPECT_EQ(expect, p.local_offsets) << "rank " << r << " " << dataset_name(p.kind, p.param);
      }
      for (int u : units) {
        int64_t expect = 0;  // the part's elements in this rank's shard of each part, or all of them
        for (const ir::FlatPart& part : ps.parts(u))
          expect += sharded(u, ir::ZeroState::ZERO_PARAMS)
                        ? std::max<int64_t>(0, std::min(part.zero.len, part.numel - part.zero.offset))
                        : part.numel;
        EXPECT_EQ(param_elems[u], expect) << "rank " << r << " unit " << u;
      }
    }
  }
}

// (4) plan_transfers covers exactly the destination's held runs, from the sources' owned runs.
TEST(Layout, TransfersCoverDestination) {
  const std::vector<std::pair<Strat, Strat>> pairs = {
      {{4, 1, 1, 1}, {1, 2, 2, 0}},        // dp4 zero1 -> tp2 pp2
      {{1, 1, 2, 0}, {2, 1, 1, 3}},        // pp2 -> dp2 zero3
      {{2, 2, 2, 2}, {}},                  // tp2 dp2 pp2 zero2 -> single rank
      {{}, {2, 2, 2, 3}},                  // single rank -> everything
      {{3, 1, 1, 0}, {8, 1, 1, 3}},        // dp3 -> dp8 zero3
      {{1, 2, 1, 0}, {2, 1, 1, 1}},        // tp2 -> dp2 zero1
      {{2, 1, 2, 3}, {1, 1, 3, 0}},        // dp2 pp2 zero3 -> pp3
      {{8, 1, 1, 2}, {2, 2, 1, 3}},        // dp8 zero2 -> dp2 tp2 zero3
      {{2, 2, 2, 1, "dp-tp-pp"}, {2, 2, 2, 3, "pp-dp-tp"}},  // same shape, other grid orders
      {{1, 2, 4, 0}, {2, 2, 1, 0}},        // tp2 pp4 -> dp2 tp2
      {{4, 1, 1, 1, "tp-dp-pp", 2}, {4, 2, 2, 3, "pp-dp-tp", 4}},  // ep2 zero1 -> ep4 tp2 pp2 zero3
      {{2, 1, 1, 2, "tp-dp-pp", 2}, {}},   // ep2 zero2 -> single rank
  };
  for (const auto& [a, b] : pairs) {
    SCOPED_TRACE(a.name() + " -> " + b.name());
    const LayoutParams from = layout_of(a), to = layout_of(b);
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<Transfer> ts = plan_transfers(graph(), from, to);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::vector<std::map<Key, Runs>> owned_src(static_cast<size_t>(from.dims.world_size()));
    for (int r = 0; r < from.dims.world_size(); ++r) owned_src[static_cast<size_t>(r)] = by_key(owned_for_write(graph(), from, r));
    std::map<std::pair<int, Key>, Runs> got;
    std::map<std::pair<int, Key>, int64_t> counted;
    int64_t elems = 0, runs = 0, local = 0;
    for (const Transfer& t : ts) {
      ASSERT_GE(t.src, 0);
      ASSERT_LT(t.src, from.dims.world_size());
      const Key k{t.kind, t.param};
      EXPECT_EQ(subtract(t.runs, owned_src[static_cast<size_t>(t.src)].at(k)), Runs{}) << "src does not own it";
      auto& g = got[{t.dst, k}];
      g = unite(g, t.runs);
      counted[{t.dst, k}] += total(t.runs);
      elems += total(t.runs);
      runs += static_cast<int64_t>(t.runs.size());
      if (t.src == t.dst) local += total(t.runs);
    }
    size_t n_held = 0;
    for (int d = 0; d < to.dims.world_size(); ++d)
      for (const Piece& p : held(graph(), to, d)) {
        ++n_held;
        const std::pair<int, Key> k{d, {p.kind, p.param}};
        EXPECT_EQ(got[k], p.runs) << "dst " << d << " " << p.param;
        EXPECT_EQ(counted[k], total(p.runs)) << "dst " << d << " " << p.param << ": received twice";
        EXPECT_NO_THROW(locate(p, got[k]));
      }
    EXPECT_EQ(got.size(), n_held);
    std::printf("[transfer] %-22s -> %-22s: %5zu transfers, %6lld runs, %8lld elements (%lld local), %.2f ms\n",
                a.name().c_str(), b.name().c_str(), ts.size(), static_cast<long long>(runs),
                static_cast<long long>(elems), static_cast<long long>(local), ms);
  }
}

TEST(Layout, LocateFindsOffsets) {
  Piece p;
  p.runs = {{0, 4}, {10, 14}};
  p.local_offsets = {100, 200};
  EXPECT_EQ(locate(p, {{1, 3}, {10, 14}, {13, 14}}), (std::vector<int64_t>{101, 200, 203}));
  EXPECT_THROW(locate(p, {{3, 11}}), std::out_of_range);
  EXPECT_THROW(locate(p, {{5, 6}}), std::out_of_range);
}

}  // namespace
}  // namespace piper::state
