// strategy.hpp — directives: the rewrites that turn the model graph into the
// global training DAG. The YAML `parallel:` shorthand expands into these.
#pragma once

#include <string>
#include <vector>

#include "config/config.hpp"

namespace piper::ir {

// split: clone the per-sample sub-DAG once per microbatch (gradient accumulation).
struct SplitDirective {
  int microbatches = 1;
};

// place: which stage holds each unit and which ranks run each stage.
struct PlaceDirective {
  std::vector<int> stage_of_unit;  // indexed by unit; empty = everything on stage 0
  std::vector<int> rank_of_stage;  // indexed by stage; empty = stage s on rank s
};

enum class ScheduleKind : uint8_t { SCHEDULE_GPIPE, SCHEDULE_1F1B, SCHEDULE_INTERLEAVED,
                                    SCHEDULE_ZBH1, SCHEDULE_DUALPIPEV };

// order: the schedule, emitted as ordering edges per rank.
struct OrderDirective {
  ScheduleKind schedule = ScheduleKind::SCHEDULE_1F1B;
};

struct Strategy {
  int world_size = 1;
  SplitDirective split;
  bool split_backward = false;  // BWD -> BWD_I + BWD_W
  PlaceDirective place;
  OrderDirective order;
};

// Parses a schedule name ("gpipe", "1f1b", ...); throws std::invalid_argument.
ScheduleKind parse_schedule(const std::string& name);
const char* schedule_name(ScheduleKind k);

// Expands the `parallel:` shorthand of a validated config into directives.
Strategy expand(const config::Config& cfg, int world_size);

// The directives as YAML text a user can copy into a config and edit.
std::string directives_yaml(const Strategy& s);

}  // namespace piper::ir
