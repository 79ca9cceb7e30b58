// switch_plan.cpp — the switch planner: transfers grouped into block steps, the steps ordered to
// keep every process's peak low, each step's messages packed into rounds (docs/state.md).
#include "state/switch_plan.hpp"

#include <algorithm>
#include <bit>
#include <stdexcept>
#include <string>
#include <tuple>

namespace piper::state {

namespace {

constexpr StateKind kKinds[] = {StateKind::STATE_PARAM, StateKind::STATE_EXP_AVG, StateKind::STATE_EXP_AVG_SQ};

// What one block step does on one process: the elements it allocates and frees.
struct Touch {
  int proc = 0;
  int64_t take = 0, give = 0;
};
struct Block {
  BlockKey key;
  std::vector<Touch> touch;  // ascending process
  std::vector<size_t> local, net;
};

// Checks one layout's process list; returns the largest process it names (-1: none).
int check_procs(const std::vector<int>& procs, const LayoutParams& lp, const char* which) {
  const int world = lp.dims.world_size();
  if (procs.size() != static_cast<size_t>(world))
    throw std::invalid_argument(std::string("plan_switch: ") + which + "_proc has " + std::to_string(procs.size()) +
                                " processes, the " + which + " layout " + std::to_string(world) + " ranks");
  std::vector<int> sorted = procs;
  std::sort(sorted.begin(), sorted.end());
  if (!sorted.empty() && sorted.front() < 0)
    throw std::invalid_argument(std::string("plan_switch: ") + which + "_proc names process " +
                                std::to_string(sorted.front()) + "; processes are numbered from 0");
  if (auto it = std::adjacent_find(sorted.begin(), sorted.end()); it != sorted.end())
    throw std::invalid_argument(std::string("plan_switch: ") + which + "_proc gives process " + std::to_string(*it) +
                                " two ranks of the " + which + " layout; a process holds one rank of a layout");
  return sorted.empty() ? -1 : sorted.back();
}

// Every block of either layout, with what each process allocates and frees for it.
std::vector<Block> blocks_of(const ir::ModelGraph& g, const LayoutParams& from, const std::vector<int>& from_proc,
                             const LayoutParams& to, const std::vector<int>& to_proc) {
  std::vector<Block> out;
  for (size_t u = 0; u < g.units.size(); ++u)
    for (StateKind kind : kKinds) {
      Block b;
      b.key = {static_cast<int>(u), kind};
      for (int d : to.devices_of_unit[u]) b.touch.push_back({to_proc[static_cast<size_t>(d)], block_numel(g, to, d, b.key), 0});
      for (int s : from.devices_of_unit[u]) b.touch.push_back({from_proc[static_cast<size_t>(s)], 0, block_numel(g, from, s, b.key)});
      std::sort(b.touch.begin(), b.touch.end(), [](const Touch& x, const Touch& y) { return x.proc < y.proc; });
      std::vector<Touch> merged;  // a process in both layouts: one touch
      for (const Touch& t : b.touch)
        if (!merged.empty() && merged.back().proc == t.proc)
          merged.back().take += t.take, merged.back().give += t.give;
        else
          merged.push_back(t);
      b.touch = std::move(merged);
      if (!b.touch.empty()) out.push_back(std::move(b));
    }
  return out;
}

// Where the greedy order stands: per process the elements held now, the most held so far, and the
// level it may rise to at no cost (the larger of that and what it holds at the end).
struct Levels {
  std::vector<int64_t> cur, peak, after;
  int64_t limit(int p) const { return std::max(peak[static_cast<size_t>(p)], after[static_cast<size_t>(p)]); }
};

// The greedy order's key of a step, smaller first: whether it raises some process above its limit
// while taking more than it frees there; how far above a limit its start lifts the highest process;
// how far above (or below) its limit it leaves the highest one.
std::tuple<bool, int64_t, int64_t> step_key(const Block& b, const Levels& lv) {
  bool takes_where_high = false;
  int64_t raise = 0, post = INT64_MIN;
  for (const Touch& t : b.touch) {
    const size_t p = static_cast<size_t>(t.proc);
    const int64_t over = lv.cur[p] + t.take - lv.limit(t.proc);
    if (over > 0 && t.take > t.give) takes_where_high = true;
    raise = std::max(raise, over);
    post = std::max(post, over - t.give);
  }
  return {takes_where_high, raise, post};
}

// Allocates the step's new blocks (the peak) and frees its old ones.
void run_step(const Block& b, Levels& lv) {
  for (const Touch& t : b.touch) {
    const size_t p = static_cast<size_t>(t.proc);
    lv.cur[p] += t.take;
    lv.peak[p] = std::max(lv.peak[p], lv.cur[p]);
  }
  for (const Touch& t : b.touch) lv.cur[static_cast<size_t>(t.proc)] -= t.give;
}

// The blocks in the order they run: greedily the step with the smallest key, ties in (unit, kind)
// order. Fills peak.
std::vector<size_t> order_steps(const std::vector<Block>& blocks, Levels& lv) {
  std::vector<size_t> left(blocks.size()), order;
  for (size_t i = 0; i < blocks.size(); ++i) left[i] = i;
  while (!left.empty()) {
    size_t best = 0;
    auto best_key = step_key(blocks[left[0]], lv);
    for (size_t i = 1; i < left.size(); ++i)
      if (auto k = step_key(blocks[left[i]], lv); k < best_key) best = i, best_key = k;
    order.push_back(left[best]);
    run_step(blocks[left[best]], lv);
    left.erase(left.begin() + static_cast<std::ptrdiff_t>(best));
  }
  return order;
}

// First fit: the rounds each process sends and receives in, as bitsets.
class Rounds {
 public:
  explicit Rounds(int processes) : send_(static_cast<size_t>(processes)), recv_(static_cast<size_t>(processes)) {}
  // The first round where `src` sends nothing and `dst` receives nothing; marks both busy in it.
  size_t take(int src, int dst) {
    auto& s = send_[static_cast<size_t>(src)];
    auto& r = recv_[static_cast<size_t>(dst)];
    size_t w = 0;
    uint64_t free = 0;
    for (;; ++w) {
      free = ~((w < s.size() ? s[w] : 0) | (w < r.size() ? r[w] : 0));
      if (free) break;
    }
    const size_t round = w * 64 + static_cast<size_t>(std::countr_zero(free));
    mark(s, round, src);
    mark(r, round, dst);
    return round;
  }
  // Clears what the last step marked.
  void clear() {
    for (int p : used_) send_[static_cast<size_t>(p)].clear(), recv_[static_cast<size_t>(p)].clear();
    used_.clear();
  }

