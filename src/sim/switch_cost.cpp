// switch_cost.cpp — a switch plan priced round by round on the analytic hardware model.
#include "sim/switch_cost.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

namespace piper::sim {

namespace {

double round_seconds(const state::Round& r, const Hardware& hw, int ranks_per_host) {
  double slowest = 0;
  for (const state::Message& m : r.messages) {
    const bool same_host = m.src / ranks_per_host == m.dst / ranks_per_host;
    const Link& link = link_for(hw, 2, same_host ? NodeSpan::SPAN_INTRA_NODE : NodeSpan::SPAN_INTER_NODE);
    slowest = std::max(slowest, comm_seconds(CommOp::COMM_P2P, 2,
                                             static_cast<double>(m.count * state::kStateElemBytes), link));
  }
  return slowest;
}

// The step's copies on its busiest process: each element read and written once. A local copy's
// process is its destination rank's (one rank of a layout to a process).
double copy_seconds(const state::BlockStep& s, const state::SwitchPlan& plan, const Hardware& hw) {
  std::map<int, int64_t> elems;  // per destination rank
  for (size_t t : s.local) elems[plan.transfers[t].dst] += state::total(plan.transfers[t].runs);
  double busiest = 0;
  for (const auto& [p, n] : elems) {
    ir::OpWork copy;
    copy.name = "switch copy";
    copy.bytes = 2.0 * static_cast<double>(n * state::kStateElemBytes);
    busiest = std::max(busiest, op_seconds(copy, hw));
  }
  return busiest;
}

}  // namespace

SwitchTime switch_time(const state::SwitchPlan& plan, const Hardware& hw, int ranks_per_host) {
  if (ranks_per_host < 1)
    throw std::invalid_argument("switch_time: ranks_per_host " + std::to_string(ranks_per_host) +
                                "; a host holds at least 1 process");
  SwitchTime t;
  for (const state::BlockStep& s : plan.steps) {
    for (const state::Round& r : s.rounds) t.network_s += round_seconds(r, hw, ranks_per_host);
    t.rounds += s.rounds.size();
    t.local_s += copy_seconds(s, plan, hw);
  }
  return t;
}

double switch_seconds(const state::SwitchPlan& plan, const Hardware& hw, int ranks_per_host) {
  return switch_time(plan, hw, ranks_per_host).seconds();
}

}  // namespace piper::sim
