// test_switch_plan.cpp — the switch planner (src/state/switch_plan.hpp): for many pairs of layouts
// (dp, tp, pp, ep, ZeRO 0-3, world changes, processes in one layout only, stage swaps) the plan is
// run over per-process buffers filled with each element's global id, block by block as the runtime
// runs it: every element of every new block is written exactly once, from a source holding the same
// element; rounds are one send and one receive per process, first fit; messages fit a chunk; the
// memory figures are what the run held.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "model/params.hpp"
#include "state/switch_plan.hpp"
#include "unit/state/layouts.hpp"

namespace piper::state {
namespace {

using Key = std::pair<StateKind, std::string>;

std::vector<int> first_processes(int n) {
  std::vector<int> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[static_cast<size_t>(i)] = i;
  return p;
}

struct Case {
  Strat a, b;
  std::vector<int> pa, pb;  // empty: the first processes
  bool swap = false;        // some process takes a block before it can free one
  std::string note;
};

std::vector<Case> cases() {
  return {
      {{4, 1, 1, 1}, {1, 2, 2, 0}, {}, {}, false, "dp4 -> tp2 pp2"},
      {{1, 1, 2, 0}, {2, 1, 1, 3}, {}, {}, false, "pp2 -> dp2 zero3"},
      {{2, 2, 2, 2}, {}, {}, {}, false, "8 -> 1"},
      {{}, {2, 2, 2, 3}, {}, {}, false, "1 -> 8"},
      {{4, 1, 1, 0}, {2, 1, 1, 0}, {}, {}, false, "4 -> 2, replicas"},
      {{2, 1, 1, 1}, {4, 1, 1, 2}, {}, {}, false, "2 -> 4"},
      {{8, 1, 1, 3}, {4, 1, 1, 1}, {}, {}, false, "8 -> 4"},
      {{2, 2, 1, 0}, {}, {}, {}, false, "4 -> 1"},
      {{1, 2, 4, 0}, {2, 2, 1, 0}, {}, {}, false, "tp2 pp4 -> dp2 tp2"},
      {{2, 2, 2, 1, "dp-tp-pp"}, {2, 2, 2, 3, "pp-dp-tp"}, {}, {}, false, "grid orders"},
      {{4, 1, 1, 1, "tp-dp-pp", 2}, {4, 2, 2, 3, "pp-dp-tp", 4}, {}, {}, false, "ep2 -> ep4 tp2 pp2"},
      {{2, 1, 1, 2, "tp-dp-pp", 2}, {4, 1, 1, 0, "tp-dp-pp", 4}, {}, {}, false, "ep2 -> ep4"},
      {{8, 1, 1, 2, "tp-dp-pp", 2}, {2, 1, 1, 1, "tp-dp-pp", 2}, {}, {}, false, "ep2 dp8 -> dp2"},
      {{2, 1, 1, 3}, {2, 1, 1, 3}, {}, {}, false, "the same layout"},
      {{2, 1, 2, 1}, {2, 1, 2, 1}, {0, 1, 2, 3}, {2, 3, 4, 5}, false, "two leave, two join"},
      {{4, 1, 1, 2}, {2, 1, 1, 0}, {0, 1, 2, 3}, {4, 5}, false, "all leave"},
      {{1, 1, 2, 0}, {1, 1, 2, 0}, {0, 1}, {1, 0}, true, "stages swapped"},
      {{1, 2, 2, 1}, {2, 1, 2, 2}, {0, 1, 2, 3}, {2, 3, 0, 1}, true, "stages swapped, tp2 -> dp2"},
  };
}

// Every element's global id: its tensor's number x 2^32 + its flat index.
std::map<Key, int64_t> tensor_ids() {
  std::map<Key, int64_t> ids;
  for (const auto& u : graph().units)
    for (const auto& p : u.params)
      for (StateKind k : {StateKind::STATE_PARAM, StateKind::STATE_EXP_AVG, StateKind::STATE_EXP_AVG_SQ})
        ids.emplace(Key{k, p.name}, static_cast<int64_t>(ids.size()) << 32);
  return ids;
}

std::map<Key, Piece> pieces_by_key(const std::vector<Piece>& ps) {
  std::map<Key, Piece> m;
  for (const Piece& p : ps) m.emplace(Key{p.kind, p.param}, p);
  return m;
}

// The plan run over per-process buffers of element ids (-1: not written).
class Runner {
 public:
  Runner(const LayoutParams& from, const std::vector<int>& pa, const LayoutParams& to, const std::vector<int>& pb,
         const SwitchPlan& plan)
      : from_(from), to_(to), pa_(pa), pb_(pb), plan_(plan), ids_(tensor_ids()),
        mem_(static_cast<size_t>(plan.processes), 0) {
    for (int r = 0; r < from.dims.world_size(); ++r) src_.push_back(pieces_by_key(held(graph(), from, r)));
    for (int r = 0; r < to.dims.world_size(); ++r) dst_.push_back(pieces_by_key(held(graph(), to, r)));
    for (int r = 0; r < from.dims.world_size(); ++r)
      for (size_t u = 0; u < graph().units.size(); ++u)
        for (StateKind k : {StateKind::STATE_PARAM, StateKind::STATE_EXP_AVG, StateKind::STATE_EXP_AVG_SQ}) {
          const BlockKey b{static_cast<int>(u), k};
          const int64_t n = block_numel(graph(), from, r, b);
          if (n == 0) continue;
          old_[{pa_[static_cast<size_t>(r)], b}] = std::vector<int64_t>(static_cast<size_t>(n), -1);
          mem_[static_cast<size_t>(pa_[static_cast<size_t>(r)])] += n;
        }
    for (int r = 0; r < from.dims.world_size(); ++r)
      for (const auto& [k, pc] : src_[static_cast<size_t>(r)]) {
        auto& buf = old_.at({pa_[static_cast<size_t>(r)], {pc.unit, pc.kind}});
        for (size_t i = 0; i < pc.runs.size(); ++i)
          for (int64_t g = pc.runs[i].begin; g < pc.runs[i].end; ++g)
            buf.at(static_cast<size_t>(pc.local_offsets[i] + g - pc.runs[i].begin)) = ids_.at(k) + g;
      }
    before_ = mem_;
    peak_ = mem_;
  }

