// units.hpp — the concrete units: embedding, the three block kinds, head.
#pragma once

#include "kernels.hpp"
#include "model/moe_dispatch.hpp"
#include "model/unit.hpp"

namespace piper::model {

class EmbedUnit final : public Unit {
 public:
  using Unit::Unit;
  CommBuffer point(ir::NodeKind pass, int k, int slot) override;
  void release(int slot) override { saved_.erase(slot); }

 protected:
  double forward(int k, int slot, const PassArgs& a) override;
  void backward_input(int /*k*/, int /*slot*/, const PassArgs& /*a*/) override {}  // no input gradient
  void weight_grads(int slot, const PassArgs& a) override;

 private:
  struct Saved {
    const int32_t* ids = nullptr;  // the microbatch's token ids on the device, alive for the step
    int64_t rows = 0;
    backend::TensorView out;  // tp > 1: the partial lookup, summed over the group at point 0 (f32)
    Tensor sum;               // tp > 1 beside bf16 rows: the lookup in f32, stored into y once summed
  };
  std::map<int, Saved> saved_;
};

class HeadUnit final : public Unit {
 public:
  using Unit::Unit;
  CommBuffer point(ir::NodeKind pass, int k, int slot) override;
  void release(int slot) override { saved_.erase(slot); }
  const float* logits(int slot) const override;

 protected:
  double forward(int k, int slot, const PassArgs& a) override;
  void backward_input(int k, int slot, const PassArgs& a) override;
  void weight_grads(int slot, const PassArgs& a) override;
  std::vector<Tensor*> kept(int slot) override;

 private:
  struct Saved {
    int64_t rows = 0;
    Tensor xn, rstd;  // in the storage type, f32
    Tensor dlogits;   // [rows, V]: d(loss)/d(logits), or the logits of an inference forward
    bool inference = false;
    // The vocab-parallel loss between its points: logits [rows, V/tp] until
    // the exponential sums, every rank's row maxima [rows, tp], their max
    // [rows], and [sum of exp | target logit] per row [2, rows].
    Tensor logits;
    Tensor all_max, row_max, sums;
    Tensor dxn;  // backward: the norm's input gradient (partial_dtype: f32 when summed at point 0)
  };
  void vocab_parallel_maxima(Saved& s);
  void vocab_parallel_sums(Saved& s, const int32_t* targets);
  double vocab_parallel_loss(Saved& s, const int32_t* targets, float scale);
  std::map<int, Saved> saved_;
};

class MlpBlock final : public Block {
 public:
  using Block::Block;

 protected:
  void mixer_forward(int slot, const MicroBatch& mb, backend::ConstTensorView xn, backend::TensorView out) override;
  void mixer_backward_input(int slot, backend::ConstTensorView xn, backend::ConstTensorView dout,
                            backend::TensorView dxn) override;
  void mixer_backward_weight(int slot, backend::ConstTensorView xn) override;
  void mixer_release(int slot) override;

 private:
  struct Saved {
    int64_t rows = 0;
    Tensor gate, up, h;         // [rows, F], in the activations' storage type
    Tensor dout, dgate, dup;    // weight-gradient stash
  };
  std::map<int, Saved> saved_;
};

// The MoE block ('E'): softmax router, top-k, the tokens permuted into
// per-expert groups, SwiGLU experts (this rank's E / ep, each split over tp),
// the weighted combine, and the sequence-wise balance loss (docs/model.md).
// With ep > 1 the rows travel to their experts' ranks and back by all-to-all
// points of the pass (ir::pass_shape); with tp > 1 the combined output and
// the routing weights' gradient are tp-partial sums, summed at points.
class MoeBlock final : public Block {
 public:
  MoeBlock(const ir::UnitSpec& spec, const config::ModelConfig& cfg, ParamStore& params, backend::Backend& be,
           TpInfo tp, EpInfo ep);
  CommBuffer point(ir::NodeKind pass, int k, int slot) override;
  Routing take_routing() override;

 protected:
  void mixer_forward(int slot, const MicroBatch& mb, backend::ConstTensorView xn, backend::TensorView out) override;
  void mixer_forward_segment(int k, int slot) override;
  void mixer_backward_input(int slot, backend::ConstTensorView xn, backend::ConstTensorView dout,
                            backend::TensorView dxn) override;
  void mixer_backward_segment(int k, int slot) override;
  void mixer_backward_weight(int slot, backend::ConstTensorView xn) override;
  void mixer_release(int slot) override;
  double mixer_loss(int slot) const override;
  // The router's gradient comes from the backward's dispatch step, so the weight half waits for it.
  int weight_segment() const override { return static_cast<int>(backward_steps_.size()) - 1; }
  // The combine and the dispatch backward sum the rows into f32 (the dispatch backward's sum takes
  // the router's part after it).
  bool mixer_writes_f32() const override { return true; }

