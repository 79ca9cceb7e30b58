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
    case Axis::EP: return "expert parallelism (mixture-of-experts blocks)";
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
  const std::vector<Axis> axes = parse_order(order);
  for (Axis a : kAxes)
    if (degrees[a] > 1 && std::find(axes.begin(), axes.end(), a) == axes.end())
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
