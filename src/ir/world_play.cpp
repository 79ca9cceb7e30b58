// world_play.cpp — all ranks' players, matched by tag and by group.
#include "ir/world_play.hpp"

#include <algorithm>
#include <stdexcept>

namespace piper::ir {

namespace {

// The slot of a collective's group in WorldPlay's tables: dp, tp, world, ep.
size_t slot(GroupDim g) {
  switch (g) {
    case GroupDim::GROUP_DP: return 0;
    case GroupDim::GROUP_TP: return 1;
    case GroupDim::GROUP_WORLD: return 2;
    case GroupDim::GROUP_EP: return 3;
    case GroupDim::GROUP_NONE: break;
  }
  throw std::logic_error("a collective without a group");
}

constexpr size_t kNone = static_cast<size_t>(-1);

// What the sides of a communication instruction share: the node of a collective, the SEND of a message.
int key(const Instr& c) { return is_p2p(c.kind) ? c.tag : c.node; }

}  // namespace

std::vector<int> group_members(const ParallelDims& dims, int rank, GroupDim g) {
  switch (slot(g)) {
    case 0: return dims.group(rank, Axis::DP);
    case 1: return dims.group(rank, Axis::TP);
    case 3: return dims.group(rank, Axis::EP);
    default: break;
  }
  std::vector<int> all(static_cast<size_t>(dims.world_size()));
  for (int r = 0; r < dims.world_size(); ++r) all[static_cast<size_t>(r)] = r;
  return all;
}

WorldPlay::WorldPlay(const std::vector<Program>& programs, const ParallelDims& dims)
    : programs_(programs), group_of_(kCollectiveGroups.size()) {
  const int world = static_cast<int>(programs.size());
  if (world != dims.world_size())
    throw std::logic_error(std::to_string(world) + " programs for a world of " + std::to_string(dims.world_size()));
  // Each group once (a group of n ranks is n ints, not n^2): the first member lists it.
  for (GroupDim g : kCollectiveGroups) {
    auto& of = group_of_[slot(g)];
    of.assign(static_cast<size_t>(world), 0);
    for (int r = 0; r < world; ++r) {
      std::vector<int> m = group_members(dims, r, g);
      if (m.front() != r) continue;
      for (int x : m) of[static_cast<size_t>(x)] = groups_.size();
      groups_.push_back(std::move(m));
    }
  }
  int nodes = 0;
  recv_of_send_.resize(programs.size());
  for (const Program& p : programs) {
    players_.push_back(std::make_unique<Player>(p));
    issued_.emplace_back(p.comm.size(), 0);
    for (size_t k = 0; k < p.comm.size(); ++k) {
      nodes = std::max(nodes, p.comm[k].node + 1);
      if (p.comm[k].kind == NodeKind::RECV) recv_of_send_[static_cast<size_t>(p.rank)][p.comm[k].tag] = k;
    }
  }
  issued_members_.assign(static_cast<size_t>(nodes), 0);
  finished_.assign(programs.size(), 0);
  queued_.assign(programs.size(), 0);
  waits_for_.assign(programs.size(), -1);
}

const std::vector<int>& WorldPlay::members(int r, GroupDim g) const {
  return groups_[group_of_[slot(g)][static_cast<size_t>(r)]];
}

std::vector<Side> WorldPlay::sides(int r, size_t k, int* missing) const {
  const Instr& c = program(r).comm[k];
  std::vector<Side> out{{r, k}};
  if (missing) *missing = 0;
  if (is_p2p(c.kind)) {
    const int pk = c.kind == NodeKind::RECV ? player(c.peer).comm_index(c.tag) : [&] {
      const auto& m = recv_of_send_[static_cast<size_t>(c.peer)];
      auto it = m.find(c.tag);
      return it == m.end() ? -1 : static_cast<int>(it->second);
    }();
    if (pk >= 0) out.push_back({c.peer, static_cast<size_t>(pk)});
    else if (missing) *missing = 1;
    return out;
  }
  for (int m : members(r, c.group)) {
    if (m == r) continue;
    const int mk = player(m).comm_index(c.node);
    if (mk >= 0) out.push_back({m, static_cast<size_t>(mk)});
    else if (missing) ++*missing;
  }
  return out;
}

void WorldPlay::issue(int r, size_t k) {
  issued_[static_cast<size_t>(r)][k] = 1;
  const Instr& c = program(r).comm[k];
  ++issued_members_[static_cast<size_t>(c.node)];
  // Only a side waiting for this very operation can move now.
  auto wake = [&](int m) {
    if (m == r || waits_for_[static_cast<size_t>(m)] != key(c) || queued_[static_cast<size_t>(m)]) return;
    queued_[static_cast<size_t>(m)] = 1;
    queue_.push_back(m);
  };
  if (is_p2p(c.kind)) wake(c.peer);
  else
    for (int m : members(r, c.group)) wake(m);
}

bool WorldPlay::matched(int r, size_t k) const {
  const Instr& c = program(r).comm[k];
  if (!issued(r, k)) return false;
  // Members issue one by one; only once as many have as the group holds is it walked.
  if (!is_p2p(c.kind) && issued_members_[static_cast<size_t>(c.node)] < static_cast<int>(members(r, c.group).size()))
    return false;
  int missing = 0;
  const std::vector<Side> all = sides(r, k, &missing);
  if (missing) return false;
  return std::all_of(all.begin(), all.end(), [&](const Side& s) { return issued(s.rank, s.k); });
}

std::vector<int> WorldPlay::play(const std::vector<PlayHost*>& hosts) {
  queue_.clear();
  for (int r = 0; r < world(); ++r) {
    player(r).start();
    std::fill(issued_[static_cast<size_t>(r)].begin(), issued_[static_cast<size_t>(r)].end(), 0);
    finished_[static_cast<size_t>(r)] = 0;
    waits_for_[static_cast<size_t>(r)] = -1;
    queued_[static_cast<size_t>(r)] = 1;
    queue_.push_back(r);
  }
  std::fill(issued_members_.begin(), issued_members_.end(), 0);
  // In turns: a rank moves again once another issues the operation it waits for.
  for (size_t head = 0; head < queue_.size(); ++head) {
    const int r = queue_[head];
    queued_[static_cast<size_t>(r)] = 0;
    if (player(r).advance(*hosts[static_cast<size_t>(r)]).finished) {
      finished_[static_cast<size_t>(r)] = 1;
      waits_for_[static_cast<size_t>(r)] = -1;
    } else {
      const size_t k = waiting_for(r);
      waits_for_[static_cast<size_t>(r)] = k == kNone ? -1 : key(program(r).comm[k]);
    }
  }
  std::vector<int> left;
  for (int r = 0; r < world(); ++r)
    if (!finished_[static_cast<size_t>(r)]) left.push_back(r);
  return left;
}

namespace {

// A host of the abstract clock: running takes no time, and a communication completes once matched.
class AbstractHost final : public PlayHost {
 public:
  AbstractHost(WorldPlay& w, int rank) : w_(w), rank_(rank) {}
  void issue(size_t k) override { w_.issue(rank_, k); }
  bool complete(size_t k) override { return w_.matched(rank_, k); }
  void run(size_t) override {}

