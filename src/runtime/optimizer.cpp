// optimizer.cpp — AdamW state, the gradient norm's local part and the update.
#include "runtime/optimizer.hpp"

#include <algorithm>

#include "optim/adamw.hpp"

namespace piper::runtime {

using backend::MemCategory;
using backend::Tensor;

Optimizer::Optimizer(model::Model& model, const config::TrainConfig& train) : model_(model), train_(train) {
  model::ParamStore& ps = model.params();
  for (int u : ps.units()) {
    const int64_t n = ps.sharding().zero(u) >= 1 ? ps.shard_len(u) : ps.padded_numel(u);
    auto& [m, v] = moments_.emplace(u, std::make_pair(Tensor(model.backend(), n, MemCategory::MEM_OPTIMIZER),
                                                      Tensor(model.backend(), n, MemCategory::MEM_OPTIMIZER)))
                       .first->second;
    m.zero();
    v.zero();
  }
}

float* Optimizer::moment(int unit, int which) {
  auto& mv = moments_.at(unit);
  return which == 0 ? mv.first.data() : mv.second.data();
}

// Calls fn(param index, lo, hi, base) for each parameter's part [lo, hi) of the
// unit's buffer in this rank's data-parallel shard (or in all of it), where
// base is the buffer offset of the range's first element.
template <class Fn>
void Optimizer::for_each_owned_range(int unit, bool shard, Fn&& fn) {
  model::ParamStore& ps = model_.params();
  const int64_t base = shard ? ps.shard_offset(unit) : 0;
  const int64_t end = shard ? std::min(base + ps.shard_len(unit), ps.unit_numel(unit)) : ps.unit_numel(unit);
  const std::span<const model::ParamRef> refs = ps.params(unit);
  for (size_t p = 0; p < refs.size(); ++p) {
    const int64_t lo = std::max(refs[p].offset, base), hi = std::min(refs[p].offset + refs[p].numel, end);
    if (lo < hi) fn(p, lo, hi, base);
  }
}

double Optimizer::local_grad_sq() {
  model::ParamStore& ps = model_.params();
  double sq = 0.0;
  const bool tp_lead = ps.sharding().tp_rank == 0;
  for (int u : ps.units())
    for_each_owned_range(u, true, [&](size_t p, int64_t lo, int64_t hi, int64_t base) {
      // Each data-parallel rank adds its shard; a parameter replicated over the tp group counts once.
      if (!ir::split_along(model_.graph().units[static_cast<size_t>(u)].params[p], ir::Axis::TP) && !tp_lead) return;
      sq += model_.backend().sum_squares(backend::view(model_.backend(), ps.shard_grads(u) + (lo - base), {hi - lo}));
    });
  return sq;
}

double Optimizer::begin_step(int64_t step, double grad_norm) {
  clip_scale_ = optim::clip_coefficient(grad_norm, train_.grad_clip);
  lr_ = optim::lr_at(train_, step);
  ++steps_;
  return lr_;
}

void Optimizer::update(int unit) {
  model::ParamStore& ps = model_.params();
  backend::Backend& be = model_.backend();
  backend::AdamWStep st{lr_, train_.beta1, train_.beta2, train_.eps, train_.weight_decay, steps_, true, clip_scale_};
  auto& [m, v] = moments_.at(unit);
  const auto& spec = model_.graph().units[static_cast<size_t>(unit)];
  const bool sharded = ps.sharding().zero(unit) >= 1;  // each rank updates its shard, else everything
  float* values = sharded ? ps.shard_values(unit) : ps.values(unit);
  float* grads = sharded ? ps.shard_grads(unit) : ps.grads(unit);
  for_each_owned_range(unit, sharded, [&](size_t p, int64_t lo, int64_t hi, int64_t base) {
    const backend::Shape n{hi - lo};
    st.decay = spec.params[p].weight_decay;
    be.adamw_update(backend::view(be, values + (lo - base), n), backend::view(be, grads + (lo - base), n),
                    backend::view(be, m.data() + (lo - base), n), backend::view(be, v.data() + (lo - base), n), st);
  });
  ps.zero_grads(unit);
}

}  // namespace piper::runtime
