// pipeline_play.cpp — plays a PipeSchedule as a timeline (free communication, ranks in order) and
// draws it as ASCII rows.
#include "ir/pipeline_play.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace piper::ir {

double PassCosts::of(Pass p) const {
  switch (p) {
    case Pass::PASS_F: return f;
    case Pass::PASS_B: return b;
    case Pass::PASS_BI: return bi;
    case Pass::PASS_BW: return bw;
    default: throw std::invalid_argument(std::string("no pipeline cost for pass ") + pass_name(p));
  }
}

namespace {

constexpr int kPasses = 4;  // F, B, BI, BW: the slots of Done
constexpr double kNotDone = -1;

int pass_slot(Pass p) {
  switch (p) {
    case Pass::PASS_F: return 0;
    case Pass::PASS_B: return 1;
    case Pass::PASS_BI: return 2;
    case Pass::PASS_BW: return 3;
    default: return -1;
  }
}

// End times of played ops by (pass, stage, microbatch); kNotDone until played.
struct Done {
  int stages, mbs;
  std::vector<double> end;
  Done(int s, int m) : stages(s), mbs(m), end(static_cast<size_t>(kPasses * s * m), kNotDone) {}
  double& at(Pass p, int stage, int mb) {
    return end[static_cast<size_t>((pass_slot(p) * stages + stage) * mbs + mb)];
  }
  // The input gradient of (stage, mb): whichever of B and BI produced it.
  double grad(int stage, int mb) { return std::max(at(Pass::PASS_B, stage, mb), at(Pass::PASS_BI, stage, mb)); }
};

// When an op may start as far as its inputs go; kNotDone while one is missing.
double inputs_ready(Done& d, Pass pass, int stage, int mb) {
  double t = 0;
  auto need = [&](double end) { t = (end == kNotDone || t == kNotDone) ? kNotDone : std::max(t, end); };
  switch (pass) {
    case Pass::PASS_F:
      if (stage > 0) need(d.at(Pass::PASS_F, stage - 1, mb));
      break;
    case Pass::PASS_B:
    case Pass::PASS_BI:
      need(d.at(Pass::PASS_F, stage, mb));
      if (stage + 1 < d.stages) need(d.grad(stage + 1, mb));
      break;
    default:  // PASS_BW
      need(d.at(Pass::PASS_BI, stage, mb));
      break;
  }
  return t;
}

std::string op_at(const PipeSchedule& s, int r, size_t i) {
  const PipeOp& op = s.ops[static_cast<size_t>(r)][i];
  return "rank " + std::to_string(r) + " op " + std::to_string(i) + " (" + pipe_op_name(op, s.chunks) + ")";
}

// Every op names a pass the player knows, a microbatch and chunk in range, and appears once.
void check_ops(const PipeSchedule& s) {
  if (s.ranks < 1 || s.chunks < 1 || s.microbatches < 1 || static_cast<int>(s.ops.size()) != s.ranks)
    throw std::invalid_argument("play: a schedule needs ranks, chunks, microbatches >= 1 and one op list per rank");
  if (const std::string problem = placement_problem(s.rank_of_stage, s.ranks); !problem.empty())
    throw std::invalid_argument("play: " + problem);
  if (s.stages() != s.ranks * s.chunks)
    throw std::invalid_argument("play: " + std::to_string(s.stages()) + " stages are not " + std::to_string(s.chunks) +
                                " chunks on each of " + std::to_string(s.ranks) + " ranks");
  Done seen(s.stages(), s.microbatches);
  for (int r = 0; r < s.ranks; ++r)
    for (size_t i = 0; i < s.ops[static_cast<size_t>(r)].size(); ++i) {
      const PipeOp& op = s.ops[static_cast<size_t>(r)][i];
      if (pass_slot(op.pass) < 0 || op.microbatch < 0 || op.microbatch >= s.microbatches || op.chunk < 0 ||
          op.chunk >= s.chunks)
        throw std::invalid_argument("play: " + op_at(s, r, i) + " is outside the schedule's " +
                                    std::to_string(s.microbatches) + " microbatches, " + std::to_string(s.chunks) +
                                    " chunks and passes F, B, BI, BW");
      if (!op.whole())
        throw std::invalid_argument("play: " + op_at(s, r, i) +
                                    " covers part of a stage; this timeline plays whole stages (the simulator plays units)");
      double& e = seen.at(op.pass, s.stage_of(r, op.chunk), op.microbatch);
      if (e != kNotDone) throw std::invalid_argument("play: " + op_at(s, r, i) + " is listed twice");
      e = 0;
    }
}

}  // namespace

