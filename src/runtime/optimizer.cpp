// optimizer.cpp — AdamW state, the gradient norm's local part and the update.
#include "runtime/optimizer.hpp"

#include <algorithm>

#include "optim/adamw.hpp"

namespace piper::runtime {

using backend::MemCategory;
using backend::Tensor;

Optimizer::Optimizer(model::Model& model, const config::TrainConfig& train, bool allocate)
    : model_(model), train_(train) {
  for (int u : model.params().units()) {
    moments_[u];
    if (!allocate) continue;
    allocate_moment(u, 0);
    allocate_moment(u, 1);
  }
}

void Optimizer::allocate_moment(int unit, int which) {
  const model::ParamStore& ps = model_.params();
  const int64_t n = ps.sharding().zero(unit) >= 1 ? ps.shard_len(unit) : ps.padded_numel(unit);
  auto& mv = moments_.at(unit);
  Tensor& t = which == 0 ? mv.first : mv.second;
  t = Tensor(model_.backend(), n, MemCategory::MEM_OPTIMIZER);
  t.zero();
}

void Optimizer::release_moment(int unit, int which) {
  auto& mv = moments_.at(unit);
  (which == 0 ? mv.first : mv.second) = Tensor();
}

float* Optimizer::moment(int unit, int which) {
  auto& mv = moments_.at(unit);
  return which == 0 ? mv.first.data() : mv.second.data();
}

// Calls fn(param index, part, o, n) for each parameter's n elements in this
// rank's shard of each part of the unit (or in all of the part), starting o
// elements after the part's shard start (or after the part's start).
template <class Fn>
void Optimizer::for_each_owned_range(int unit, bool shard, Fn&& fn) {
  model::ParamStore& ps = model_.params();
  const std::span<const model::ParamRef> refs = ps.params(unit);
  for (const ir::FlatPart& part : ps.parts(unit)) {
    const int64_t begin = shard ? part.zero.offset : 0;
    const int64_t end = shard ? std::min(part.zero.offset + part.zero.len, part.numel) : part.numel;
    for (size_t p = part.first; p < part.first + part.count; ++p) {
      const int64_t at = refs[p].offset - part.full_offset;  // the parameter's start within the part
      const int64_t lo = std::max(at, begin), hi = std::min(at + refs[p].numel, end);
      if (lo < hi) fn(p, part, lo - begin, hi - lo);
    }
  }
}

double Optimizer::local_grad_sq() {
  model::ParamStore& ps = model_.params();
  double sq = 0.0;
  const bool tp_lead = ps.sharding().tp_rank == 0;
  for (int u : ps.units())
    for_each_owned_range(u, true, [&](size_t p, const ir::FlatPart& part, int64_t o, int64_t n) {
      // Each rank adds its shard of each part; a parameter replicated over the tp group counts once.
      if (!ir::split_along(model_.graph().units[static_cast<size_t>(u)].params[p], ir::Axis::TP) && !tp_lead) return;
      sq += model_.backend().sum_squares(backend::view(model_.backend(), ps.shard_grads(u, part) + o, {n}));
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
  const bool sharded = ps.sharding().zero(unit) >= 1;  // each rank updates its shards, else everything
  for_each_owned_range(unit, sharded, [&](size_t p, const ir::FlatPart& part, int64_t o, int64_t len) {
    const backend::Shape n{len};
    // The moments are shard buffers when sharded, full buffers otherwise.
    const int64_t mo = (sharded ? part.shard_offset : part.full_offset) + o;
    float* values = sharded ? ps.shard_values(unit, part) + o : ps.values(unit) + part.full_offset + o;
    float* grads = sharded ? ps.shard_grads(unit, part) + o : ps.grads(unit) + part.full_offset + o;
    st.decay = spec.params[p].weight_decay;
    be.adamw_update(backend::view(be, values, n), backend::view(be, grads, n), backend::view(be, m.data() + mo, n),
                    backend::view(be, v.data() + mo, n), st);
  });
  ps.zero_grads(unit);
}

}  // namespace piper::runtime
