// moe_unit.cpp — the MoE block ('E'): top-k routed SwiGLU experts (docs/model.md).
#include <stdexcept>
#include <utility>

#include "model/units.hpp"

namespace piper::model {

using backend::view;

namespace {
// Parameters in spec order: router [E,D], experts.gate_proj [E,F,D], experts.up_proj [E,F,D],
// experts.down_proj [E,D,F] (0 is the block's norm); locally E/ep experts, F/tp each.
enum MoeParam : size_t { MOE_ROUTER = 1, MOE_GATE, MOE_UP, MOE_DOWN };
}  // namespace

MoeBlock::MoeBlock(const ir::UnitSpec& spec, const config::ModelConfig& cfg, ParamStore& params, backend::Backend& be,
                   TpInfo tp, EpInfo ep)
    : Block(spec, cfg, params, be, tp, ep) {
  const bool tp_sum = tp.size > 1, all_to_all = ep.size > 1;
  auto& f = forward_steps_;
  auto fpoint = [&](Move m) { forward_moves_.push_back(m), f.emplace_back(); };
  f = {{Step::ROUTE}};
  if (all_to_all) {
    fpoint(Move::COUNTS), f.back().push_back(Step::SIZE);
    fpoint(Move::DISPATCH), f.back().push_back(Step::EXPERTS);
    fpoint(Move::GIVE_BACK), f.back().push_back(Step::COMBINE);
  } else {
    f.back().insert(f.back().end(), {Step::EXPERTS, Step::COMBINE});
  }
  if (tp_sum) fpoint(Move::SUM);
  auto& b = backward_steps_;
  auto bpoint = [&](Move m) { backward_moves_.push_back(m), b.emplace_back(); };
  b = {{Step::COMBINE_BWD}};
  if (tp_sum) bpoint(Move::DWEIGHTS);  // the routing weights' gradient reads the whole (tp-summed) outputs
  if (all_to_all) {
    bpoint(Move::DISPATCH_GRAD), b.back().push_back(Step::EXPERTS_BWD);
    bpoint(Move::RETURN_GRAD), b.back().push_back(Step::DISPATCH_BWD);
  } else {
    b.back().insert(b.back().end(), {Step::EXPERTS_BWD, Step::DISPATCH_BWD});
  }
  if (tp_sum) bpoint(Move::SUM);
  for (ir::NodeKind pass : {ir::NodeKind::FWD, ir::NodeKind::BWD})
    if (static_cast<size_t>(shape(pass).segments) != (pass == ir::NodeKind::FWD ? f : b).size())
      throw std::logic_error("MoE block " + spec.name + ": its " + ir::node_kind_name(pass) + " has " +
                             std::to_string(shape(pass).segments) + " segments in ir::pass_shape, the unit runs " +
                             std::to_string((pass == ir::NodeKind::FWD ? f : b).size()));
  routing_.tokens.assign(static_cast<size_t>(cfg.n_experts), 0.0);
}

void MoeBlock::mixer_forward(int slot, const MicroBatch& mb, backend::ConstTensorView xn, backend::TensorView out) {
  Saved s;
  s.rows = mb.rows(), s.seq = mb.seq, s.loss_scale = mb.loss_scale;
  s.xn = xn, s.out = out;
  const backend::DType rows = activation_storage();
  s.dispatch = std::make_unique<Dispatcher>(be_, cfg_.n_experts, cfg_.d_model, ep_.size, rows, partial_dtype(rows));
  Saved& kept = saved_[slot] = std::move(s);
  for (Step step : forward_steps_[0]) run(step, kept);
  if (mb.targets && tp_.rank == 0) {  // training: the routing statistics, once per tp group
    routing_.aux_sum += kept.aux;
    const auto& counts = kept.dispatch->counts_per_expert();
    for (size_t e = 0; e < counts.size(); ++e) routing_.tokens[e] += static_cast<double>(counts[e]);
  }
}

void MoeBlock::mixer_forward_segment(int k, int slot) {
  for (Step step : forward_steps_.at(static_cast<size_t>(k))) run(step, saved_.at(slot));
}

void MoeBlock::mixer_backward_input(int slot, backend::ConstTensorView /*xn*/, backend::ConstTensorView dout,
                                    backend::TensorView dxn) {
  Saved& s = saved_.at(slot);
  s.dout = dout, s.dxn = dxn;
  for (Step step : backward_steps_[0]) run(step, s);
}

void MoeBlock::mixer_backward_segment(int k, int slot) {
  for (Step step : backward_steps_.at(static_cast<size_t>(k))) run(step, saved_.at(slot));
}

void MoeBlock::run(Step step, Saved& s) {
  const int64_t M = s.rows, D = cfg_.d_model, E = cfg_.n_experts, K = cfg_.top_k;
  Dispatcher& d = *s.dispatch;
  switch (step) {
    case Step::ROUTE: {
      Tensor logits = scratch(M * E);
      be_.linear_fwd(s.xn, weight(MOE_ROUTER, {E, D}), logits.view({M, E}));
      s.probs = act(M * E), s.weights = act(M * K), s.dprobs = act(M * E);
      s.experts = Tensor(be_, backend::Shape{M, K}, backend::MemCategory::MEM_ACTIVATIONS, backend::DType::DTYPE_I32);
      be_.moe_route_fwd(logits.view({M, E}), s.probs.view({M, E}), s.experts.view(), s.weights.view({M, K}));
      // d(loss)/d(probs) of coef x the mean over the global batch's sequences of aux(s).
      const float scale = static_cast<float>(cfg_.moe_aux_coef * static_cast<double>(s.seq) * s.loss_scale);
      s.aux = be_.moe_balance(s.probs.view({M, E}), s.experts.view(), s.seq, s.dprobs.view({M, E}), scale);
      d.route(s.experts.view(), s.xn);
      break;
    }
    case Step::SIZE: d.size(); break;
    case Step::EXPERTS:
      d.sort();
      experts_forward(s);
      d.unsort();
      break;
    case Step::COMBINE: d.combine(s.weights.view({M, K}), s.out); break;
    case Step::COMBINE_BWD: {
      s.dweights = scratch(M * K);
      d.combine_backward(s.dout, s.weights.view({M, K}), s.dweights.view({M, K}));
      break;
    }
    case Step::EXPERTS_BWD:
      d.sort_grad();
      experts_backward(s);
      d.unsort_grad();
      break;
    case Step::DISPATCH_BWD:
      be_.fill_zero(s.dxn.ptr, static_cast<size_t>(M * D) * backend::dtype_size(s.dxn.dtype));
      d.dispatch_backward(s.dxn);
      router_backward(s);
      break;
  }
}

// fn(l, first row, rows) for each local expert l with rows, its rows contiguous from `first row`.
template <class Fn>
void MoeBlock::for_each_expert(const Saved& s, Fn&& fn) const {
  int64_t first = 0;
  const auto& rows = s.dispatch->rows_of_expert();
  for (size_t l = 0; l < rows.size(); first += rows[l], ++l)
    if (rows[l] > 0) fn(static_cast<int64_t>(l), first, rows[l]);
}

// Each local expert's rows through its SwiGLU: one GEMM per expert group and matrix. The experts compute
// on the activations' storage type (bf16 under train.precision bf16): their rows in and out, gate, up,
// h, their gradients and the weight half's stash are tensors of it; the input gradient, the sum of two
// products, is f32 (the dispatcher rounds it once).
void MoeBlock::experts_forward(Saved& s) {
  const int64_t D = cfg_.d_model, F = dims_.moe_ffn, R = s.dispatch->rows();
  const backend::DType t = activation_storage();
  const int64_t n_all = std::max<int64_t>(1, R * F);
  s.gate = act(n_all, t), s.up = act(n_all, t), s.h = act(n_all, t);
  Dispatcher& d = *s.dispatch;
  for_each_expert(s, [&](int64_t li, int64_t o, int64_t n) {
    const auto xl = d.expert_input(o, n);
    be_.linear_fwd(xl, expert_weight(MOE_GATE, li, F, D), s.gate.part(o * F, {n, F}));
    be_.linear_fwd(xl, expert_weight(MOE_UP, li, F, D), s.up.part(o * F, {n, F}));
    be_.swiglu_fwd(s.gate.part(o * F, {n * F}), s.up.part(o * F, {n * F}), s.h.part(o * F, {n * F}));
    be_.linear_fwd(s.h.part(o * F, {n, F}), expert_weight(MOE_DOWN, li, D, F), d.expert_output(o, n));
  });
}

void MoeBlock::experts_backward(Saved& s) {
  const int64_t D = cfg_.d_model, F = dims_.moe_ffn, R = s.dispatch->rows();
  const backend::DType t = s.h.dtype();
  s.dgate = scratch(std::max<int64_t>(1, R * F), t), s.dup = scratch(std::max<int64_t>(1, R * F), t);
  Dispatcher& d = *s.dispatch;
  for_each_expert(s, [&](int64_t li, int64_t o, int64_t n) {
    Tensor dh = scratch(n * F, t);
    be_.linear_bwd_input(d.expert_grad_output(o, n), expert_weight(MOE_DOWN, li, D, F), dh.view({n, F}), false);
    be_.swiglu_bwd(dh.view(), s.gate.part(o * F, {n * F}), s.up.part(o * F, {n * F}), s.dgate.part(o * F, {n * F}),
                   s.dup.part(o * F, {n * F}));
    const auto dxl = d.expert_grad_input(o, n);
    be_.linear_bwd_input(s.dgate.part(o * F, {n, F}), expert_weight(MOE_GATE, li, F, D), dxl, false);
    be_.linear_bwd_input(s.dup.part(o * F, {n, F}), expert_weight(MOE_UP, li, F, D), dxl, true);
  });
  s.gate = {}, s.up = {};
}

// The routing weights' and the balance loss's gradients through top-k and the softmax, into the
// router logits and dxn. The tp group routes the same tokens alike: tp rank 0 alone adds the
// router's part of dxn, which the block's tp sum then completes.
void MoeBlock::router_backward(Saved& s) {
  const int64_t M = s.rows, D = cfg_.d_model, E = cfg_.n_experts, K = cfg_.top_k;
  s.dlogits = scratch(M * E);
  be_.moe_route_bwd(s.dweights.view({M, K}), s.dprobs.view({M, E}), s.probs.view({M, E}), s.experts.view(),
                    s.weights.view({M, K}), s.dlogits.view({M, E}));
  if (tp_.rank == 0)
    be_.linear_bwd_input(s.dlogits.view({M, E}), weight(MOE_ROUTER, {E, D}), s.dxn, true);
  s.dweights = {}, s.dprobs = {}, s.probs = {};
}

void MoeBlock::mixer_backward_weight(int slot, backend::ConstTensorView xn) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.rows, D = cfg_.d_model, E = cfg_.n_experts, F = dims_.moe_ffn;
  be_.linear_bwd_weight(s.dlogits.view({M, E}), xn, view(be_, g(MOE_ROUTER), {E, D}));
  const Dispatcher& d = *s.dispatch;
  for_each_expert(s, [&](int64_t li, int64_t o, int64_t n) {
    const auto xl = d.expert_input(o, n);
    be_.linear_bwd_weight(d.expert_grad_output(o, n), s.h.part(o * F, {n, F}),
                          view(be_, expert(g(MOE_DOWN), li, D, F), {D, F}));
    be_.linear_bwd_weight(s.dgate.part(o * F, {n, F}), xl, view(be_, expert(g(MOE_GATE), li, F, D), {F, D}));
    be_.linear_bwd_weight(s.dup.part(o * F, {n, F}), xl, view(be_, expert(g(MOE_UP), li, F, D), {F, D}));
  });
}

