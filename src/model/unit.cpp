// unit.cpp — what every unit shares: its pass shapes, the dispatch of a
// segment to its pass, and playing a whole pass alone.
#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>

#include "model/unit.hpp"

namespace piper::model {

namespace {

int pass_slot(ir::NodeKind pass) {
  switch (pass) {
    case ir::NodeKind::FWD: return 0;
    case ir::NodeKind::BWD_I: return 1;
    case ir::NodeKind::BWD_W: return 2;
    case ir::NodeKind::BWD: return 3;
    default: break;
  }
  throw std::logic_error(std::string(ir::node_kind_name(pass)) + " is not a pass of a unit");
}

}  // namespace

Unit::Unit(const ir::UnitSpec& spec, const config::ModelConfig& cfg, ParamStore& params, backend::Backend& be,
           TpInfo tp, EpInfo ep)
    : spec_(spec), cfg_(cfg), params_(params), be_(be), tp_(tp), ep_(ep), dims_(cfg, tp, ep) {
  for (ir::NodeKind p : {ir::NodeKind::FWD, ir::NodeKind::BWD_I, ir::NodeKind::BWD_W, ir::NodeKind::BWD})
    shapes_[pass_slot(p)] = ir::pass_shape(spec.kind, p, {tp.size, ep.size, cfg.d_model, cfg.top_k, cfg.n_experts});
}

const ir::PassShape& Unit::shape(ir::NodeKind pass) const { return shapes_[pass_slot(pass)]; }

double Unit::run(ir::NodeKind pass, int k, int slot, const PassArgs& a) {
  if (k < 0 || k >= shape(pass).segments)
    throw std::logic_error("unit " + spec_.name + ": " + ir::node_kind_name(pass) + " has " +
                           std::to_string(shape(pass).segments) + " segment(s), asked for segment " +
                           std::to_string(k));
  if (k == 0 && pass != ir::NodeKind::FWD) convert_kept(slot, backend::DType::DTYPE_F32);
  double loss = 0.0;
  switch (pass) {
    case ir::NodeKind::FWD:
      loss = forward(k, slot, a);
      if (last(pass, k)) narrow(slot);
      break;
    case ir::NodeKind::BWD_I:
      backward_input(k, slot, a);
      if (last(pass, k)) narrow(slot);  // until the weight half
      break;
    case ir::NodeKind::BWD_W:
      weight_grads(slot, a);
      release(slot);
      break;
    default:  // BWD: the weight gradients as soon as they can run, so that the later segments stay small
      backward_input(k, slot, a);
      if (k == weight_segment()) weight_grads(slot, a);
      if (last(pass, k)) release(slot);
      break;
  }
  return loss;
}

backend::ConstTensorView Unit::weight_as(size_t i, backend::Shape shape, backend::DType t, Tensor& held) {
  const backend::ConstTensorView v = weight(i, shape);
  if (v.dtype == t) return v;
  held = backend::converted(v, t, backend::MemCategory::MEM_BUFFERS);
  return held.view();
}

void Unit::convert_kept(int slot, backend::DType to) {
  if (kept_dtype_ == backend::DType::DTYPE_F32) return;  // nothing was narrowed
  for (Tensor* t : kept(slot)) store_as(*t, to);
}

void Unit::store_as(Tensor& t, backend::DType to) {
  if (!t.empty() && t.dtype() != to) t = backend::converted(t.view(), to, backend::MemCategory::MEM_ACTIVATIONS);
}

void Unit::drop(int /*slot*/, ir::Recompute mode) {
  throw std::logic_error("unit " + spec_.name + " is never recomputed, asked to drop its state for " +
                         ir::recompute_name(mode) + " recomputation");
}

void Unit::recompute(int /*slot*/, const MicroBatch& /*mb*/, backend::ConstTensorView /*x*/, ir::Recompute mode) {
  throw std::logic_error("unit " + spec_.name + " is never recomputed, asked for " + ir::recompute_name(mode) +
                         " recomputation");
}

float* CommBuffer::floats(void* p) const {
  if (dtype != backend::DType::DTYPE_F32)
    throw std::logic_error(std::string("a reduction or a gather over a buffer of ") + backend::dtype_name(dtype) +
                           "; they sum and gather f32");
  return static_cast<float*>(p);
}

double play_pass(Unit& unit, ir::NodeKind pass, int slot, const PassArgs& a, double* compute_ms) {
  using Clock = std::chrono::steady_clock;
  const ir::PassShape& shape = unit.shape(pass);
  double result = 0.0;
  for (int k = 0; k < shape.segments; ++k) {
    const auto t0 = Clock::now();
    result += unit.run(pass, k, slot, a);
    if (compute_ms) *compute_ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (static_cast<size_t>(k) >= shape.points.size()) continue;
    const ir::CommPoint& point = shape.points[static_cast<size_t>(k)];
    comm::Communicator* group = unit.group(point.group);
    if (!group)
      throw std::logic_error("unit " + unit.spec().name + ": a pass with a " + ir::group_name(point.group) +
                             " collective, but the unit has no " + ir::group_name(point.group) + " group");
    const CommBuffer b = unit.point(pass, k, slot);
    const auto n = static_cast<size_t>(b.count);
    if (point.kind == ir::NodeKind::ALLGATHER)
      group->allgather(b.send, b.recv, n, b.dtype);
    else if (point.kind == ir::NodeKind::ALLTOALL && b.send_counts.empty())
      group->alltoall(b.send, b.recv, n / static_cast<size_t>(group->size()), b.dtype);
    else if (point.kind == ir::NodeKind::ALLTOALL)
      group->alltoallv(b.send, b.send_counts, b.recv, b.recv_counts, b.dtype);
    else
      group->allreduce(b.send_floats(), n);
  }
  return result;
}

}  // namespace piper::model
