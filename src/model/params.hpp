// params.hpp — parameter values and gradients of the units a rank holds, one
// contiguous buffer per unit, located by name, optionally sharded over the
// data-parallel group (ZeRO). A unit's buffer is its parts (ir::flat_parts):
// the dense parameters, and an MoE block's experts, which only the ranks of an
// expert-data-parallel group share. Each part, padded to a multiple of its
// group's size, splits into equal shards, one per rank of that group.
#pragma once

#include <map>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "ir/model_graph.hpp"

namespace piper::model {

// A parameter inside its unit's buffers.
struct ParamRef {
  const ir::ParamSpec* spec = nullptr;
  int unit = -1;
  int64_t offset = 0;  // into the unit's full buffer
  size_t part = 0;     // the unit's part (ir::flat_parts) that holds it
  int64_t numel = 0;   // this rank's piece (ir::local_numel)
};

// How the store is sharded over the data-parallel group.
struct Sharding {
  int dp_rank = 0;
  int dp_size = 1;
  // The ZeRO stage of each unit (ir::ReplicateDirective::zero_of_unit): 0 replicated, 1 optimiser
  // state, 2 + gradients, 3 + parameters; empty: 0 for every unit.
  std::vector<int> zero_of_unit;
  int tp_rank = 0;  // tensor parallelism: each parameter is this rank's piece (ir::local_shape)
  int tp_size = 1;
  int ep_rank = 0;  // expert parallelism: an MoE block's experts are this rank's ep piece
  int ep_size = 1;
  // The degrees and this rank's coordinates the parameters' pieces depend on (ParamSpec::shards).
  ir::Degrees degrees() const { return {.tp = tp_size, .ep = ep_size, .dp = dp_size}; }
  ir::Coords coords() const { return {.tp = tp_rank, .ep = ep_rank, .dp = dp_rank}; }
  int zero(int unit) const { return zero_of_unit.empty() ? 0 : zero_of_unit.at(static_cast<size_t>(unit)); }
  bool shards(int unit, ir::ZeroState s) const { return ir::zero_shards(zero(unit), s); }
};

class ParamStore {
 public:
  // With `allocate` false the store has the layout of every unit but no buffers yet: an online switch
  // gives it its state block by block (allocate_values, then allocate_grads once every block is in).
  ParamStore(const ir::ModelGraph& graph, const std::vector<int>& units, backend::Backend& be,
             Sharding sharding = {}, bool allocate = true);

  // Initialises every value this rank stores from (seed, name, global index).
  void init(uint64_t seed);

  const Sharding& sharding() const { return sharding_; }
  bool holds(int unit) const { return slots_.count(unit) > 0; }
  std::vector<int> units() const;
  const std::vector<ParamRef>& params() const { return refs_; }
  // The parameters of a unit held here, in spec order.
  std::span<const ParamRef> params(int unit) const;
  const ParamRef& find(const std::string& name) const;  // throws std::out_of_range

  int64_t unit_numel(int unit) const { return slot(unit).numel; }    // local elements, without padding
  int64_t padded_numel(int unit) const { return slot(unit).padded; }  // the full buffer
  int64_t shard_len(int unit) const { return slot(unit).shard; }      // the shard buffer
  const std::vector<ir::FlatPart>& parts(int unit) const { return slot(unit).parts; }

  // Full parameter values [padded_numel]: the master weights. With ZeRO-3 only while
  // gathered f32 values are bound for compute (bind_compute_values); throws otherwise.
  float* values(int unit);
  // Parameter i (spec order) of a unit as the unit computes with it, in f32: in the values bound
  // for compute where some are (bf16 ones widened into a copy of this parameter alone, kept until
  // unbind_compute_values), else in values(unit).
  const float* value(int unit, size_t i);
  // Elements [offset, offset + shape.numel()) of parameter i seen as `shape`, in the storage type
  // the products and the embedding's lookup read it in: the bound values' (bf16 under
  // train.precision bf16), else f32 in values(unit).
  backend::ConstTensorView compute_view(int unit, size_t i, int64_t offset, backend::Shape shape);
  // ZeRO-3: this rank's shards of the values [shard_len], part after part.
  float* shard_values(int unit);
  // This rank's shard of part `p`'s values [p.zero.len] (in the full buffer below ZeRO-3).
  float* shard_values(int unit, const ir::FlatPart& p);
  // Lends the full values [padded_numel], f32 or bf16, a unit computes with for a while (not
  // owned): ZeRO-3's gathered ones, or the executor's compute copy under train.precision bf16.
  void bind_compute_values(int unit, backend::ConstTensorView full);
  void unbind_compute_values(int unit);
  // The master values [padded_numel] rounded to storage type t (category PARAMS): the compute copy a unit
  // binds under train.precision bf16. Empty for f32, whose units compute with the masters themselves.
  backend::Tensor rounded_values(int unit, backend::DType t);

  // Full gradients [padded_numel], accumulated by backward. With ZeRO >= 2
  // allocated (zeroed) on first use in a step and released after the
  // reduce-scatter (release_full_grads).
  float* grads(int unit);
  float* grad(int unit, size_t i);
  // This rank's shard of part `p`'s gradients [p.zero.len] (after the reduction).
  float* shard_grads(int unit, const ir::FlatPart& p);
  void release_full_grads(int unit);
  // Zeroes the gradients this rank keeps between steps (of one unit, or all).
  void zero_grads(int unit);
  void zero_grads();

  // A unit's values buffer (the full one, or the shard at ZeRO-3), zeroed, and taking it back.
  void allocate_values(int unit);
  void release_values(int unit);
  // The gradient buffers kept between steps, of every unit: released while a switch moves state, allocated
  // (zeroed) again after it.
  void release_grads();
  void allocate_grads();

 private:
  struct Slot {
    int64_t numel = 0, padded = 0, shard = 0;
    std::vector<ir::FlatPart> parts;
    size_t first = 0, count = 0;  // the unit's parameters in refs_
    backend::Tensor values, grads;   // full (padded), when this rank keeps them
    backend::Tensor shard_values_t;  // ZeRO-3: the persistent shard
    backend::Tensor shard_grads_t;   // ZeRO >= 2: the persistent shard
    backend::ConstTensorView bound;  // the values lent for compute (bind_compute_values); null ptr: none
    std::map<size_t, backend::Tensor> widened;  // value(): parameters of bf16 bound values, in f32
  };
  Slot& slot(int unit);
  const Slot& slot(int unit) const;

  const ir::ModelGraph& graph_;
  backend::Backend& be_;
  Sharding sharding_;
  std::map<int, Slot> slots_;
  std::vector<ParamRef> refs_;
  std::map<std::string, size_t> by_name_;
};

}  // namespace piper::model
