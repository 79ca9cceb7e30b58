// switch_plan.hpp — an online strategy switch as a plan: which process sends which elements of
// the live state to which, block by block and round by round (docs/state.md, "Switch plans").
// Pure: every rank computes the same plan from the two layouts; src/runtime executes it.
#pragma once

#include <algorithm>
#include <compare>
#include <cstdint>
#include <vector>

#include "ir/model_graph.hpp"
#include "state/layout.hpp"

namespace piper::state {

// Bytes of one element of state: piper keeps values and Adam moments in fp32.
constexpr int64_t kStateElemBytes = 4;

// One buffer a rank stores per unit it runs and kind: the values (the full padded buffer at zero
// 0-2, the shard at zero 3) or a moment (the full padded buffer at zero 0, the shard at zero >= 1),
// the buffers whose local offsets held() reports. A switch allocates and frees blocks whole.
struct BlockKey {
  int unit = -1;
  StateKind kind = StateKind::STATE_PARAM;
  auto operator<=>(const BlockKey&) const = default;
};
// Elements of the buffer `rank` stores for block `b` under `lp` (0 when it does not run the unit).
int64_t block_numel(const ir::ModelGraph& g, const LayoutParams& lp, int rank, BlockKey b);

// Elements [first, first + count) of transfer `transfer`'s runs taken in order, from process src to dst.
struct Message {
  int src = 0, dst = 0;
  size_t transfer = 0;
  int64_t first = 0, count = 0;
};
// Each process sends at most one message and receives at most one in a round, so a round is one
// Isend + one Irecv per process and then a wait: no order of rounds can deadlock.
struct Round {
  std::vector<Message> messages;
};
// One block of every process: its new buffer allocated where `to` holds it, filled, then its old
// buffer freed where `from` held it.
struct BlockStep {
  BlockKey block;
  std::vector<size_t> local;   // transfers whose source and destination are the same process: copies
  std::vector<Round> rounds;   // the rest, cut into messages of at most chunk_elems
};
struct SwitchPlan {
  std::vector<Transfer> transfers;  // plan_transfers(from, to), the local source of each rank preferred
  std::vector<BlockStep> steps;     // every block of either layout, in the order they run
  int64_t chunk_elems = 0;
  int processes = 0;
  // Per process, in elements of state (blocks only): held before, after, and the most held at any
  // moment of the plan as the runtime runs it (new block allocated at its step's start, old one
  // freed at its step's end), not counting the staging buffers (two chunks: one out, one in).
  std::vector<int64_t> before, after, peak;
  int64_t bytes_moved() const;  // over the network (not the local copies)
  int64_t bytes_local() const;
  size_t messages() const;
};

// The largest message of a switch that stages `buffer_bytes` per process (train.switch_buffer_mb,
// `piper plan-switch --buffer-mb`): half of it, since a process holds one message out and one in.
inline int64_t chunk_elems(int64_t buffer_bytes) { return std::max<int64_t>(1, buffer_bytes / 2 / kStateElemBytes); }

// `from_proc[i]` is the process of `from`'s rank i, `to_proc[j]` of `to`'s rank j (processes are
// 0..processes-1, the largest given plus one; a process holds at most one rank of each layout and
// may be in one layout only: a rank that leaves, or one that joins). Where a process holds an
// element under both layouts, it copies it; every other element comes from its writer
// (owned_for_write). Throws std::invalid_argument for process lists that do not fit the layouts and
// chunk_elems below 1.
SwitchPlan plan_switch(const ir::ModelGraph& g, const LayoutParams& from, const std::vector<int>& from_proc,
                       const LayoutParams& to, const std::vector<int>& to_proc, int64_t chunk_elems);

}  // namespace piper::state
