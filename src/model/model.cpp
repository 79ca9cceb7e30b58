// model.cpp — unit construction and autoregressive sampling.
#include "model/model.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

namespace piper::model {

std::vector<int> Model::all_units(const ir::ModelGraph& g, std::vector<int> units) {
  if (units.empty())
    for (size_t u = 0; u < g.units.size(); ++u) units.push_back(static_cast<int>(u));
  return units;
}

Model::Model(const config::ModelConfig& cfg, const ir::ModelGraph& graph, std::vector<int> units,
             backend::Backend& be, Sharding sharding, comm::Communicator* tp, comm::Communicator* ep,
             bool allocate_state)
    : cfg_(cfg), graph_(graph), be_(be), params_(graph, all_units(graph, units), be, sharding, allocate_state) {
  units_.resize(graph.units.size());
  for (int u : all_units(graph, std::move(units)))
    units_[static_cast<size_t>(u)] = make_unit(graph.units[static_cast<size_t>(u)], cfg_, params_, be,
                                               {sharding.tp_rank, sharding.tp_size, sharding.tp_size > 1 ? tp : nullptr},
                                               {sharding.ep_rank, sharding.ep_size, sharding.ep_size > 1 ? ep : nullptr});
}

Precision precision_of(config::Precision p) {
  const backend::DType stored =
      config::stores_in_bf16(p) ? backend::DType::DTYPE_BF16 : backend::DType::DTYPE_F32;
  switch (p) {
    case config::Precision::PRECISION_FP32: return {backend::MatmulPrecision::MATMUL_FP32, stored};
    case config::Precision::PRECISION_TF32: return {backend::MatmulPrecision::MATMUL_TF32, stored};
    case config::Precision::PRECISION_BF16: return {backend::MatmulPrecision::MATMUL_BF16, stored};
  }
  throw std::logic_error("model: a train.precision without its products' precision");
}

void Model::set_precision(const Precision& p) {
  be_.set_matmul_precision(p.products);
  for (const auto& u : units_)
    if (u) u->keep_activations_in(p.storage);
  storage_ = p.storage;
}

std::vector<int32_t> Model::generate(const std::vector<int32_t>& prompt, int64_t n,
                                     int64_t max_context, uint64_t seed, float temperature,
                                     int64_t top_k, const std::function<bool()>& stop) {
  for (const auto& u : units_)
    if (!u) throw std::logic_error("generate needs every unit of the model on this rank");
  constexpr int kSlot = -1;  // inference slot, apart from training microbatches
  std::vector<int32_t> seq = prompt;
  std::mt19937_64 rng(seed);
  const int64_t D = cfg_.d_model, V = cfg_.vocab_size;
  for (int64_t step = 0; step < n && !(stop && stop()); ++step) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(seq.size()) - max_context);
    const int64_t T = static_cast<int64_t>(seq.size()) - start;
    Tensor ids(be_, backend::Shape{T}, backend::MemCategory::MEM_BUFFERS, backend::DType::DTYPE_I32);
    be_.to_device(ids.view().ptr, seq.data() + start, static_cast<size_t>(T) * sizeof(int32_t));
    MicroBatch mb{static_cast<const int32_t*>(ids.view().ptr), nullptr, 1, T, 1.0f};
    Tensor a(be_, {mb.rows(), D}, backend::MemCategory::MEM_BUFFERS, storage_);
    Tensor b(be_, {mb.rows(), D}, backend::MemCategory::MEM_BUFFERS, storage_);
    play_pass(*units_.front(), ir::NodeKind::FWD, kSlot, {&mb, {}, {}, a.view(), {}});
    for (size_t u = 1; u + 1 < units_.size(); ++u) {
      play_pass(*units_[u], ir::NodeKind::FWD, kSlot, {&mb, a.view(), {}, b.view(), {}});
      std::swap(a, b);
    }
    play_pass(*units_.back(), ir::NodeKind::FWD, kSlot, {&mb, a.view(), {}, {}, {}});
    std::vector<float> logits(static_cast<size_t>(V));  // the last position's, on the host
    be_.to_host(logits.data(), units_.back()->logits(kSlot) + (mb.rows() - 1) * V, logits.size() * sizeof(float));
    const float* last = logits.data();
    int32_t next = 0;
    if (temperature <= 0.0f) {
      next = static_cast<int32_t>(std::max_element(last, last + V) - last);
    } else {
      std::vector<double> p(static_cast<size_t>(V));
      const double mx = *std::max_element(last, last + V);
      for (int64_t v = 0; v < V; ++v) p[static_cast<size_t>(v)] = std::exp((last[v] - mx) / temperature);
      if (top_k > 0 && top_k < V) {  // below the k-th largest logit: weight 0 (ties at the k-th all stay)
        std::vector<float> sorted(last, last + V);
        std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<float>());
        const float kth = sorted[static_cast<size_t>(top_k - 1)];
        for (int64_t v = 0; v < V; ++v)
          if (last[v] < kth) p[static_cast<size_t>(v)] = 0;
      }
      std::discrete_distribution<int32_t> dist(p.begin(), p.end());
      next = dist(rng);
    }
    for (auto& u : units_) u->release(kSlot);
    seq.push_back(next);
  }
  return std::vector<int32_t>(seq.begin() + static_cast<int64_t>(prompt.size()), seq.end());
}

}  // namespace piper::model
