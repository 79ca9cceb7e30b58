// rank_grid.hpp — process groups from one order string (Megatron's RankGenerator): pure, no MPI.
//
// A RankGrid factors the world into named dimensions (tp, cp, ep, dp, pp).
// The order string lists them from fastest- to slowest-varying: with
// "tp-dp-pp" and sizes tp=2, dp=2, pp=2,
//
//     rank = tp_idx + tp * (dp_idx + dp * pp_idx)
//
// so ranks {0,1} form a tp group, {0,2} a dp group, {0,4} a pp group.
// A group along dimension d is the set of ranks that agree on every other
// coordinate. Dimensions the order names but the size map omits have size 1;
// known dimensions absent from the order also have size 1 (their groups are
// single ranks). ep is an ordinary dimension here: a layout where experts
// are sharded over the dp ranks is written as an order without dp.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace piper::comm {

class RankGrid {
 public:
  // Throws std::invalid_argument for an unknown or repeated name in the
  // order, a size < 1, a size > 1 for a dimension the order does not name,
  // or a product of sizes != world_size; the message prints every factor,
  // e.g. "world size 6 != tp(2) x dp(2) x pp(2) = 8".
  RankGrid(int world_size, const std::map<std::string, int>& sizes,
           const std::string& order = "tp-dp-pp");

  // The names every grid accepts, in Megatron's default order.
  static const std::vector<std::string>& known_dims();

  int world_size() const { return world_size_; }
  const std::string& order() const { return order_; }
  const std::vector<std::string>& dims() const { return dims_; }  // the order, fastest first
  int size(std::string_view dim) const;                            // 1 for a known dim not in the order

  // Index of `rank` along `dim` (0 for a known dim not in the order).
  int coord(int rank, std::string_view dim) const;
  // Every dim of the order -> coordinate of `rank`.
  std::map<std::string, int> coords(int rank) const;
  // The world rank at `coords`; dims left out are 0. Throws std::invalid_argument
  // for an unknown dim or a coordinate out of range.
  int rank_of(const std::map<std::string, int>& coords) const;

  // The sorted world ranks of the group along `dim` that contains `rank`.
  std::vector<int> group(int rank, std::string_view dim) const;
  // Every group along `dim`, ordered by their first rank; each rank is in exactly one.
  std::vector<std::vector<int>> groups(std::string_view dim) const;

  // "tp(2) x dp(2) x pp(2) = 8 [order tp-dp-pp]"
  std::string describe() const;

 private:
  int index_of(std::string_view dim) const;  // -1 for a known dim not in the order; throws if unknown
  void check_rank(int rank) const;

  int world_size_ = 1;
  std::string order_;
  std::vector<std::string> dims_;  // fastest first
  std::vector<int> sizes_;         // per dims_
  std::vector<int> strides_;       // per dims_: product of the sizes before it
};

}  // namespace piper::comm
