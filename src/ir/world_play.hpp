// world_play.hpp — every rank's program played together by ir::Player's
// rules: which instructions of other ranks match a communication instruction
// (the partner of a message, every member of a collective's group), whether
// all of them have been issued, and the turns in which ranks advance until
// all finish or none can move. The verifier plays it on an abstract clock,
// the simulator on a cost model.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.hpp"
#include "ir/parallel_dims.hpp"
#include "ir/player.hpp"
#include "ir/program.hpp"

namespace piper::ir {

// The ranks a collective over `g` issued on `rank` runs with, `rank`
// included, ascending: its group along the dp or tp axis of the rank grid,
// or every rank. The executor's communicators and the simulator's groups are
// these.
std::vector<int> group_members(const ParallelDims& dims, int rank, GroupDim g);
// Every group dimension a collective runs over.
inline constexpr std::array<GroupDim, 4> kCollectiveGroups = {GroupDim::GROUP_DP, GroupDim::GROUP_TP,
                                                              GroupDim::GROUP_WORLD, GroupDim::GROUP_EP};

// One side of a communication instruction: a rank and an index into its
// Program::comm.
struct Side {
  int rank = 0;
  size_t k = 0;
};

class WorldPlay {
 public:
  // programs[r] is rank r's (ir::lower); held by reference.
  WorldPlay(const std::vector<Program>& programs, const ParallelDims& dims);

  int world() const { return static_cast<int>(programs_.size()); }
  const Program& program(int r) const { return programs_[static_cast<size_t>(r)]; }
  Player& player(int r) { return *players_[static_cast<size_t>(r)]; }
  const Player& player(int r) const { return *players_[static_cast<size_t>(r)]; }
  // The members of rank r's group over `g` (group_members).
  const std::vector<int>& members(int r, GroupDim g) const;

  // Every side of communication instruction k of rank r, its own first: the
  // two of a message, every member of a collective's group. `missing` counts
  // the members whose programs lack the collective (they never issue it).
  std::vector<Side> sides(int r, size_t k, int* missing = nullptr) const;
  // Hosts call this from PlayHost::issue.
  void issue(int r, size_t k);
  bool issued(int r, size_t k) const { return issued_[static_cast<size_t>(r)][k] != 0; }
  // Every side of (r, k) has issued it: a PlayHost may complete it.
  bool matched(int r, size_t k) const;

  // Starts every player, then advances ranks (hosts[r] drives rank r), each
  // again once another rank issues the operation it waits for, until none
  // can move. Returns the ranks that did not finish, ascending.
  std::vector<int> play(const std::vector<PlayHost*>& hosts);
  // play() on an abstract clock, as the verifier plays: nothing takes time, and a communication
  // completes once every side has issued it.
  std::vector<int> play_abstract();

  // Where unfinished rank r stands, as users read it: the instruction it
  // cannot get past, the communication it waits for and the sides that have
  // not issued theirs, each with where that rank stands.
  std::string stuck(int r, const Graph& g, const std::vector<std::string>& unit_names) const;

 private:
  // The communication instruction rank r waits for (npos once finished).
  size_t waiting_for(int r) const;
  std::string stand(int r, const Graph& g, const std::vector<std::string>& unit_names) const;

  const std::vector<Program>& programs_;
  std::vector<std::unique_ptr<Player>> players_;
  std::vector<std::unordered_map<int, size_t>> recv_of_send_;  // per rank: SEND node -> its RECV's comm index here
  std::vector<std::vector<int>> groups_;         // every dp group, every tp group, the world
  std::vector<std::vector<size_t>> group_of_;    // [dp, tp, world][rank]: index into groups_
  std::vector<std::vector<char>> issued_;        // per rank and comm index
  std::vector<int> issued_members_;              // per graph node: ranks that issued it (all its groups)
  std::vector<char> finished_, queued_;          // per rank
  std::vector<int> waits_for_;                   // per rank: the collective's node or message's SEND it waits for, -1
  std::vector<int> queue_;                       // ranks to advance
};

}  // namespace piper::ir
