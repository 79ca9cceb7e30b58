// validate.hpp — a config checked against every rule before it is compiled: the config's own
// (config::validate) and those the IR owns, each reported at the file position of the key it
// concerns (config::Positions).
#pragma once

#include "config/config.hpp"

namespace piper::ir {

// Throws config::ConfigError naming the file, line, key and what would be right: first every
// problem of the config's own rules (config::validate); on a config that passes them, the IR's
// rules: the stages of a place directive along the model's units (placement_problems), the
// schedule name (schedule_names), the schedule's requirements (schedule_problem), the rules of a
// hand-written order (order_problem), and the stage count of a placement against the pp x chunks
// per rank the schedule holds. What every command calls before ir::compile.
void validate(const config::Config& cfg, int world_size);

}  // namespace piper::ir
