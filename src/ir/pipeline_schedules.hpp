// pipeline_schedules.hpp — every pipeline schedule as a small function that emits, per pipeline rank,
// the order of (pass, microbatch, model chunk) operations. Pure: no MPI, no I/O.
//
// A schedule only orders work; the DAG builder expands each op over the units of the stage that
// (rank, chunk) holds (PipeSchedule::stage_of) and chains them with ordering edges.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.hpp"
#include "ir/strategy.hpp"

namespace piper::ir {

// One operation of a pipeline rank: a pass over one model chunk for one microbatch.
struct PipeOp {
  Pass pass = Pass::PASS_F;  // PASS_F, PASS_B (fused backward), PASS_BI (input grads), PASS_BW (weight grads)
  int microbatch = 0;
  int chunk = 0;             // model chunk of the rank (0 .. chunks-1), not the global stage
  bool operator==(const PipeOp&) const = default;
};

// How global stages (model chunks 0 .. ranks*chunks-1, in model order) sit on ranks.
enum class StageLayout : uint8_t {
  STAGE_LAYOUT_LOOP,  // chunk c of rank r holds stage c*ranks + r (1 chunk: stage = rank; Megatron interleaving)
  STAGE_LAYOUT_V,     // 2 chunks: chunk 0 holds stage r (going down), chunk 1 stage 2*ranks-1-r (coming back up)
};

struct PipeSchedule {
  ScheduleKind kind = ScheduleKind::SCHEDULE_1F1B;
  StageLayout layout = StageLayout::STAGE_LAYOUT_LOOP;
  int ranks = 1;         // pipeline ranks (pp)
  int chunks = 1;        // model chunks per rank: 1 for gpipe/1f1b/zbh1, v for interleaved, 2 for dualpipev
  int microbatches = 1;
  std::vector<std::vector<PipeOp>> ops;  // ops[r]: rank r's order

  int stages() const { return ranks * chunks; }
  int stage_of(int rank, int chunk) const;  // global stage that (rank, chunk) holds
  int rank_of(int stage) const;             // the rank holding a global stage
  int chunk_of(int stage) const;            // which of that rank's chunks it is
};

// Builds the schedule `kind` for `ranks` pipeline ranks. `virtual_stages` is the interleaved
// schedule's chunks per rank (>= 2); every other schedule needs 1 (dualpipev also accepts 2, its
// fixed chunk count). With split_backward each backward is BI + BW; gpipe, 1f1b and interleaved then
// run BW right after its BI, zbh1 and dualpipev (which need it) defer BW to fill bubbles.
// Throws std::invalid_argument naming the violated constraint and the values, e.g.
// "dualpipev needs microbatches >= 2 x pipeline ranks (got 3 microbatches for 2 ranks)".
PipeSchedule make_schedule(ScheduleKind kind, int ranks, int virtual_stages, int microbatches,
                           bool split_backward);

// "F3" / "BI3.1": an op as schedules print it (".chunk" only when ranks hold several chunks).
std::string pipe_op_name(const PipeOp& op, int chunks);

}  // namespace piper::ir
