// pipeline_play.hpp — an abstract timeline player for pipeline schedules: per-pass costs, free
// communication, each rank running its ops strictly in order. For tests, docs and the simulator.
#pragma once

#include <string>
#include <vector>

#include "ir/pipeline_schedules.hpp"

namespace piper::ir {

// Time of one op over one model chunk, by pass. Communication is free.
struct PassCosts {
  double f = 1;   // forward
  double b = 2;   // fused backward
  double bi = 1;  // input-gradient half
  double bw = 1;  // weight-gradient half
  double of(Pass p) const;
};

struct PlayedOp {
  PipeOp op;
  int stage = 0;
  double start = 0, end = 0;
};

struct PlayResult {
  std::vector<std::vector<PlayedOp>> timeline;  // [rank]: its ops in order, with start and end
  std::vector<double> busy;                     // [rank]: sum of its op times
  double makespan = 0;                          // end of the last op
  double bubble = 0;                            // 1 - sum(busy) / (ranks * makespan)
  // [rank]: most (microbatch, chunk) activations alive at once; F makes one alive, its B or BW frees it.
  std::vector<int> peak_alive;
};

// Plays the schedule; the ops of a group run back to back (communication is free, so there is
// nothing for them to overlap). An op starts when its rank is free and its inputs are done: F(mb, s) needs
// F(mb, s-1); B or BI(mb, s) needs F(mb, s) and B/BI(mb, s+1) (the last stage only its own F);
// BW(mb, s) needs BI(mb, s). Throws std::invalid_argument for an op outside the schedule's ranges
// or listed twice, and std::logic_error naming each rank's first blocked op when no rank can proceed.
PlayResult play(const PipeSchedule& s, const PassCosts& costs);

// The played timeline, one row per rank, as in the DualPipe and zero-bubble papers' figures:
//   r0 |F0|F1|F2|F3|.........B0|W0|F4|B1|W1|...
// one box per op, closed by '|'; '.' is idle. F forward, B fused backward or its input half, W the
// weight half; with 2 chunks per rank the second chunk's letters are lower case (f, b, w), with more a
// ".c" suffix names the chunk. One time unit is as wide as the cheapest op's widest box.
std::string render(const PipeSchedule& s, const PassCosts& costs);

}  // namespace piper::ir
