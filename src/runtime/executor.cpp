// executor.cpp — one training step of a rank's program, played by
// ir::Player: compute dispatched to the units and the optimiser,
// communication issued non-blocking on the communicator of its group.
#include "runtime/executor.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>

namespace piper::runtime {

using backend::MemCategory;
using backend::Tensor;
using ir::NodeKind;
using ir::Payload;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The unit pass a segment or a communication point belongs to.
NodeKind pass_kind(ir::Pass p) {
  switch (p) {
    case ir::Pass::PASS_F: return NodeKind::FWD;
    case ir::Pass::PASS_BI: return NodeKind::BWD_I;
    case ir::Pass::PASS_BW: return NodeKind::BWD_W;
    default: return NodeKind::BWD;
  }
}

}  // namespace

comm::Communicator* Groups::of(ir::GroupDim g) const {
  switch (g) {
    case ir::GroupDim::GROUP_DP: return dp;
    case ir::GroupDim::GROUP_TP: return tp;
    case ir::GroupDim::GROUP_EP: return ep;
    case ir::GroupDim::GROUP_WORLD: return world;
    case ir::GroupDim::GROUP_NONE: break;
  }
  return nullptr;
}

Executor::Executor(model::Model& model, Optimizer& optimizer, ir::Program program, Groups groups, Passes passes)
    : model_(model),
      optimizer_(optimizer),
      program_(std::move(program)),
      player_(program_),
      groups_(groups),
      passes_(passes) {
  last_unit_ = static_cast<int>(model.graph().units.size()) - 1;
  for (const ir::Instr& c : program_.comm) group_of(c);  // every group this program talks over exists
  for (const ir::Instr& in : program_.compute)
    if (in.kind == NodeKind::RECOMP) recomputed_[{in.unit, in.microbatch}] = in.recompute;
}

// A message goes over the world; a collective over the communicator of its group.
comm::Communicator& Executor::group_of(const ir::Instr& c) const {
  comm::Communicator* g = ir::is_p2p(c.kind) ? groups_.world : groups_.of(c.group);
  if (!g)
    throw std::logic_error("rank " + std::to_string(program_.rank) + ": " + ir::node_kind_name(c.kind) + " node " +
                           std::to_string(c.node) + " runs over the " + ir::group_name(c.group) +
                           " group, which this rank has no communicator for");
  return *g;
}

// An activation or a gradient between units: [rows, D] in the model's activation storage type.
Tensor Executor::boundary(int64_t rows, MemCategory c) {
  return Tensor(model_.backend(), {rows, model_.config().d_model}, c, model_.storage_dtype());
}

Tensor Executor::take(std::map<Key, Tensor>& m, Key k) {
  auto it = m.find(k);
  if (it == m.end()) return {};
  Tensor t = std::move(it->second);
  m.erase(it);
  return t;
}

Tensor& Executor::get(std::map<Key, Tensor>& m, Key k, const char* what) {
  auto it = m.find(k);
  if (it == m.end())
    throw std::logic_error("rank " + std::to_string(program_.rank) + ": " + what + " of unit " +
                           std::to_string(k.first) + " mb" + std::to_string(k.second) +
                           " is not available; the program order is inconsistent");
  return it->second;
}

// ---- compute stream -----------------------------------------------------------

void Executor::run(size_t i) {
  const ir::Instr& in = program_.compute[i];
  if (step_trace_) poll_traced();
  model::ParamStore& ps = model_.params();
  std::vector<int> gathers;  // ZeRO-3: the unit computes with its gathered parameters
  for (int w : in.waits)
    if (uses_left_.count(w)) gathers.push_back(w);
  const bool unit_pass = in.kind == NodeKind::FWD || in.kind == NodeKind::BWD || in.kind == NodeKind::BWD_I ||
                         in.kind == NodeKind::BWD_W || in.kind == NodeKind::RECOMP;
  // The values the unit computes with, where they are not its own f32 ones: ZeRO-3's gathered values
  // (in the storage type), or its compute copy.
  backend::ConstTensorView bound;
  for (int w : gathers) bound = held_[static_cast<size_t>(player_.comm_index(w))].front().view();
  if (gathers.empty() && unit_pass) bound = compute_copy(in.unit);
  if (bound.ptr) ps.bind_compute_values(in.unit, bound);
  const auto t0 = std::chrono::steady_clock::now();
  switch (in.kind) {
    case NodeKind::FWD:
    case NodeKind::BWD:
    case NodeKind::BWD_I:
    case NodeKind::BWD_W:
      run_segment(in);
      break;
    case NodeKind::RECOMP:
      recompute(in);
      break;
    case NodeKind::NORM:
      norm_squares();
      break;
    case NodeKind::UPD:
      update(in.unit);
      break;
    default:
      throw std::logic_error(std::string("communication instruction ") + ir::node_kind_name(in.kind) +
                             " on the compute stream");
  }
  const auto t1 = std::chrono::steady_clock::now();
  stats_->compute_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
  if (step_trace_) step_trace_->add(in.node, step_, t0, t1);
  if (bound.ptr) ps.unbind_compute_values(in.unit);
  for (int w : gathers)
    if (--uses_left_[w] == 0) held_[static_cast<size_t>(player_.comm_index(w))].clear();
  if (step_trace_) poll_traced();
}

