// embed_head_units.cpp — the token embedding and the head (final norm,
// untied lm_head, cross-entropy), and the unit factory.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "kernels.hpp"
#include "model/units.hpp"

namespace piper::model {

namespace k = piper::kernels;
constexpr float kNormEps = 1e-5f;

// Params: 0 embed.weight [V, D].
double EmbedUnit::forward(int /*k*/, int slot, const PassArgs& a) {
  const MicroBatch& mb = *a.mb;
  const int64_t M = mb.rows(), D = cfg_.d_model;
  if (tp_.size == 1) {
    k::embedding_fwd(mb.inputs, w(0), a.y, M, D, dims_.vocab, 0);
  } else {  // vocab-parallel: this rank's rows, zeros elsewhere, summed over the group at point 0
    const float* table = w(0);
#pragma omp parallel for schedule(static) if (M * D > 65536)
    for (int64_t m = 0; m < M; ++m) {
      const int64_t id = mb.inputs[m] - dims_.vocab_offset;
      float* row = a.y + m * D;
      if (id >= 0 && id < dims_.vocab)
        std::copy(table + id * D, table + (id + 1) * D, row);
      else
        std::fill(row, row + D, 0.0f);
    }
  }
  Saved& s = saved_[slot];
  s.ids.assign(mb.inputs, mb.inputs + M);
  s.out = a.y;
  return 0.0;
}

CommBuffer EmbedUnit::point(ir::NodeKind /*pass*/, int /*k*/, int slot) {
  Saved& s = saved_.at(slot);
  return {s.out, s.out, static_cast<int64_t>(s.ids.size()) * cfg_.d_model};
}

void EmbedUnit::weight_grads(int slot, const PassArgs& a) {
  Saved& s = saved_.at(slot);
  const int64_t M = static_cast<int64_t>(s.ids.size()), D = cfg_.d_model;
  if (tp_.size == 1) {
    k::embedding_bwd(s.ids.data(), a.dy, g(0), M, D, dims_.vocab, 0);
  } else {  // rows of this rank's vocabulary, in order m = 0..M-1 (deterministic)
    float* dtable = g(0);
    for (int64_t m = 0; m < M; ++m) {
      const int64_t id = s.ids[static_cast<size_t>(m)] - dims_.vocab_offset;
      if (id < 0 || id >= dims_.vocab) continue;
      const float* src = a.dy + m * D;
      float* dst = dtable + id * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) dst[d] += src[d];
    }
  }
}

