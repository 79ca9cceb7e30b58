// simulator.cpp — the executor's semantics on a clock instead of a machine.
//
// Each rank plays its program (ir::lower, as the runtime gets it) with an
// ir::Player, the executor's player: the same issue order, look-ahead and
// completions. Here a compute instruction takes the cost model's time, a
// transfer completes when both sides have issued it and a collective when
// every member of its group has (ir::WorldPlay matches them and takes the
// ranks in turns, as the verifier does), each after the cost model's time.
// Memory is a list of (time, bytes) changes per rank, summed in time order
// at the end.
#include "sim/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>

#include "ir/parallel_dims.hpp"
#include "ir/player.hpp"
#include "ir/unit_passes.hpp"
#include "ir/work.hpp"
#include "ir/world_play.hpp"

namespace piper::sim {

using ir::Instr;
using ir::NodeKind;
using ir::Payload;

const char* mem_name(Mem m) {
  static const char* names[] = {"params", "grads", "optimizer", "activations", "buffers"};
  return names[static_cast<int>(m)];
}

namespace {

constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();

bool known(double t) { return !std::isnan(t); }
bool p2p(NodeKind k) { return ir::is_p2p(k); }
bool zero3_gather(const Instr& c) { return ir::is_zero3_gather(c); }
// The slot of a unit pass in per-pass tables: FWD, BWD_I, BWD_W, BWD.
size_t pass_slot(NodeKind k) {
  return k == NodeKind::FWD ? 0 : k == NodeKind::BWD_I ? 1 : k == NodeKind::BWD_W ? 2 : 3;
}

struct MemDelta {
  double t;
  int seq;  // insertion order breaks ties
  Mem cat;
  double bytes;
};

// Per-unit sizes on one rank: elements of its local pieces, the dp shard, the
// padded buffer, and the elements of parameters, gradients and each Adam
// moment it keeps between steps (ir::zero_shards).
struct UnitSize {
  int64_t numel = 0, shard = 0, padded = 0;
  int64_t expert_padded = 0;  // of `padded`: an MoE block's experts, which move over the expert-data group
  int64_t kept[3] = {0, 0, 0};
};

struct RankState {
  const ir::Program* prog = nullptr;  // ir::lower's program of this rank, lowered once per simulate()
  const ir::Player* player = nullptr;          // the WorldPlay's player of this rank
  std::unique_ptr<ir::PlayHost> host;
  std::unique_ptr<ir::PlayHost> recorder;  // wraps host when the play is logged
  std::vector<double> issue, done;             // per comm index
  std::vector<double> begin;                   // per comm index: when every party had issued it
  double cursor = 0;      // the rank's clock: end of its last compute, or time inside a wait
  std::map<int, int> uses_left;  // ZeRO-3 gather node -> compute uses left
  std::vector<char> grads_alive;  // per unit: ZeRO >= 2 full gradients allocated
  std::vector<char> copy_alive;   // per unit: its compute copy held (a storage narrower than f32)
  std::map<std::pair<int, int>, int> alive;  // (stage, mb) -> units holding saved state
  int alive_now = 0, alive_peak = 0;
  std::vector<MemDelta> mem;
  std::vector<std::pair<double, double>> busy;  // per compute instruction: start, end
  RankResult res;
};

class Sim {
 public:
  Sim(const ir::Plan& plan, const std::vector<ir::Program>& programs, const config::Config& cfg, const CostModel& cost,
      const SimOptions& opts, const std::vector<std::vector<double>>* stretch = nullptr)
      : plan_(plan), programs_(programs), cost_(cost), opts_(opts), stretch_(stretch), world_(plan.strategy.world_size),
        dims_(plan.strategy.dims()), play_(programs, dims_) {
    const auto& s = plan.strategy;
    tp_ = dims_.degree(ir::Axis::TP);
    dp_ = dims_.degree(ir::Axis::DP);
    zero_ = s.replicate.zero_of_unit;
    rows_ = cfg.train.global_batch / std::max(1, dp_ * s.split.microbatches) * cfg.train.seq_len;
    // An activation or its gradient between units, in the type the units compute with (bf16 under bf16).
    act_bytes_ = static_cast<double>(rows_ * cfg.model.d_model * s.compute_elem_bytes);
    elem_bytes_ = static_cast<double>(s.compute_elem_bytes);
    last_unit_ = static_cast<int>(plan.model.units.size()) - 1;
    const ir::ZeroState kept[3] = {ir::ZeroState::ZERO_PARAMS, ir::ZeroState::ZERO_GRADS,
                                   ir::ZeroState::ZERO_MOMENTS};
    // Buffers, shards and the expert-data group as the strategy at dp x replicas has them.
    ir::Degrees full = dims_.degrees();
    full.dp *= opts_.replicas;
    expert_data_ = ir::replica_degree(true, full);
    for (const auto& u : plan.model.units) {
      UnitSize us;
      us.numel = ir::local_numel(u, full);
      for (const ir::FlatPart& p : ir::flat_parts(u, full, {})) {
        us.shard += p.zero.len, us.padded += p.zero.padded;
        if (p.experts) us.expert_padded += p.zero.padded;
      }
      for (int c = 0; c < 3; ++c)
        us.kept[c] = ir::zero_shards(s.replicate.zero(u.index), kept[c]) ? us.shard : us.padded;
      sizes_.push_back(us);
      kind_.push_back(ir::unit_symbol(u.kind));
      names_.push_back(u.name);
      std::array<std::vector<double>, 4> shares;
      for (NodeKind k : {NodeKind::FWD, NodeKind::BWD_I, NodeKind::BWD_W, NodeKind::BWD}) {
        const ir::PassShape shape = ir::pass_shape(u.kind, k, ir::pass_dims(plan.model, tp_, dims_.degree(ir::Axis::EP)));
        shares[pass_slot(k)] = ir::segment_shares(cfg.model, ir::unit_symbol(u.kind), k, shape, rows_, cfg.train.seq_len, tp_);
      }
      shares_.push_back(std::move(shares));
      const ir::Recompute mode = s.recompute_of(static_cast<int>(sizes_.size()) - 1);
      recompute_.push_back(mode == ir::Recompute::RECOMPUTE_NONE
                               ? ir::RecomputeShare{}
                               : ir::recompute_share(cfg.model, kind_.back(), mode, rows_, cfg.train.seq_len, tp_,
                                                     static_cast<int>(s.compute_elem_bytes)));
    }
    for (const auto& n : plan.graph.nodes()) stage_of_node_.push_back(n.tags.stage);
    ranks_.resize(static_cast<size_t>(world_));
    for (int r = 0; r < world_; ++r) init_rank(r);
  }