  void run() {
    std::set<BlockKey> seen;
    for (const BlockStep& s : plan_.steps) {
      EXPECT_TRUE(seen.insert(s.block).second) << "block " << s.block.unit << " twice";
      step(s);
    }
    EXPECT_EQ(seen.size(), graph().units.size() * 3) << "every block of either layout";
    EXPECT_TRUE(old_.empty()) << old_.size() << " old blocks never freed";
  }

  // Every element of every new block at its place, written once; padding never written.
  void check_result() const {
    for (int r = 0; r < to_.dims.world_size(); ++r) {
      std::map<BlockKey, int64_t> held_elems;
      for (const auto& [k, pc] : dst_[static_cast<size_t>(r)]) {
        const BlockKey b{pc.unit, pc.kind};
        const auto& buf = new_.at({pb_[static_cast<size_t>(r)], b});
        const auto& w = writes_.at({pb_[static_cast<size_t>(r)], b});
        for (size_t i = 0; i < pc.runs.size(); ++i)
          for (int64_t g = pc.runs[i].begin; g < pc.runs[i].end; ++g) {
            const size_t at = static_cast<size_t>(pc.local_offsets[i] + g - pc.runs[i].begin);
            ASSERT_EQ(buf.at(at), ids_.at(k) + g) << "rank " << r << " " << dataset_name(k.first, k.second) << "[" << g << "]";
            ASSERT_EQ(w.at(at), 1) << "rank " << r << " " << dataset_name(k.first, k.second) << "[" << g << "] written";
          }
        held_elems[b] += total(pc.runs);
      }
      for (const auto& [b, n] : held_elems) {
        const auto& w = writes_.at({pb_[static_cast<size_t>(r)], b});
        int64_t written = 0;
        for (int x : w) written += x;
        EXPECT_EQ(written, n) << "rank " << r << " unit " << b.unit << ": writes outside its pieces";
      }
    }
  }

  const std::vector<int64_t>& before() const { return before_; }
  const std::vector<int64_t>& mem() const { return mem_; }
  const std::vector<int64_t>& peak() const { return peak_; }

