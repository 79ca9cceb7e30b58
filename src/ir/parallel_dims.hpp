// parallel_dims.hpp — the degrees of parallelism (tp, cp, ep, dp, pp), the
// rank grid order and the world size, validated once here. Process groups,
// coordinates and parameter pieces derive from one ParallelDims, which the
// Strategy gives (Strategy::dims). Pure.
//
// Expert parallelism is carved out of data parallelism (Megatron's layout):
// the dp ranks of a data-parallel group split into dp / ep expert-data-parallel
// groups of ep consecutive dp ranks each. A rank's ep coordinate is its dp
// coordinate mod ep, its expert-data coordinate dp / ep; the ep group holds the
// ranks that differ only in the ep coordinate (they hold different experts),
// the expert-data group those that differ only in the expert-data coordinate
// (they hold the same experts). The grid order may name ep only right before
// dp ("tp-cp-ep-dp-pp", Megatron's), which says the same as leaving it out.
#pragma once

#include <string>
#include <vector>

#include "ir/grid.hpp"

namespace piper::ir {

class ParallelDims {
 public:
  ParallelDims();  // one rank, every degree 1, order "tp-dp-pp"
  // Throws std::invalid_argument, printing every factor, when a degree is
  // below 1, the order names an unknown axis or one twice or misses an axis
  // of degree > 1, the product of the degrees is not the world size, or a
  // degree asks for a kind of parallelism this build does not have (cp > 1),
  // ep does not divide dp, or the order names ep elsewhere than right before dp.
  ParallelDims(int world_size, const std::string& order, const Degrees& degrees);

  int world_size() const { return world_; }
  const std::string& order() const { return order_; }  // as given, e.g. "tp-dp-pp"
  const Degrees& degrees() const { return degrees_; }
  int degree(Axis a) const { return degrees_[a]; }

  int coord(int rank, Axis a) const;
  Coords coords(int rank) const;
  // The rank at c's tp, cp, dp and pp coordinates (c.ep is c.dp mod ep, not read).
  int rank_of(const Coords& c) const;
  // World ranks of the group along `a` that contains `rank`, ascending.
  std::vector<int> group(int rank, Axis a) const;
  // Every group along `a`, each ascending, ordered by their first rank.
  std::vector<std::vector<int>> groups(Axis a) const;

  // Expert data parallelism: dp / ep ranks that hold the same experts.
  int expert_data_degree() const { return degrees_.dp / degrees_.ep; }
  int expert_data_coord(int rank) const { return coord(rank, Axis::DP) / degrees_.ep; }
  std::vector<int> expert_data_group(int rank) const;

 private:
  int world_ = 1;
  std::string order_ = "tp-dp-pp";
  Degrees degrees_;
  RankGrid grid_;
};

}  // namespace piper::ir
