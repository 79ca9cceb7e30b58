// switching.cpp — the state of one strategy's runtime moved into another's, block by block.
#include "runtime/switching.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <utility>

#include "comm/device_comm.hpp"
#include "state/switch_plan.hpp"

namespace piper::runtime {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kSwitchTag = 7100;  // each pair exchanges at most one message a round, in round order

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// A process's pieces under one layout, found by (kind, parameter).
using PieceKey = std::pair<state::StateKind, std::string>;
std::map<PieceKey, state::Piece> pieces_of(const ir::ModelGraph& g, const state::LayoutParams& lp, int rank) {
  std::map<PieceKey, state::Piece> out;
  if (rank < 0) return out;
  for (state::Piece& p : state::held(g, lp, rank)) out.emplace(PieceKey{p.kind, p.param}, std::move(p));
  return out;
}

// Where a transfer's elements lie in one side's buffer: the local offset of each of its runs.
struct Located {
  float* base = nullptr;
  std::vector<int64_t> offsets;
};

Located locate_in(RankRuntime& rt, const std::map<PieceKey, state::Piece>& pieces, const state::Transfer& t) {
  const state::Piece& p = pieces.at({t.kind, t.param});
  return {rt.state_buffer(p), state::locate(p, t.runs)};
}

// Calls f(local offset, length, position in the message) for the elements [first, first + count) of the
// runs taken in order.
template <class F>
void for_each_segment(const std::vector<state::Run>& runs, const std::vector<int64_t>& offsets, int64_t first,
                      int64_t count, F&& f) {
  const int64_t origin = first;
  int64_t at = 0;  // elements of the runs before run r
  for (size_t r = 0; r < runs.size() && count > 0; ++r) {
    const int64_t n = runs[r].size();
    if (first < at + n) {
      const int64_t skip = std::max<int64_t>(0, first - at), len = std::min(n - skip, count);
      f(offsets[r] + skip, len, at + skip - origin);
      first += len, count -= len;
    }
    at += n;
  }
}

// The local offset where the elements [first, first + count) of the runs start when they lie back to back
// in the buffer, else -1.
int64_t stretch_start(const std::vector<state::Run>& runs, const std::vector<int64_t>& offsets, int64_t first,
                      int64_t count) {
  int64_t start = -1, next = -1;
  bool together = true;
  for_each_segment(runs, offsets, first, count, [&](int64_t off, int64_t len, int64_t) {
    if (start < 0) start = off;
    else together = together && off == next;
    next = off + len;
  });
  return together ? start : -1;
}

// This process's side of the moves: its rank in each layout and its pieces there.
struct Side {
  RankRuntime* rt = nullptr;
  int rank = -1;
  std::map<PieceKey, state::Piece> pieces;
};

int rank_of(const std::vector<int>& procs, int proc) {
  auto it = std::find(procs.begin(), procs.end(), proc);
  return it == procs.end() ? -1 : static_cast<int>(it - procs.begin());
}

bool holds(const Side& s, int unit) { return s.rt && s.rt->model().holds(unit); }

// Runs the plan's steps on this process: allocate, copy, exchange, free.
void run_steps(const state::SwitchPlan& plan, Side& from, Side& to, comm::Communicator& host_members,
               backend::Backend& be, MoveFigures& fig) {
  const int me = host_members.rank();
  // The state lives on `be`: messages go through host staging where the host cannot address it (a switch
  // moves each block once; an NCCL communicator for it would cost more to create than it saves).
  const std::unique_ptr<comm::Communicator> staged =
      comm::for_device(host_members, be, comm::DeviceComm::DEVICE_COMM_MPI);
  comm::Communicator& members = staged ? *staged : host_members;
  // Staging, counted as buffers: one message out, one in, as large as this process's largest.
  int64_t largest_out = 0, largest_in = 0;
  for (const state::BlockStep& step : plan.steps)
    for (const state::Round& round : step.rounds)
      for (const state::Message& m : round.messages) {
        if (m.src == me) largest_out = std::max(largest_out, m.count);
        if (m.dst == me) largest_in = std::max(largest_in, m.count);
      }
  backend::Tensor out_t(be, largest_out, backend::MemCategory::MEM_BUFFERS);
  backend::Tensor in_t(be, largest_in, backend::MemCategory::MEM_BUFFERS);
  float* out = largest_out ? out_t.data() : nullptr;
  float* in = largest_in ? in_t.data() : nullptr;
  for (const state::BlockStep& step : plan.steps) {
    const int unit = step.block.unit;
    if (holds(to, unit)) to.rt->allocate_block(unit, step.block.kind);
    for (size_t t : step.local) {
      const state::Transfer& tr = plan.transfers[t];
      if (from.rank != tr.src || to.rank != tr.dst) continue;  // another process's copy
      const Located src = locate_in(*from.rt, from.pieces, tr), dst = locate_in(*to.rt, to.pieces, tr);
      for (size_t r = 0; r < tr.runs.size(); ++r)
        be.copy(dst.base + dst.offsets[r], src.base + src.offsets[r], static_cast<size_t>(tr.runs[r].size()) * sizeof(float));
      fig.bytes_local += state::total(tr.runs) * state::kStateElemBytes;
    }
    // Where each transfer of the step lies on either side, located once for all its messages.
    std::map<size_t, Located> at_src, at_dst;
    auto src_of = [&](size_t t) -> const Located& {
      auto it = at_src.find(t);
      return it != at_src.end() ? it->second : at_src.emplace(t, locate_in(*from.rt, from.pieces, plan.transfers[t])).first->second;
    };
    auto dst_of = [&](size_t t) -> const Located& {
      auto it = at_dst.find(t);
      return it != at_dst.end() ? it->second : at_dst.emplace(t, locate_in(*to.rt, to.pieces, plan.transfers[t])).first->second;
    };
    for (const state::Round& round : step.rounds) {
      const state::Message* send = nullptr;
      const state::Message* recv = nullptr;
      for (const state::Message& m : round.messages) {
        if (m.src == me) send = &m;
        if (m.dst == me) recv = &m;
      }
      // A message that lies back to back in its buffer goes from (or into) the buffer itself; the others
      // through the staging.
      std::vector<comm::Request> pending;
      float* recv_into = nullptr;
      if (recv) {
        const state::Transfer& tr = plan.transfers[recv->transfer];
        const Located& dst = dst_of(recv->transfer);
        const int64_t at = stretch_start(tr.runs, dst.offsets, recv->first, recv->count);
        recv_into = at >= 0 ? dst.base + at : in;
        pending.push_back(members.irecv(recv_into, static_cast<size_t>(recv->count), backend::DType::DTYPE_F32, recv->src, kSwitchTag));
      }
      if (send) {
        const state::Transfer& tr = plan.transfers[send->transfer];
        const Located& src = src_of(send->transfer);
        const int64_t at = stretch_start(tr.runs, src.offsets, send->first, send->count);
        const float* from_buf = src.base + std::max<int64_t>(at, 0);
        if (at < 0) {
          for_each_segment(tr.runs, src.offsets, send->first, send->count, [&](int64_t off, int64_t len, int64_t pos) {
            be.copy(out + pos, src.base + off, static_cast<size_t>(len) * sizeof(float));
          });
          from_buf = out;
        }
        pending.push_back(members.isend(from_buf, static_cast<size_t>(send->count), backend::DType::DTYPE_F32, send->dst, kSwitchTag));
        fig.bytes_sent += send->count * state::kStateElemBytes;
      }
      comm::wait_all(pending);
      if (recv) {
        if (recv_into == in) {
          const state::Transfer& tr = plan.transfers[recv->transfer];
          const Located& dst = dst_of(recv->transfer);
          for_each_segment(tr.runs, dst.offsets, recv->first, recv->count, [&](int64_t off, int64_t len, int64_t pos) {
            be.copy(dst.base + off, in + pos, static_cast<size_t>(len) * sizeof(float));
          });
        }
        fig.bytes_received += recv->count * state::kStateElemBytes;
      }
    }
    if (holds(from, unit)) from.rt->release_block(unit, step.block.kind);
  }
}

// The old strategy's rank 0 tells every process where training stands.
DataPosition share_position(const Side& from, comm::Communicator& members) {
  double v[3] = {0, 0, 0};
  if (from.rank == 0) {
    const DataPosition& at = from.rt->position();
    v[0] = static_cast<double>(at.step), v[1] = static_cast<double>(at.tokens_seen),
    v[2] = static_cast<double>(at.data_position);
  }
  members.allreduce_double(v, 3);  // counts below 2^53 are exact
  return {static_cast<int64_t>(v[0]), static_cast<int64_t>(v[1]), static_cast<int64_t>(v[2])};
}

}  // namespace

