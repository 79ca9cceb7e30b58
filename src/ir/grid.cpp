// grid.cpp — rank coordinates and process groups from the axis order.
#include "ir/grid.hpp"

#include <algorithm>
#include <stdexcept>

namespace piper::ir {

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::TP: return "tp";
    case Axis::CP: return "cp";
    case Axis::EP: return "ep";
    case Axis::DP: return "dp";
    case Axis::PP: return "pp";
  }
  return "?";
}

RankGrid::RankGrid(std::vector<Axis> order, const Degrees& sizes) : order_(std::move(order)), sizes_(sizes) {
  for (Axis a : kAxes)
    if (std::find(order_.begin(), order_.end(), a) == order_.end()) sizes_[a] = 1;
  for (Axis a : order_) world_ *= sizes_[a];
}

int RankGrid::coord(int rank, Axis a) const {
  if (rank < 0 || rank >= world_)
    throw std::invalid_argument("rank grid: rank " + std::to_string(rank) + " outside world size " +
                                std::to_string(world_));
  int r = rank;
  for (Axis o : order_) {
    if (o == a) return r % sizes_[o];
    r /= sizes_[o];
  }
  return 0;  // an axis outside the order: size 1
}

Coords RankGrid::coords(int rank) const {
  Coords c;
  for (Axis a : kAxes) c[a] = coord(rank, a);
  return c;
}

int RankGrid::rank_of(const Coords& c) const {
  for (Axis a : kAxes)
    if (c[a] < 0 || c[a] >= sizes_[a])
      throw std::invalid_argument(std::string("rank grid: ") + axis_name(a) + " coordinate " + std::to_string(c[a]) +
                                  " outside 0.." + std::to_string(sizes_[a] - 1));
  int rank = 0, stride = 1;
  for (Axis o : order_) {
    rank += c[o] * stride;
    stride *= sizes_[o];
  }
  return rank;
}

std::vector<int> RankGrid::group(int rank, Axis a) const {
  Coords c = coords(rank);
  std::vector<int> g;
  for (int i = 0; i < sizes_[a]; ++i) {
    c[a] = i;
    g.push_back(rank_of(c));
  }
  std::sort(g.begin(), g.end());
  return g;
}

std::vector<std::vector<int>> RankGrid::groups(Axis a) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_; ++r)
    if (coord(r, a) == 0) out.push_back(group(r, a));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace piper::ir