 private:
  WorldPlay& w_;
  int rank_;
};

}  // namespace

std::vector<int> WorldPlay::play_abstract() {
  std::vector<AbstractHost> hosts;
  hosts.reserve(static_cast<size_t>(world()));
  std::vector<PlayHost*> of;
  for (int r = 0; r < world(); ++r) of.push_back(&hosts.emplace_back(*this, r));
  return play(of);
}

size_t WorldPlay::waiting_for(int r) const {
  const Player& p = player(r);
  const Program& prog = program(r);
  if (p.pc() < prog.compute.size()) {
    for (int w : prog.compute[p.pc()].waits) {
      const int k = p.comm_index(w);
      if (k >= 0 && !p.completed(static_cast<size_t>(k))) return static_cast<size_t>(k);
    }
    return kNone;
  }
  for (size_t k = 0; k < prog.comm.size(); ++k)
    if (!p.completed(k)) return k;
  return kNone;
}

// "at FWD layers.2 mb0 (...) waiting for RECV layers.1 mb0 (...)" or "draining, waiting for ...".
std::string WorldPlay::stand(int r, const Graph& g, const std::vector<std::string>& names) const {
  const Player& p = player(r);
  const Program& prog = program(r);
  std::string s = p.pc() < prog.compute.size() ? "at " + describe_at(g, prog.compute[p.pc()].node, names)
                                               : std::string("after its last compute instruction");
  const size_t k = waiting_for(r);
  if (k == kNone) return s;
  return s + ", waiting for " + describe_at(g, prog.comm[k].node, names);
}

std::string WorldPlay::stuck(int r, const Graph& g, const std::vector<std::string>& names) const {
  std::string s = "rank " + std::to_string(r) + " stops " + stand(r, g, names);
  const size_t k = waiting_for(r);
  if (k == kNone) return s;
  int missing = 0;
  const std::vector<Side> all = sides(r, k, &missing);
  std::string waits;
  for (const Side& o : all) {
    if (o.rank == r || issued(o.rank, o.k)) continue;
    waits += "\n    " + describe_at(g, program(o.rank).comm[o.k].node, names) + " on rank " + std::to_string(o.rank) +
             ", not issued: rank " + std::to_string(o.rank) + " stops " + stand(o.rank, g, names);
  }
  if (missing) waits += "\n    " + std::to_string(missing) + " member(s) of its group that never issue it";
  return waits.empty() ? s : s + "; it waits on:" + waits;
}

}  // namespace piper::ir
