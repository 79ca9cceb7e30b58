// parallel_dims.hpp — the degrees of parallelism (tp, cp, ep, dp, pp), the
// rank grid order and the world size, validated once here. Process groups,
// coordinates and parameter pieces derive from one ParallelDims, which the
// Strategy gives (Strategy::dims). Pure.
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
  // degree asks for a kind of parallelism this build does not have (cp, ep > 1).
  ParallelDims(int world_size, const std::string& order, const Degrees& degrees);

  int world_size() const { return world_; }
  const std::string& order() const { return order_; }  // as given, e.g. "tp-dp-pp"
  const Degrees& degrees() const { return degrees_; }
  int degree(Axis a) const { return degrees_[a]; }

  int coord(int rank, Axis a) const { return grid_.coord(rank, a); }
  Coords coords(int rank) const { return grid_.coords(rank); }
  int rank_of(const Coords& c) const { return grid_.rank_of(c); }
  // World ranks of the group along `a` that contains `rank`, ascending.
  std::vector<int> group(int rank, Axis a) const { return grid_.group(rank, a); }
  // Every group along `a`, each ascending, ordered by their first rank.
  std::vector<std::vector<int>> groups(Axis a) const { return grid_.groups(a); }

 private:
  int world_ = 1;
  std::string order_ = "tp-dp-pp";
  Degrees degrees_;
  RankGrid grid_;
};

}  // namespace piper::ir