  // Per rank, each compute instruction's (start, end) of the last run.
  std::vector<std::vector<std::pair<double, double>>> busy_;

  SimResult run() {
    std::vector<ir::PlayHost*> hosts;
    for (RankState& st : ranks_) hosts.push_back(st.recorder ? st.recorder.get() : st.host.get());
    const std::vector<int> left = play_.play(hosts);
    if (!left.empty())
      throw std::logic_error("the simulated programs cannot complete: " + play_.stuck(left.front(), plan_.graph, names_));
    for (RankState& st : ranks_) {
      st.res.finish_ms = st.cursor;  // nothing moves a clock after its rank's end
      for (size_t u = 0; u < st.copy_alive.size(); ++u) drop_copy(st, static_cast<int>(u), st.cursor);
    }
    return finish();
  }

 private:
  RankState& R(int r) { return ranks_[static_cast<size_t>(r)]; }

  // What a rank's player drives: the simulator's clock and cost model.
  class Host final : public ir::PlayHost {
   public:
    Host(Sim& sim, int rank) : sim_(sim), rank_(rank) {}
    void issue(size_t k) override { sim_.issue_at(rank_, k, sim_.R(rank_).cursor); }
    bool complete(size_t k) override { return sim_.complete(rank_, k); }
    void run(size_t i) override { sim_.run(rank_, i); }

   private:
    Sim& sim_;
    int rank_;
  };

  void init_rank(int r) {
    RankState& st = R(r);
    st.prog = &programs_[static_cast<size_t>(r)];
    st.player = &play_.player(r);
    st.host = std::make_unique<Host>(*this, r);
    if (opts_.play_log) {
      opts_.play_log->resize(static_cast<size_t>(world_));
      auto& log = (*opts_.play_log)[static_cast<size_t>(r)];
      log.clear();
      st.recorder = std::make_unique<ir::RecordingHost>(*st.host, log);
    }
    st.res.rank = r;
    const auto& comm = st.prog->comm;
    st.issue.assign(comm.size(), kUnknown);
    st.done.assign(comm.size(), kUnknown);
    st.begin.assign(comm.size(), kUnknown);
    for (size_t i = 0; i < st.prog->compute.size(); ++i)
      for (int w : st.prog->compute[i].waits) {
        const int k = st.player->comm_index(w);
        if (k >= 0 && zero3_gather(comm[static_cast<size_t>(k)])) ++st.uses_left[w];
      }
    st.grads_alive.assign(sizes_.size(), 0);
    st.copy_alive.assign(sizes_.size(), 0);
    // State held between steps, as the parameter store and the optimiser allocate it.
    std::vector<char> held(sizes_.size(), 0);
    for (const Instr& in : st.prog->compute)
      if (in.unit >= 0) held[static_cast<size_t>(in.unit)] = 1;
    for (size_t u = 0; u < sizes_.size(); ++u) {
      if (!held[u]) continue;
      const UnitSize& z = sizes_[u];
      st.res.state[0] += 4.0 * static_cast<double>(z.kept[0]);
      st.res.state[1] += 4.0 * static_cast<double>(z.kept[1]);
      st.res.state[2] += 8.0 * static_cast<double>(z.kept[2]);  // two moments
    }
    for (int c = 0; c < 3; ++c) add_mem(st, -1.0, static_cast<Mem>(c), st.res.state[static_cast<size_t>(c)]);
    // The step starts after the batch is read.
    st.cursor = std::max(0.0, cost_.step_overhead.at(plan_.strategy.split.microbatches));
    if (!std::isfinite(st.cursor)) overflow(r, -1, "the step overhead", 0, st.cursor);
  }

