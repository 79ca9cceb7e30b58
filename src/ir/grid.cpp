// grid.cpp — rank coordinates and process groups from the grid order string.
#include "ir/grid.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace piper::ir {

namespace {
const std::vector<std::string> kKnownDims = {"tp", "cp", "ep", "dp", "pp"};
}

RankGrid::RankGrid(int world_size, const std::string& order, const std::map<std::string, int>& sizes)
    : world_(world_size), order_(order) {
  std::stringstream ss(order);
  std::string d;
  while (std::getline(ss, d, '-')) {
    if (std::find(kKnownDims.begin(), kKnownDims.end(), d) == kKnownDims.end())
      throw std::invalid_argument("rank grid order '" + order + "': unknown dimension '" + d +
                                  "' (expected names from tp, cp, ep, dp, pp joined by '-')");
    if (std::find(dims_.begin(), dims_.end(), d) != dims_.end())
      throw std::invalid_argument("rank grid order '" + order + "': dimension '" + d + "' is repeated");
    dims_.push_back(d);
  }
  for (const auto& [name, n] : sizes) {
    if (std::find(kKnownDims.begin(), kKnownDims.end(), name) == kKnownDims.end())
      throw std::invalid_argument("rank grid: unknown dimension '" + name + "' (expected tp, cp, ep, dp or pp)");
    if (n > 1 && std::find(dims_.begin(), dims_.end(), name) == dims_.end())
      throw std::invalid_argument("rank grid order '" + order + "' does not name " + name + ", whose size is " +
                                  std::to_string(n));
  }
  int product = 1;
  std::string factors;
  for (const auto& name : dims_) {
    auto it = sizes.find(name);
    const int n = it == sizes.end() ? 1 : it->second;
    if (n < 1) throw std::invalid_argument("rank grid: " + name + " size must be >= 1, got " + std::to_string(n));
    sizes_.push_back(n);
    product *= n;
    factors += (factors.empty() ? "" : " x ") + name + "(" + std::to_string(n) + ")";
  }
  if (product != world_size)
    throw std::invalid_argument("world size " + std::to_string(world_size) + " != " + factors + " = " +
                                std::to_string(product));
}

int RankGrid::index_of(const std::string& dim) const {
  for (size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i] == dim) return static_cast<int>(i);
  if (std::find(kKnownDims.begin(), kKnownDims.end(), dim) == kKnownDims.end())
    throw std::invalid_argument("rank grid: unknown dimension '" + dim + "' (expected tp, cp, ep, dp or pp)");
  return -1;  // a known dimension outside the order: size 1
}

int RankGrid::size(const std::string& dim) const {
  const int i = index_of(dim);
  return i < 0 ? 1 : sizes_[static_cast<size_t>(i)];
}

int RankGrid::coord(int rank, const std::string& dim) const {
  if (rank < 0 || rank >= world_)
    throw std::invalid_argument("rank grid: rank " + std::to_string(rank) + " outside world size " +
                                std::to_string(world_));
  if (index_of(dim) < 0) return 0;
  int r = rank;
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (dims_[i] == dim) return r % sizes_[i];
    r /= sizes_[i];
  }
  return 0;
}

std::map<std::string, int> RankGrid::coords(int rank) const {
  std::map<std::string, int> c;
  for (const auto& d : dims_) c[d] = coord(rank, d);
  return c;
}

int RankGrid::rank_of(const std::map<std::string, int>& coords) const {
  int rank = 0, stride = 1;
  for (const auto& [name, c] : coords)
    if (c < 0 || c >= size(name))
      throw std::invalid_argument("rank grid: " + name + " coordinate " + std::to_string(c) + " outside 0.." +
                                  std::to_string(size(name) - 1));
  for (size_t i = 0; i < dims_.size(); ++i) {
    auto it = coords.find(dims_[i]);
    rank += (it == coords.end() ? 0 : it->second) * stride;
    stride *= sizes_[i];
  }
  return rank;
}

std::vector<int> RankGrid::group(int rank, const std::string& dim) const {
  auto c = coords(rank);
  std::vector<int> g;
  for (int i = 0; i < size(dim); ++i) {
    c[dim] = i;
    g.push_back(rank_of(c));
  }
  std::sort(g.begin(), g.end());
  return g;
}

std::vector<std::vector<int>> RankGrid::groups(const std::string& dim) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_; ++r)
    if (coord(r, dim) == 0) out.push_back(group(r, dim));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace piper::ir
