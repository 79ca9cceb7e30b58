// params.hpp — parameter values and gradients of the units a rank holds, one
// contiguous buffer per unit (values and gradients alike), located by name.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "ir/model_graph.hpp"

namespace piper::model {

// A parameter inside its unit's buffers.
struct ParamRef {
  const ir::ParamSpec* spec = nullptr;
  int unit = -1;
  int64_t offset = 0;  // into the unit's buffer
};

class ParamStore {
 public:
  // Allocates (zeroed) values and gradients of `units` (indices into `graph`).
  ParamStore(const ir::ModelGraph& graph, const std::vector<int>& units, backend::Backend& be);

  // Initialises every value from (seed, name, global index).
  void init(uint64_t seed);

  bool holds(int unit) const { return values_.count(unit) > 0; }
  float* values(int unit) { return values_.at(unit).data(); }
  float* grads(int unit) { return grads_.at(unit).data(); }
  int64_t unit_numel(int unit) const { return values_.at(unit).numel(); }
  // Pointers to parameter i (spec order) of a unit.
  float* value(int unit, size_t i);
  float* grad(int unit, size_t i);

  const std::vector<ParamRef>& params() const { return refs_; }
  const ParamRef& find(const std::string& name) const;  // throws std::out_of_range
  std::vector<int> units() const;
  void zero_grads();

 private:
  const ir::ModelGraph& graph_;
  std::map<int, backend::Tensor> values_, grads_;
  std::map<int, std::vector<int64_t>> offsets_;  // per unit, per param
  std::vector<ParamRef> refs_;
  std::map<std::string, size_t> by_name_;
};

}  // namespace piper::model
