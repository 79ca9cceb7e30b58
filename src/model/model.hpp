// model.hpp — the units a rank holds, their parameters, and text generation.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "config/config.hpp"
#include "ir/model_graph.hpp"
#include "model/params.hpp"
#include "model/unit.hpp"

namespace piper::model {

// What train.precision asks of the backend, the units and the runtime (docs/backend.md): the precision
// of the matrix products, and the storage type of what the units compute on where it is stored or
// moved: the activations kept from a forward for its backward (Unit::kept), the activations and their
// gradients between units and pipeline stages (PassArgs), an MoE block's rows between ranks, and the
// parameters a pass computes with (ZeRO-3 gathers them so). It follows config::stores_in_bf16: f32
// under fp32 and tf32, bf16 under bf16.
struct Precision {
  backend::MatmulPrecision products = backend::MatmulPrecision::MATMUL_FP32;
  backend::DType storage = backend::DType::DTYPE_F32;
};
// What the setting `p` (config::precision_of) asks.
Precision precision_of(config::Precision p);

class Model {
 public:
  // Holds `units` (indices into graph.units); all of them when empty. With `allocate_state` false the
  // parameter store starts without buffers (ParamStore's constructor).
  Model(const config::ModelConfig& cfg, const ir::ModelGraph& graph, std::vector<int> units,
        backend::Backend& be, Sharding sharding = {}, comm::Communicator* tp = nullptr,
        comm::Communicator* ep = nullptr, bool allocate_state = true);

  const config::ModelConfig& config() const { return cfg_; }
  const ir::ModelGraph& graph() const { return graph_; }
  ParamStore& params() { return params_; }
  bool holds(int unit) const { return params_.holds(unit); }
  Unit& unit(int u) { return *units_.at(static_cast<size_t>(u)); }
  backend::Backend& backend() { return be_; }
  // The products' precision on the backend, and the storage type to every unit held and to the
  // runtime (storage_dtype).
  void set_precision(const Precision& p);
  // Precision::storage (f32 to begin with).
  backend::DType storage_dtype() const { return storage_; }

  // Continues `prompt` by `n` tokens, sampling from softmax(logits / temperature)
  // over the `top_k` most likely tokens (0: all of them) with a generator seeded
  // by `seed` (temperature 0: greedy). Context is cut to the last `max_context`
  // tokens. Needs every unit on this rank. Stops early, returning the tokens so
  // far, once `stop` (asked before each token) says so.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t n, int64_t max_context,
                                uint64_t seed, float temperature, int64_t top_k = 0,
                                const std::function<bool()>& stop = {});

 private:
  static std::vector<int> all_units(const ir::ModelGraph& g, std::vector<int> units);
  const config::ModelConfig cfg_;
  const ir::ModelGraph& graph_;
  backend::Backend& be_;
  ParamStore params_;
  std::vector<std::unique_ptr<Unit>> units_;  // indexed by unit; null where not held
  backend::DType storage_ = backend::DType::DTYPE_F32;
};

}  // namespace piper::model