std::unique_ptr<RankRuntime> move_state(RankRuntime* old_rt, const MoveSide& from, const config::Config& to_cfg,
                                        const MoveSide& to, comm::Communicator* new_world,
                                        comm::Communicator& members, int64_t buffer_bytes, MoveFigures& fig) {
  const int me = members.rank();
  auto t0 = Clock::now();
  std::unique_ptr<RankRuntime> fresh;
  if (new_world) fresh = std::make_unique<RankRuntime>(to_cfg, *to.plan, *new_world, StateStart::EMPTY);
  fig.build_ms = ms_since(t0);
  if (!old_rt && !fresh) {  // in reserve before and after: nothing to send or take, only the position to hear
    (void)share_position(Side{}, members);
    return nullptr;
  }

  t0 = Clock::now();
  const int64_t chunk = state::chunk_elems(buffer_bytes);
  const state::LayoutParams lp_from = state::layout_params(*from.plan), lp_to = state::layout_params(*to.plan);
  const state::SwitchPlan plan =
      state::plan_switch(from.plan->model, lp_from, from.procs, lp_to, to.procs, chunk);
  Side src{old_rt, rank_of(from.procs, me), pieces_of(from.plan->model, lp_from, rank_of(from.procs, me))};
  Side dst{fresh.get(), rank_of(to.procs, me), pieces_of(to.plan->model, lp_to, rank_of(to.procs, me))};
  fig.plan_ms = ms_since(t0);
  fig.rounds = 0;
  for (const state::BlockStep& s : plan.steps) fig.rounds += static_cast<int>(s.rounds.size());

  t0 = Clock::now();
  backend::Backend& be = (old_rt ? old_rt->model() : fresh->model()).backend();
  if (old_rt) old_rt->release_grads();
  be.reset_peak();
  run_steps(plan, src, dst, members, be, fig);
  const DataPosition at = share_position(src, members);
  if (fresh) {
    fresh->allocate_grads();
    fresh->resume_at(at);
  }
  fig.peak_bytes = be.memory().total_peak;
  fig.move_ms = ms_since(t0);
  return fresh;
}

}  // namespace piper::runtime