 private:
  void mark(std::vector<uint64_t>& bits, size_t round, int p) {
    if (bits.empty()) used_.push_back(p);
    if (bits.size() <= round / 64) bits.resize(round / 64 + 1, 0);
    bits[round / 64] |= uint64_t{1} << (round % 64);
  }
  std::vector<std::vector<uint64_t>> send_, recv_;
  std::vector<int> used_;
};

// The step's network transfers cut into chunks, in transfer order, each in its first free round.
std::vector<Round> rounds_of(const Block& b, const SwitchPlan& plan, const std::vector<int>& from_proc,
                             const std::vector<int>& to_proc, Rounds& busy) {
  std::vector<Round> out;
  for (size_t t : b.net) {
    const Transfer& tr = plan.transfers[t];
    const int src = from_proc[static_cast<size_t>(tr.src)], dst = to_proc[static_cast<size_t>(tr.dst)];
    const int64_t n = total(tr.runs);
    for (int64_t first = 0; first < n; first += plan.chunk_elems) {
      const size_t r = busy.take(src, dst);
      if (out.size() <= r) out.resize(r + 1);
      out[r].messages.push_back({src, dst, t, first, std::min(plan.chunk_elems, n - first)});
    }
  }
  busy.clear();
  return out;
}

}  // namespace

int64_t block_numel(const ir::ModelGraph& g, const LayoutParams& lp, int rank, BlockKey b) {
  if (b.unit < 0 || static_cast<size_t>(b.unit) >= g.units.size() || lp.devices_of_unit.size() != g.units.size())
    throw std::out_of_range("block_numel: unit " + std::to_string(b.unit) + " of a model of " +
                            std::to_string(g.units.size()) + " units (the layout has " +
                            std::to_string(lp.devices_of_unit.size()) + ")");
  const auto& devs = lp.devices_of_unit[static_cast<size_t>(b.unit)];
  if (!std::binary_search(devs.begin(), devs.end(), rank)) return 0;
  const bool sharded = ir::zero_shards(lp.zero_of_unit.at(static_cast<size_t>(b.unit)), zero_state_of(b.kind));
  int64_t n = 0;
  for (const ir::FlatPart& part :
       ir::flat_parts(g.units[static_cast<size_t>(b.unit)], lp.dims.degrees(), lp.dims.coords(rank)))
    n += sharded ? part.zero.len : part.zero.padded;
  return n;
}

int64_t SwitchPlan::bytes_moved() const {
  int64_t n = 0;
  for (const BlockStep& s : steps)
    for (const Round& r : s.rounds)
      for (const Message& m : r.messages) n += m.count;
  return n * kStateElemBytes;
}

int64_t SwitchPlan::bytes_local() const {
  int64_t n = 0;
  for (const BlockStep& s : steps)
    for (size_t t : s.local) n += total(transfers[t].runs);
  return n * kStateElemBytes;
}

size_t SwitchPlan::messages() const {
  size_t n = 0;
  for (const BlockStep& s : steps)
    for (const Round& r : s.rounds) n += r.messages.size();
  return n;
}

SwitchPlan plan_switch(const ir::ModelGraph& g, const LayoutParams& from, const std::vector<int>& from_proc,
                       const LayoutParams& to, const std::vector<int>& to_proc, int64_t chunk_elems) {
  if (chunk_elems < 1)
    throw std::invalid_argument("plan_switch: chunk_elems " + std::to_string(chunk_elems) + "; a message carries at least 1 element");
  SwitchPlan plan;
  plan.chunk_elems = chunk_elems;
  plan.processes = std::max(check_procs(from_proc, from, "from"), check_procs(to_proc, to, "to")) + 1;
  const size_t procs = static_cast<size_t>(plan.processes);
  // The rank of `from` on each process, for each rank of `to` the one on its process.
  std::vector<int> from_rank(procs, -1), local_src(to_proc.size(), -1);
  for (size_t s = 0; s < from_proc.size(); ++s) from_rank[static_cast<size_t>(from_proc[s])] = static_cast<int>(s);
  for (size_t d = 0; d < to_proc.size(); ++d) local_src[d] = from_rank[static_cast<size_t>(to_proc[d])];
  plan.transfers = plan_transfers(g, from, to, local_src);

  std::vector<Block> blocks = blocks_of(g, from, from_proc, to, to_proc);
  std::vector<size_t> block_of(g.units.size() * std::size(kKinds), blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i)
    block_of[static_cast<size_t>(blocks[i].key.unit) * std::size(kKinds) + static_cast<size_t>(blocks[i].key.kind)] = i;
  for (size_t t = 0; t < plan.transfers.size(); ++t) {
    const Transfer& tr = plan.transfers[t];
    Block& b = blocks.at(block_of[static_cast<size_t>(tr.unit) * std::size(kKinds) + static_cast<size_t>(tr.kind)]);
    const bool local = from_proc[static_cast<size_t>(tr.src)] == to_proc[static_cast<size_t>(tr.dst)];
    (local ? b.local : b.net).push_back(t);
  }

  Levels lv{std::vector<int64_t>(procs, 0), {}, std::vector<int64_t>(procs, 0)};
  for (const Block& b : blocks)
    for (const Touch& t : b.touch) lv.cur[static_cast<size_t>(t.proc)] += t.give, lv.after[static_cast<size_t>(t.proc)] += t.take;
  plan.before = lv.cur;
  plan.after = lv.after;
  lv.peak = lv.cur;
  const std::vector<size_t> order = order_steps(blocks, lv);
  plan.peak = lv.peak;

  Rounds busy(plan.processes);
  for (size_t i : order) {
    Block& b = blocks[i];
    plan.steps.push_back({b.key, std::move(b.local), rounds_of(b, plan, from_proc, to_proc, busy)});
  }
  return plan;
}

}  // namespace piper::state
