// executor.cpp — instruction dispatch for one training step.
#include "runtime/executor.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "optim/adamw.hpp"

namespace piper::runtime {

using backend::MemCategory;
using backend::Tensor;

Executor::Executor(model::Model& model, ir::Program program, const config::TrainConfig& train)
    : model_(model), program_(std::move(program)), train_(train) {
  last_unit_ = static_cast<int>(model.graph().units.size()) - 1;
  for (int u : model.params().units()) {
    const int64_t n = model.params().unit_numel(u);
    auto& [m, v] = moments_.emplace(u, std::make_pair(Tensor(model.backend(), n, MemCategory::MEM_OPTIMIZER),
                                                      Tensor(model.backend(), n, MemCategory::MEM_OPTIMIZER)))
                       .first->second;
    m.zero();
    v.zero();
  }
  if (!program_.comm.empty())
    throw std::runtime_error("rank " + std::to_string(program_.rank) + ": the program has " +
                             std::to_string(program_.comm.size()) +
                             " communication instructions, and this build has no communicator");
}

Tensor Executor::take(std::map<Key, Tensor>& m, Key k) {
  auto it = m.find(k);
  if (it == m.end()) return {};
  Tensor t = std::move(it->second);
  m.erase(it);
  return t;
}

float* Executor::get(std::map<Key, Tensor>& m, Key k, const char* what) {
  auto it = m.find(k);
  if (it == m.end())
    throw std::logic_error("rank " + std::to_string(program_.rank) + ": " + what + " of unit " +
                           std::to_string(k.first) + " mb" + std::to_string(k.second) +
                           " is not available; the program order is inconsistent");
  return it->second.data();
}

void Executor::forward(const ir::Instr& in, const model::MicroBatch& mb, StepStats& st) {
  const int u = in.unit, i = in.microbatch;
  const float* x = u > 0 ? get(acts_, {u - 1, i}, "the input activation") : nullptr;
  float* y = nullptr;
  if (u < last_unit_) {
    Tensor out(model_.backend(), mb.rows() * model_.config().d_model, MemCategory::MEM_ACTIVATIONS);
    y = out.data();
    acts_[{u, i}] = std::move(out);
  }
  st.loss_sum += model_.unit(u).forward(i, mb, x, y);
}

// BWD and BWD_I: input gradients (and, fused, weight gradients); BWD_W: weight gradients.
void Executor::backward(const ir::Instr& in) {
  const int u = in.unit, i = in.microbatch;
  model::Unit& unit = model_.unit(u);
  if (in.kind == ir::NodeKind::BWD_W && u > 0) {
    unit.backward_weight(i);
    return;
  }
  const float* x = u > 0 ? get(acts_, {u - 1, i}, "the input activation") : nullptr;
  const float* dy = u < last_unit_ ? get(grads_, {u + 1, i}, "the output gradient") : nullptr;
  Tensor grad_in;  // the input gradient has the shape of the input activation
  if (u > 0) grad_in = Tensor(model_.backend(), acts_.at({u - 1, i}).numel(), MemCategory::MEM_BUFFERS);
  // The embedding has no input gradient: its weight half is the whole backward.
  const bool whole = in.kind == ir::NodeKind::BWD || u == 0;
  if (whole) {
    unit.backward(i, x, dy, grad_in.data());
  } else {
    unit.backward_input(i, x, dy, grad_in.data());
  }
  take(grads_, {u + 1, i});
  take(acts_, {u - 1, i});
  if (u > 0) grads_[{u, i}] = std::move(grad_in);
}

void Executor::update(int unit, int64_t step, StepStats& st) {
  model::ParamStore& ps = model_.params();
  if (!norm_ready_) {  // clipping needs the norm over every gradient of the step
    double sq = 0.0;
    for (int u : ps.units()) sq += optim::sum_squares(ps.grads(u), ps.unit_numel(u));
    st.grad_norm = std::sqrt(sq);
    clip_scale_ = optim::clip_coefficient(st.grad_norm, train_.grad_clip);
    st.lr = optim::lr_at(train_, step);
    norm_ready_ = true;
    ++adam_steps_;
  }
  const optim::AdamWHyper h{st.lr, train_.beta1, train_.beta2, train_.eps, train_.weight_decay};
  auto& [m, v] = moments_.at(unit);
  const auto& spec = model_.graph().units[static_cast<size_t>(unit)];
  int64_t off = 0;
  for (size_t p = 0; p < spec.params.size(); ++p) {
    const int64_t n = spec.params[p].numel();
    optim::adamw_update(ps.value(unit, p), ps.grad(unit, p), m.data() + off, v.data() + off, n,
                        adam_steps_, h, spec.params[p].weight_decay, clip_scale_);
    off += n;
  }
  model_.backend().fill_zero(ps.grads(unit), static_cast<size_t>(ps.unit_numel(unit)) * sizeof(float));
}

StepStats Executor::run_step(int64_t step, const std::vector<model::MicroBatch>& mbs) {
  StepStats st;
  norm_ready_ = false;
  for (const ir::Instr& in : program_.compute) {
    switch (in.kind) {
      case ir::NodeKind::FWD:
        forward(in, mbs.at(static_cast<size_t>(in.microbatch)), st);
        break;
      case ir::NodeKind::BWD:
      case ir::NodeKind::BWD_I:
      case ir::NodeKind::BWD_W:
        backward(in);
        break;
      case ir::NodeKind::UPD:
        update(in.unit, step, st);
        break;
      default:
        throw std::logic_error(std::string("communication instruction ") +
                               ir::node_kind_name(in.kind) + " on the compute stream");
    }
  }
  if (!acts_.empty() || !grads_.empty())
    throw std::logic_error("rank " + std::to_string(program_.rank) + ": " +
                           std::to_string(acts_.size() + grads_.size()) +
                           " activations or gradients outlived the step; the program is incomplete");
  return st;
}

}  // namespace piper::runtime
