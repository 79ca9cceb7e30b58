// parallel_dims.cpp — validation of the degrees and the grid order.
#include "ir/parallel_dims.hpp"

#include <algorithm>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "config/checked.hpp"

namespace piper::ir {

namespace {

std::vector<Axis> parse_order(const std::string& order) {
  std::vector<Axis> axes;
  std::stringstream ss(order);
  std::string name;
  while (std::getline(ss, name, '-')) {
    auto known = std::find_if(kAxes.begin(), kAxes.end(), [&](Axis a) { return name == axis_name(a); });
    if (known == kAxes.end())
      throw std::invalid_argument("rank grid order '" + order + "': unknown dimension '" + name +
                                  "' (expected names from tp, cp, ep, dp, pp joined by '-')");
    if (std::find(axes.begin(), axes.end(), *known) != axes.end())
      throw std::invalid_argument("rank grid order '" + order + "': dimension '" + name + "' is repeated");
    axes.push_back(*known);
  }
  if (axes.empty()) throw std::invalid_argument("rank grid order is empty; use e.g. tp-dp-pp");
  return axes;
}

// What a degree > 1 along an axis needs that this build does not have; "" when it has it.
const char* missing_capability(Axis a) {
  switch (a) {
    case Axis::CP: return "context parallelism (a sequence split over ranks)";
    default: return "";
  }
}

}  // namespace

ParallelDims::ParallelDims() : grid_({Axis::TP, Axis::DP, Axis::PP}, degrees_) {}

ParallelDims::ParallelDims(int world_size, const std::string& order, const Degrees& degrees)
    : world_(world_size), order_(order), degrees_(degrees) {
  for (Axis a : kAxes)
    if (degrees[a] < 1)
      throw std::invalid_argument(std::string("rank grid: ") + axis_name(a) + " size must be >= 1, got " +
                                  std::to_string(degrees[a]));
  std::vector<Axis> axes = parse_order(order);
  // ep is carved out of dp: an order may name it only right before dp (as Megatron's "tp-cp-ep-dp-pp" does).
  if (auto e = std::find(axes.begin(), axes.end(), Axis::EP); e != axes.end()) {
    if (e + 1 == axes.end() || *(e + 1) != Axis::DP)
      throw std::invalid_argument("rank grid order '" + order +
                                  "' puts ep elsewhere than right before dp; expert parallelism is carved out of dp "
                                  "(its groups are ep consecutive data-parallel ranks): write ep-dp, or leave ep out");
    axes.erase(e);
  }
  if (degrees.dp % degrees.ep != 0)
    throw std::invalid_argument("ep = " + std::to_string(degrees.ep) + " does not divide dp = " +
                                std::to_string(degrees.dp) + ": expert parallelism splits the data-parallel ranks " +
                                "into groups of ep; use an ep that divides dp");
  for (Axis a : kAxes)
    if (a != Axis::EP && degrees[a] > 1 && std::find(axes.begin(), axes.end(), a) == axes.end())
      throw std::invalid_argument("rank grid order '" + order + "' does not name " + axis_name(a) +
                                  ", whose size is " + std::to_string(degrees[a]) + "; add it, e.g. tp-cp-ep-dp-pp");
  for (Axis a : kAxes)
    if (degrees[a] > 1 && *missing_capability(a))
      throw std::invalid_argument(std::string(axis_name(a)) + " = " + std::to_string(degrees[a]) + ": " +
                                  axis_name(a) + " > 1 needs " + missing_capability(a) +
                                  ", which this build does not have; use " + axis_name(a) + " 1");
  std::vector<int64_t> sizes;
  std::string factors;
  for (Axis a : axes) {
    sizes.push_back(degrees[a]);
    factors += (factors.empty() ? "" : " x ") + std::string(axis_name(a)) + "(" + std::to_string(degrees[a]) + ")";
  }
  const std::optional<int64_t> product = config::checked_product(sizes);
  if (!product || *product != world_size)
    throw std::invalid_argument("world size " + std::to_string(world_size) + " != " + factors + " = " +
                                (product ? std::to_string(*product) : std::string("more than 2^63")));
  grid_ = RankGrid(axes, degrees);
}

}  // namespace piper::ir

namespace piper::ir {

int ParallelDims::coord(int rank, Axis a) const {
  if (a == Axis::EP) return grid_.coord(rank, Axis::DP) % degrees_.ep;
  return grid_.coord(rank, a);
}

int ParallelDims::rank_of(const Coords& c) const {
  Coords grid = c;
  grid.ep = 0;  // derived from dp, not an axis of the grid
  return grid_.rank_of(grid);
}

Coords ParallelDims::coords(int rank) const {
  Coords c = grid_.coords(rank);
  c.ep = c.dp % degrees_.ep;
  return c;
}

std::vector<int> ParallelDims::group(int rank, Axis a) const {
  if (a != Axis::EP) return grid_.group(rank, a);
  Coords c = grid_.coords(rank);
  const int first = c.dp - c.dp % degrees_.ep;
  std::vector<int> g;
  for (int i = 0; i < degrees_.ep; ++i) {
    c.dp = first + i;
    g.push_back(grid_.rank_of(c));
  }
  std::sort(g.begin(), g.end());
  return g;
}

std::vector<int> ParallelDims::expert_data_group(int rank) const {
  Coords c = grid_.coords(rank);
  const int ep = c.dp % degrees_.ep;
  std::vector<int> g;
  for (int i = 0; i < expert_data_degree(); ++i) {
    c.dp = i * degrees_.ep + ep;
    g.push_back(grid_.rank_of(c));
  }
  std::sort(g.begin(), g.end());
  return g;
}

std::vector<std::vector<int>> ParallelDims::groups(Axis a) const {
  if (a != Axis::EP) return grid_.groups(a);
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_; ++r)
    if (coord(r, Axis::EP) == 0) out.push_back(group(r, a));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace piper::ir