// Params: 0 final_norm.weight [D], 1 lm_head.weight [V, D].
// tp 1: one segment. tp > 1, Megatron's vocab-parallel loss (ir::pass_shape):
// norm and local logits | the row maxima gathered | exponential sums and the
// target logit | summed | loss and dlogits. Full logits are never gathered.
double HeadUnit::forward(int k, int slot, const PassArgs& a) {
  const MicroBatch& mb = *a.mb;
  const int64_t D = cfg_.d_model, V = dims_.vocab;
  if (k == 0) {
    const int64_t M = mb.rows();
    Saved s{M, act(M * D), act(M), {}, mb.targets == nullptr, {}, {}, {}, {}, {}, {}};
    k::rmsnorm_fwd(a.x, w(0), s.xn.data(), s.rstd.data(), M, D, kNormEps);
    Tensor logits = act(M * V);
    k::linear_fwd(s.xn.data(), w(1), logits.data(), M, D, V);
    double loss = 0.0;
    if (s.inference) {
      if (tp_.size > 1) throw std::logic_error("inference of a vocab-parallel head needs the whole vocabulary");
      s.dlogits = std::move(logits);
    } else if (tp_.size == 1) {
      s.dlogits = act(M * V);
      loss = k::cross_entropy(logits.data(), mb.targets, s.dlogits.data(), M, V, mb.loss_scale);
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
  if (pass != ir::NodeKind::FWD) return {s.dxn.data(), s.dxn.data(), s.rows * cfg_.d_model};
  if (k == 0) return {s.local_max.data(), s.all_max.data(), s.rows};
  return {s.sums.data(), s.sums.data(), static_cast<int64_t>(s.sums.size())};
}

void HeadUnit::backward_input(int k, int slot, const PassArgs& a) {
  Saved& s = saved_.at(slot);
  if (s.inference) throw std::logic_error("backward of an inference forward of the head");
  const int64_t M = s.rows, D = cfg_.d_model, V = dims_.vocab;
  if (k == 0) {
    s.dxn = scratch(M * D);
    k::linear_bwd_input(s.dlogits.data(), w(1), s.dxn.data(), M, D, V, false);
  }
  if (last(ir::NodeKind::BWD_I, k)) {  // tp > 1: each rank's vocabulary rows gave a partial sum
    k::rmsnorm_bwd(s.dxn.data(), a.x, w(0), s.rstd.data(), a.dx, g(0), M, D);
    s.dxn = {};
  }
}

void HeadUnit::weight_grads(int slot, const PassArgs& /*a*/) {
  Saved& s = saved_.at(slot);
  k::linear_bwd_weight(s.dlogits.data(), s.xn.data(), g(1), s.rows, cfg_.d_model, dims_.vocab);
}

// Segment 0 of the vocab-parallel loss: each row's max over this rank's logits.
void HeadUnit::vocab_parallel_maxima(Saved& s) {
  const int64_t M = s.rows, V = dims_.vocab;
  const float* logits = s.logits.data();
  s.local_max.resize(static_cast<size_t>(M));
  s.all_max.resize(static_cast<size_t>(M * tp_.size));
  for (int64_t m = 0; m < M; ++m) s.local_max[static_cast<size_t>(m)] = *std::max_element(logits + m * V, logits + (m + 1) * V);
}

// Segment 1: the global row max, exp(logit - max) into dlogits, and per row
// [sum of exp | target logit] (0 where the target is another rank's).
void HeadUnit::vocab_parallel_sums(Saved& s, const int32_t* targets) {
  const int64_t M = s.rows, V = dims_.vocab, off = dims_.vocab_offset, T = tp_.size;
  s.row_max.resize(static_cast<size_t>(M));
  s.sums.assign(static_cast<size_t>(2 * M), 0.0f);
  for (int64_t m = 0; m < M; ++m) {
    float mx = s.all_max[static_cast<size_t>(m)];
    for (int64_t t = 1; t < T; ++t) mx = std::max(mx, s.all_max[static_cast<size_t>(t * M + m)]);
    s.row_max[static_cast<size_t>(m)] = mx;
  }
  s.dlogits = act(M * V);
  const float* logits = s.logits.data();
  float* dlogits = s.dlogits.data();
#pragma omp parallel for schedule(static) if (M * V > 65536)
  for (int64_t m = 0; m < M; ++m) {
    const float* l = logits + m * V;
    float* d = dlogits + m * V;
    float sum = 0.0f;
    for (int64_t v = 0; v < V; ++v) sum += (d[v] = std::exp(l[v] - s.row_max[static_cast<size_t>(m)]));
    s.sums[static_cast<size_t>(m)] = sum;
    const int64_t t = targets[m] - off;
    s.sums[static_cast<size_t>(M + m)] = t >= 0 && t < V ? l[t] : 0.0f;
  }
  s.logits = {};
}

// Segment 2: loss and dlogits from the summed [sum of exp | target logit].
// Returns the loss sum on tp rank 0 only, so the group counts it once.
double HeadUnit::vocab_parallel_loss(Saved& s, const int32_t* targets, float scale) {
  const int64_t M = s.rows, V = dims_.vocab, off = dims_.vocab_offset;
  double loss = 0.0;
  for (int64_t m = 0; m < M; ++m) {
    const float total = s.sums[static_cast<size_t>(m)];
    loss += std::log(static_cast<double>(total)) + s.row_max[static_cast<size_t>(m)] - s.sums[static_cast<size_t>(M + m)];
    float* d = s.dlogits.data() + m * V;
    const float inv = 1.0f / total;
    for (int64_t v = 0; v < V; ++v) d[v] *= inv * scale;
    const int64_t t = targets[m] - off;
    if (t >= 0 && t < V) d[t] -= scale;
  }
  s.local_max = s.all_max = s.row_max = s.sums = {};
  return tp_.rank == 0 ? loss : 0.0;
}

const float* HeadUnit::logits(int slot) const {
  auto it = saved_.find(slot);
  return it != saved_.end() && it->second.inference ? it->second.dlogits.data() : nullptr;
}

std::unique_ptr<Unit> make_unit(const ir::UnitSpec& spec, const config::ModelConfig& cfg,
                                ParamStore& params, backend::Backend& be, TpInfo tp) {
  switch (spec.kind) {
    case ir::UnitKind::UNIT_EMBED: return std::make_unique<EmbedUnit>(spec, cfg, params, be, tp);
    case ir::UnitKind::UNIT_HEAD: return std::make_unique<HeadUnit>(spec, cfg, params, be, tp);
    case ir::UnitKind::UNIT_MLP: return std::make_unique<MlpBlock>(spec, cfg, params, be, tp);
    case ir::UnitKind::UNIT_ATTENTION: return std::make_unique<AttentionBlock>(spec, cfg, params, be, tp);
    case ir::UnitKind::UNIT_MAMBA: return std::make_unique<MambaBlock>(spec, cfg, params, be, tp);
    case ir::UnitKind::UNIT_MOE: break;
  }
  throw std::invalid_argument("unit " + spec.name + ": " + ir::unit_kind_name(spec.kind) +
                              " blocks are not supported in this build");
}

}  // namespace piper::model
