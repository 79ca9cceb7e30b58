// embed_head_units.cpp — the token embedding and the head (final norm,
// untied lm_head, cross-entropy), and the unit factory.
#include <stdexcept>

#include "kernels.hpp"
#include "model/units.hpp"

namespace piper::model {

namespace k = piper::kernels;
constexpr float kNormEps = 1e-5f;

// Params: 0 embed.weight [V, D].
double EmbedUnit::forward(int slot, const MicroBatch& mb, const float* /*x*/, float* y) {
  const int64_t M = mb.rows();
  k::embedding_fwd(mb.inputs, w(0), y, M, cfg_.d_model);
  saved_[slot].ids.assign(mb.inputs, mb.inputs + M);
  return 0.0;
}

void EmbedUnit::backward_input(int slot, const float* /*x*/, const float* dy, float* /*dx*/) {
  Saved& s = saved_.at(slot);
  const int64_t n = static_cast<int64_t>(s.ids.size()) * cfg_.d_model;
  s.dy = scratch(n);
  be_.copy(s.dy.data(), dy, static_cast<size_t>(n) * sizeof(float));
}

void EmbedUnit::backward_weight(int slot) {
  Saved& s = saved_.at(slot);
  k::embedding_bwd(s.ids.data(), s.dy.data(), g(0), static_cast<int64_t>(s.ids.size()), cfg_.d_model);
  saved_.erase(slot);
}

// Params: 0 final_norm.weight [D], 1 lm_head.weight [V, D].
double HeadUnit::forward(int slot, const MicroBatch& mb, const float* x, float* /*y*/) {
  const int64_t M = mb.rows(), D = cfg_.d_model, V = cfg_.vocab_size;
  Saved s{M, act(M * D), act(M), {}, mb.targets == nullptr};
  k::rmsnorm_fwd(x, w(0), s.xn.data(), s.rstd.data(), M, D, kNormEps);
  Tensor logits = act(M * V);
  k::linear_fwd(s.xn.data(), w(1), logits.data(), M, D, V);
  double loss = 0.0;
  if (s.inference) {
    s.dlogits = std::move(logits);
  } else {
    s.dlogits = act(M * V);
    loss = k::cross_entropy(logits.data(), mb.targets, s.dlogits.data(), M, V, mb.loss_scale);
  }
  saved_[slot] = std::move(s);
  return loss;
}

void HeadUnit::backward_input(int slot, const float* x, const float* /*dy*/, float* dx) {
  Saved& s = saved_.at(slot);
  if (s.inference) throw std::logic_error("backward of an inference forward of the head");
  const int64_t M = s.rows, D = cfg_.d_model, V = cfg_.vocab_size;
  Tensor dxn = scratch(M * D);
  k::linear_bwd_input(s.dlogits.data(), w(1), dxn.data(), M, D, V, false);
  k::rmsnorm_bwd(dxn.data(), x, w(0), s.rstd.data(), dx, g(0), M, D);
}

void HeadUnit::backward_weight(int slot) {
  Saved& s = saved_.at(slot);
  k::linear_bwd_weight(s.dlogits.data(), s.xn.data(), g(1), s.rows, cfg_.d_model, cfg_.vocab_size);
  saved_.erase(slot);
}

const float* HeadUnit::logits(int slot) const {
  auto it = saved_.find(slot);
  return it != saved_.end() && it->second.inference ? it->second.dlogits.data() : nullptr;
}

std::unique_ptr<Unit> make_unit(const ir::UnitSpec& spec, const config::ModelConfig& cfg,
                                ParamStore& params, backend::Backend& be) {
  switch (spec.kind) {
    case ir::UnitKind::UNIT_EMBED: return std::make_unique<EmbedUnit>(spec, cfg, params, be);
    case ir::UnitKind::UNIT_HEAD: return std::make_unique<HeadUnit>(spec, cfg, params, be);
    case ir::UnitKind::UNIT_MLP: return std::make_unique<MlpBlock>(spec, cfg, params, be);
    case ir::UnitKind::UNIT_ATTENTION: return std::make_unique<AttentionBlock>(spec, cfg, params, be);
    case ir::UnitKind::UNIT_MAMBA: return std::make_unique<MambaBlock>(spec, cfg, params, be);
    case ir::UnitKind::UNIT_MOE: break;
  }
  throw std::invalid_argument("unit " + spec.name + ": " + ir::unit_kind_name(spec.kind) +
                              " blocks are not supported in this build");
}

}  // namespace piper::model
