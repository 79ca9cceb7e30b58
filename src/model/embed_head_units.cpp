// embed_head_units.cpp — the token embedding and the head (final norm,
// untied lm_head, cross-entropy), and the unit factory.
#include <stdexcept>

#include "model/units.hpp"

namespace piper::model {

using backend::view;

// Params: 0 embed.weight [V, D]. Vocab-parallel with tp > 1: this rank's rows
// of the table at vocab_offset, zeros for the other ranks' tokens, summed over
// the group at point 0 (in f32, before segment 1, which stores the sum into a
// bf16 output); the backward adds into this rank's rows only.
double EmbedUnit::forward(int k, int slot, const PassArgs& a) {
  if (k > 0) {  // after the sum
    Saved& s = saved_.at(slot);
    if (!s.sum.empty()) be_.convert(s.sum.view(a.y.shape), a.y);
    s.sum = {}, s.out = {};
    return 0.0;
  }
  const MicroBatch& mb = *a.mb;
  const int64_t M = mb.rows(), D = cfg_.d_model;
  Saved& s = saved_[slot];
  s.ids = mb.inputs;
  s.rows = M;
  s.out = a.y;
  if (partial_dtype(a.y.dtype) != a.y.dtype) {
    s.sum = scratch(M * D, partial_dtype(a.y.dtype));
    s.out = s.sum.view({M, D});
  }
  // A bf16 lookup reads a bf16 table: the compute copy (converted into `held` only where none is bound).
  Tensor held;
  const backend::Shape table{dims_.vocab, D};
  be_.embedding_fwd(view(be_, mb.inputs, {M}),
                    s.out.dtype == backend::DType::DTYPE_F32 ? weight(0, table) : weight_as(0, table, s.out.dtype, held),
                    s.out, dims_.vocab_offset);
  return 0.0;
}

CommBuffer EmbedUnit::point(ir::NodeKind /*pass*/, int /*k*/, int slot) {
  Saved& s = saved_.at(slot);
  return {s.out.ptr, s.out.ptr, s.rows * cfg_.d_model, {}, {}};
}

void EmbedUnit::weight_grads(int slot, const PassArgs& a) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.rows, D = cfg_.d_model;
  be_.embedding_bwd(view(be_, s.ids, {M}), a.dy, view(be_, g(0), {dims_.vocab, D}), dims_.vocab_offset);
}

// Params: 0 final_norm.weight [D], 1 lm_head.weight [V, D].
// tp 1: one segment. tp > 1, Megatron's vocab-parallel loss (ir::pass_shape):
// norm and local logits | the row maxima summed into a table | exponential sums and the
// target logit | summed | loss and dlogits. Full logits are never gathered.
double HeadUnit::forward(int k, int slot, const PassArgs& a) {
  const MicroBatch& mb = *a.mb;
  const int64_t D = cfg_.d_model, V = dims_.vocab;
  if (k == 0) {
    const int64_t M = mb.rows();
    const backend::DType t = a.x.dtype;
    Saved s{M, act(M * D, t), act(M), {}, mb.targets == nullptr, {}, {}, {}, {}, {}};
    Tensor nw;
    be_.rmsnorm_fwd(a.x, weight_as(0, {D}, t, nw), s.xn.view({M, D}), s.rstd.view({M}), kNormEps);
    Tensor logits = act(M * V);
    be_.linear_fwd(s.xn.view({M, D}), weight(1, {V, D}), logits.view({M, V}));
    double loss = 0.0;
    if (s.inference) {
      if (tp_.size > 1) throw std::logic_error("inference of a vocab-parallel head needs the whole vocabulary");
      s.dlogits = std::move(logits);
    } else if (tp_.size == 1) {
      s.dlogits = act(M * V);
      loss = be_.cross_entropy(logits.view({M, V}), view(be_, mb.targets, {M}), s.dlogits.view({M, V}), mb.loss_scale);
    } else {
      s.logits = std::move(logits);
      vocab_parallel_maxima(s);
    }
    saved_[slot] = std::move(s);
    return loss;
  }
  Saved& s = saved_.at(slot);
  if (k == 1) {
    vocab_parallel_sums(s, mb.targets);
    return 0.0;
  }
  return vocab_parallel_loss(s, mb.targets, mb.loss_scale);
}

CommBuffer HeadUnit::point(ir::NodeKind pass, int k, int slot) {
  Saved& s = saved_.at(slot);
  if (pass != ir::NodeKind::FWD) return {s.dxn.data(), s.dxn.data(), s.rows * cfg_.d_model, {}, {}};
  if (k == 0) return {s.all_max.data(), s.all_max.data(), s.all_max.numel(), {}, {}};
  return {s.sums.data(), s.sums.data(), s.sums.numel(), {}, {}};
}