  void add_mem(RankState& st, double t, Mem c, double bytes) {
    if (bytes != 0) st.mem.push_back({t, static_cast<int>(st.mem.size()), c, bytes});
  }

  // ---- communication ---------------------------------------------------------

  // A time that is not a finite number: the cost model's times are too large to add up. (Checked
  // where every time is made, so that no clock reads as kUnknown.)
  [[noreturn]] void overflow(int r, int node, const std::string& what, double start, double took) const {
    char b[160];
    std::snprintf(b, sizeof b, " (from %.6g ms, taking %.6g ms)", start, took);
    throw SimError("the simulated clock of rank " + std::to_string(r) + " overflowed at " +
                   (node >= 0 ? ir::describe(plan_.graph.node(node), names_) : what) + b +
                   ": the cost model's times are too large to add up; every time in a cost file is at most " +
                   std::to_string(static_cast<long long>(kMaxCoefficient)) + " ms (docs/calibration.md)");
  }

  void issue_at(int r, size_t k, double t) {
    RankState& st = R(r);
    if (!std::isfinite(t)) overflow(r, st.prog->comm[k].node, "", t, 0);
    st.issue[k] = t;
    play_.issue(r, k);
    const Instr& c = st.prog->comm[k];
    if (c.kind == NodeKind::RECV)
      add_mem(st, t, c.payload == Payload::PAYLOAD_ACTIVATION ? Mem::MEM_ACTIVATIONS : Mem::MEM_BUFFERS, act_bytes_);
    if (c.kind == NodeKind::ALLGATHER)
      for (int u : c.units) add_mem(st, t, Mem::MEM_BUFFERS, sent_bytes(c, u));
    if (c.kind == NodeKind::ALLGATHER && zero3_gather(c))
      for (int u : c.units)
        add_mem(st, t, Mem::MEM_PARAMS, elem_bytes_ * static_cast<double>(sizes_[static_cast<size_t>(u)].padded));
  }

  // Bytes of an element of unit collective c: ZeRO-3 gathers the values the units compute with,
  // the rest move the f32 master weights and gradients.
  double elem_of(const Instr& c) const { return zero3_gather(c) ? elem_bytes_ : 4.0; }

  // What an all-gather sends of unit u until it completes: ZeRO-1/2's shard of the updated
  // values is copied out; ZeRO-3's is sent as it is in f32, or rounded into a copy.
  double sent_bytes(const Instr& c, int u) const {
    const double shard = static_cast<double>(sizes_[static_cast<size_t>(u)].shard);
    if (!zero3_gather(c)) return 4.0 * shard;
    return elem_bytes_ < 4.0 ? elem_bytes_ * shard : 0.0;
  }

  double bytes_of(const Instr& c) const {
    if (c.units.empty()) return static_cast<double>(c.bytes);  // messages, unit points, the norm
    double b = 0;
    for (int u : c.units) b += elem_of(c) * static_cast<double>(sizes_[static_cast<size_t>(u)].padded);
    return b;
  }

  // The ranks comm instruction c runs over, `parties` of them in the plan: a data-parallel or
  // world collective's parties stand for SimOptions::replicas times as many.
  int group_size(const Instr& c, size_t parties) const {
    if (p2p(c.kind)) return 2;
    const bool replicated = c.group == ir::GroupDim::GROUP_DP || c.group == ir::GroupDim::GROUP_WORLD;
    return static_cast<int>(parties) * (replicated ? opts_.replicas : 1);
  }

