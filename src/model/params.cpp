// params.cpp — per-unit parameter and gradient buffers, ZeRO-sharded on request.
#include "model/params.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "model/init.hpp"

namespace piper::model {

using backend::MemCategory;
using backend::Tensor;

namespace {
constexpr ir::ZeroState kParams = ir::ZeroState::ZERO_PARAMS, kGrads = ir::ZeroState::ZERO_GRADS;
}  // namespace

ParamStore::ParamStore(const ir::ModelGraph& graph, const std::vector<int>& units, backend::Backend& be,
                       Sharding sharding, bool allocate)
    : graph_(graph), be_(be), sharding_(sharding) {
  const ir::Degrees degrees = sharding_.degrees();
  for (int u : units) {
    const ir::UnitSpec& spec = graph.units.at(static_cast<size_t>(u));
    Slot& s = slots_[u];
    s.first = refs_.size();
    s.count = spec.params.size();
    s.numel = ir::local_numel(spec, degrees);  // throws when a piece or the sum is out of bounds
    s.parts = ir::flat_parts(spec, degrees, sharding_.coords());
    for (size_t k = 0; k < s.parts.size(); ++k) {
      const ir::FlatPart& part = s.parts[k];
      int64_t offset = part.full_offset;
      for (size_t i = part.first; i < part.first + part.count; ++i) {
        const ir::ParamSpec& p = spec.params[i];
        const int64_t n = ir::local_numel(p, degrees);
        by_name_[p.name] = refs_.size();
        refs_.push_back({&p, u, offset, k, n});
        offset += n;
      }
      s.padded += part.zero.padded;
      s.shard += part.zero.len;
    }
    if (allocate) allocate_values(u);
  }
  if (allocate) allocate_grads();
}

void ParamStore::allocate_values(int unit) {
  Slot& s = slot(unit);
  Tensor& t = sharding_.shards(unit, kParams) ? s.shard_values_t : s.values;
  t = Tensor(be_, sharding_.shards(unit, kParams) ? s.shard : s.padded, MemCategory::MEM_PARAMS);
  t.zero();
}

void ParamStore::release_values(int unit) {
  Slot& s = slot(unit);
  s.values = Tensor();
  s.shard_values_t = Tensor();
}

void ParamStore::release_grads() {
  for (auto& [u, s] : slots_) s.grads = Tensor(), s.shard_grads_t = Tensor();
}

void ParamStore::allocate_grads() {
  for (auto& [u, s] : slots_) {
    Tensor& t = sharding_.shards(u, kGrads) ? s.shard_grads_t : s.grads;
    t = Tensor(be_, sharding_.shards(u, kGrads) ? s.shard : s.padded, MemCategory::MEM_GRADS);
    t.zero();
  }
}

ParamStore::Slot& ParamStore::slot(int unit) {
  auto it = slots_.find(unit);
  if (it == slots_.end()) throw std::out_of_range("unit " + std::to_string(unit) + " is not held on this rank");
  return it->second;
}
const ParamStore::Slot& ParamStore::slot(int unit) const { return const_cast<ParamStore*>(this)->slot(unit); }

void ParamStore::init(uint64_t seed) {
  const ir::Degrees degrees = sharding_.degrees();
  const ir::Coords at = sharding_.coords();
  for (const ParamRef& r : refs_) {
    Slot& s = slot(r.unit);
    const bool sharded = sharding_.shards(r.unit, kParams);
    // The elements [lo, hi) of this parameter's local piece that this rank stores.
    int64_t lo = 0, hi = r.numel;
    float* dst = nullptr;
    if (!sharded) {
      dst = s.values.data() + r.offset;
    } else {
      const ir::FlatPart& part = s.parts[r.part];
      const int64_t in_part = r.offset - part.full_offset;  // the parameter's start within its part
      lo = std::max<int64_t>(0, part.zero.offset - in_part);
      hi = std::min(r.numel, part.zero.offset + part.zero.len - in_part);
      dst = s.shard_values_t.data() + part.shard_offset + (in_part + lo - part.zero.offset);
    }
    // Stretch by stretch of globally contiguous elements (one per row of a column split):
    // one long stretch draws in parallel inside init_range, many short ones in parallel here.
    std::vector<std::pair<int64_t, ir::Stretch>> stretches;  // local start, global start and length
    for (int64_t i = lo; i < hi;) {
      const ir::Stretch st = ir::global_stretch(*r.spec, degrees, at, i);
      stretches.push_back({i, {st.global, std::min(st.len, hi - i)}});
      i += stretches.back().second.len;
    }
    // Drawn on the host, then copied to the device.
    std::vector<float> host(static_cast<size_t>(std::max<int64_t>(0, hi - lo)));
#pragma omp parallel for schedule(static) if (stretches.size() > 1 && hi - lo > 65536)
    for (size_t k = 0; k < stretches.size(); ++k) {
      const auto& [i, st] = stretches[k];
      init_range(seed, *r.spec, st.global, st.len, host.data() + (i - lo));
    }
    if (!host.empty()) be_.to_device(dst, host.data(), host.size() * sizeof(float));
  }
}

std::span<const ParamRef> ParamStore::params(int unit) const {
  const Slot& s = slot(unit);
  return std::span<const ParamRef>(refs_).subspan(s.first, s.count);
}

std::vector<int> ParamStore::units() const {
  std::vector<int> u;
  for (const auto& [k, v] : slots_) u.push_back(k);
  return u;
}

const ParamRef& ParamStore::find(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) throw std::out_of_range("no parameter named '" + name + "' on this rank");
  return refs_[it->second];
}

