// unit.hpp — the executable form of one model unit (embedding, a block, the
// head): forward, the two halves of backward, and per-microbatch saved state.
// The runtime calls these for FWD / BWD_I / BWD_W / BWD nodes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "comm/comm.hpp"
#include "config/config.hpp"
#include "ir/model_graph.hpp"
#include "model/params.hpp"

namespace piper::model {

// The tokens of one microbatch: `batch` sequences of `seq` positions.
struct MicroBatch {
  const int32_t* inputs = nullptr;   // [batch, seq]
  const int32_t* targets = nullptr;  // [batch, seq]; nullptr = inference (head keeps logits)
  int64_t batch = 0;
  int64_t seq = 0;
  float loss_scale = 1.0f;  // d(loss)/d(sum of token losses): 1 / tokens in the global batch
  int64_t rows() const { return batch * seq; }
};

using backend::Tensor;

// Tensor parallelism: this rank's place in its tp group (Megatron style).
struct TpInfo {
  int rank = 0;
  int size = 1;
  comm::Communicator* comm = nullptr;  // null when size is 1
};

// The sizes a tp rank computes with: heads, groups, hidden and vocabulary split.
struct LocalDims {
  int64_t heads, kv_heads, ffn, d_inner, mamba_heads, groups, conv_channels, in_proj_rows;
  int64_t vocab, vocab_offset;
  LocalDims(const config::ModelConfig& c, const TpInfo& tp);
};

class Unit {
 public:
  Unit(const ir::UnitSpec& spec, const config::ModelConfig& cfg, ParamStore& params,
       backend::Backend& be, TpInfo tp = {})
      : spec_(spec), cfg_(cfg), params_(params), be_(be), tp_(tp), dims_(cfg, tp) {}
  virtual ~Unit() = default;
  Unit(const Unit&) = delete;
  Unit& operator=(const Unit&) = delete;

  const ir::UnitSpec& spec() const { return spec_; }

  // x: input activations [rows, D] (unused by the embedding); y: output [rows, D]
  // (unused by the head). Saves what backward needs under `slot`. Returns the
  // sum of token losses for the head, 0 otherwise.
  virtual double forward(int slot, const MicroBatch& mb, const float* x, float* y) = 0;
  // dy: gradient of the output (unused by the head); dx: gradient of the input,
  // overwritten (unused by the embedding). Accumulates the cheap parameter
  // gradients and keeps what backward_weight needs.
  virtual void backward_input(int slot, const float* x, const float* dy, float* dx) = 0;
  // Accumulates the matrix weight gradients and releases the slot.
  virtual void backward_weight(int slot) = 0;
  // Fused backward.
  void backward(int slot, const float* x, const float* dy, float* dx) {
    backward_input(slot, x, dy, dx);
    backward_weight(slot);
  }
  // Drops a slot's saved state without a backward (inference).
  virtual void release(int slot) = 0;
  // The head keeps logits [rows, V] of an inference forward; nullptr elsewhere.
  virtual const float* logits(int /*slot*/) const { return nullptr; }

 protected:
  float* w(size_t i) { return params_.value(spec_.index, i); }
  float* g(size_t i) { return params_.grad(spec_.index, i); }
  Tensor act(int64_t n) { return Tensor(be_, n, backend::MemCategory::MEM_ACTIVATIONS); }
  Tensor scratch(int64_t n) { return Tensor(be_, n, backend::MemCategory::MEM_BUFFERS); }

  // Sums a tp-partial buffer over the tp group (a no-op without tensor parallelism).
  void tp_allreduce(float* buf, int64_t n) {
    if (tp_.comm) tp_.comm->allreduce(buf, static_cast<size_t>(n));
  }

  const ir::UnitSpec& spec_;
  const config::ModelConfig& cfg_;
  ParamStore& params_;
  backend::Backend& be_;
  TpInfo tp_;
  LocalDims dims_;
};

// A residual pre-norm block: y = x + mixer(rmsnorm(x, norm.weight)).
// Parameter 0 is norm.weight; the mixer's follow in spec order.
class Block : public Unit {
 public:
  using Unit::Unit;
  double forward(int slot, const MicroBatch& mb, const float* x, float* y) final;
  void backward_input(int slot, const float* x, const float* dy, float* dx) final;
  void backward_weight(int slot) final;
  void release(int slot) final;

 protected:
  // xn, out: [rows, D]. Saves under `slot`.
  virtual void mixer_forward(int slot, const MicroBatch& mb, const float* xn, float* out) = 0;
  // dout [rows, D] -> dxn [rows, D] (overwritten); keeps the weight-gradient stash.
  virtual void mixer_backward_input(int slot, const float* xn, const float* dout, float* dxn) = 0;
  virtual void mixer_backward_weight(int slot, const float* xn) = 0;
  virtual void mixer_release(int slot) = 0;

 private:
  struct Saved {
    int64_t rows = 0;
    Tensor xn, rstd;
  };
  std::map<int, Saved> saved_;
};

// Builds the unit for `spec` (its parameters must be in `params`).
std::unique_ptr<Unit> make_unit(const ir::UnitSpec& spec, const config::ModelConfig& cfg,
                                ParamStore& params, backend::Backend& be, TpInfo tp = {});

}  // namespace piper::model
