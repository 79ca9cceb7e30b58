// strategy.cpp — the `parallel:` shorthand expanded into directives.
#include "ir/strategy.hpp"

#include <sstream>
#include <stdexcept>

namespace piper::ir {

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::SCHEDULE_GPIPE;
  if (name == "1f1b") return ScheduleKind::SCHEDULE_1F1B;
  if (name == "interleaved") return ScheduleKind::SCHEDULE_INTERLEAVED;
  if (name == "zbh1") return ScheduleKind::SCHEDULE_ZBH1;
  if (name == "dualpipev") return ScheduleKind::SCHEDULE_DUALPIPEV;
  throw std::invalid_argument("unknown schedule '" + name +
                              "' (expected gpipe, 1f1b, interleaved, zbh1 or dualpipev)");
}

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::SCHEDULE_GPIPE: return "gpipe";
    case ScheduleKind::SCHEDULE_1F1B: return "1f1b";
    case ScheduleKind::SCHEDULE_INTERLEAVED: return "interleaved";
    case ScheduleKind::SCHEDULE_ZBH1: return "zbh1";
    case ScheduleKind::SCHEDULE_DUALPIPEV: return "dualpipev";
  }
  return "?";
}

Strategy expand(const config::Config& cfg, int world_size) {
  Strategy s;
  s.world_size = world_size;
  s.split.microbatches = static_cast<int>(cfg.parallel.microbatches);
  s.order.schedule = parse_schedule(cfg.parallel.schedule);
  // Zero-bubble schedules need the backward split into its two halves.
  s.split_backward = cfg.parallel.split_backward ||
                     s.order.schedule == ScheduleKind::SCHEDULE_ZBH1 ||
                     s.order.schedule == ScheduleKind::SCHEDULE_DUALPIPEV;
  return s;
}

std::string directives_yaml(const Strategy& s) {
  std::ostringstream o;
  o << "directives:\n";
  o << "  - split: {microbatches: " << s.split.microbatches << "}\n";
  if (s.split_backward) o << "  - split_backward: true\n";
  o << "  - place: {stages: " << (s.place.rank_of_stage.empty() ? 1 : s.place.rank_of_stage.size())
    << ", ranks: [";
  for (size_t i = 0; i < s.place.rank_of_stage.size(); ++i)
    o << (i ? ", " : "") << s.place.rank_of_stage[i];
  if (s.place.rank_of_stage.empty()) o << "0";
  o << "]}\n";
  o << "  - order: {schedule: " << schedule_name(s.order.schedule) << "}\n";
  return o.str();
}

}  // namespace piper::ir