void HeadUnit::backward_input(int k, int slot, const PassArgs& a) {
  Saved& s = saved_.at(slot);
  if (s.inference) throw std::logic_error("backward of an inference forward of the head");
  const int64_t M = s.rows, D = cfg_.d_model, V = dims_.vocab;
  if (k == 0) {
    s.dxn = scratch(M * D, partial_dtype(a.dx.dtype));
    be_.linear_bwd_input(s.dlogits.view({M, V}), weight(1, {V, D}), s.dxn.view({M, D}), false);
  }
  if (last(ir::NodeKind::BWD_I, k)) {  // tp > 1: each rank's vocabulary rows gave a partial sum
    const backend::DType t = a.dx.dtype;
    if (s.dxn.dtype() != t) s.dxn = backend::converted(s.dxn.view(), t, backend::MemCategory::MEM_BUFFERS);
    Tensor nw;
    be_.rmsnorm_bwd(s.dxn.view({M, D}), a.x, weight_as(0, {D}, t, nw), s.rstd.view({M}), a.dx,
                    view(be_, g(0), {D}));
    s.dxn = {}, s.rstd = {};  // the weight gradient reads xn and dlogits
  }
}

void HeadUnit::weight_grads(int slot, const PassArgs& /*a*/) {
  Saved& s = saved_.at(slot);
  const int64_t M = s.rows, D = cfg_.d_model, V = dims_.vocab;
  be_.linear_bwd_weight(s.dlogits.view({M, V}), s.xn.view({M, D}), view(be_, g(1), {V, D}));
}

// d(loss)/d(logits), which the cross-entropy writes in f32 and only products read again; nothing of
// an inference forward, whose logits are read as they are. The normalised input is of the storage type.
std::vector<Tensor*> HeadUnit::kept(int slot) {
  auto it = saved_.find(slot);
  if (it == saved_.end() || it->second.inference) return {};
  return {&it->second.dlogits};
}

// Segment 0 of the vocab-parallel loss: each row's max over this rank's logits, in column tp rank of
// an [M, tp] table of zeros, which the group's all-reduce fills with every rank's maxima (a sum of one
// value and zeros is that value exactly).
void HeadUnit::vocab_parallel_maxima(Saved& s) {
  const int64_t M = s.rows, V = dims_.vocab, T = tp_.size;
  Tensor local_max = scratch(M);
  s.all_max = scratch(M * T);
  be_.fill_zero(s.all_max.data(), s.all_max.bytes());
  be_.row_max(s.logits.view({M, V}), local_max.view({M}));
  be_.scatter_cols(local_max.view({M, 1}), s.all_max.view({M, T}), tp_.rank);
}

// Segment 1: the group's row max over the table [M, tp], then exp(logit - max) into dlogits and per
// row [sum of exp | target logit] (0 where the target is another rank's).
void HeadUnit::vocab_parallel_sums(Saved& s, const int32_t* targets) {
  const int64_t M = s.rows, V = dims_.vocab, T = tp_.size;
  s.row_max = scratch(M);
  s.sums = scratch(2 * M);
  be_.row_max(s.all_max.view({M, T}), s.row_max.view({M}));
  s.all_max = {};
  s.dlogits = act(M * V);
  be_.vocab_ce_partials(s.logits.view({M, V}), s.row_max.view({M}), view(be_, targets, {M}), dims_.vocab_offset,
                        s.dlogits.view({M, V}), s.sums.view({2, M}));
  s.logits = {};
}

// Segment 2: loss and dlogits from the summed [sum of exp | target logit].
// Returns the loss sum on tp rank 0 only, so the group counts it once.
double HeadUnit::vocab_parallel_loss(Saved& s, const int32_t* targets, float scale) {
  const int64_t M = s.rows, V = dims_.vocab;
  const double loss = be_.vocab_ce_finish(s.sums.view({2, M}), s.row_max.view({M}), view(be_, targets, {M}),
                                          dims_.vocab_offset, s.dlogits.view({M, V}), scale);
  s.row_max = {};
  s.sums = {};
  return tp_.rank == 0 ? loss : 0.0;
}

const float* HeadUnit::logits(int slot) const {
  auto it = saved_.find(slot);
  return it != saved_.end() && it->second.inference ? it->second.dlogits.data() : nullptr;
}

std::unique_ptr<Unit> make_unit(const ir::UnitSpec& spec, const config::ModelConfig& cfg,
                                ParamStore& params, backend::Backend& be, TpInfo tp, EpInfo ep) {
  switch (spec.kind) {
    case ir::UnitKind::UNIT_EMBED: return std::make_unique<EmbedUnit>(spec, cfg, params, be, tp);
    case ir::UnitKind::UNIT_HEAD: return std::make_unique<HeadUnit>(spec, cfg, params, be, tp);
    case ir::UnitKind::UNIT_MLP: return std::make_unique<MlpBlock>(spec, cfg, params, be, tp);
    case ir::UnitKind::UNIT_ATTENTION: return std::make_unique<AttentionBlock>(spec, cfg, params, be, tp);
    case ir::UnitKind::UNIT_MAMBA: return std::make_unique<MambaBlock>(spec, cfg, params, be, tp);
    case ir::UnitKind::UNIT_MOE: return std::make_unique<MoeBlock>(spec, cfg, params, be, tp, ep);
  }
  throw std::logic_error("unit " + spec.name + ": unknown unit kind");
}

}  // namespace piper::model
