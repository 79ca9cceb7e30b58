// params.cpp — per-unit parameter and gradient buffers, ZeRO-sharded on request.
#include "model/params.hpp"

#include <algorithm>
#include <stdexcept>

#include "model/init.hpp"

namespace piper::model {

using backend::MemCategory;
using backend::Tensor;

ParamStore::ParamStore(const ir::ModelGraph& graph, const std::vector<int>& units, backend::Backend& be,
                       Sharding sharding)
    : graph_(graph), be_(be), sharding_(sharding) {
  const int64_t dp = std::max(1, sharding_.dp_size);
  for (int u : units) {
    const ir::UnitSpec& spec = graph.units.at(static_cast<size_t>(u));
    Slot& s = slots_[u];
    for (const auto& p : spec.params) {
      s.offsets.push_back(s.numel);
      by_name_[p.name] = refs_.size();
      refs_.push_back({&p, u, s.numel});
      s.numel += p.numel();
    }
    s.shard_len = (s.numel + dp - 1) / dp;
    const int64_t padded = s.shard_len * dp;
    if (sharding_.zero >= 3) {
      s.shard_values_t = Tensor(be, s.shard_len, MemCategory::MEM_PARAMS);
      s.shard_values_t.zero();
    } else {
      s.values = Tensor(be, padded, MemCategory::MEM_PARAMS);
      s.values.zero();
    }
    if (sharding_.zero >= 2) {
      s.shard_grads_t = Tensor(be, s.shard_len, MemCategory::MEM_GRADS);
      s.shard_grads_t.zero();
    } else {
      s.grads = Tensor(be, padded, MemCategory::MEM_GRADS);
      s.grads.zero();
    }
  }
}

ParamStore::Slot& ParamStore::slot(int unit) {
  auto it = slots_.find(unit);
  if (it == slots_.end()) throw std::out_of_range("unit " + std::to_string(unit) + " is not held on this rank");
  return it->second;
}
const ParamStore::Slot& ParamStore::slot(int unit) const { return const_cast<ParamStore*>(this)->slot(unit); }

void ParamStore::init(uint64_t seed) {
  for (const ParamRef& r : refs_) {
    Slot& s = slot(r.unit);
    if (sharding_.zero < 3) {
      init_range(seed, *r.spec, 0, r.spec->numel(), s.values.data() + r.offset);
      continue;
    }
    // Only the part of this parameter inside the shard.
    const int64_t lo = std::max(r.offset, shard_offset(r.unit));
    const int64_t hi = std::min(r.offset + r.spec->numel(), shard_offset(r.unit) + s.shard_len);
    if (lo < hi) init_range(seed, *r.spec, lo - r.offset, hi - lo, s.shard_values_t.data() + (lo - shard_offset(r.unit)));
  }
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
  if (sharding_.zero < 3) return s.values.data();
  if (!s.bound)
    throw std::logic_error(graph_.units[static_cast<size_t>(unit)].name +
                           ": ZeRO-3 parameters used without being gathered first");
  return s.bound;
}

float* ParamStore::value(int unit, size_t i) { return values(unit) + slot(unit).offsets.at(i); }

float* ParamStore::shard_values(int unit) {
  Slot& s = slot(unit);
  return sharding_.zero >= 3 ? s.shard_values_t.data() : s.values.data() + shard_offset(unit);
}

void ParamStore::bind_full_values(int unit, float* full) { slot(unit).bound = full; }
void ParamStore::unbind_full_values(int unit) { slot(unit).bound = nullptr; }

float* ParamStore::grads(int unit) {
  Slot& s = slot(unit);
  if (s.grads.empty()) {
    s.grads = Tensor(be_, s.shard_len * std::max(1, sharding_.dp_size), MemCategory::MEM_GRADS);
    s.grads.zero();
  }
  return s.grads.data();
}

float* ParamStore::grad(int unit, size_t i) { return grads(unit) + slot(unit).offsets.at(i); }

float* ParamStore::shard_grads(int unit) {
  Slot& s = slot(unit);
  return sharding_.zero >= 2 ? s.shard_grads_t.data() : grads(unit) + shard_offset(unit);
}

void ParamStore::release_full_grads(int unit) {
  if (sharding_.zero >= 2) slot(unit).grads = Tensor();
}

void ParamStore::zero_grads(int unit) {
  Slot& s = slot(unit);
  if (sharding_.zero >= 2) {
    s.shard_grads_t.zero();
    s.grads = Tensor();
  } else {
    s.grads.zero();
  }
}

}  // namespace piper::model