  // The time of a collective over n ranks: a data-parallel one moves the units' dense parts over
  // its n ranks and their experts over the expert-data group, one after the other.
  double comm_time(const Instr& c, int n) const {
    const CommOp op = comm_op_of(c.kind);
    if (c.units.empty()) return cost_.comm_ms(op, n, c.bytes);
    double dense = 0, experts = 0;
    for (int u : c.units) {
      const UnitSize& z = sizes_[static_cast<size_t>(u)];
      dense += elem_of(c) * static_cast<double>(z.padded - z.expert_padded);
      experts += elem_of(c) * static_cast<double>(z.expert_padded);
    }
    return cost_.comm_ms(op, n, static_cast<int64_t>(dense)) +
           (experts > 0 && expert_data_ > 1 ? cost_.comm_ms(op, expert_data_, static_cast<int64_t>(experts)) : 0.0);
  }

  // The completion time of comm instruction k of rank r, once every party has issued it.
  double resolve(int r, size_t k) {
    RankState& st = R(r);
    if (known(st.done[k])) return st.done[k];
    if (!known(st.issue[k])) return kUnknown;
    const Instr& c = st.prog->comm[k];
    if (!play_.matched(r, k)) return kUnknown;
    const std::vector<ir::Side> parties = play_.sides(r, k);
    double start = 0;
    for (auto [m, mk] : parties) start = std::max(start, R(m).issue[mk]);
    const double took = comm_time(c, group_size(c, parties.size()));
    const double end = start + took;
    if (!std::isfinite(end)) overflow(r, c.node, "", start, took);
    for (auto [m, mk] : parties) R(m).begin[mk] = start, completed(m, mk, end);
    return end;
  }

  void completed(int r, size_t k, double end) {
    RankState& st = R(r);
    st.done[k] = end;
    const Instr& c = st.prog->comm[k];
    if (c.kind == NodeKind::SEND)
      add_mem(st, end, c.payload == Payload::PAYLOAD_ACTIVATION ? Mem::MEM_ACTIVATIONS : Mem::MEM_BUFFERS, -act_bytes_);
    if (c.kind == NodeKind::REDUCE_SCATTER)
      for (int u : c.units) release_grads(st, u, end);
    if (c.kind == NodeKind::ALLGATHER)
      for (int u : c.units) add_mem(st, end, Mem::MEM_BUFFERS, -sent_bytes(c, u));
    if (opts_.timeline) {
      trace::Event e;
      e.rank = r;
      e.lane = trace::Lane::LANE_COMM;
      e.kind = ir::node_kind_name(c.kind);
      e.name = ir::describe(plan_.graph.node(c.node), names_);
      e.node = c.node;
      e.microbatch = c.microbatch;
      e.stage = stage_of_node_[static_cast<size_t>(c.node)];
      e.unit = c.unit;
      e.start_us = st.issue[k] * 1000.0;
      e.end_us = end * 1000.0;
      e.bytes = static_cast<int64_t>(bytes_of(c));
      events_.push_back(std::move(e));
    }
  }

  // Waiting from the cursor until `end` for an operation every party had
  // issued at `begin`: before that the rank waits for another (bubble), after
  // it for the transfer itself (exposed communication).
  static void wait_until(RankState& st, double begin, double end) {
    if (end <= st.cursor) return;
    const double other = std::max(0.0, std::min(begin, end) - st.cursor);
    st.res.bubble_ms += other;
    st.res.comm_ms += end - st.cursor - other;
    st.cursor = end;
  }

  // Completes comm instruction k of rank r (ir::PlayHost::complete): false
  // while another rank has not issued its side yet.
  bool complete(int r, size_t k) {
    RankState& st = R(r);
    if (!known(st.done[k]) && !known(resolve(r, k))) return false;
    wait_until(st, st.begin[k], st.done[k]);
    return true;
  }

  // ---- compute -------------------------------------------------------------

  void release_grads(RankState& st, int u, double t) {
    if (zero_[static_cast<size_t>(u)] < 2 || !st.grads_alive[static_cast<size_t>(u)]) return;
    st.grads_alive[static_cast<size_t>(u)] = 0;
    add_mem(st, t, Mem::MEM_GRADS, -4.0 * static_cast<double>(sizes_[static_cast<size_t>(u)].padded));
  }

  void touch_grads(RankState& st, int u, double t) {
    if (zero_[static_cast<size_t>(u)] < 2 || st.grads_alive[static_cast<size_t>(u)]) return;
    st.grads_alive[static_cast<size_t>(u)] = 1;
    add_mem(st, t, Mem::MEM_GRADS, 4.0 * static_cast<double>(sizes_[static_cast<size_t>(u)].padded));
  }

  void set_alive(RankState& st, int stage, int mb, int delta) {
    int& n = st.alive[{stage, mb}];
    const bool was = n > 0;
    n += delta;
    st.alive_now += (n > 0) - was;
    st.alive_peak = std::max(st.alive_peak, st.alive_now);
  }