 private:
  void step(const BlockStep& s) {
    const auto& devs_to = to_.devices_of_unit[static_cast<size_t>(s.block.unit)];
    for (int d : devs_to) {
      const int q = pb_[static_cast<size_t>(d)];
      const int64_t n = block_numel(graph(), to_, d, s.block);
      ASSERT_TRUE(new_.emplace(std::pair{q, s.block}, std::vector<int64_t>(static_cast<size_t>(n), -1)).second);
      writes_[{q, s.block}] = std::vector<int>(static_cast<size_t>(n), 0);
      mem_[static_cast<size_t>(q)] += n;
      peak_[static_cast<size_t>(q)] = std::max(peak_[static_cast<size_t>(q)], mem_[static_cast<size_t>(q)]);
    }
    for (size_t t : s.local) {
      const Transfer& tr = plan_.transfers.at(t);
      EXPECT_EQ(pa_[static_cast<size_t>(tr.src)], pb_[static_cast<size_t>(tr.dst)]) << "a local copy between processes";
      move(s.block, t, 0, total(tr.runs));
    }
    std::map<size_t, int64_t> sent;  // per transfer: the elements sent so far, in order
    for (size_t r = 0; r < s.rounds.size(); ++r) {
      std::set<int> senders, receivers;
      EXPECT_FALSE(s.rounds[r].messages.empty()) << "an empty round";
      for (const Message& m : s.rounds[r].messages) {
        const Transfer& tr = plan_.transfers.at(m.transfer);
        EXPECT_TRUE(senders.insert(m.src).second) << "process " << m.src << " sends twice in round " << r;
        EXPECT_TRUE(receivers.insert(m.dst).second) << "process " << m.dst << " receives twice in round " << r;
        EXPECT_EQ(m.src, pa_[static_cast<size_t>(tr.src)]);
        EXPECT_EQ(m.dst, pb_[static_cast<size_t>(tr.dst)]);
        EXPECT_NE(m.src, m.dst) << "a copy sent over the network";
        EXPECT_GE(m.count, 1);
        EXPECT_LE(m.count, plan_.chunk_elems);
        EXPECT_EQ(m.first, sent[m.transfer]) << "transfer " << m.transfer << " out of order";
        sent[m.transfer] = m.first + m.count;
        move(s.block, m.transfer, m.first, m.count);
      }
      for (size_t e = 0; e < r; ++e) check_first_fit(s.rounds[e], s.rounds[r], e, r);
    }
    for (const auto& [t, n] : sent) EXPECT_EQ(n, total(plan_.transfers[t].runs)) << "transfer " << t << " partly sent";
    for (int src : from_.devices_of_unit[static_cast<size_t>(s.block.unit)]) {
      const int q = pa_[static_cast<size_t>(src)];
      auto it = old_.find({q, s.block});
      ASSERT_NE(it, old_.end());
      mem_[static_cast<size_t>(q)] -= static_cast<int64_t>(it->second.size());
      old_.erase(it);
    }
  }

  // A message placed in a later round than `earlier` finds its source or destination busy there.
  static void check_first_fit(const Round& earlier, const Round& later, size_t e, size_t r) {
    std::set<int> s, d;
    for (const Message& m : earlier.messages) s.insert(m.src), d.insert(m.dst);
    for (const Message& m : later.messages)
      EXPECT_TRUE(s.count(m.src) || d.count(m.dst))
          << "message " << m.src << " -> " << m.dst << " in round " << r << " fits round " << e;
  }

  // Elements [first, first + count) of transfer t from its source's old block to its destination's new one.
  void move(BlockKey b, size_t t, int64_t first, int64_t count) {
    const Transfer& tr = plan_.transfers.at(t);
    ASSERT_EQ(tr.unit, b.unit);
    ASSERT_EQ(tr.kind, b.kind);
    const Key k{tr.kind, tr.param};
    const Piece& sp = src_.at(static_cast<size_t>(tr.src)).at(k);
    const Piece& dp = dst_.at(static_cast<size_t>(tr.dst)).at(k);
    auto oit = old_.find({pa_[static_cast<size_t>(tr.src)], b});
    ASSERT_NE(oit, old_.end()) << "transfer " << t << ": the source block is not there";
    auto& out = new_.at({pb_[static_cast<size_t>(tr.dst)], b});
    auto& w = writes_.at({pb_[static_cast<size_t>(tr.dst)], b});
    int64_t skip = first, left = count;
    for (const Run& run : tr.runs) {
      if (left == 0) break;
      if (skip >= run.size()) {
        skip -= run.size();
        continue;
      }
      const Run part{run.begin + skip, std::min(run.end, run.begin + skip + left)};
      skip = 0;
      left -= part.size();
      const int64_t so = locate(sp, {part})[0], dso = locate(dp, {part})[0];
      for (int64_t i = 0; i < part.size(); ++i) {
        const int64_t v = oit->second.at(static_cast<size_t>(so + i));
        ASSERT_EQ(v, ids_.at(k) + part.begin + i) << "source rank " << tr.src << " does not hold " << tr.param;
        out.at(static_cast<size_t>(dso + i)) = v;
        ++w.at(static_cast<size_t>(dso + i));
      }
    }
    ASSERT_EQ(left, 0) << "transfer " << t << " has fewer elements than its messages";
  }