 private:
  // The steps of the passes, segment by segment (the points between segments follow ir::pass_shape).
  enum class Step : uint8_t {
    ROUTE,         // router, top-k, balance loss, permutation
    SIZE,          // the rows to receive, from the exchanged counts
    EXPERTS,       // sorted expert-major, through the experts, unsorted
    COMBINE,       // the returned rows weighted into the output
    COMBINE_BWD,   // the routing weights' and the returned rows' gradients
    EXPERTS_BWD,   // sorted, the experts' input-gradient backward, unsorted
    DISPATCH_BWD,  // the rows' gradients into dxn, and the router's backward
  };
  // What a point moves: the block's own tp sum, or one of the mixer's.
  enum class Move : uint8_t { SUM, COUNTS, DISPATCH, GIVE_BACK, DWEIGHTS, DISPATCH_GRAD, RETURN_GRAD };
  struct Saved {
    int64_t rows = 0, seq = 0;
    float loss_scale = 0;
    backend::ConstTensorView xn;  // the block's, in the storage type
    backend::TensorView out;      // f32 (mixer_writes_f32)
    backend::ConstTensorView dout;  // in the storage type
    backend::TensorView dxn;      // f32
    std::unique_ptr<Dispatcher> dispatch;
    Tensor probs, experts, weights, dprobs;  // [M,E], i32 [M,K], [M,K], [M,E]
    Tensor gate, up, h;                      // the experts' [R,F] x3, in the activations' storage type
    double aux = 0;                          // sum over the microbatch's sequences of aux(s)
    Tensor dweights, dlogits;                // backward: [M,K], [M,E]
    Tensor dgate, dup;                       // weight-gradient stash [R,F] x2, likewise
  };
  void run(Step step, Saved& s);
  void experts_forward(Saved& s);
  void experts_backward(Saved& s);
  void router_backward(Saved& s);
  template <class Fn>
  void for_each_expert(const Saved& s, Fn&& fn) const;
  // Local expert l's matrix of a stacked [L, rows, cols] parameter: its gradient, and its values as the
  // products read them (Unit::weight).
  float* expert(float* stacked, int64_t l, int64_t rows, int64_t cols) const { return stacked + l * rows * cols; }
  backend::ConstTensorView expert_weight(size_t i, int64_t l, int64_t rows, int64_t cols) {
    return weight(i, {rows, cols}, l * rows * cols);
  }

  std::vector<std::vector<Step>> forward_steps_, backward_steps_;  // by segment
  std::vector<Move> forward_moves_, backward_moves_;                // by point
  std::map<int, Saved> saved_;
  Routing routing_;
};

class AttentionBlock final : public Block {
 public:
  using Block::Block;

 protected:
  void mixer_forward(int slot, const MicroBatch& mb, backend::ConstTensorView xn, backend::TensorView out) override;
  void mixer_backward_input(int slot, backend::ConstTensorView xn, backend::ConstTensorView dout,
                            backend::TensorView dxn) override;
  void mixer_backward_weight(int slot, backend::ConstTensorView xn) override;
  void mixer_release(int slot) override;

 private:
  struct Saved {
    int64_t batch = 0, seq = 0;
    Tensor q, k, v;    // after RoPE: [B,T,H,hd], [B,T,KV,hd], [B,T,KV,hd], in the activations' storage type
    Tensor att, lse;   // [B,T,H,hd] likewise, [B,H,T] f32
    Tensor dout, dq, dk, dv;  // weight-gradient stash
  };
  std::map<int, Saved> saved_;
};

class MambaBlock final : public Block {
 public:
  using Block::Block;

 protected:
  void mixer_forward(int slot, const MicroBatch& mb, backend::ConstTensorView xn, backend::TensorView out) override;
  void mixer_backward_input(int slot, backend::ConstTensorView xn, backend::ConstTensorView dout,
                            backend::TensorView dxn) override;
  void mixer_backward_weight(int slot, backend::ConstTensorView xn) override;
  void mixer_release(int slot) override;

 private:
  // In the activations' storage type but states and rstd (f32).
  struct Saved {
    int64_t batch = 0, seq = 0;
    Tensor z, xbc_in, dt_raw;   // slices of in_proj's output: [rows, d_inner], [rows, C], [rows, Hm]
    Tensor xbc_conv;            // conv output before silu [rows, C]
    Tensor x, B, C, dt;         // scan inputs [rows, d_inner], [rows, G*N] x2, [rows, Hm]
    Tensor y, states;           // scan output [rows, d_inner], chunk-entry states
    Tensor normed, rstd;        // gated norm output [rows, d_inner], [rows, G]
    Tensor dout, dzxbcdt;       // weight-gradient stash
  };
  std::map<int, Saved> saved_;
};

}  // namespace piper::model
