// strategy.hpp — directives: the rewrites that turn the model graph into the
// global training DAG. The YAML `parallel:` shorthand and the `directives:`
// section (docs/directives.md) expand into these; `piper plan --directives`
// prints them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "ir/graph.hpp"
#include "ir/model_graph.hpp"
#include "ir/parallel_dims.hpp"

namespace piper::ir {

// ir/pipeline_schedules.hpp, included at the end of this header (it needs
// ScheduleKind from here; OrderDirective holds PipeOps).
struct PipeOp;
struct PipeSchedule;

// split: clone the per-sample sub-DAG once per microbatch (gradient accumulation).
struct SplitDirective {
  int microbatches = 1;
  bool operator==(const SplitDirective&) const = default;
};

// place: which stage holds each unit, and which pipeline rank each stage.
// Empty rank_of_stage = the schedule's own layout (loop, or V for dualpipev).
struct PlaceDirective {
  int pp = 1;                      // pipeline ranks
  int virtual_stages = 1;          // model chunks per pipeline rank
  std::vector<int> stage_of_unit;  // indexed by unit, every unit (expand balances them when no directive says)
  std::vector<int> rank_of_stage;  // indexed by stage: its pipeline rank
  bool operator==(const PlaceDirective&) const = default;
};

// replicate: data parallelism over `dp` replicas, with ZeRO sharding per unit.
struct ReplicateDirective {
  int dp = 1;
  // Indexed by unit, every unit: 0 none, 1 optimiser state, 2 + gradients, 3 + parameters.
  std::vector<int> zero_of_unit;
  int64_t bucket_bytes = 25 << 20;  // gradient all-reduce bucket size
  int zero(int unit) const { return zero_of_unit.at(static_cast<size_t>(unit)); }
  int max_zero() const;             // the highest stage of any unit (0 for none)
  bool operator==(const ReplicateDirective&) const = default;
};

// shard: tensor parallelism over `tp` ranks (Megatron style), and the experts of
// MoE blocks over `ep` ranks carved out of the data-parallel ones (ParallelDims).
struct ShardDirective {
  int tp = 1;
  int ep = 1;
  bool operator==(const ShardDirective&) const = default;
};

enum class ScheduleKind : uint8_t { SCHEDULE_GPIPE, SCHEDULE_1F1B, SCHEDULE_INTERLEAVED,
                                    SCHEDULE_ZBH1, SCHEDULE_DUALPIPEV };

// order: the schedule, emitted as ordering edges per rank. Either a named
// schedule function, or a hand-written order: custom[r] lists pipeline rank
// r's ops, each rank holding `chunks` model chunks (chunk c of rank r is the
// c-th stage place puts on r; the loop layout without place.rank_of_stage). A
// custom order replaces the schedule, and `schedule` is then left at its
// default. The ops of a group (PipeOp::grouped) run interleaved, a segment
// each.
struct OrderDirective {
  ScheduleKind schedule = ScheduleKind::SCHEDULE_1F1B;
  bool pairs = false;                       // the named schedule's F&B pairs are groups
  std::vector<std::vector<PipeOp>> custom;  // empty: `schedule` orders the ops
  int chunks = 1;                           // of a custom order; equals place.virtual_stages
  bool operator==(const OrderDirective&) const = default;
};

struct Strategy {
  int world_size = 1;
  std::string grid_order = "tp-dp-pp";  // rank grid order, first varies fastest
  SplitDirective split;
  // Indexed by unit, every unit: its backward is BWD_I + BWD_W, else one fused BWD.
  std::vector<bool> split_backward_of_unit;
  PlaceDirective place;
  ReplicateDirective replicate;
  ShardDirective shard;
  OrderDirective order;
  // recompute: the recomputation of each unit (none for the embedding and the head); empty: none.
  std::vector<Recompute> recompute;
  Recompute recompute_of(int unit) const {
    return static_cast<size_t>(unit) < recompute.size() ? recompute[static_cast<size_t>(unit)] : Recompute::RECOMPUTE_NONE;
  }
  int64_t microbatch_rows = 0;   // tokens of one microbatch on one data-parallel replica
  // Bytes of an element of what the units compute on and move between ranks (activations, an MoE
  // block's rows, ZeRO-3's gathered parameters): config::storage_bytes of train.precision.
  int64_t compute_elem_bytes = 4;
  int64_t activation_bytes = 0;  // one microbatch's activation between units, per rank
  bool operator==(const Strategy&) const = default;
  bool split_backward(int unit) const { return split_backward_of_unit.at(static_cast<size_t>(unit)); }
  // Whether some unit's backward is split: the schedule then runs BI and BW ops (a BI op runs the
  // fused BWD of a unit whose backward is not split, and its BW op has nothing of that unit).
  bool any_split_backward() const;
  // The degrees and the rank grid of these directives; throws
  // std::invalid_argument when they do not form one (ParallelDims).
  ParallelDims dims() const {
    return ParallelDims(world_size, grid_order, {.tp = shard.tp, .ep = shard.ep, .dp = replicate.dp, .pp = place.pp});
  }
};

// Parses a schedule name ("gpipe", "1f1b", ...); throws std::invalid_argument.
ScheduleKind parse_schedule(const std::string& name);
const char* schedule_name(ScheduleKind k);

// Expands the `parallel:` shorthand of a validated config into directives,
// then applies its `directives:` section in order (config::effective_strategy):
// the stage of every unit (balanced when no place directive gives them), then
// the per-unit backward split, ZeRO stage and recomputation, whose filters may
// name stages.
// Throws config::ConfigError when a filter does not resolve.
Strategy expand(const config::Config& cfg, int world_size);

// The directives as YAML text a user can copy into a config and edit: a
// `directives:` list giving every field, so that it reads back (whatever the
// config's `parallel:` section says) to a Strategy with the same DAG. The
// placement and the order are written out in full: `place: {..., ranks: [...]}`
// and `order: {ranks: [[...], ...]}` with every rank's ops and groups, a named
// schedule too (its name in a comment), so any schedule can be copied and
// edited. The stage of every unit is printed as its stage_of_unit; a backward
// split or a ZeRO stage that differs between units as a directive for most
// units followed by directives with a `unit:` filter for the rest. Throws
// std::invalid_argument when the strategy has no schedule.
std::string directives_yaml(const Strategy& s, const ModelGraph& model);

// The PipeSchedule of the strategy: its named schedule, or its custom order
// (s.order.custom) with s.place.pp ranks, s.order.chunks chunks per rank and
// s.split.microbatches microbatches, placed by s.place.rank_of_stage (the loop
// layout when empty). Throws std::invalid_argument as make_schedule does, and
// when a placement is not one (placement_problem) or a named schedule is given
// a placement other than its own layout.
// Throws std::invalid_argument naming the op and the rank when an op names a
// microbatch or chunk that does not exist, an op repeats, or a backward is of
// the wrong kind (B with split_backward, BI/BW without).
PipeSchedule schedule_of(const Strategy& s);

}  // namespace piper::ir

#include "ir/pipeline_schedules.hpp"  // PipeOp, PipeSchedule: complete wherever a Strategy is used