  // Runs compute instruction i of rank r from the rank's clock (ir::PlayHost::run):
  // its time, memory and trace. A unit pass's time is its first segment's
  // (the later ones are the small steps after a tensor-parallel collective:
  // a residual, a norm's backward, the loss from reduced sums), but for an MoE
  // block's all-to-all segments (segment_shares).
  void run(int r, size_t i) {
    RankState& st = R(r);
    const Instr& in = st.prog->compute[i];
    const double start = st.cursor;
    const int u = in.unit;
    const size_t us = static_cast<size_t>(std::max(0, u));
    const int stage = stage_of_node_[static_cast<size_t>(in.node)];
    double dur = 0;
    if (in.kind == NodeKind::UPD) {
      dur = std::max(0.0, cost_.update.at(static_cast<double>(zero_[us] >= 1 ? sizes_[us].shard : sizes_[us].numel)));
    } else if (in.kind == NodeKind::RECOMP) {
      dur = recompute_[us].time * cost_.compute_ms(kind_[us], ir::Pass::PASS_F, tp_, rows_);
      recompute_memory(st, u, start, start + dur);
    } else if (in.kind != NodeKind::NORM) {
      const std::vector<double>& share = shares_[us][pass_slot(in.kind)];
      const bool first = in.segment == 0, last = in.segment + 1 == static_cast<int>(share.size());
      const double part = share.at(static_cast<size_t>(in.segment));
      if (part > 0) dur = part * cost_.compute_ms(kind_[us], in.pass, tp_, rows_);
      pass_memory(st, in, first ? start : kUnknown, last ? start + dur : kUnknown);
    }
    if (stretch_) dur *= (*stretch_)[static_cast<size_t>(r)][i];
    if (!std::isfinite(start + dur)) overflow(r, in.node, "", start, dur);
    const double end = start + dur;
    if (in.kind != NodeKind::UPD && in.kind != NodeKind::NORM) hold_copy(st, in, start);
    if (in.kind == NodeKind::UPD) drop_copy(st, in.unit, start);
    st.res.compute_ms += dur;
    st.busy.push_back({start, end});
    if (opts_.timeline) {
      trace::Event e;
      e.rank = r;
      e.kind = ir::node_kind_name(in.kind);
      e.name = ir::describe(plan_.graph.node(in.node), names_);
      e.node = in.node;
      e.microbatch = in.microbatch;
      e.stage = stage;
      e.unit = u;
      e.start_us = start * 1000.0;
      e.end_us = end * 1000.0;
      events_.push_back(std::move(e));
    }
    for (int w : in.waits) {
      auto it = st.uses_left.find(w);
      if (it != st.uses_left.end() && --it->second == 0)
        for (int g : st.prog->comm[static_cast<size_t>(st.player->comm_index(w))].units)
          add_mem(st, end, Mem::MEM_PARAMS, -elem_bytes_ * static_cast<double>(sizes_[static_cast<size_t>(g)].padded));
    }
    if (in.kind == NodeKind::UPD) release_grads(st, in.unit, end);
    st.cursor = end;
  }

  // The memory of a unit pass: what it allocates at `start` (its first
  // segment's), what it frees or keeps at `end` (its last segment's); kUnknown
  // where this segment is not that one.
  // Bytes as calibrate measures them (docs/calibration.md): `saved` is the rise over the
  // forward, `kept` (kept_for_w) the level between BI and BW above the level before the forward,
  // `transient` the peak inside a pass above the level before it. An entry taken at another
  // tp degree has its row-proportional part scaled as the work splits.
  struct UnitBytes {
    double saved, kept, transient;
  };
  UnitBytes unit_bytes(int u) const {
    const OpCost& oc = cost_.op(kind_[static_cast<size_t>(u)], tp_);
    const double rows = static_cast<double>(rows_) * (oc.tp == tp_ ? 1.0 : static_cast<double>(oc.tp) / tp_);
    // A fitted line below 0 at these rows (a negative intercept) holds nothing.
    return {std::max(0.0, oc.saved.at(rows)), std::max(0.0, oc.kept_for_w.at(rows)),
            std::max(0.0, oc.transient.at(rows))};
  }

