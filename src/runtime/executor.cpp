// executor.cpp — instruction dispatch for one training step: the compute
// stream in program order, the communication stream issued ahead of it.
#include "runtime/executor.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>

#include "optim/adamw.hpp"

namespace piper::runtime {

using backend::MemCategory;
using backend::Tensor;
using ir::NodeKind;
using ir::Payload;

namespace {

// How many compute instructions ahead a receive or a ZeRO-3 gather is posted:
// enough to hide its latency, few enough to keep memory at the schedule's.
constexpr size_t kLookahead = 2;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

bool zero3_gather(const ir::Instr& c) { return c.kind == NodeKind::ALLGATHER && c.microbatch >= 0; }

}  // namespace

Executor::Executor(model::Model& model, ir::Program program, const config::TrainConfig& train, Groups groups)
    : model_(model), program_(std::move(program)), train_(train), groups_(groups) {
  last_unit_ = static_cast<int>(model.graph().units.size()) - 1;
  model::ParamStore& ps = model.params();
  for (int u : ps.units()) {
    const int64_t n = ps.sharding().zero >= 1 ? ps.shard_len(u) : ps.padded_numel(u);
    auto& [m, v] = moments_.emplace(u, std::make_pair(Tensor(model.backend(), n, MemCategory::MEM_OPTIMIZER),
                                                      Tensor(model.backend(), n, MemCategory::MEM_OPTIMIZER)))
                       .first->second;
    m.zero();
    v.zero();
  }
  for (size_t c = 0; c < program_.comm.size(); ++c) comm_index_[program_.comm[c].node] = c;
  first_use_.assign(program_.comm.size(), program_.compute.size());
  for (size_t i = 0; i < program_.compute.size(); ++i)
    for (int w : program_.compute[i].waits) {
      auto it = comm_index_.find(w);
      if (it != comm_index_.end()) first_use_[it->second] = std::min(first_use_[it->second], i);
    }
  const bool needs_dp = std::any_of(program_.comm.begin(), program_.comm.end(),
                                    [](const ir::Instr& c) { return c.group == ir::GroupDim::GROUP_DP; });
  if (needs_dp && !groups_.dp)
    throw std::logic_error("rank " + std::to_string(program_.rank) + ": data-parallel collectives without a dp group");
}

Tensor Executor::buffer(int64_t n, MemCategory c) { return Tensor(model_.backend(), n, c); }

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

// ---- compute stream -----------------------------------------------------------

void Executor::forward(const ir::Instr& in, const model::MicroBatch& mb, StepStats& st) {
  const int u = in.unit, i = in.microbatch;
  const float* x = u > 0 ? get(acts_, {u - 1, i}, "the input activation") : nullptr;
  float* y = nullptr;
  if (u < last_unit_) {
    Tensor out = buffer(mb.rows() * model_.config().d_model, MemCategory::MEM_ACTIVATIONS);
    y = out.data();
    acts_[{u, i}] = std::move(out);
  }
  st.loss_sum += model_.unit(u).forward(i, mb, x, y);
}

// BWD and BWD_I: input gradients (and, fused, weight gradients); BWD_W: weight gradients.
void Executor::backward(const ir::Instr& in) {
  const int u = in.unit, i = in.microbatch;
  model::Unit& unit = model_.unit(u);
  if (in.kind == NodeKind::BWD_W && u > 0) {
    unit.backward_weight(i);
    return;
  }
  const float* x = u > 0 ? get(acts_, {u - 1, i}, "the input activation") : nullptr;
  const float* dy = u < last_unit_ ? get(grads_, {u + 1, i}, "the output gradient") : nullptr;
  Tensor grad_in;  // the input gradient has the shape of the input activation
  if (u > 0) grad_in = buffer(acts_.at({u - 1, i}).numel(), MemCategory::MEM_BUFFERS);
  // The embedding has no input gradient: its weight half is the whole backward.
  if (in.kind == NodeKind::BWD || u == 0) {
    unit.backward(i, x, dy, grad_in.data());
  } else {
    unit.backward_input(i, x, dy, grad_in.data());
  }
  take(grads_, {u + 1, i});
  take(acts_, {u - 1, i});
  if (u > 0) grads_[{u, i}] = std::move(grad_in);
}

// Clipping needs the norm over every gradient of the step: all reductions
// complete, then each rank sums the squares of its shard and the world adds.
void Executor::prepare_norm(int64_t step, StepStats& st) {
  for (const ir::Instr& c : program_.comm)
    if (c.payload == Payload::PAYLOAD_WGRAD) complete(c.node, st);
  model::ParamStore& ps = model_.params();
  double sq = 0.0;
  const bool tp_lead = ps.sharding().tp_rank == 0;
  for (int u : ps.units())
    for_each_owned_range(u, true, [&](size_t p, int64_t lo, int64_t hi, int64_t base) {
      // Each data-parallel rank adds its shard; a parameter replicated over the tp group counts once.
      if (model_.graph().units[static_cast<size_t>(u)].params[p].tp_dim < 0 && !tp_lead) return;
      sq += optim::sum_squares(ps.shard_grads(u) + (lo - base), hi - lo);
    });
  if (groups_.world && groups_.world->size() > 1) {
    const auto t0 = std::chrono::steady_clock::now();
    groups_.world->allreduce_double(&sq, 1);
    st.comm_ms += ms_since(t0);
  }
  st.grad_norm = std::sqrt(sq);
  clip_scale_ = optim::clip_coefficient(st.grad_norm, train_.grad_clip);
  st.lr = optim::lr_at(train_, step);
  norm_ready_ = true;
  ++adam_steps_;
}

// Calls fn(param index, lo, hi, base) for each parameter's part [lo, hi) of the
// unit's buffer in this rank's data-parallel shard (or in all of it), where
// base is the buffer offset of the range's first element.
template <class Fn>
void Executor::for_each_owned_range(int unit, bool shard, Fn&& fn) {
  model::ParamStore& ps = model_.params();
  const int64_t base = shard ? ps.shard_offset(unit) : 0;
  const int64_t end = shard ? std::min(base + ps.shard_len(unit), ps.unit_numel(unit)) : ps.unit_numel(unit);
  const size_t n_params = model_.graph().units[static_cast<size_t>(unit)].params.size();
  int64_t off = 0;
  for (size_t p = 0; p < n_params; ++p) {
    const int64_t lo = std::max(off, base), hi = std::min(off + ps.param_numel(unit, p), end);
    if (lo < hi) fn(p, lo, hi, base);
    off += ps.param_numel(unit, p);
  }
}

void Executor::update(int unit, int64_t step, StepStats& st) {
  if (!norm_ready_) prepare_norm(step, st);
  model::ParamStore& ps = model_.params();
  const optim::AdamWHyper h{st.lr, train_.beta1, train_.beta2, train_.eps, train_.weight_decay};
  auto& [m, v] = moments_.at(unit);
  const auto& spec = model_.graph().units[static_cast<size_t>(unit)];
  const bool sharded = ps.sharding().zero >= 1;  // each rank updates its shard, else everything
  float* values = sharded ? ps.shard_values(unit) : ps.values(unit);
  float* grads = sharded ? ps.shard_grads(unit) : ps.grads(unit);
  for_each_owned_range(unit, sharded, [&](size_t p, int64_t lo, int64_t hi, int64_t base) {
    optim::adamw_update(values + (lo - base), grads + (lo - base), m.data() + (lo - base), v.data() + (lo - base),
                        hi - lo, adam_steps_, h, spec.params[p].weight_decay, clip_scale_);
  });
  ps.zero_grads(unit);
}

// ---- communication stream -------------------------------------------------------

bool Executor::ready(const ir::Instr& c) const {
  return std::all_of(c.waits.begin(), c.waits.end(), [&](int w) { return done_.count(w) > 0; });
}

// Issues every communication instruction whose inputs are ready. Point-to-point
// messages are matched by tag and may go out of program order; collectives go
// in program order (every member of a group issues them alike). Receives and
// ZeRO-3 gathers wait until their consumer is near.
void Executor::pump(size_t compute_index) {
  if (step_trace_) poll_traced();
  bool collective_blocked = false;
  for (size_t k = comm_next_; k < program_.comm.size(); ++k) {
    if (issued_[k]) continue;
    const ir::Instr& c = program_.comm[k];
    const bool p2p = c.kind == NodeKind::SEND || c.kind == NodeKind::RECV;
    if (!p2p && collective_blocked) continue;
    const bool deferred = (c.kind == NodeKind::RECV || zero3_gather(c)) && first_use_[k] > compute_index + kLookahead;
    if (!ready(c) || deferred) {
      collective_blocked |= !p2p;
      continue;
    }
    issue_at(k);
  }
}

void Executor::issue_at(size_t k) {
  if (step_trace_) issued_at_[k] = TraceClock::now();
  issue(program_.comm[k]);
  issued_[k] = 1;
  while (comm_next_ < issued_.size() && issued_[comm_next_]) ++comm_next_;
}

void Executor::issue(const ir::Instr& c) {
  model::ParamStore& ps = model_.params();
  auto& reqs = inflight_[c.node];
  auto& held = held_[c.node];
  const Key key{c.unit, c.microbatch};
  auto& values_map = c.payload == Payload::PAYLOAD_ACTIVATION ? acts_ : grads_;
  switch (c.kind) {
    case NodeKind::SEND: {
      Tensor t = take(values_map, key);
      if (t.empty())
        throw std::logic_error("rank " + std::to_string(program_.rank) + ": nothing to send for unit " +
                               std::to_string(c.unit) + " mb" + std::to_string(c.microbatch));
      reqs.push_back(groups_.world->isend(t.data(), static_cast<size_t>(t.numel()), c.peer, c.tag));
      held.push_back(std::move(t));
      break;
    }
    case NodeKind::RECV: {
      Tensor t = buffer(c.bytes / static_cast<int64_t>(sizeof(float)),
                        c.payload == Payload::PAYLOAD_ACTIVATION ? MemCategory::MEM_ACTIVATIONS
                                                                 : MemCategory::MEM_BUFFERS);
      reqs.push_back(groups_.world->irecv(t.data(), static_cast<size_t>(t.numel()), c.peer, c.tag));
      values_map[key] = std::move(t);  // the consumer waits for this node before reading
      break;
    }
    case NodeKind::ALLREDUCE:
      for (int u : c.units)
        reqs.push_back(groups_.dp->iallreduce(ps.grads(u), static_cast<size_t>(ps.padded_numel(u))));
      break;
    case NodeKind::REDUCE_SCATTER:
      for (int u : c.units)
        reqs.push_back(groups_.dp->ireduce_scatter(ps.grads(u), ps.shard_grads(u), static_cast<size_t>(ps.shard_len(u))));
      break;
    case NodeKind::ALLGATHER:
      for (int u : c.units) {
        const auto n = static_cast<size_t>(ps.shard_len(u));
        if (zero3_gather(c)) {  // into a fresh full buffer the unit borrows
          Tensor full = buffer(ps.padded_numel(u), MemCategory::MEM_PARAMS);
          reqs.push_back(groups_.dp->iallgather(ps.shard_values(u), full.data(), n));
          held.push_back(std::move(full));
        } else {  // updated shards back into every replica's full values
          Tensor mine = buffer(ps.shard_len(u), MemCategory::MEM_BUFFERS);
          model_.backend().copy(mine.data(), ps.shard_values(u), n * sizeof(float));
          reqs.push_back(groups_.dp->iallgather(mine.data(), ps.values(u), n));
          held.push_back(std::move(mine));
        }
      }
      break;
    default:
      throw std::logic_error(std::string(ir::node_kind_name(c.kind)) + " is not supported by this executor");
  }
}

// Waits for communication node `node` (issuing it, and what precedes it, first).
void Executor::complete(int node, StepStats& st) {
  if (done_.count(node)) return;
  const size_t idx = comm_index_.at(node);
  // Collectives before it go first, in order; a point-to-point message alone.
  const bool p2p = program_.comm[idx].kind == NodeKind::SEND || program_.comm[idx].kind == NodeKind::RECV;
  for (size_t k = p2p ? idx : comm_next_; k <= idx; ++k) {
    const ir::Instr& c = program_.comm[k];
    if (issued_[k] || (k != idx && (c.kind == NodeKind::SEND || c.kind == NodeKind::RECV))) continue;
    if (!ready(c))
      throw std::logic_error("rank " + std::to_string(program_.rank) + ": communication node " +
                             std::to_string(c.node) + " waits for compute that has not run");
    issue_at(k);
  }
  const ir::Instr& c = program_.comm[idx];
  const auto t0 = std::chrono::steady_clock::now();
  comm::wait_all(inflight_[node]);
  (c.kind == NodeKind::RECV ? st.idle_ms : st.comm_ms) += ms_since(t0);
  if (step_trace_) trace_comm_end(idx);
  inflight_.erase(node);
  if (c.kind == NodeKind::REDUCE_SCATTER)
    for (int u : c.units) model_.params().release_full_grads(u);
  if (!zero3_gather(c)) held_.erase(node);
  done_.insert(node);
}

// While tracing: ends the event of every in-flight communication now complete.
// Request::test only polls; waiting stays with complete().
void Executor::poll_traced() {
  for (auto& [node, reqs] : inflight_) {
    const size_t k = comm_index_.at(node);
    if (comm_traced_[k]) continue;
    bool all = true;
    for (comm::Request& r : reqs) all = r.test() && all;
    if (all) trace_comm_end(k);
  }
}

void Executor::trace_comm_end(size_t k) {
  if (comm_traced_[k]) return;
  comm_traced_[k] = 1;
  step_trace_->add(program_.comm[k].node, step_, issued_at_[k], TraceClock::now());
}

void Executor::drain(StepStats& st) {
  for (const ir::Instr& c : program_.comm) complete(c.node, st);
}

StepStats Executor::run_step(int64_t step, const std::vector<model::MicroBatch>& mbs) {
  StepStats st;
  norm_ready_ = false;
  done_.clear();
  comm_next_ = 0;
  issued_.assign(program_.comm.size(), 0);
  uses_left_.clear();
  step_ = step;
  step_trace_ = recorder_ && recorder_->traces(step) ? recorder_ : nullptr;
  if (step_trace_) {
    issued_at_.assign(program_.comm.size(), TraceClock::time_point{});
    comm_traced_.assign(program_.comm.size(), 0);
  }
  for (const ir::Instr& in : program_.compute)
    for (int w : in.waits)
      if (comm_index_.count(w) && zero3_gather(program_.comm[comm_index_.at(w)])) ++uses_left_[w];
  model::ParamStore& ps = model_.params();
  for (size_t i = 0; i < program_.compute.size(); ++i) {
    const ir::Instr& in = program_.compute[i];
    pump(i);
    std::vector<int> gathers;
    for (int w : in.waits) {
      complete(w, st);
      if (uses_left_.count(w)) gathers.push_back(w);
    }
    for (int w : gathers) ps.bind_full_values(in.unit, held_.at(w).front().data());
    // The first update's wait for every reduction and the norm's all-reduce
    // count as communication, not as the update's compute.
    if (in.kind == NodeKind::UPD && !norm_ready_) prepare_norm(step, st);
    const auto t0 = std::chrono::steady_clock::now();
    switch (in.kind) {
      case NodeKind::FWD:
        forward(in, mbs.at(static_cast<size_t>(in.microbatch)), st);
        break;
      case NodeKind::BWD:
      case NodeKind::BWD_I:
      case NodeKind::BWD_W:
        backward(in);
        break;
      case NodeKind::UPD:
        update(in.unit, step, st);
        break;
      default:
        throw std::logic_error(std::string("communication instruction ") + ir::node_kind_name(in.kind) +
                               " on the compute stream");
    }
    const auto t1 = std::chrono::steady_clock::now();
    st.compute_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
    if (step_trace_) step_trace_->add(in.node, step, t0, t1);
    for (int w : gathers) {
      ps.unbind_full_values(in.unit);
      if (--uses_left_[w] == 0) held_.erase(w);
    }
    done_.insert(in.node);
    pump(i);
  }
  drain(st);
  if (!acts_.empty() || !grads_.empty())
    throw std::logic_error("rank " + std::to_string(program_.rank) + ": " +
                           std::to_string(acts_.size() + grads_.size()) +
                           " activations or gradients outlived the step; the program is incomplete");
  return st;
}

}  // namespace piper::runtime
