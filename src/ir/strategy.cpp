// strategy.cpp — the `parallel:` shorthand expanded into directives.
#include "ir/strategy.hpp"

#include <algorithm>
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
  const auto& p = cfg.parallel;
  Strategy s;
  s.world_size = world_size;
  s.split.microbatches = static_cast<int>(p.microbatches);
  s.order.schedule = parse_schedule(p.schedule);
  // Zero-bubble schedules need the backward split into its two halves.
  s.split_backward = p.split_backward || s.order.schedule == ScheduleKind::SCHEDULE_ZBH1 ||
                     s.order.schedule == ScheduleKind::SCHEDULE_DUALPIPEV;
  s.place.pp = static_cast<int>(p.pp);
  s.place.virtual_stages = s.order.schedule == ScheduleKind::SCHEDULE_DUALPIPEV ? 2
                                                                               : static_cast<int>(p.virtual_stages);
  s.replicate.dp = static_cast<int>(p.dp);
  s.replicate.zero = static_cast<int>(p.zero);
  s.shard.tp = static_cast<int>(p.tp);
  s.activation_bytes = cfg.train.global_batch / std::max<int64_t>(1, p.dp * p.microbatches) *
                       cfg.train.seq_len * cfg.model.d_model * static_cast<int64_t>(sizeof(float));
  return s;
}

std::string directives_yaml(const Strategy& s) {
  std::ostringstream o;
  o << "directives:\n";
  o << "  - split: {microbatches: " << s.split.microbatches << "}\n";
  if (s.split_backward) o << "  - split_backward: true\n";
  o << "  - place: {pp: " << s.place.pp << ", virtual_stages: " << s.place.virtual_stages;
  if (!s.place.stage_of_unit.empty()) {
    o << ", stage_of_unit: [";
    for (size_t i = 0; i < s.place.stage_of_unit.size(); ++i) o << (i ? ", " : "") << s.place.stage_of_unit[i];
    o << "]";
  }
  o << "}\n";
  o << "  - replicate: {dp: " << s.replicate.dp << ", shard_grads: " << (s.replicate.zero >= 2 ? "true" : "false")
    << ", shard_params: " << (s.replicate.zero >= 3 ? "true" : "false")
    << ", shard_optimizer: " << (s.replicate.zero >= 1 ? "true" : "false")
    << ", bucket_mb: " << static_cast<double>(s.replicate.bucket_bytes) / (1 << 20) << "}\n";
  o << "  - shard: {tp: " << s.shard.tp << "}\n";
  o << "  - order: {schedule: " << schedule_name(s.order.schedule) << "}\n";
  o << "  - grid: {order: " << s.grid_order << "}\n";
  return o.str();
}

}  // namespace piper::ir