  // Under a storage narrower than f32 the executor keeps a unit's values rounded to it, its compute
  // copy, from the unit's first pass after an update until that update (Executor::compute_copy), unless
  // ZeRO-3 gathered them rounded for the pass; what it widens of them for the f32 readers (norm weights,
  // the conv, the scan's scalars: a unit's small parameters) is not counted.
  void hold_copy(RankState& st, const Instr& in, double start) {
    if (elem_bytes_ >= 4.0) return;
    const bool gathered =
        std::any_of(in.waits.begin(), in.waits.end(), [&](int w) { return st.uses_left.count(w) > 0; });
    char& alive = st.copy_alive[static_cast<size_t>(in.unit)];
    if (gathered || alive) return;
    alive = 1;
    add_mem(st, start, Mem::MEM_PARAMS, elem_bytes_ * static_cast<double>(sizes_[static_cast<size_t>(in.unit)].padded));
  }
  void drop_copy(RankState& st, int u, double t) {
    char& alive = st.copy_alive[static_cast<size_t>(u)];
    if (!alive) return;
    alive = 0;
    add_mem(st, t, Mem::MEM_PARAMS, -elem_bytes_ * static_cast<double>(sizes_[static_cast<size_t>(u)].padded));
  }

  // RECOMP: what the forward dropped allocated again, a pass's scratch and the scratch output meanwhile.
  void recompute_memory(RankState& st, int u, double start, double end) {
    const UnitBytes b = unit_bytes(u);
    add_mem(st, start, Mem::MEM_ACTIVATIONS, recompute_[static_cast<size_t>(u)].saved * b.saved);
    add_mem(st, start, Mem::MEM_BUFFERS, b.transient + act_bytes_);
    add_mem(st, end, Mem::MEM_BUFFERS, -b.transient - act_bytes_);
  }

  void pass_memory(RankState& st, const Instr& in, double start, double end) {
    const int u = in.unit;
    const int stage = stage_of_node_[static_cast<size_t>(in.node)];
    const auto [saved, kept, transient] = unit_bytes(u);
    const bool at_start = known(start), at_end = known(end);
    const bool embed_w = in.kind == NodeKind::BWD_W && u == 0;  // the embedding's whole backward
    if (at_start) add_mem(st, start, Mem::MEM_BUFFERS, transient);
    if (at_end) add_mem(st, end, Mem::MEM_BUFFERS, -transient);
    if (in.kind == NodeKind::FWD) {
      if (at_start && u < last_unit_) add_mem(st, start, Mem::MEM_ACTIVATIONS, act_bytes_);
      if (at_start) set_alive(st, stage, in.microbatch, +1);
      if (at_end) add_mem(st, end, Mem::MEM_ACTIVATIONS, saved);
      if (at_end) add_mem(st, end, Mem::MEM_ACTIVATIONS, -recompute_[static_cast<size_t>(u)].saved * saved);  // dropped
    } else if (in.kind == NodeKind::BWD_W && !embed_w) {
      if (at_start) touch_grads(st, u, start);
      if (at_end) {
        add_mem(st, end, Mem::MEM_ACTIVATIONS, -kept);
        set_alive(st, stage, in.microbatch, -1);
      }
    } else {  // BWD, BWD_I, the embedding's BWD_W: input gradient in, output gradient and input freed
      if (at_start) touch_grads(st, u, start);
      if (at_start && u > 0) add_mem(st, start, Mem::MEM_BUFFERS, act_bytes_);
      if (!at_end) return;
      const bool fused = in.kind != NodeKind::BWD_I;
      add_mem(st, end, Mem::MEM_ACTIVATIONS, fused ? -saved : kept - saved);
      if (u > 0) add_mem(st, end, Mem::MEM_ACTIVATIONS, -act_bytes_);   // the input activation
      if (u < last_unit_) add_mem(st, end, Mem::MEM_BUFFERS, -act_bytes_);  // the output gradient
      if (fused) set_alive(st, stage, in.microbatch, -1);
    }
  }

