// grid.hpp — the rank grid: one order string (like Megatron's "tp-cp-ep-dp-pp",
// first name varies fastest) and a size per dimension give every rank its
// coordinates and every process group its ranks. Pure.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace piper::ir {

class RankGrid {
 public:
  // Throws std::invalid_argument when a name is unknown or repeated, or the
  // product of the sizes is not the world size (the message prints every factor).
  RankGrid(int world_size, const std::string& order, const std::map<std::string, int>& sizes);

  int world_size() const { return world_; }
  const std::string& order() const { return order_; }
  const std::vector<std::string>& dims() const { return dims_; }
  int size(const std::string& dim) const;
  int coord(int rank, const std::string& dim) const;
  std::map<std::string, int> coords(int rank) const;
  int rank_of(const std::map<std::string, int>& coords) const;
  // World ranks of the group along `dim` that contains `rank`, ascending.
  std::vector<int> group(int rank, const std::string& dim) const;
  // Every group along `dim`, each ascending, ordered by their first rank.
  std::vector<std::vector<int>> groups(const std::string& dim) const;

 private:
  int index_of(const std::string& dim) const;  // throws for a name the grid does not know
  int world_ = 1;
  std::string order_;
  std::vector<std::string> dims_;  // in order, first varies fastest
  std::vector<int> sizes_;
};

}  // namespace piper::ir
