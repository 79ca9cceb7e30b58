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
double EmbedUnit::forward(int slot, const MicroBatch& mb, const float* /*x*/, float* y) {
  const int64_t M = mb.rows(), D = cfg_.d_model;
  if (tp_.size == 1) {
    k::embedding_fwd(mb.inputs, w(0), y, M, D);
  } else {  // vocab-parallel: this rank's rows, zeros elsewhere, summed over the group
    const float* table = w(0);
#pragma omp parallel for schedule(static) if (M * D > 65536)
    for (int64_t m = 0; m < M; ++m) {
      const int64_t id = mb.inputs[m] - dims_.vocab_offset;
      float* row = y + m * D;
      if (id >= 0 && id < dims_.vocab)
        std::copy(table + id * D, table + (id + 1) * D, row);
      else
        std::fill(row, row + D, 0.0f);
    }
    tp_allreduce(y, M * D);
  }
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
  const int64_t M = static_cast<int64_t>(s.ids.size()), D = cfg_.d_model;
  if (tp_.size == 1) {
    k::embedding_bwd(s.ids.data(), s.dy.data(), g(0), M, D);
  } else {  // rows of this rank's vocabulary, in order m = 0..M-1 (deterministic)
    float* dtable = g(0);
    for (int64_t m = 0; m < M; ++m) {
      const int64_t id = s.ids[static_cast<size_t>(m)] - dims_.vocab_offset;
      if (id < 0 || id >= dims_.vocab) continue;
      const float* src = s.dy.data() + m * D;
      float* dst = dtable + id * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) dst[d] += src[d];
    }
  }
  saved_.erase(slot);
}

// Params: 0 final_norm.weight [D], 1 lm_head.weight [V, D].
double HeadUnit::forward(int slot, const MicroBatch& mb, const float* x, float* /*y*/) {
  const int64_t M = mb.rows(), D = cfg_.d_model, V = dims_.vocab;
  Saved s{M, act(M * D), act(M), {}, mb.targets == nullptr};
  k::rmsnorm_fwd(x, w(0), s.xn.data(), s.rstd.data(), M, D, kNormEps);
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
    s.dlogits = act(M * V);
    loss = vocab_parallel_cross_entropy(logits.data(), mb.targets, s.dlogits.data(), M, mb.loss_scale);
  }
  saved_[slot] = std::move(s);
  return loss;
}

void HeadUnit::backward_input(int slot, const float* x, const float* /*dy*/, float* dx) {
  Saved& s = saved_.at(slot);
  if (s.inference) throw std::logic_error("backward of an inference forward of the head");
  const int64_t M = s.rows, D = cfg_.d_model, V = dims_.vocab;
  Tensor dxn = scratch(M * D);
  k::linear_bwd_input(s.dlogits.data(), w(1), dxn.data(), M, D, V, false);
  tp_allreduce(dxn.data(), M * D);  // vocab-parallel: each rank's rows give a partial sum
  k::rmsnorm_bwd(dxn.data(), x, w(0), s.rstd.data(), dx, g(0), M, D);
}

void HeadUnit::backward_weight(int slot) {
  Saved& s = saved_.at(slot);
  k::linear_bwd_weight(s.dlogits.data(), s.xn.data(), g(1), s.rows, cfg_.d_model, dims_.vocab);
  saved_.erase(slot);
}

// Cross-entropy over a vocabulary split across the tp group (Megatron's
// vocab-parallel loss): the row max, the sum of exponentials and the target
// logit are reduced over the group; full logits are never gathered.
// logits [M, V/tp] -> dlogits [M, V/tp]; returns the loss sum (tp rank 0 only,
// so the group counts it once).
double HeadUnit::vocab_parallel_cross_entropy(const float* logits, const int32_t* targets, float* dlogits,
                                              int64_t M, float scale) {
  const int64_t V = dims_.vocab, off = dims_.vocab_offset, T = tp_.size;
  std::vector<float> local_max(static_cast<size_t>(M)), all_max(static_cast<size_t>(M * T));
  for (int64_t m = 0; m < M; ++m) local_max[static_cast<size_t>(m)] = *std::max_element(logits + m * V, logits + (m + 1) * V);
  tp_.comm->allgather(local_max.data(), all_max.data(), static_cast<size_t>(M));
  std::vector<float> row_max(static_cast<size_t>(M)), sums(static_cast<size_t>(2 * M), 0.0f);
  for (int64_t m = 0; m < M; ++m) {
    float mx = all_max[static_cast<size_t>(m)];
    for (int64_t t = 1; t < T; ++t) mx = std::max(mx, all_max[static_cast<size_t>(t * M + m)]);
    row_max[static_cast<size_t>(m)] = mx;
  }
#pragma omp parallel for schedule(static) if (M * V > 65536)
  for (int64_t m = 0; m < M; ++m) {
    const float* l = logits + m * V;
    float* d = dlogits + m * V;
    float sum = 0.0f;
    for (int64_t v = 0; v < V; ++v) sum += (d[v] = std::exp(l[v] - row_max[static_cast<size_t>(m)]));
    sums[static_cast<size_t>(m)] = sum;
    const int64_t t = targets[m] - off;
    sums[static_cast<size_t>(M + m)] = t >= 0 && t < V ? l[t] : 0.0f;
  }
  tp_.comm->allreduce(sums.data(), sums.size());  // [sum of exp | target logit] per row
  double loss = 0.0;
  for (int64_t m = 0; m < M; ++m) {
    const float total = sums[static_cast<size_t>(m)];
    loss += std::log(static_cast<double>(total)) + row_max[static_cast<size_t>(m)] - sums[static_cast<size_t>(M + m)];
    float* d = dlogits + m * V;
    const float inv = 1.0f / total;
    for (int64_t v = 0; v < V; ++v) d[v] *= inv * scale;
    const int64_t t = targets[m] - off;
    if (t >= 0 && t < V) d[t] -= scale;
  }
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
