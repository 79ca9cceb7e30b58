// schedule.cpp — the schedules, each readable against its paper's figure.
#include "ir/schedule.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace piper::ir {

namespace {

// A backward: fused, or its input half followed at once by its weight half.
void push_backward(std::vector<StageOp>& ops, int mb, bool split_backward) {
  if (!split_backward) {
    ops.push_back({Pass::PASS_B, mb});
  } else {
    ops.push_back({Pass::PASS_BI, mb});
    ops.push_back({Pass::PASS_BW, mb});
  }
}

// GPipe (Huang et al. 2019): every forward, then every backward.
std::vector<StageOp> gpipe(int /*stage*/, int /*stages*/, int m, bool split) {
  std::vector<StageOp> ops;
  for (int i = 0; i < m; ++i) ops.push_back({Pass::PASS_F, i});
  for (int i = 0; i < m; ++i) push_backward(ops, i, split);
  return ops;
}

// 1F1B (PipeDream-Flush, Narayanan et al. 2021): stage s runs S - s - 1
// warm-up forwards, then alternates one forward and one backward, then
// drains the remaining backwards. With one stage this is plain gradient
// accumulation: F0 B0 F1 B1 ...
std::vector<StageOp> one_f_one_b(int stage, int stages, int m, bool split) {
  std::vector<StageOp> ops;
  const int warmup = std::min(stages - stage - 1, m);
  int f = 0, b = 0;
  for (; f < warmup; ++f) ops.push_back({Pass::PASS_F, f});
  while (f < m) {  // steady state: 1F then 1B
    ops.push_back({Pass::PASS_F, f++});
    push_backward(ops, b++, split);
  }
  while (b < m) push_backward(ops, b++, split);  // cool-down
  return ops;
}

}  // namespace

std::vector<std::vector<StageOp>> schedule_ops(ScheduleKind kind, int stages, int microbatches,
                                               bool split_backward) {
  if (stages < 1 || microbatches < 1)
    throw std::invalid_argument("a schedule needs at least one stage and one microbatch");
  std::vector<std::vector<StageOp>> per_stage(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    switch (kind) {
      case ScheduleKind::SCHEDULE_GPIPE:
        per_stage[static_cast<size_t>(s)] = gpipe(s, stages, microbatches, split_backward);
        break;
      case ScheduleKind::SCHEDULE_1F1B:
        per_stage[static_cast<size_t>(s)] = one_f_one_b(s, stages, microbatches, split_backward);
        break;
      case ScheduleKind::SCHEDULE_INTERLEAVED:
      case ScheduleKind::SCHEDULE_ZBH1:
      case ScheduleKind::SCHEDULE_DUALPIPEV:
        if (stages == 1) {  // with one stage every schedule is gradient accumulation
          per_stage[0] = one_f_one_b(0, 1, microbatches, split_backward);
          break;
        }
        throw std::invalid_argument(std::string("schedule '") + schedule_name(kind) +
                                    "' with " + std::to_string(stages) +
                                    " stages is not available in this build");
    }
  }
  return per_stage;
}

}  // namespace piper::ir
