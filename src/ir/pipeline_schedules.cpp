// pipeline_schedules.cpp — GPipe, 1F1B, interleaved 1F1B, ZB-H1 and DualPipeV, each a short function
// that reads like its paper's figure: numbered phases with closed-form counts, for one rank.
#include "ir/pipeline_schedules.hpp"

#include <algorithm>
#include <deque>
#include <stdexcept>
#include <utility>

#include "config/config.hpp"

namespace piper::ir {

int PipeSchedule::stage_of(int rank, int chunk) const {
  for (int st = 0; st < stages(); ++st)
    if (rank_of_stage[static_cast<size_t>(st)] == rank && chunk-- == 0) return st;
  throw std::out_of_range("pipeline rank " + std::to_string(rank) + " holds no chunk " + std::to_string(chunk));
}

int PipeSchedule::rank_of(int stage) const { return rank_of_stage.at(static_cast<size_t>(stage)); }

int PipeSchedule::chunk_of(int stage) const {
  const int r = rank_of(stage);
  return static_cast<int>(std::count(rank_of_stage.begin(), rank_of_stage.begin() + stage, r));
}

std::vector<int> loop_placement(int ranks, int chunks) {
  std::vector<int> out;
  for (int st = 0; st < ranks * chunks; ++st) out.push_back(st % ranks);
  return out;
}

std::vector<int> v_placement(int ranks) {
  std::vector<int> out;
  for (int st = 0; st < 2 * ranks; ++st) out.push_back(st < ranks ? st : 2 * ranks - 1 - st);
  return out;
}

std::string placement_problem(const std::vector<int>& rank_of_stage, int ranks) {
  std::vector<int> held(static_cast<size_t>(std::max(0, ranks)), 0);
  for (size_t st = 0; st < rank_of_stage.size(); ++st) {
    const int r = rank_of_stage[st];
    if (r < 0 || r >= ranks)
      return "stage " + std::to_string(st) + " is placed on pipeline rank " + std::to_string(r) + ", but there are " +
             std::to_string(ranks) + " pipeline ranks (0.." + std::to_string(ranks - 1) + ")";
    ++held[static_cast<size_t>(r)];
  }
  for (int r = 0; r < ranks; ++r)
    if (held[static_cast<size_t>(r)] == 0)
      return "pipeline rank " + std::to_string(r) + " holds no stage; place at least one stage on every rank";
  for (int r = 1; r < ranks; ++r)
    if (held[static_cast<size_t>(r)] != held[0])
      return "pipeline rank 0 holds " + std::to_string(held[0]) + " stage(s) but rank " + std::to_string(r) +
             " holds " + std::to_string(held[static_cast<size_t>(r)]) +
             "; every rank holds the same number of stages (its model chunks)";
  return "";
}

std::string pipe_op_name(const PipeOp& op, int chunks) {
  std::string s = pass_name(op.pass) + std::to_string(op.microbatch);
  if (chunks > 1) s.append(".").append(std::to_string(op.chunk));
  if (!op.whole()) {
    s.append("/").append(std::to_string(op.first_unit));
    if (op.last_unit != op.first_unit) s.append("-").append(std::to_string(op.last_unit));
  }
  return s;
}

std::string pipe_ops_text(const std::vector<PipeOp>& ops, int chunks) {
  std::vector<std::string> names;
  std::vector<bool> grouped;
  for (const PipeOp& op : ops) names.push_back(pipe_op_name(op, chunks)), grouped.push_back(op.grouped);
  return config::order_text(names, grouped);
}

namespace {

// One rank's order under construction. b() is a whole backward: fused B, or (split) BI at once
// followed by its BW; bi()/bw() place the two halves separately, as the zero-bubble schedules do.
struct RankOrder {
  std::vector<PipeOp>& ops;
  bool split;
  bool pairs;  // pair(): the next op runs as one group with the one before
  bool pending = false;
  void push(Pass pass, int mb, int chunk) {
    ops.push_back({pass, mb, chunk, -1, -1, pending});
    pending = false;
  }
  // An F&B pair: the backward that follows (its first op) is grouped with the forward just placed.
  void pair() { pending = pairs; }
  void f(int mb, int chunk) { push(Pass::PASS_F, mb, chunk); }
  void b(int mb, int chunk) {
    if (!split) {
      push(Pass::PASS_B, mb, chunk);
      return;
    }
    bi(mb, chunk);
    bw(mb, chunk);
  }
  void bi(int mb, int chunk) { push(Pass::PASS_BI, mb, chunk); }
  void bw(int mb, int chunk) { push(Pass::PASS_BW, mb, chunk); }
};

// GPipe (Huang et al. 2019, "GPipe: Efficient Training of Giant Neural Networks using Pipeline
// Parallelism", Fig. 2c): every forward, then every backward. Holds all m microbatches.
void gpipe(RankOrder& o, int /*r*/, int /*p*/, int m) {
  for (int i = 0; i < m; ++i) o.f(i, 0);  // 1: mF
  for (int i = 0; i < m; ++i) o.b(i, 0);  // 2: mB
}

// 1F1B (PipeDream-Flush: Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training";
// Fig. 4 top of Narayanan et al. SC'21). Rank r holds at most min(p - r, m) microbatches. With one
// rank this is plain gradient accumulation: F0 B0 F1 B1 ...
// With pairs every rank warms up with at least one forward, so that F(i+1) can pair with B(i): one
// more microbatch in flight on the last rank is the price of overlapping the two.
int paired_warmup(const RankOrder& o, int warmup, int m) { return std::min(o.pairs ? std::max(warmup, 1) : warmup, m); }

void one_f_one_b(RankOrder& o, int r, int p, int m) {
  const int warmup = paired_warmup(o, std::min(p - r - 1, m), m);
  for (int i = 0; i < warmup; ++i) o.f(i, 0);  // 1: warm-up, (p-r-1) F
  for (int i = 0; i < m - warmup; ++i) {       // 2: steady, (m-p+r+1) x (F B)
    o.f(warmup + i, 0);
    if (warmup + i != i) o.pair();  // F(i+warm-up) with B(i); with no warm-up they are one microbatch's
    o.b(i, 0);
  }
  for (int i = m - warmup; i < m; ++i) o.b(i, 0);  // 3: cool-down, (p-r-1) B
}

// Interleaved 1F1B (Narayanan et al. SC'21, "Efficient Large-Scale Language Model Training on GPU
// Clusters Using Megatron-LM", Sec. 2.2.2 and Fig. 4 bottom; counts as Megatron-LM's
// forward_backward_pipelining_with_interleaving). Rank r holds v chunks, chunk c = stage c*p + r.
// Microbatches pass the chunks in groups of p: the k-th forward (k < m*v) is microbatch
// (k / pv)*p + k % p on chunk (k % pv) / p; the k-th backward the same microbatch on chunk
// v-1-(k % pv)/p.
void interleaved(RankOrder& o, int r, int p, int v, int m) {
  const int pv = p * v, total = m * v;
  auto mb = [&](int k) { return k / pv * p + k % p; };
  auto fchunk = [&](int k) { return k % pv / p; };
  auto bchunk = [&](int k) { return v - 1 - k % pv / p; };
  const int warmup = std::min(2 * (p - r - 1) + (v - 1) * p, total);
  for (int k = 0; k < warmup; ++k) o.f(mb(k), fchunk(k));  // 1: warm-up, 2(p-r-1) + (v-1)p F
  for (int k = 0; k < total - warmup; ++k) {                // 2: steady, (mv - warm-up) x (F B)
    o.f(mb(warmup + k), fchunk(warmup + k));
    if (mb(warmup + k) != mb(k)) o.pair();
    o.b(mb(k), bchunk(k));
  }
  for (int k = total - warmup; k < total; ++k) o.b(mb(k), bchunk(k));  // 3: cool-down, warm-up x B
}

// ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR, Sec. 2.1 and Fig. 3 top): 1F1B
// with each backward split into B (input grads: the critical path) and W (weight grads: off it).
// Rank r keeps 1F1B's p-r-1 warm-up forwards but starts its W passes r steps late, so every rank
// has min(p, m) microbatches in flight (1F1B's rank-0 count), B reaches rank 0 sooner, and the r
// deferred W fill the cool-down. Bubble (p-1)(F+B-W) against 1F1B's (p-1)(F+B+W).
void zbh1(RankOrder& o, int r, int p, int m) {
  const int warmup = paired_warmup(o, std::min(p - r - 1, m), m);
  int w = 0;                                   // the next W, oldest first
  for (int i = 0; i < warmup; ++i) o.f(i, 0);  // 1: warm-up, (p-r-1) F
  for (int i = 0; i < m - warmup; ++i) {       // 2: steady, (m-p+r+1) x (F B [W]), W from step r on
    o.f(warmup + i, 0);
    if (warmup + i != i) o.pair();
    o.bi(i, 0);
    if (i >= r) o.bw(w++, 0);
  }
  for (int i = m - warmup; i < m; ++i) {  // 3: cool-down, (p-r-1) x (B W)
    o.bi(i, 0);
    o.bw(w++, 0);
  }
  while (w < m) o.bw(w++, 0);  // 4: the r deferred W
}

// DualPipeV (DeepSeek-AI 2025, DualPipe repository: dualpipev.py `DualPipeV.step()`, the V-shaped
// cut of DualPipe from the DeepSeek-V3 report; placed like Sea AI's ZB-V, Qi et al. 2024, "Zero
// Bubble Pipeline Parallelism", and the V-shaped building blocks of "Pipeline Parallelism with
// Controllable Memory"). Rank r holds stage r (chunk 0, going down) and stage 2p-1-r (chunk 1,
// coming back up). The eight steps and their counts are DualPipeV's; F0 is a forward of chunk 0,
// B1 a backward of chunk 1, W the oldest deferred weight half. A zero-bubble backward (zb) runs BI
// now and queues its BW; every other backward is BI followed by BW. DualPipe overlaps the F&B
// pairs of steps 4 and 5: with pairs each is a group (the forward with the backward's BI), else
// adjacent ops run back to back.
void dualpipev(RankOrder& o, int r, int p, int m) {
  int nf[2] = {0, 0}, nb[2] = {0, 0};  // next microbatch per chunk: forwards, backwards
  std::deque<std::pair<int, int>> wq;  // (microbatch, chunk) whose BW is deferred, FIFO
  auto F = [&](int c) { o.f(nf[c]++, c); };
  auto B = [&](int c, bool zb) {
    const int mb = nb[c]++;
    o.bi(mb, c);
    if (zb) wq.emplace_back(mb, c);
    else o.bw(mb, c);
  };
  auto W = [&] {
    o.bw(wq.front().first, wq.front().second);
    wq.pop_front();
  };
  for (int i = 0; i < 2 * (p - r - 1); ++i) F(0);  // 1: nF0
  for (int i = 0; i < r + 1; ++i) F(0), F(1);      // 2: nF0F1
  for (int i = 0; i < p - r - 1; ++i) {            // 3: nB1W1F1 (zero bubble)
    B(1, true);
    W();
    F(1);
  }
  for (int i = 0; i < m - 2 * p + r + 1; ++i) {  // 4 (main): nF0B1F1B0, two F&B pairs
    F(0), o.pair(), B(1, false);
    F(1), o.pair(), B(0, false);
  }
  for (int i = 0; i < p - r - 1; ++i) {  // 5: nB1F1B0
    B(1, false);
    F(1), o.pair(), B(0, false);
  }
  const int n6 = r + 1;  // 6: nB1B0, the second half zero bubble
  bool zb = false;
  for (int i = 0; i < n6; ++i) {
    if (i == n6 / 2 && r % 2 == 1) zb = true;
    B(1, zb);
    if (i == n6 / 2 && r % 2 == 0) zb = true;
    B(0, zb);
  }
  for (int i = 0; i < p - r - 1; ++i) W(), B(0, true);  // 7: nWB0 (zero bubble)
  for (int i = 0; i < r + 1; ++i) W();                  // 8: nW
  if (!wq.empty()) throw std::logic_error("dualpipev: weight halves left over on rank " + std::to_string(r));
}

std::string counts(int m, int p) {
  return "(got " + std::to_string(m) + " microbatches for " + std::to_string(p) + " ranks)";
}

}  // namespace

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"gpipe", "1f1b", "interleaved", "zbh1", "dualpipev"};
  return names;
}