// One segment of a unit pass. The output activation is allocated by the
// forward's first segment; the input gradient is written by the backward's
// last, which also releases what the pass consumed.
void Executor::run_segment(const ir::Instr& in) {
  const int u = in.unit, i = in.microbatch;
  model::Unit& unit = model_.unit(u);
  const bool first = in.segment == 0, last = in.segment + 1 == unit.shape(in.kind).segments;
  model::PassArgs a;
  if (in.kind == NodeKind::FWD) {
    const model::MicroBatch& mb = mbs_->at(static_cast<size_t>(i));
    a.mb = &mb;
    if (u > 0) a.x = get(acts_, {u - 1, i}, "the input activation").view();
    if (u < last_unit_) {
      if (first) acts_[{u, i}] = boundary(mb.rows(), MemCategory::MEM_ACTIVATIONS);
      a.y = get(acts_, {u, i}, "the output activation").view();
    }
    stats_->loss_sum += unit.run(NodeKind::FWD, in.segment, i, a);
    if (!last) return;
    if (passes_ == Passes::FORWARD) forward_done(u, i);
    const auto r = recomputed_.find({u, i});
    if (r != recomputed_.end()) unit.drop(i, r->second);
    return;
  }
  // BWD_W of a unit with an input gradient reads only what its BWD_I kept; the
  // embedding's BWD_W is its whole backward.
  const bool weight_half = in.kind == NodeKind::BWD_W && u > 0;
  if (weight_half) {
    unit.run(in.kind, in.segment, i, a);
    return;
  }
  if (u > 0) a.x = get(acts_, {u - 1, i}, "the input activation").view();
  if (u < last_unit_) a.dy = get(grads_, {u + 1, i}, "the output gradient").view();
  Tensor grad_in;  // the input gradient has the shape of the input activation
  if (u > 0 && last) {
    grad_in = boundary(acts_.at({u - 1, i}).shape()[0], MemCategory::MEM_BUFFERS);
    a.dx = grad_in.view();
  }
  unit.run(in.kind, in.segment, i, a);
  if (!last) return;
  take(grads_, {u + 1, i});
  take(acts_, {u - 1, i});
  if (u > 0) grads_[{u, i}] = std::move(grad_in);
}

// Passes::FORWARD: a unit's forward is complete (its last segment), and no backward reads what it saved
// or its input activation.
void Executor::forward_done(int unit, int mb) {
  model_.unit(unit).release(mb);
  take(acts_, {unit - 1, mb});
}

// RECOMP: the unit's dropped state again, from its input activation (kept until its backward).
void Executor::recompute(const ir::Instr& in) {
  const int u = in.unit, i = in.microbatch;
  model_.unit(u).recompute(i, mbs_->at(static_cast<size_t>(i)),
                           get(acts_, {u - 1, i}, "the input activation").view(), in.recompute);
}

// NORM: the sum of squares of this rank's gradients, once they are final
// (Optimizer::local_grad_sq). The world's total arrives by the norm's all-reduce.
void Executor::norm_squares() { norm_sq_ = optimizer_.local_grad_sq(); }

// Before the first update: the clipping coefficient and the learning rate.
void Executor::finish_norm() {
  stats_->grad_norm = std::sqrt(norm_sq_);
  stats_->lr = optimizer_.begin_step(step_, stats_->grad_norm);
  norm_ready_ = true;
}

void Executor::update(int unit) {
  if (!norm_ready_) finish_norm();
  compute_copies_.erase(unit);
  optimizer_.update(unit);
}

// ---- communication stream -------------------------------------------------------

