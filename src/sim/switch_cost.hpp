// switch_cost.hpp — the time of an online strategy switch (a state::SwitchPlan) on a cluster
// (docs/switching.md, "Simulated at scale").
#pragma once

#include <cstddef>

#include "sim/hardware.hpp"
#include "state/switch_plan.hpp"

namespace piper::sim {

// The parts of a switch's time. Steps and their rounds run one after another: a round lasts as
// long as its slowest message, a point-to-point transfer (comm_seconds) over the link between its
// two processes (link_for: intra-node within a host, inter-node between hosts; processes numbered
// host by host, ranks_per_host to a host); a step's local copies last as long as the busiest
// process's, read and written at device memory bandwidth (op_seconds).
struct SwitchTime {
  double network_s = 0;
  double local_s = 0;
  size_t rounds = 0;
  double seconds() const { return network_s + local_s; }
};
// Throws std::invalid_argument when ranks_per_host is below 1.
SwitchTime switch_time(const state::SwitchPlan& plan, const Hardware& hw, int ranks_per_host);
double switch_seconds(const state::SwitchPlan& plan, const Hardware& hw, int ranks_per_host);

}  // namespace piper::sim
