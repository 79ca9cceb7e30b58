// strategy.hpp — directives: the rewrites that turn the model graph into the
// global training DAG. The YAML `parallel:` shorthand expands into these;
// `piper plan --directives` prints them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace piper::ir {

// split: clone the per-sample sub-DAG once per microbatch (gradient accumulation).
struct SplitDirective {
  int microbatches = 1;
};

// place: which stage holds each unit; the schedule's layout puts stages on
// pipeline ranks. Empty stage_of_unit = balance units over the stages by cost.
struct PlaceDirective {
  int pp = 1;                      // pipeline ranks
  int virtual_stages = 1;          // model chunks per pipeline rank
  std::vector<int> stage_of_unit;  // indexed by unit
};

// replicate: data parallelism over `dp` replicas, with ZeRO sharding.
struct ReplicateDirective {
  int dp = 1;
  int zero = 0;                  // 0 none, 1 optimiser state, 2 + gradients, 3 + parameters
  int64_t bucket_bytes = 25 << 20;  // gradient all-reduce bucket size
};

// shard: tensor parallelism over `tp` ranks (Megatron style).
struct ShardDirective {
  int tp = 1;
};

enum class ScheduleKind : uint8_t { SCHEDULE_GPIPE, SCHEDULE_1F1B, SCHEDULE_INTERLEAVED,
                                    SCHEDULE_ZBH1, SCHEDULE_DUALPIPEV };

// order: the schedule, emitted as ordering edges per rank.
struct OrderDirective {
  ScheduleKind schedule = ScheduleKind::SCHEDULE_1F1B;
};

struct Strategy {
  int world_size = 1;
  std::string grid_order = "tp-dp-pp";  // rank grid order, first varies fastest
  SplitDirective split;
  bool split_backward = false;  // BWD -> BWD_I + BWD_W
  PlaceDirective place;
  ReplicateDirective replicate;
  ShardDirective shard;
  OrderDirective order;
  int64_t activation_bytes = 0;  // one microbatch's activation between units, per rank
};

// Parses a schedule name ("gpipe", "1f1b", ...); throws std::invalid_argument.
ScheduleKind parse_schedule(const std::string& name);
const char* schedule_name(ScheduleKind k);

// Expands the `parallel:` shorthand of a validated config into directives.
Strategy expand(const config::Config& cfg, int world_size);

// The directives as YAML text a user can copy into a config and edit.
std::string directives_yaml(const Strategy& s);

}  // namespace piper::ir
