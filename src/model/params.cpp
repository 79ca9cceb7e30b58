// params.cpp — per-unit parameter and gradient buffers, ZeRO-sharded on request.
#include "model/params.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "config/checked.hpp"
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
      if (!ir::tp_divides(p, sharding_.tp_size))
        throw std::invalid_argument(p.name + ": its split dimension does not divide by tp " +
                                    std::to_string(sharding_.tp_size));
      const int64_t n = config::size_product(ir::tp_local_shape(p, sharding_.tp_size), "parameter " + p.name);
      s.offsets.push_back(s.numel);
      s.numels.push_back(n);
      by_name_[p.name] = refs_.size();
      refs_.push_back({&p, u, s.numel, n});
      const std::optional<int64_t> sum = config::checked_add(s.numel, n);
      if (!sum)
        throw config::ConfigError(spec.name + ": its parameter count does not fit 64-bit arithmetic; use smaller "
                                  "sizes (docs/config.md, Bounds)");
      s.numel = *sum;
    }
    s.shard_len = (s.numel + dp - 1) / dp;
    const int64_t padded = config::size_product({s.shard_len, dp}, spec.name + ": the padded parameter buffer");
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
  const int tp = sharding_.tp_size, tr = sharding_.tp_rank;
  for (const ParamRef& r : refs_) {
    Slot& s = slot(r.unit);
    // The elements [lo, hi) of this parameter's local piece that this rank stores.
    int64_t lo = 0, hi = r.numel;
    float* dst = nullptr;
    if (sharding_.zero < 3) {
      dst = s.values.data() + r.offset;
    } else {
      lo = std::max<int64_t>(0, shard_offset(r.unit) - r.offset);
      hi = std::min(r.numel, shard_offset(r.unit) + s.shard_len - r.offset);
      dst = s.shard_values_t.data() + (r.offset + lo - shard_offset(r.unit));
    }
    if (lo >= hi) continue;
    if (tp == 1 || r.spec->tp_dim < 0) {
      init_range(seed, *r.spec, lo, hi - lo, dst);
      continue;
    }
#pragma omp parallel for schedule(static) if (hi - lo > 65536)
    for (int64_t i = lo; i < hi; ++i) dst[i - lo] = init_value(seed, *r.spec, ir::tp_global_index(*r.spec, tr, tp, i));
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

namespace piper::model {

void ParamStore::zero_grads() {
  for (auto& [u, s] : slots_) zero_grads(u);
}

}  // namespace piper::model