PlayResult play(const PipeSchedule& s, const PassCosts& costs) {
  check_ops(s);
  const size_t R = static_cast<size_t>(s.ranks);
  PlayResult res;
  res.timeline.resize(R);
  res.busy.assign(R, 0);
  res.peak_alive.assign(R, 0);
  Done done(s.stages(), s.microbatches);
  std::vector<size_t> next(R, 0);
  std::vector<double> free_at(R, 0);
  std::vector<int> alive(R, 0);
  size_t left = 0;
  for (const auto& v : s.ops) left += v.size();
  // Play every rank as far as its inputs allow; start times depend only on end times already
  // known, so the sweep order does not change the result.
  while (left > 0) {
    bool progress = false;
    for (size_t r = 0; r < R; ++r) {
      const auto& ops = s.ops[r];
      while (next[r] < ops.size()) {
        const PipeOp& op = ops[next[r]];
        const int stage = s.stage_of(static_cast<int>(r), op.chunk);
        const double ready = inputs_ready(done, op.pass, stage, op.microbatch);
        if (ready == kNotDone) break;
        const double start = std::max(free_at[r], ready), end = start + costs.of(op.pass);
        done.at(op.pass, stage, op.microbatch) = end;
        free_at[r] = end;
        res.busy[r] += end - start;
        res.timeline[r].push_back({op, stage, start, end});
        res.makespan = std::max(res.makespan, end);
        if (op.pass == Pass::PASS_F) res.peak_alive[r] = std::max(res.peak_alive[r], ++alive[r]);
        if (op.pass == Pass::PASS_B || op.pass == Pass::PASS_BW) --alive[r];
        ++next[r], --left, progress = true;
      }
    }
    if (!progress) {
      std::string msg = "pipeline order deadlocks; first blocked op of each rank:";
      for (size_t r = 0; r < R; ++r) {
        const int rank = static_cast<int>(r);
        if (next[r] == s.ops[r].size()) {
          msg.append(" rank ").append(std::to_string(r)).append(" done;");
          continue;
        }
        const int stage = s.stage_of(rank, s.ops[r][next[r]].chunk);
        msg.append(" ").append(op_at(s, rank, next[r]));
        msg.append(" on stage ").append(std::to_string(stage)).append(";");
      }
      msg.pop_back();
      throw std::logic_error(msg);
    }
  }
  double total = 0;
  for (double b : res.busy) total += b;
  res.bubble = res.makespan > 0 ? 1 - total / (static_cast<double>(R) * res.makespan) : 0;
  return res;
}

std::string render(const PipeSchedule& s, const PassCosts& costs) {
  const PlayResult res = play(s, costs);
  // The papers' letters: F, B (fused backward or its input half), W (weight half). With two chunks
  // per rank the second is lower case (the papers' second colour); with more, ".c" names the chunk.
  auto label = [&](const PipeOp& op) {
    std::string l = op.pass == Pass::PASS_BW ? "W" : op.pass == Pass::PASS_F ? "F" : "B";
    if (s.chunks == 2 && op.chunk == 1) l[0] = static_cast<char>(l[0] - 'A' + 'a');
    l += std::to_string(op.microbatch);
    if (s.chunks > 2) l.append(".").append(std::to_string(op.chunk));
    return l;
  };
  // Scale: chars per time unit, so the cheapest op's box fits the widest label and its '|'.
  size_t widest = 1;
  double cheapest = 0;
  for (const auto& row : res.timeline)
    for (const PlayedOp& p : row) {
      widest = std::max(widest, label(p.op).size() + 1);
      const double d = p.end - p.start;
      if (d > 0 && (cheapest == 0 || d < cheapest)) cheapest = d;
    }
  const double scale = cheapest > 0 ? static_cast<double>(widest) / cheapest : 1;
  auto col = [&](double t) { return static_cast<size_t>(std::llround(t * scale)); };
  std::string out;
  const std::string width = std::to_string(s.ranks - 1);
  for (size_t r = 0; r < res.timeline.size(); ++r) {
    std::string row = "r";
    row.append(std::to_string(r)).resize(width.size() + 1, ' ');
    row += " |";
    const size_t origin = row.size();
    for (const PlayedOp& p : res.timeline[r]) {
      const size_t from = origin + col(p.start), to = origin + col(p.end);
      if (row.size() < from) row.resize(from, '.');
      std::string box = label(p.op);
      box.resize(to > from + 1 ? to - from - 1 : 0, ' ');
      row += box + "|";
    }
    out += row + "\n";
  }
  return out;
}

}  // namespace piper::ir