CommBuffer MoeBlock::point(ir::NodeKind pass, int k, int slot) {
  const Move m = (pass == ir::NodeKind::FWD ? forward_moves_ : backward_moves_).at(static_cast<size_t>(k));
  Saved& s = saved_.at(slot);
  switch (m) {
    case Move::SUM: return Block::point(pass, k, slot);
    case Move::COUNTS: return s.dispatch->counts();
    case Move::DISPATCH: return s.dispatch->dispatch();
    case Move::GIVE_BACK: return s.dispatch->give_back();
    case Move::DWEIGHTS: return {s.dweights.data(), s.dweights.data(), s.rows * cfg_.top_k, {}, {}};
    case Move::DISPATCH_GRAD: return s.dispatch->dispatch_grad();
    case Move::RETURN_GRAD: return s.dispatch->return_grad();
  }
  throw std::logic_error("MoE block: unknown communication point");
}

double MoeBlock::mixer_loss(int slot) const {
  const Saved& s = saved_.at(slot);
  return tp_.rank == 0 ? cfg_.moe_aux_coef * static_cast<double>(s.seq) * s.aux : 0.0;
}

Unit::Routing MoeBlock::take_routing() {
  return std::exchange(routing_, Routing{0.0, std::vector<double>(static_cast<size_t>(cfg_.n_experts), 0.0)});
}

void MoeBlock::mixer_release(int slot) { saved_.erase(slot); }

}  // namespace piper::model
