// schedule.hpp — pipeline schedules as small functions that emit, per stage,
// the order of (pass, microbatch) operations. The builder turns each list
// into ordering edges over the stage's nodes (the `order` directive).
#pragma once

#include <vector>

#include "ir/graph.hpp"
#include "ir/strategy.hpp"

namespace piper::ir {

// One scheduled operation of a stage: a pass over all its units for one microbatch.
struct StageOp {
  Pass pass = Pass::PASS_F;  // PASS_F, PASS_B (fused), PASS_BI, PASS_BW
  int microbatch = 0;
  bool operator==(const StageOp&) const = default;
};

// Per-stage op lists for `kind` with `stages` stages and `microbatches` microbatches.
// Throws std::invalid_argument naming the constraint a schedule needs.
std::vector<std::vector<StageOp>> schedule_ops(ScheduleKind kind, int stages, int microbatches,
                                               bool split_backward);

}  // namespace piper::ir
