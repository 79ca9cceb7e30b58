// rank_grid.cpp — the rank grid: validation of the order string and sizes, coordinates and groups.
#include "comm/rank_grid.hpp"

#include <algorithm>
#include <iomanip>
#include <sstream>
#include <stdexcept>

namespace piper::comm {

namespace {

bool is_known(std::string_view dim) {
  const auto& known = RankGrid::known_dims();
  return std::find(known.begin(), known.end(), dim) != known.end();
}

std::string known_list() {
  std::string out;
  for (const auto& d : RankGrid::known_dims()) out += (out.empty() ? "" : ", ") + d;
  return out;
}

std::vector<std::string> split_order(const std::string& order) {
  std::vector<std::string> dims;
  size_t start = 0;
  while (true) {
    size_t dash = order.find('-', start);
    dims.push_back(order.substr(start, dash == std::string::npos ? std::string::npos : dash - start));
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  return dims;
}

}  // namespace

const std::vector<std::string>& RankGrid::known_dims() {
  static const std::vector<std::string> dims = {"tp", "cp", "ep", "dp", "pp"};
  return dims;
}

RankGrid::RankGrid(int world_size, const std::map<std::string, int>& sizes, const std::string& order)
    : world_size_(world_size), order_(order), dims_(split_order(order)) {
  if (world_size < 1)
    throw std::invalid_argument("rank grid: world size must be >= 1, got " + std::to_string(world_size));
  for (size_t i = 0; i < dims_.size(); ++i) {
    const std::string& d = dims_[i];
    if (!is_known(d))
      throw std::invalid_argument("rank grid: unknown dimension '" + d + "' in order '" + order +
                                  "' (known: " + known_list() + ")");
    if (std::find(dims_.begin(), dims_.begin() + static_cast<long>(i), d) != dims_.begin() + static_cast<long>(i))
      throw std::invalid_argument("rank grid: dimension '" + d + "' repeated in order '" + order + "'");
  }
  for (const auto& [d, n] : sizes) {
    if (!is_known(d))
      throw std::invalid_argument("rank grid: unknown dimension '" + d + "' in sizes (known: " +
                                  known_list() + ")");
    if (n < 1)
      throw std::invalid_argument("rank grid: size of " + d + " must be >= 1, got " + std::to_string(n));
    if (n > 1 && std::find(dims_.begin(), dims_.end(), d) == dims_.end())
      throw std::invalid_argument("rank grid: " + d + "=" + std::to_string(n) + " but order '" + order +
                                  "' does not name " + d);
  }
  double product = 1;  // exact for any world that fits in an int; no overflow for absurd sizes
  for (const auto& d : dims_) {
    auto it = sizes.find(d);
    int n = it == sizes.end() ? 1 : it->second;
    sizes_.push_back(n);
    product *= n;
  }
  if (product != world_size) {
    std::ostringstream msg;
    msg << "world size " << world_size << " != ";
    for (size_t i = 0; i < dims_.size(); ++i) msg << (i ? " x " : "") << dims_[i] << "(" << sizes_[i] << ")";
    msg << " = " << std::fixed << std::setprecision(0) << product;
    throw std::invalid_argument(msg.str());
  }
  int stride = 1;
  for (int n : sizes_) {
    strides_.push_back(stride);
    stride *= n;
  }
}

int RankGrid::index_of(std::string_view dim) const {
  for (size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i] == dim) return static_cast<int>(i);
  if (!is_known(dim))
    throw std::invalid_argument("rank grid: unknown dimension '" + std::string(dim) + "' (known: " +
                                known_list() + ")");
  return -1;
}

void RankGrid::check_rank(int rank) const {
  if (rank < 0 || rank >= world_size_)
    throw std::invalid_argument("rank grid: rank " + std::to_string(rank) + " outside world of size " +
                                std::to_string(world_size_));
}

int RankGrid::size(std::string_view dim) const {
  int i = index_of(dim);
  return i < 0 ? 1 : sizes_[static_cast<size_t>(i)];
}

int RankGrid::coord(int rank, std::string_view dim) const {
  check_rank(rank);
  int i = index_of(dim);
  if (i < 0) return 0;
  return (rank / strides_[static_cast<size_t>(i)]) % sizes_[static_cast<size_t>(i)];
}

std::map<std::string, int> RankGrid::coords(int rank) const {
  std::map<std::string, int> out;
  for (const auto& d : dims_) out[d] = coord(rank, d);
  return out;
}

int RankGrid::rank_of(const std::map<std::string, int>& coords) const {
  int rank = 0;
  for (const auto& [d, c] : coords) {
    int i = index_of(d);
    int n = i < 0 ? 1 : sizes_[static_cast<size_t>(i)];
    if (c < 0 || c >= n)
      throw std::invalid_argument("rank grid: coordinate " + d + "=" + std::to_string(c) + " outside [0, " +
                                  std::to_string(n) + ")");
    if (i >= 0) rank += c * strides_[static_cast<size_t>(i)];
  }
  return rank;
}

std::vector<int> RankGrid::group(int rank, std::string_view dim) const {
  check_rank(rank);
  int i = index_of(dim);
  if (i < 0) return {rank};
  const int n = sizes_[static_cast<size_t>(i)], stride = strides_[static_cast<size_t>(i)];
  const int first = rank - coord(rank, dim) * stride;  // same other coordinates, index 0 along dim
  std::vector<int> out;
  out.reserve(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) out.push_back(first + k * stride);
  return out;  // sorted: strides are positive
}

std::vector<std::vector<int>> RankGrid::groups(std::string_view dim) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_size_; ++r)
    if (coord(r, dim) == 0) out.push_back(group(r, dim));
  return out;  // ordered by first rank: r increases
}

std::string RankGrid::describe() const {
  std::ostringstream s;
  for (size_t i = 0; i < dims_.size(); ++i) s << (i ? " x " : "") << dims_[i] << "(" << sizes_[i] << ")";
  s << " = " << world_size_ << " [order " << order_ << "]";
  return s.str();
}

}  // namespace piper::comm