std::optional<ScheduleProblem> schedule_problem(ScheduleKind kind, int p, int v, int m, bool split, bool pairs) {
  const std::string name = schedule_name(kind), got_v = "(got " + std::to_string(v) + ")";
  auto problem = [](const char* key, const std::string& message) {
    return std::optional<ScheduleProblem>(ScheduleProblem{std::string("parallel.") + key, message});
  };
  if (p < 1) return problem("pp", name + " needs at least 1 pipeline rank (got " + std::to_string(p) + ")");
  if (m < 1) return problem("microbatches", name + " needs at least 1 microbatch (got " + std::to_string(m) + ")");
  // Pairs. DualPipeV's V sends a chunk-0 forward and a chunk-1 backward the same way down the
  // pipeline. Elsewhere forwards flow down and backwards up: a rank running F(i+1) interleaved with
  // B(i) sends F(i+1) on only when B(i) is done too, and its neighbours wait for both.
  if (pairs && kind == ScheduleKind::SCHEDULE_GPIPE)
    return problem("pairs", "gpipe runs every forward before every backward: it has no forward/backward pairs");
  if (pairs && p > 1 && kind != ScheduleKind::SCHEDULE_DUALPIPEV)
    return problem("pairs", name + " pairs F(i+1) with B(i) only without pipeline parallelism (pp 1, got " +
                                std::to_string(p) + "): across ranks its forwards flow down and its backwards up, so "
                                "a pair would hold each rank's forward output until its backward is done; pair with "
                                "dualpipev, whose V layout sends both the same way");
  switch (kind) {
    case ScheduleKind::SCHEDULE_INTERLEAVED:
      if (v < 2)
        return problem("virtual_stages", "interleaved needs virtual_stages >= 2 model chunks per rank " + got_v +
                                             "; with one chunk use 1f1b");
      if (m % p != 0)
        return problem("microbatches", "interleaved needs microbatches divisible by pipeline ranks " + counts(m, p));
      return std::nullopt;
    case ScheduleKind::SCHEDULE_DUALPIPEV:
      if (v != 1 && v != 2)
        return problem("virtual_stages",
                       "dualpipev holds exactly 2 model chunks per rank: virtual_stages must be 1 or 2 " + got_v);
      if (!split) return problem("split_backward", "dualpipev needs split_backward (its W passes fill the bubbles)");
      if (m < 2 * p)
        return problem("microbatches", "dualpipev needs microbatches >= 2 x pipeline ranks " + counts(m, p));
      return std::nullopt;
    case ScheduleKind::SCHEDULE_ZBH1:
      if (!split) return problem("split_backward", "zbh1 needs split_backward (its W passes fill the bubbles)");
      [[fallthrough]];
    case ScheduleKind::SCHEDULE_GPIPE:
    case ScheduleKind::SCHEDULE_1F1B:
      if (v != 1)
        return problem("virtual_stages", name + " holds one model chunk per rank: virtual_stages must be 1 " + got_v +
                                             "; interleaved runs several");
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<OrderProblem> order_problem(const std::vector<std::vector<PipeOp>>& ranks, int pp, int chunks,
                                          int microbatches, bool split_backward, const OrderNames& names) {
  if (static_cast<int>(ranks.size()) != pp)
    return OrderProblem{-1, -1, "lists the ops of " + std::to_string(ranks.size()) + " rank(s), but there are " +
                                    std::to_string(pp) + " pipeline ranks (" + names.value("parallel.pp") +
                                    "); give one list per pipeline rank"};
  std::pair<int, int> fused{-1, -1}, half{-1, -1};  // the first fused backward (B), the first backward half (BI, BW)
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    const std::vector<PipeOp>& ops = ranks[static_cast<size_t>(r)];
    const std::string rank = "rank " + std::to_string(r);
    if (ops.empty())
      return OrderProblem{r, -1, rank + " has no ops; list its forwards and backwards of every microbatch"};
    for (int q = 0; q < static_cast<int>(ops.size()); ++q) {
      const PipeOp& op = ops[static_cast<size_t>(q)];
      const std::string runs = rank + " runs " + pipe_op_name(op, chunks > 1 || op.chunk != 0 ? 2 : 1);
      auto problem = [&](const std::string& what) { return OrderProblem{r, q, runs + what}; };
      if (op.microbatch < 0 || op.microbatch >= microbatches)
        return problem(", but there are " + std::to_string(microbatches) + " microbatches (0.." +
                       std::to_string(microbatches - 1) + "; " + names.value("parallel.microbatches") + ")");
      if (op.chunk < 0 || op.chunk >= chunks)
        return problem(", but each rank holds " + std::to_string(chunks) + " model chunk(s) (0.." +
                       std::to_string(chunks - 1) + "; " + names.value("parallel.virtual_stages") + ")");
      for (int j = 0; j < q; ++j)
        if (ops[static_cast<size_t>(j)] == op)
          return problem(" twice (first as " + names.op(r, j) + "); each op runs once per step");
      if (op.pass == Pass::PASS_F) continue;
      const bool is_fused = op.pass == Pass::PASS_B;
      if (!is_fused && op.pass != Pass::PASS_BI && op.pass != Pass::PASS_BW)
        return problem(": an op is a pass F, B, BI or BW");
      std::pair<int, int>& mine = is_fused ? fused : half;
      const std::pair<int, int>& other = is_fused ? half : fused;
      if (mine.first < 0) mine = {r, q};
      if (other.first >= 0)
        return problem(", but " + names.op(other.first, other.second) + " is a " + (is_fused ? "split" : "fused") +
                       " backward; write fused backwards (B) throughout, or split ones (BI and BW)");
      if (is_fused && split_backward)
        return problem(", a fused backward, but " + names.value("parallel.split_backward") +
                       " splits every backward; write BI" + std::to_string(op.microbatch) + " and BW" +
                       std::to_string(op.microbatch) + " instead");
    }
  }
  return std::nullopt;
}

int schedule_chunks(ScheduleKind kind, int virtual_stages) {
  return kind == ScheduleKind::SCHEDULE_INTERLEAVED ? virtual_stages
         : kind == ScheduleKind::SCHEDULE_DUALPIPEV ? 2
                                                     : 1;
}

PipeSchedule make_schedule(ScheduleKind kind, int ranks, int virtual_stages, int microbatches,
                           bool split_backward, bool pairs) {
  if (const std::optional<ScheduleProblem> problem =
          schedule_problem(kind, ranks, virtual_stages, microbatches, split_backward, pairs))
    throw std::invalid_argument(problem->message);
  PipeSchedule s;
  s.kind = kind;
  s.ranks = ranks;
  s.microbatches = microbatches;
  s.chunks = schedule_chunks(kind, virtual_stages);
  s.rank_of_stage = kind == ScheduleKind::SCHEDULE_DUALPIPEV ? v_placement(ranks) : loop_placement(ranks, s.chunks);
  s.ops.resize(static_cast<size_t>(ranks));
  const int p = ranks, m = microbatches;
  for (int r = 0; r < p; ++r) {
    RankOrder o{s.ops[static_cast<size_t>(r)], split_backward, pairs};
    switch (kind) {
      case ScheduleKind::SCHEDULE_GPIPE: gpipe(o, r, p, m); break;
      case ScheduleKind::SCHEDULE_1F1B: one_f_one_b(o, r, p, m); break;
      case ScheduleKind::SCHEDULE_INTERLEAVED: interleaved(o, r, p, s.chunks, m); break;
      case ScheduleKind::SCHEDULE_ZBH1: zbh1(o, r, p, m); break;
      case ScheduleKind::SCHEDULE_DUALPIPEV: dualpipev(o, r, p, m); break;
    }
  }
  return s;
}

}  // namespace piper::ir