  SimResult finish() {
    SimResult out;
    double slowest = 0;
    for (const RankState& st : ranks_) slowest = std::max(slowest, st.res.finish_ms);
    const int world = world_ * opts_.replicas;
    const double loss_sum = world > 1 ? cost_.comm_ms(CommOp::COMM_ALLREDUCE, world, 8) : 0.0;
    out.step_ms = slowest + loss_sum;
    if (!std::isfinite(out.step_ms)) overflow(0, -1, "the step's loss all-reduce", slowest, loss_sum);
    double idle = 0;
    for (RankState& st : ranks_) {
      RankResult res = st.res;
      res.bubble_ms += out.step_ms - st.res.finish_ms;  // waiting for the slowest rank
      idle += res.bubble_ms;
      res.peak_microbatches = st.alive_peak;
      std::stable_sort(st.mem.begin(), st.mem.end(), [](const MemDelta& a, const MemDelta& b) {
        return a.t < b.t || (a.t == b.t && a.seq < b.seq);
      });
      std::array<double, kMemCount> cur{};
      double total = 0;
      for (const MemDelta& d : st.mem) {
        double& c = cur[static_cast<size_t>(d.cat)];
        c += d.bytes;
        total += d.bytes;
        res.peak[static_cast<size_t>(d.cat)] = std::max(res.peak[static_cast<size_t>(d.cat)], c);
        res.peak_total = std::max(res.peak_total, total);
      }
      out.nodes += static_cast<int64_t>(st.prog->compute.size() + st.prog->comm.size());
      busy_.push_back(std::move(st.busy));
      out.ranks.push_back(res);
    }
    out.bubble = out.step_ms > 0 ? idle / (world_ * out.step_ms) : 0.0;
    // Every figure is a sum of the finite times and byte counts above; checked all the same.
    for (const RankResult& rr : out.ranks) {
      bool ok = std::isfinite(rr.finish_ms) && std::isfinite(rr.compute_ms) && std::isfinite(rr.comm_ms) &&
                std::isfinite(rr.bubble_ms) && std::isfinite(rr.peak_total);
      for (double b : rr.peak) ok &= std::isfinite(b);
      if (!ok)
        throw SimError("rank " + std::to_string(rr.rank) +
                       "'s predicted times or memory overflowed: the cost model's values are too large to add up "
                       "(docs/calibration.md gives their bounds)");
    }
    if (!std::isfinite(out.bubble)) throw SimError("the predicted bubble fraction overflowed");
    if (opts_.timeline) {
      out.trace.title = opts_.title;
      out.trace.ranks = world_;
      out.trace.events = std::move(events_);
      std::stable_sort(out.trace.events.begin(), out.trace.events.end(),
                       [](const trace::Event& a, const trace::Event& b) {
                         return a.rank < b.rank || (a.rank == b.rank && a.start_us < b.start_us);
                       });
    }
    return out;
  }