void Executor::issue(size_t k) {
  const ir::Instr& c = program_.comm[k];
  if (step_trace_) issued_at_[k] = TraceClock::now();
  model::ParamStore& ps = model_.params();
  comm::Communicator& group = group_of(c);
  auto& reqs = inflight_[k];
  auto& held = held_[k];
  const Key key{c.unit, c.microbatch};
  auto& values_map = c.payload == Payload::PAYLOAD_ACTIVATION ? acts_ : grads_;
  if (c.payload == Payload::PAYLOAD_UNIT) {  // a tensor-parallel collective between two segments of a pass
    const model::CommBuffer b = model_.unit(c.unit).point(pass_kind(c.pass), c.segment, c.microbatch);
    const auto n = static_cast<size_t>(b.count);
    if (c.kind == NodeKind::ALLTOALL)
      reqs.push_back(b.send_counts.empty()
                         ? group.ialltoall(b.send, b.recv, n / static_cast<size_t>(group.size()), b.dtype)
                         : group.ialltoallv(b.send, b.send_counts, b.recv, b.recv_counts, b.dtype));
    else
      reqs.push_back(c.kind == NodeKind::ALLGATHER ? group.iallgather(b.send, b.recv, n, b.dtype)
                                                   : group.iallreduce(b.send_floats(), n));
    return;
  }
  switch (c.kind) {
    case NodeKind::SEND: {
      Tensor t = take(values_map, key);
      if (t.empty())
        throw std::logic_error("rank " + std::to_string(program_.rank) + ": nothing to send for unit " +
                               std::to_string(c.unit) + " mb" + std::to_string(c.microbatch));
      reqs.push_back(group.isend(t.view().ptr, static_cast<size_t>(t.numel()), t.dtype(), c.peer, c.tag));
      held.push_back(std::move(t));
      break;
    }
    case NodeKind::RECV: {
      Tensor t = boundary(mbs_->at(static_cast<size_t>(c.microbatch)).rows(),
                          c.payload == Payload::PAYLOAD_ACTIVATION ? MemCategory::MEM_ACTIVATIONS
                                                                   : MemCategory::MEM_BUFFERS);
      if (static_cast<int64_t>(t.bytes()) != c.bytes)
        throw std::logic_error("rank " + std::to_string(program_.rank) + ": RECV node " + std::to_string(c.node) +
                               " of unit " + std::to_string(c.unit) + " mb" + std::to_string(c.microbatch) +
                               " moves " + std::to_string(c.bytes) + " bytes, but the activation is " +
                               t.shape().str() + " " + backend::dtype_name(t.dtype()) + " (" +
                               std::to_string(t.bytes()) + " bytes)");
      reqs.push_back(group.irecv(t.view().ptr, static_cast<size_t>(t.numel()), t.dtype(), c.peer, c.tag));
      values_map[key] = std::move(t);  // the consumer waits for this node before reading
      break;
    }
    case NodeKind::ALLREDUCE:
      if (c.payload == Payload::PAYLOAD_NORM) {
        reqs.push_back(group.iallreduce_double(&norm_sq_, 1));
        break;
      }
      for (int u : c.units)
        for (const ir::FlatPart& p : ps.parts(u))
          reqs.push_back(
              part_group(p, group).iallreduce(ps.grads(u) + p.full_offset, static_cast<size_t>(p.zero.padded)));
      break;
    case NodeKind::REDUCE_SCATTER:
      for (int u : c.units)
        for (const ir::FlatPart& p : ps.parts(u))
          reqs.push_back(part_group(p, group).ireduce_scatter(ps.grads(u) + p.full_offset, ps.shard_grads(u, p),
                                                       static_cast<size_t>(p.zero.len)));
      break;
    case NodeKind::ALLGATHER:
      for (int u : c.units) {
        if (ir::is_zero3_gather(c)) {  // into a fresh full buffer the unit borrows (held.front())
          gather_for_compute(u, group, reqs, held);
        } else {  // updated shards back into every replica's full values
          Tensor mine(model_.backend(), ps.shard_len(u), MemCategory::MEM_BUFFERS);
          for (const ir::FlatPart& p : ps.parts(u)) {
            const auto n = static_cast<size_t>(p.zero.len);
            model_.backend().copy(mine.data() + p.shard_offset, ps.shard_values(u, p), n * sizeof(float));
            reqs.push_back(part_group(p, group).iallgather(mine.data() + p.shard_offset, ps.values(u) + p.full_offset, n,
                                                    backend::DType::DTYPE_F32));
          }
          held.push_back(std::move(mine));
        }
      }
      break;
    default:
      throw std::logic_error(std::string(ir::node_kind_name(c.kind)) + " is not supported by this executor");
  }
}

// Under a storage type narrower than f32 (bf16: Megatron's bf16 parameters beside the f32 master weights),
// unit u's values rounded to it: made at the unit's first pass after an update and kept for every pass
// until its next update (Executor::update), as ZeRO-3 gathers them rounded, so every strategy computes
// with the same values. A null view where the unit computes with its own f32 values.
backend::ConstTensorView Executor::compute_copy(int u) {
  const backend::DType t = model_.storage_dtype();
  if (t == backend::DType::DTYPE_F32) return {};
  auto it = compute_copies_.find(u);
  if (it == compute_copies_.end()) it = compute_copies_.emplace(u, model_.params().rounded_values(u, t)).first;
  return it->second.view();
}

