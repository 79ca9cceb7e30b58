// pipeline_schedules.hpp — every pipeline schedule as a small function that emits, per pipeline rank,
// the order of (pass, microbatch, model chunk) operations. Pure: no MPI, no I/O.
//
// A schedule only orders work; the DAG builder expands each op over the units of the stage that
// (rank, chunk) holds (PipeSchedule::stage_of) and chains them with ordering edges.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.hpp"
#include "ir/strategy.hpp"

namespace piper::ir {

// One operation of a pipeline rank: a pass over one model chunk (or a range of its units) for one
// microbatch.
struct PipeOp {
  Pass pass = Pass::PASS_F;  // PASS_F, PASS_B (fused backward), PASS_BI (input grads), PASS_BW (weight grads)
  int microbatch = 0;
  int chunk = 0;             // model chunk of the rank (0 .. chunks-1), not the global stage
  // Units first_unit..last_unit of the chunk's stage (model unit indices, inclusive); -1: all of them.
  int first_unit = -1, last_unit = -1;
  // Runs as one group with the op before it: the ops of a group take turns, one segment each, so
  // that each one's communication is in flight while the other computes (DualPipe's overlapped
  // forward/backward pair).
  bool grouped = false;
  bool whole() const { return first_unit < 0; }
  bool operator==(const PipeOp&) const = default;
};

// The stage placements the library schedules use, as PipeSchedule::rank_of_stage lists them.
// Loop: chunk c of rank r holds stage c*ranks + r (1 chunk: stage = rank; Megatron interleaving).
std::vector<int> loop_placement(int ranks, int chunks);
// V (2 chunks): rank r holds stage r going down and stage 2*ranks-1-r coming back up.
std::vector<int> v_placement(int ranks);

struct PipeSchedule {
  ScheduleKind kind = ScheduleKind::SCHEDULE_1F1B;
  int ranks = 1;         // pipeline ranks (pp)
  int chunks = 1;        // model chunks per rank: 1 for gpipe/1f1b/zbh1, v for interleaved, 2 for dualpipev
  int microbatches = 1;
  // [stage]: the pipeline rank holding it; every rank holds `chunks` stages, and chunk c of a rank
  // is the c-th of them in model order.
  std::vector<int> rank_of_stage;
  std::vector<std::vector<PipeOp>> ops;  // ops[r]: rank r's order

  int stages() const { return static_cast<int>(rank_of_stage.size()); }
  int stage_of(int rank, int chunk) const;  // global stage that (rank, chunk) holds
  int rank_of(int stage) const;             // the rank holding a global stage
  int chunk_of(int stage) const;            // which of that rank's chunks it is
};

// The first problem of a stage placement (rank_of_stage[s]: the pipeline rank of stage s) for
// `ranks` pipeline ranks, or "": a rank out of range, a rank without a stage, ranks holding
// different numbers of stages.
std::string placement_problem(const std::vector<int>& rank_of_stage, int ranks);

// The schedule names, in ScheduleKind order: what parse_schedule accepts and schedule_name prints.
const std::vector<std::string>& schedule_names();

// A requirement of a schedule that a strategy breaks: the config key of the value it concerns
// ("parallel.pp", "parallel.virtual_stages", "parallel.microbatches", "parallel.split_backward",
// "parallel.pairs")
// and what is wrong, naming the schedule, the values and what would be right.
struct ScheduleProblem {
  std::string key;
  std::string message;
};

// The first requirement of `kind` that the values break, or nullopt. make_schedule throws the
// same; ir::validate reports it at the key's file position.
std::optional<ScheduleProblem> schedule_problem(ScheduleKind kind, int ranks, int virtual_stages, int microbatches,
                                                bool split_backward, bool pairs);

// The model chunks per rank that schedule `kind` holds: virtual_stages for interleaved, 2 for
// dualpipev, 1 for the others.
int schedule_chunks(ScheduleKind kind, int virtual_stages);

// Builds the schedule `kind` for `ranks` pipeline ranks, placed by the schedule's own layout (loop,
// or V for dualpipev). With `pairs`, forward/backward pairs of different microbatches that the
// schedule runs back to back in its steady phase become groups (PipeOp::grouped): dualpipev's
// F&B pairs of its steps 4 and 5; F(i+1) with B(i) in the steady phase of 1f1b, interleaved and
// zbh1 at pp 1 (where one forward runs ahead to pair with); gpipe has none. `virtual_stages` is the interleaved
// schedule's chunks per rank (>= 2); every other schedule needs 1 (dualpipev also accepts 2, its
// fixed chunk count). With split_backward each backward is BI + BW; gpipe, 1f1b and interleaved then
// run BW right after its BI, zbh1 and dualpipev (which need it) defer BW to fill bubbles.
// Throws std::invalid_argument naming the violated constraint and the values, e.g.
// "dualpipev needs microbatches >= 2 x pipeline ranks (got 3 microbatches for 2 ranks)".
PipeSchedule make_schedule(ScheduleKind kind, int ranks, int virtual_stages, int microbatches,
                           bool split_backward, bool pairs = false);

// "F3" / "BI3.1" / "F3/4-6": an op as schedules print it (".chunk" only when ranks hold several
// chunks, "/first-last" when it covers a range of its stage's units).
std::string pipe_op_name(const PipeOp& op, int chunks);
// One rank's ops as an order lists them: groups in brackets, "F0, [F3, B1], B2".
std::string pipe_ops_text(const std::vector<PipeOp>& ops, int chunks);

// How the rules of a hand-written order name what they speak of: plain words when they guard a
// Strategy (custom_schedule), the config's file positions when ir::validate checks a config.
struct OrderNames {
  std::function<std::string(int rank, int op)> op;           // op `op` of rank `rank`'s list
  std::function<std::string(const std::string& key)> value;  // a strategy value by config key ("parallel.pp")
};

// A rule of a hand-written order that it breaks, at op `op` of rank `rank` (op -1: the rank's
// whole list; rank -1: the whole order).
struct OrderProblem {
  int rank = -1;
  int op = -1;
  std::string message;
};

// The first rule the hand-written order `ranks` breaks against `pp` pipeline ranks, `chunks`
// model chunks per rank and `microbatches`, or nullopt: one list of ops per rank, each naming an
// existing microbatch and chunk, each op once, backwards fused (B) throughout or split (BI, BW)
// throughout, and split when `split_backward` is set.
std::optional<OrderProblem> order_problem(const std::vector<std::vector<PipeOp>>& ranks, int pp, int chunks,
                                          int microbatches, bool split_backward, const OrderNames& names);

}  // namespace piper::ir