  const LayoutParams &from_, &to_;
  const std::vector<int>&pa_, &pb_;
  const SwitchPlan& plan_;
  std::map<Key, int64_t> ids_;
  std::vector<std::map<Key, Piece>> src_, dst_;
  std::map<std::pair<int, BlockKey>, std::vector<int64_t>> old_, new_;
  std::map<std::pair<int, BlockKey>, std::vector<int>> writes_;
  std::vector<int64_t> mem_, before_, peak_;
};

// The largest block process p holds under either layout.
int64_t largest_block(const LayoutParams& lp, const std::vector<int>& procs, int p) {
  int64_t m = 0;
  for (size_t r = 0; r < procs.size(); ++r)
    if (procs[r] == p)
      for (size_t u = 0; u < graph().units.size(); ++u)
        for (StateKind k : {StateKind::STATE_PARAM, StateKind::STATE_EXP_AVG, StateKind::STATE_EXP_AVG_SQ})
          m = std::max(m, block_numel(graph(), lp, static_cast<int>(r), {static_cast<int>(u), k}));
  return m;
}

TEST(SwitchPlan, RunOverIdsWritesEveryElementOnceFromAHolder) {
  for (const Case& c : cases())
    for (int64_t chunk : {int64_t{7}, int64_t{100}, int64_t{1} << 20}) {
      SCOPED_TRACE(c.note + ": " + c.a.name() + " -> " + c.b.name() + ", chunk " + std::to_string(chunk));
      const LayoutParams from = layout_of(c.a), to = layout_of(c.b);
      const std::vector<int> pa = c.pa.empty() ? first_processes(c.a.world()) : c.pa;
      const std::vector<int> pb = c.pb.empty() ? first_processes(c.b.world()) : c.pb;
      const SwitchPlan plan = plan_switch(graph(), from, pa, to, pb, chunk);
      EXPECT_EQ(plan.chunk_elems, chunk);
      Runner run(from, pa, to, pb, plan);
      run.run();
      if (HasFatalFailure()) return;
      run.check_result();
      EXPECT_EQ(plan.before, run.before());
      EXPECT_EQ(plan.after, run.mem()) << "what the run holds at its end";
      EXPECT_EQ(plan.peak, run.peak());
      int64_t worst = 0;  // the most any process goes above max(before, after), in its largest blocks
      for (int p = 0; p < plan.processes; ++p) {
        const size_t i = static_cast<size_t>(p);
        const int64_t floor = std::max(plan.before[i], plan.after[i]);
        const int64_t block = std::max(largest_block(from, pa, p), largest_block(to, pb, p));
        EXPECT_GE(plan.peak[i], floor) << "process " << p;
        EXPECT_LE(plan.peak[i], plan.before[i] + plan.after[i]) << "process " << p;
        // What the order achieves (docs/state.md): at most one block above, the swap included.
        EXPECT_LE(plan.peak[i], floor + block) << "process " << p << ": before " << plan.before[i] << ", after "
                                               << plan.after[i] << ", largest block " << block;
        worst = std::max(worst, plan.peak[i] - floor);
      }
      if (c.swap) {
        EXPECT_GT(worst, 0) << "a swap takes a block before it frees one";
      }
      if (chunk == 100)
        std::printf("[switch] %-28s %-22s -> %-22s: %3zu steps, %4zu messages, %6lld B moved, %6lld B local, "
                    "peak above max(before, after) %lld elements\n",
                    c.note.c_str(), c.a.name().c_str(), c.b.name().c_str(), plan.steps.size(), plan.messages(),
                    static_cast<long long>(plan.bytes_moved()), static_cast<long long>(plan.bytes_local()),
                    static_cast<long long>(worst));
    }
}

// A process that holds an element under both layouts copies it: a replica-only change moves nothing.
TEST(SwitchPlan, HeldElementsAreCopiedNotSent) {
  const LayoutParams from = layout_of({4, 1, 1, 0}), to = layout_of({2, 1, 1, 0});
  const SwitchPlan plan = plan_switch(graph(), from, first_processes(4), to, first_processes(2), 100);
  EXPECT_EQ(plan.bytes_moved(), 0);
  EXPECT_EQ(plan.messages(), 0u);
  int64_t held_to = 0;
  for (int r = 0; r < 2; ++r)
    for (const Piece& p : held(graph(), to, r)) held_to += total(p.runs);
  EXPECT_EQ(plan.bytes_local(), held_to * kStateElemBytes);
  // The same switch onto two new processes: everything over the network.
  const SwitchPlan moved = plan_switch(graph(), from, first_processes(4), to, {4, 5}, 100);
  EXPECT_EQ(moved.bytes_local(), 0);
  EXPECT_EQ(moved.bytes_moved(), held_to * kStateElemBytes);
  EXPECT_EQ(moved.processes, 6);
}

// block_numel is the buffer model::ParamStore (values) and runtime::Executor (moments) allocate.
TEST(SwitchPlan, BlockSizesAreTheStoresBuffers) {
  for (const Strat& s : {Strat{2, 1, 1, 0}, Strat{2, 2, 1, 1}, Strat{4, 1, 2, 3}, Strat{4, 1, 1, 2, "tp-dp-pp", 2}}) {
    SCOPED_TRACE(s.name());
    const LayoutParams lp = layout_of(s);
    const ir::ParallelDims& grid = lp.dims;
    for (int r = 0; r < grid.world_size(); ++r) {
      std::vector<int> units;
      for (size_t u = 0; u < lp.devices_of_unit.size(); ++u)
        if (std::binary_search(lp.devices_of_unit[u].begin(), lp.devices_of_unit[u].end(), r))
          units.push_back(static_cast<int>(u));
      model::ParamStore ps(graph(), units, backend::cpu(),
                           {grid.coord(r, ir::Axis::DP), grid.degree(ir::Axis::DP), lp.zero_of_unit,
                            grid.coord(r, ir::Axis::TP), grid.degree(ir::Axis::TP), grid.coord(r, ir::Axis::EP),
                            grid.degree(ir::Axis::EP)});
      for (size_t u = 0; u < graph().units.size(); ++u) {
        const int ui = static_cast<int>(u);
        const bool runs = std::find(units.begin(), units.end(), ui) != units.end();
        for (StateKind k : {StateKind::STATE_PARAM, StateKind::STATE_EXP_AVG, StateKind::STATE_EXP_AVG_SQ}) {
          const int64_t n = block_numel(graph(), lp, r, {ui, k});
          if (!runs) {
            EXPECT_EQ(n, 0);
            continue;
          }
          const bool sharded = ir::zero_shards(s.zero, zero_state_of(k));
          EXPECT_EQ(n, sharded ? ps.shard_len(ui) : ps.padded_numel(ui)) << "rank " << r << " unit " << u;
        }
      }
    }
  }
}

TEST(SwitchPlan, RefusesProcessListsThatDoNotFit) {
  const LayoutParams a = layout_of({2, 1, 1, 0}), b = layout_of({});
  EXPECT_THROW(plan_switch(graph(), a, {0}, b, {0}, 10), std::invalid_argument);       // one process for 2 ranks
  EXPECT_THROW(plan_switch(graph(), a, {0, 0}, b, {0}, 10), std::invalid_argument);    // two ranks on one process
  EXPECT_THROW(plan_switch(graph(), a, {0, -1}, b, {0}, 10), std::invalid_argument);   // no such process
  EXPECT_THROW(plan_switch(graph(), a, {0, 1}, b, {0}, 0), std::invalid_argument);     // empty messages
  EXPECT_NO_THROW(plan_switch(graph(), a, {0, 1}, b, {1}, 10));
}

}  // namespace
}  // namespace piper::state
