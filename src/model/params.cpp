// params.cpp — per-unit parameter and gradient buffers.
#include "model/params.hpp"

#include <stdexcept>

#include "model/init.hpp"

namespace piper::model {

ParamStore::ParamStore(const ir::ModelGraph& graph, const std::vector<int>& units,
                       backend::Backend& be)
    : graph_(graph) {
  for (int u : units) {
    const ir::UnitSpec& spec = graph.units.at(static_cast<size_t>(u));
    int64_t off = 0;
    auto& offs = offsets_[u];
    for (const auto& p : spec.params) {
      offs.push_back(off);
      by_name_[p.name] = refs_.size();
      refs_.push_back({&p, u, off});
      off += p.numel();
    }
    values_.emplace(u, backend::Tensor(be, off, backend::MemCategory::MEM_PARAMS));
    grads_.emplace(u, backend::Tensor(be, off, backend::MemCategory::MEM_GRADS));
    values_.at(u).zero();
    grads_.at(u).zero();
  }
}

void ParamStore::init(uint64_t seed) {
  for (const ParamRef& r : refs_)
    init_range(seed, *r.spec, 0, r.spec->numel(), values(r.unit) + r.offset);
}

float* ParamStore::value(int unit, size_t i) { return values(unit) + offsets_.at(unit).at(i); }
float* ParamStore::grad(int unit, size_t i) { return grads(unit) + offsets_.at(unit).at(i); }

const ParamRef& ParamStore::find(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) throw std::out_of_range("no parameter named '" + name + "' on this rank");
  return refs_[it->second];
}

std::vector<int> ParamStore::units() const {
  std::vector<int> u;
  for (const auto& [k, v] : values_) u.push_back(k);
  return u;
}

void ParamStore::zero_grads() {
  for (auto& [u, t] : grads_) t.zero();
}

}  // namespace piper::model
