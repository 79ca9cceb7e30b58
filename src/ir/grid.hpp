// grid.hpp — the axes of parallelism and the rank grid arithmetic: axes in
// an order (like Megatron's "tp-cp-ep-dp-pp", first varies fastest) and a
// size per axis give every rank its coordinates and every process group its
// ranks. Pure. ir::ParallelDims validates the sizes and the order and owns
// the grid; nothing else builds one.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace piper::ir {

// The axes of the rank grid: tensor, context (sequence), expert, data and
// pipeline parallelism.
enum class Axis : uint8_t { TP, CP, EP, DP, PP };
inline constexpr std::array<Axis, 5> kAxes = {Axis::TP, Axis::CP, Axis::EP, Axis::DP, Axis::PP};
const char* axis_name(Axis a);  // "tp", "cp", "ep", "dp", "pp"

// One value per axis: `Init` for every axis not given (1 for degrees, 0 for coordinates).
template <int Init>
struct PerAxis {
  int tp = Init, cp = Init, ep = Init, dp = Init, pp = Init;
  int& operator[](Axis a) {
    switch (a) {
      case Axis::TP: return tp;
      case Axis::CP: return cp;
      case Axis::EP: return ep;
      case Axis::DP: return dp;
      case Axis::PP: break;
    }
    return pp;
  }
  int operator[](Axis a) const { return (*const_cast<PerAxis*>(this))[a]; }
  bool operator==(const PerAxis&) const = default;
};
using Degrees = PerAxis<1>;  // ranks along each axis
using Coords = PerAxis<0>;   // a rank's coordinate along each axis

class RankGrid {
 public:
  RankGrid() = default;  // one rank
  // `order` lists the axes, first varies fastest; an axis outside it has
  // size 1. The caller (ParallelDims) has validated both.
  RankGrid(std::vector<Axis> order, const Degrees& sizes);

  int world_size() const { return world_; }
  // Throw std::invalid_argument for a rank or coordinate outside the grid.
  int coord(int rank, Axis a) const;
  Coords coords(int rank) const;
  int rank_of(const Coords& c) const;
  // World ranks of the group along `a` that contains `rank`, ascending.
  std::vector<int> group(int rank, Axis a) const;
  // Every group along `a`, each ascending, ordered by their first rank.
  std::vector<std::vector<int>> groups(Axis a) const;

 private:
  int world_ = 1;
  std::vector<Axis> order_;  // first varies fastest
  Degrees sizes_;
};

}  // namespace piper::ir