float* ParamStore::values(int unit) {
  Slot& s = slot(unit);
  if (!sharding_.shards(unit, kParams)) return s.values.data();
  if (!s.bound.ptr)
    throw std::logic_error(graph_.units[static_cast<size_t>(unit)].name +
                           ": ZeRO-3 parameters used without being gathered first");
  if (s.bound.dtype != backend::DType::DTYPE_F32)
    throw std::logic_error(graph_.units[static_cast<size_t>(unit)].name +
                           ": ZeRO-3 gathered its parameters in " + backend::dtype_name(s.bound.dtype) +
                           "; ask value() or compute_view() for them, not the f32 values");
  return static_cast<float*>(const_cast<void*>(s.bound.ptr));
}

const float* ParamStore::value(int unit, size_t i) {
  Slot& s = slot(unit);
  const ParamRef& r = params(unit)[i];
  if (!s.bound.ptr || s.bound.dtype == backend::DType::DTYPE_F32) {
    const float* full = s.bound.ptr ? static_cast<const float*>(s.bound.ptr) : values(unit);
    return full + r.offset;
  }
  auto it = s.widened.find(i);
  if (it == s.widened.end())
    it = s.widened.emplace(i, backend::converted(compute_view(unit, i, 0, {r.numel}), backend::DType::DTYPE_F32,
                                                 MemCategory::MEM_PARAMS))
             .first;
  return it->second.data();
}

backend::ConstTensorView ParamStore::compute_view(int unit, size_t i, int64_t offset, backend::Shape shape) {
  Slot& s = slot(unit);
  const ParamRef& r = params(unit)[i];
  if (offset < 0 || offset + shape.numel() > r.numel)
    throw std::logic_error(r.spec->name + ": elements [" + std::to_string(offset) + ", " +
                           std::to_string(offset + shape.numel()) + ") asked of a parameter of " +
                           std::to_string(r.numel) + " on this rank");
  if (!s.bound.ptr) return backend::view(be_, values(unit) + r.offset + offset, shape);
  const auto* base = static_cast<const unsigned char*>(s.bound.ptr);
  return {&be_, s.bound.dtype, shape, base + (r.offset + offset) * static_cast<int64_t>(backend::dtype_size(s.bound.dtype))};
}

float* ParamStore::shard_values(int unit) {
  if (!sharding_.shards(unit, kParams))
    throw std::logic_error(graph_.units[static_cast<size_t>(unit)].name +
                           ": the shard buffer of the values exists at ZeRO-3 only; ask for a part's shard");
  return slot(unit).shard_values_t.data();
}

float* ParamStore::shard_values(int unit, const ir::FlatPart& p) {
  Slot& s = slot(unit);
  return sharding_.shards(unit, kParams) ? s.shard_values_t.data() + p.shard_offset
                                         : s.values.data() + p.full_offset + p.zero.offset;
}

void ParamStore::bind_compute_values(int unit, backend::ConstTensorView full) {
  Slot& s = slot(unit);
  if (full.numel() != s.padded || full.dtype == backend::DType::DTYPE_I32)
    throw std::logic_error(graph_.units[static_cast<size_t>(unit)].name + ": values of shape " + full.shape.str() +
                           " " + backend::dtype_name(full.dtype) + " bound for compute, expected [" +
                           std::to_string(s.padded) + "] f32 or bf16");
  s.widened.clear();
  s.bound = full;
}

backend::Tensor ParamStore::rounded_values(int unit, backend::DType t) {
  if (t == backend::DType::DTYPE_F32) return {};
  return backend::converted(backend::view(be_, values(unit), {padded_numel(unit)}), t,
                            backend::MemCategory::MEM_PARAMS);
}

void ParamStore::unbind_compute_values(int unit) {
  Slot& s = slot(unit);
  s.widened.clear();
  s.bound = {};
}

float* ParamStore::grads(int unit) {
  Slot& s = slot(unit);
  if (s.grads.empty()) {
    s.grads = Tensor(be_, s.padded, MemCategory::MEM_GRADS);
    s.grads.zero();
  }
  return s.grads.data();
}

float* ParamStore::grad(int unit, size_t i) { return grads(unit) + params(unit)[i].offset; }

float* ParamStore::shard_grads(int unit, const ir::FlatPart& p) {
  Slot& s = slot(unit);
  return sharding_.shards(unit, kGrads) ? s.shard_grads_t.data() + p.shard_offset
                                        : grads(unit) + p.full_offset + p.zero.offset;
}

void ParamStore::release_full_grads(int unit) {
  if (sharding_.shards(unit, kGrads)) slot(unit).grads = Tensor();
}

void ParamStore::zero_grads(int unit) {
  Slot& s = slot(unit);
  if (sharding_.shards(unit, kGrads)) {
    s.shard_grads_t.zero();
    s.grads = Tensor();
  } else {
    s.grads.zero();
  }
}

}  // namespace piper::model

namespace piper::model {

void ParamStore::zero_grads() {
  for (auto& [u, s] : slots_) zero_grads(u);
}

}  // namespace piper::model