// ZeRO-3: unit u's parameters gathered into held.front() in the type the units compute with
// (Model::storage_dtype: bf16 under train.precision bf16, each rank's f32 shard rounded first);
// dense parts over `dense`, an MoE block's experts over the expert-data group.
void Executor::gather_for_compute(int u, comm::Communicator& dense, std::vector<comm::Request>& reqs,
                                  std::vector<Tensor>& held) {
  model::ParamStore& ps = model_.params();
  backend::Backend& be = model_.backend();
  const backend::DType t = model_.storage_dtype();
  held.emplace_back(be, backend::Shape{ps.padded_numel(u)}, MemCategory::MEM_PARAMS, t);
  auto* full = static_cast<unsigned char*>(held.front().view().ptr);
  for (const ir::FlatPart& p : ps.parts(u)) {
    comm::Communicator& g = part_group(p, dense);
    const auto n = static_cast<size_t>(p.zero.len);
    const void* mine = ps.shard_values(u, p);
    if (t != backend::DType::DTYPE_F32) {
      const backend::ConstTensorView shard = backend::view(be, ps.shard_values(u, p), {p.zero.len});
      held.push_back(backend::converted(shard, t, MemCategory::MEM_BUFFERS));
      mine = held.back().view().ptr;
    }
    reqs.push_back(g.iallgather(mine, full + static_cast<size_t>(p.full_offset) * backend::dtype_size(t), n, t));
  }
}

// A data-parallel collective moves each unit's parts over their own groups: dense parameters over
// `dense`, an MoE block's experts over their expert-data group.
comm::Communicator& Executor::part_group(const ir::FlatPart& p, comm::Communicator& dense) const {
  return p.experts ? *groups_.edp : dense;
}

// Waits for communication instruction k (the player issued it).
bool Executor::complete(size_t k) {
  const ir::Instr& c = program_.comm[k];
  const auto t0 = std::chrono::steady_clock::now();
  comm::wait_all(inflight_[k]);
  (c.kind == NodeKind::RECV ? stats_->idle_ms : stats_->comm_ms) += ms_since(t0);
  if (step_trace_) trace_comm_end(k);
  inflight_[k].clear();
  if (c.kind == NodeKind::REDUCE_SCATTER)
    for (int u : c.units) model_.params().release_full_grads(u);
  if (!ir::is_zero3_gather(c)) held_[k].clear();
  else held_[k].resize(1);  // the gathered values, until their last use; the narrowed shards are sent
  return true;
}

// While tracing: ends the event of every in-flight communication now complete.
// Request::test only polls; waiting stays with complete().
void Executor::poll_traced() {
  for (size_t k = 0; k < inflight_.size(); ++k) {
    if (inflight_[k].empty() || comm_traced_[k]) continue;
    bool all = true;
    for (comm::Request& r : inflight_[k]) all = r.test() && all;
    if (all) trace_comm_end(k);
  }
}

void Executor::trace_comm_end(size_t k) {
  if (comm_traced_[k]) return;
  comm_traced_[k] = 1;
  step_trace_->add(program_.comm[k].node, step_, issued_at_[k], TraceClock::now());
}

StepStats Executor::run_step(int64_t step, const std::vector<model::MicroBatch>& mbs) {
  StepStats st;
  step_ = step;
  mbs_ = &mbs;
  stats_ = &st;
  norm_ready_ = false;
  norm_sq_ = 0.0;
  inflight_.clear();
  inflight_.resize(program_.comm.size());
  held_.clear();
  held_.resize(program_.comm.size());
  uses_left_.clear();
  compute_copies_.clear();
  step_trace_ = recorder_ && recorder_->traces(step) ? recorder_ : nullptr;
  if (step_trace_) {
    issued_at_.assign(program_.comm.size(), TraceClock::time_point{});
    comm_traced_.assign(program_.comm.size(), 0);
  }
  for (const ir::Instr& in : program_.compute)
    for (int w : in.waits) {
      const int k = player_.comm_index(w);
      if (k >= 0 && ir::is_zero3_gather(program_.comm[static_cast<size_t>(k)])) ++uses_left_[w];
    }
  player_.start();
  // Every wait blocks until complete, so one advance plays the whole step.
  if (!player_.advance(*this).finished)
    throw std::logic_error("rank " + std::to_string(program_.rank) + ": the program stopped before its end");
  stats_ = nullptr;
  mbs_ = nullptr;
  compute_copies_.clear();  // a forward-only program updates nothing; what comes next may change the values
  if (!acts_.empty() || !grads_.empty())
    throw std::logic_error("rank " + std::to_string(program_.rank) + ": " +
                           std::to_string(acts_.size() + grads_.size()) +
                           " activations or gradients outlived the step; the program is incomplete");
  return st;
}

}  // namespace piper::runtime