  const ir::Plan& plan_;
  const std::vector<ir::Program>& programs_;  // per rank
  const CostModel& cost_;
  SimOptions opts_;
  const std::vector<std::vector<double>>* stretch_;  // per rank and compute instruction: time factor
  int world_;
  ir::ParallelDims dims_;
  ir::WorldPlay play_;  // every rank's player, matched
  int tp_ = 1, dp_ = 1, last_unit_ = 0;
  int expert_data_ = 1;    // ranks of the expert-data group, replicas included
  std::vector<int> zero_;  // the ZeRO stage of each unit
  int64_t rows_ = 0;
  double act_bytes_ = 0;
  double elem_bytes_ = 4;  // of what the units compute on (Strategy::compute_elem_bytes): ZeRO-3 gathers it
  std::vector<UnitSize> sizes_;
  std::vector<char> kind_;
  std::vector<std::string> names_;
  std::vector<int> stage_of_node_;
  // Per unit and pass (pass_slot): the share of the pass's time each segment runs (ir::segment_shares).
  std::vector<std::array<std::vector<double>, 4>> shares_;
  std::vector<ir::RecomputeShare> recompute_;      // per unit: what its RECOMP costs and restores (none: 0, 0)
  std::vector<RankState> ranks_;
  std::vector<trace::Event> events_;
};

}  // namespace

namespace {

// Ranks sharing a host: each compute instruction is stretched by the cost
// model's slowdown at the time-averaged number of ranks of its host computing
// during it (itself included).
std::vector<std::vector<double>> sharing(const std::vector<std::vector<std::pair<double, double>>>& busy,
                                         int ranks_per_host, const CostModel& cost) {
  std::vector<std::vector<double>> out(busy.size());
  const int world = static_cast<int>(busy.size());
  for (int h0 = 0; h0 < world; h0 += ranks_per_host) {
    const int h1 = std::min(world, h0 + ranks_per_host);
    std::vector<std::pair<double, int>> edges;  // +1 at a start, -1 at an end
    for (int r = h0; r < h1; ++r)
      for (auto [a, b] : busy[static_cast<size_t>(r)]) edges.push_back({a, +1}), edges.push_back({b, -1});
    std::sort(edges.begin(), edges.end());
    // Piecewise-constant busy count and its running integral at each edge.
    std::vector<double> t, integral;  // at each edge: its time, the integral up to it
    int count = 0;
    double acc = 0, last = edges.empty() ? 0 : edges.front().first;
    for (auto [x, d] : edges) {
      acc += count * (x - last);
      last = x;
      count += d;
      t.push_back(x);
      integral.push_back(acc);
    }
    // Running counts after each edge, for O(log n) lookups.
    std::vector<int> after(edges.size());
    int c = 0;
    for (size_t k = 0; k < edges.size(); ++k) after[k] = c += edges[k].second;
    auto integral_to = [&](double x) {
      const size_t i = static_cast<size_t>(std::upper_bound(t.begin(), t.end(), x) - t.begin());
      return i == 0 ? 0.0 : integral[i - 1] + after[i - 1] * (x - t[i - 1]);
    };
    for (int r = h0; r < h1; ++r) {
      auto& f = out[static_cast<size_t>(r)];
      for (auto [a, b] : busy[static_cast<size_t>(r)]) {
        const double avg = b > a ? (integral_to(b) - integral_to(a)) / (b - a) : 1.0;
        f.push_back(cost.sharing(avg));
      }
    }
  }
  return out;
}

// SimOptions::replicas: at least 1; above 1, a plan with data-parallel replicas to stand for more
// (at dp 1 it has no data-parallel collectives), each rank on its own host, and dp x replicas
// within the config's bound on parallel.dp.
void check_replicas(const ir::Plan& plan, const SimOptions& opts) {
  const int k = opts.replicas, dp = plan.strategy.dims().degree(ir::Axis::DP);
  const auto refuse = [&](const std::string& why) {
    throw std::invalid_argument("sim: SimOptions::replicas = " + std::to_string(k) + ": " + why);
  };
  if (k < 1)
    refuse("the plan's data-parallel replicas stand for `replicas` times as many; give at least 1 (1: the plan as "
           "compiled)");
  if (k == 1) return;
  if (opts.ranks_per_host > 1)
    refuse("ranks_per_host = " + std::to_string(opts.ranks_per_host) +
           " makes ranks of a host slow each other down, and the ranks the replicas stand for would share hosts "
           "otherwise than the plan's; give ranks_per_host 0 or 1, or replicas 1 with the plan compiled at its full dp");
  if (dp < 2)
    refuse("the plan has dp 1, so no data-parallel collectives to price over more replicas; compile it at dp 2 (dp = "
           "ep with sharded experts) and give replicas = the full dp / the compiled dp");
  if (int64_t{dp} * k > kMaxGroupRanks)
    refuse("dp " + std::to_string(dp) + " x replicas is " + std::to_string(int64_t{dp} * k) +
           ", beyond the " + std::to_string(kMaxGroupRanks) +
           " data-parallel ranks a strategy may have (parallel.dp); give at most " +
           std::to_string(kMaxGroupRanks / dp));
}

}  // namespace

int64_t instructions(const ir::Plan& plan) {
  int64_t n = 0;
  for (const ir::Node& nd : plan.graph.nodes()) n += static_cast<int64_t>(nd.devices.size());
  return n;
}

SimResult simulate(const ir::Plan& plan, const config::Config& cfg, const CostModel& cost, const SimOptions& opts) {
  check_replicas(plan, opts);
  const int world = plan.strategy.world_size;
  // Each rank's program, lowered once for every round below.
  const std::vector<ir::Program> programs = ir::lower_all(plan.graph, world);
  const int rph = std::min(world, opts.ranks_per_host);
  if (rph <= 1 || cost.sharing(rph) <= 1.0) {
    Sim s(plan, programs, cfg, cost, opts);
    return s.run();
  }
  // Ranks slow each other down: iterate the stretch factors to a fixed point (damped), at most
  // kMaxSharingRounds simulations, until no factor moves by more than kSharingTolerance of itself.
  std::vector<std::vector<double>> stretch;
  double change = 0;
  for (int round = 0; round < kMaxSharingRounds; ++round) {
    Sim s(plan, programs, cfg, cost, opts, stretch.empty() ? nullptr : &stretch);
    SimResult res = s.run();
    // The factors apply to the base times: divide the stretched intervals' lengths back out.
    auto next = sharing(s.busy_, rph, cost);
    change = 0;
    if (!stretch.empty())
      for (size_t r = 0; r < next.size(); ++r)
        for (size_t i = 0; i < next[r].size(); ++i) {
          const double v = 0.5 * (stretch[r][i] + next[r][i]);
          change = std::max(change, std::abs(v - stretch[r][i]) / stretch[r][i]);
          next[r][i] = v;
        }
    if (!stretch.empty() && change < kSharingTolerance) return res;
    stretch = std::move(next);
  }
  char msg[512];
  std::snprintf(msg, sizeof msg,
                "the host-sharing slowdowns did not settle: after %d rounds a compute instruction's factor still "
                "moved by %.3g%% per round (settled: below %.3g%%), with --ranks-per-host %d and a slowdown of %.4g "
                "at %d ranks computing at once (host_slowdown of the cost model); measure host_slowdown with `piper "
                "calibrate` on as many ranks per host, or give fewer --ranks-per-host",
                kMaxSharingRounds, 100 * change, 100 * kSharingTolerance, rph, cost.sharing(rph), rph);
  throw SimError(msg);
}

}  // namespace piper::sim
