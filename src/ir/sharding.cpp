// sharding.cpp — a parameter's pieces from its shard description, and the
// ZeRO shard of a unit's flat buffer: the one place these rules live.
#include <algorithm>
#include <limits>
#include <stdexcept>

#include "config/checked.hpp"
#include "ir/model_graph.hpp"

namespace piper::ir {

namespace {

std::vector<int64_t> parts_of(const Shard& s, const std::vector<int64_t>& shape) {
  if (!s.parts.empty()) return s.parts;
  return {shape.at(static_cast<size_t>(s.dim))};
}

std::string dims_text(const std::vector<int64_t>& shape) {
  std::string t;
  for (int64_t d : shape) t += (t.empty() ? "" : " x ") + std::to_string(d);
  return "[" + t + "]";
}

// The shape before each shard, and after the last: shapes[k] is what shard k splits.
std::vector<std::vector<int64_t>> level_shapes(const ParamSpec& spec, const Degrees& n) {
  std::vector<std::vector<int64_t>> shapes{spec.shape};
  for (const Shard& s : spec.shards) {
    shapes.push_back(shapes.back());
    shapes.back()[static_cast<size_t>(s.dim)] /= n[s.axis];
  }
  return shapes;
}

}  // namespace

bool split_along(const ParamSpec& spec, Axis a) {
  return std::any_of(spec.shards.begin(), spec.shards.end(), [a](const Shard& s) { return s.axis == a; });
}

std::string shard_problem(const ParamSpec& spec, const Degrees& n) {
  std::vector<int64_t> shape = spec.shape;
  std::vector<Axis> seen;
  for (const Shard& s : spec.shards) {
    const std::string head = "parameter " + spec.name + " (shape " + dims_text(shape) + ", split along " +
                             axis_name(s.axis) + ")";
    if (std::find(seen.begin(), seen.end(), s.axis) != seen.end())
      return head + ": split twice along " + axis_name(s.axis) + "; give one shard per axis";
    seen.push_back(s.axis);
    if (s.dim < 0 || s.dim >= static_cast<int>(shape.size()))
      return head + ": dimension " + std::to_string(s.dim) + " does not exist; use 0.." +
             std::to_string(shape.size() - 1);
    const size_t d = static_cast<size_t>(s.dim);
    const int degree = n[s.axis];
    if (!s.parts.empty()) {
      int64_t sum = 0;
      for (int64_t p : s.parts) sum += p;
      if (sum != shape[d])
        return head + ": its parts along dimension " + std::to_string(d) + " sum to " + std::to_string(sum) +
               ", the dimension is " + std::to_string(shape[d]);
    }
    const std::vector<int64_t> parts = parts_of(s, shape);
    for (size_t k = 0; k < parts.size(); ++k)
      if (parts[k] % degree != 0)
        return head + ": " +
               (s.parts.empty() ? "dimension " + std::to_string(d)
                                : "part " + std::to_string(k) + " of dimension " + std::to_string(d)) +
               " (size " + std::to_string(parts[k]) + ") does not divide by " + axis_name(s.axis) + " " +
               std::to_string(degree) + "; use a degree that divides " + std::to_string(parts[k]);
    shape[d] /= degree;
  }
  return "";
}

void check_shards(const ModelGraph& graph, const Degrees& n) {
  for (const UnitSpec& u : graph.units)
    for (const ParamSpec& p : u.params)
      if (std::string why = shard_problem(p, n); !why.empty()) throw std::invalid_argument(why);
}

std::vector<int64_t> local_shape(const ParamSpec& spec, const Degrees& n) {
  if (std::string why = shard_problem(spec, n); !why.empty()) throw std::invalid_argument(why);
  return level_shapes(spec, n).back();
}

int64_t local_numel(const ParamSpec& spec, const Degrees& n) {
  return config::size_product(local_shape(spec, n), "parameter " + spec.name);
}

int64_t local_numel(const UnitSpec& unit, const Degrees& n) {
  int64_t total = 0;
  for (const ParamSpec& p : unit.params) {
    const std::optional<int64_t> sum = config::checked_add(total, local_numel(p, n));
    if (!sum)
      throw config::ConfigError(unit.name + ": its parameter count does not fit 64-bit arithmetic; use smaller "
                                "sizes (docs/config.md, Bounds)");
    total = *sum;
  }
  return total;
}

PieceStretches::PieceStretches(const ParamSpec& spec, const Degrees& n, const Coords& at) : numel_(spec.numel()) {
  const auto shapes = level_shapes(spec, n);
  // From the last shard back to the global shape.
  for (size_t k = spec.shards.size(); k-- > 0;) {
    const Shard& s = spec.shards[k];
    const std::vector<int64_t>& shape = shapes[k];
    const size_t d = static_cast<size_t>(s.dim);
    Level l;
    l.degree = n[s.axis];
    l.coord = at[s.axis];
    for (int64_t x : shape) l.numel *= x;
    for (size_t j = d + 1; j < shape.size(); ++j) l.inner *= shape[j];
    l.n_global = shape[d];
    l.n_local = l.n_global / l.degree;
    l.parts = parts_of(s, shape);
    levels_.push_back(std::move(l));
  }
}

// Local element i of the piece at coordinate c (of n) of a level's shape: its index in that shape
// and how many local elements from it stay contiguous there; the run is as long as its shortest link.
Stretch PieceStretches::at(int64_t i) const {
  if (levels_.empty()) return {i, numel_ - i};
  Stretch out{i, std::numeric_limits<int64_t>::max()};
  for (const Level& l : levels_) {
    const int64_t j = out.global;
    if (l.degree == 1) {
      out.len = std::min(out.len, l.numel - j);
      continue;
    }
    const int64_t q = j / l.inner, rest = j - q * l.inner, outer = q / l.n_local, cl = q - outer * l.n_local;
    // Local coordinate cl lies in part k's piece; globally, piece c of part k.
    int64_t local_start = 0, part_start = 0;
    bool found = false;
    for (int64_t p : l.parts) {
      const int64_t piece = p / l.degree;
      if (cl < local_start + piece) {
        const int64_t g = part_start + l.coord * piece + (cl - local_start);
        out = {(outer * l.n_global + g) * l.inner + rest, std::min(out.len, (local_start + piece - cl) * l.inner - rest)};
        found = true;
        break;
      }
      local_start += piece, part_start += p;
    }
    if (!found) throw std::logic_error("shard: local index " + std::to_string(j) + " outside its piece");
  }
  return out;
}

void PieceStretches::walk(int64_t lo, int64_t hi, std::vector<Stretch>& out) const {
  out.clear();
  if (levels_.size() != 1 || levels_[0].degree == 1) {
    for (int64_t i = lo; i < hi;) {
      Stretch st = at(i);
      st.len = std::min(st.len, hi - i);
      out.push_back(st);
      i += st.len;
    }
    return;
  }
  // One split: from the part holding lo, each stretch is the rest of a part's piece of one outer index.
  const Level& l = levels_[0];
  if (lo >= hi) return;
  const int64_t q = lo / l.inner;
  int64_t rest = lo - q * l.inner, outer = q / l.n_local, cl = q - outer * l.n_local;
  size_t k = 0;
  int64_t local_start = 0, part_start = 0;
  while (cl >= local_start + l.parts[k] / l.degree) local_start += l.parts[k] / l.degree, part_start += l.parts[k], ++k;
  for (int64_t i = lo; i < hi;) {
    const int64_t piece = l.parts[k] / l.degree;
    const int64_t g = (outer * l.n_global + part_start + l.coord * piece + (cl - local_start)) * l.inner + rest;
    const int64_t len = std::min((local_start + piece - cl) * l.inner - rest, hi - i);
    out.push_back({g, len});
    i += len;
    local_start += piece, part_start += l.parts[k], cl = local_start, rest = 0;
    if (++k == l.parts.size()) k = 0, local_start = part_start = cl = 0, ++outer;
  }
}

Stretch global_stretch(const ParamSpec& spec, const Degrees& n, const Coords& at, int64_t i) {
  return PieceStretches(spec, n, at).at(i);
}

int64_t global_index(const ParamSpec& spec, const Degrees& n, const Coords& at, int64_t i) {
  return global_stretch(spec, n, at, i).global;
}

bool zero_shards(int zero, ZeroState s) {
  switch (s) {
    case ZeroState::ZERO_PARAMS: return zero >= 3;
    case ZeroState::ZERO_GRADS: return zero >= 2;
    case ZeroState::ZERO_MOMENTS: return zero >= 1;
  }
  return false;
}

int replica_degree(bool experts, const Degrees& n) { return experts ? n.dp / n.ep : n.dp; }
int replica_coord(bool experts, const Degrees& n, const Coords& at) { return experts ? at.dp / n.ep : at.dp; }

std::vector<FlatPart> flat_parts(const UnitSpec& unit, const Degrees& n, const Coords& at) {
  std::vector<FlatPart> parts;
  for (size_t i = 0; i < unit.params.size(); ++i) {
    const bool experts = split_along(unit.params[i], Axis::EP);
    if (parts.empty() || parts.back().experts != experts) parts.push_back({i, 0, 0, experts, {}, 0, 0});
    ++parts.back().count;
    parts.back().numel += local_numel(unit.params[i], n);
  }
  if (parts.empty()) parts.push_back({});
  int64_t full = 0, shard = 0;
  for (FlatPart& p : parts) {
    p.zero = flat_shard(p.numel, replica_degree(p.experts, n), replica_coord(p.experts, n, at));
    p.full_offset = full, p.shard_offset = shard;
    full += p.zero.padded, shard += p.zero.len;
  }
  return parts;
}

FlatShard flat_shard(int64_t numel, int dp, int dp_rank) {
  const int64_t n = std::max(1, dp);
  const int64_t len = (numel + n - 1) / n;
  return {len * dp_rank, len, config::size_product({len, n}, "the padded parameter buffer")};
}

}  // namespace piper::ir
