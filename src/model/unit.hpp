// unit.hpp — the executable form of one model unit (embedding, a block, the
// head): forward, the two halves of backward, and per-microbatch saved state.
// Each pass runs as the segments ir::pass_shape gives it, so that its
// tensor-parallel collectives are DAG nodes between them; the runtime calls
// Unit::run for each FWD / BWD_I / BWD_W / BWD segment node.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "comm/comm.hpp"
#include "config/config.hpp"
#include "ir/model_graph.hpp"
#include "ir/unit_passes.hpp"
#include "model/params.hpp"

namespace piper::model {

// The epsilon of every RMSNorm of the model (docs/model.md).
constexpr float kNormEps = 1e-5f;

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

// This rank's place in a process group of the unit's passes: tp (Megatron
// style) or ep (an MoE block's experts).
struct GroupInfo {
  int rank = 0;
  int size = 1;
  comm::Communicator* comm = nullptr;  // null when size is 1, or where the DAG's nodes run the collectives
};
using TpInfo = GroupInfo;
using EpInfo = GroupInfo;

// The sizes a tp (and ep) rank computes with: heads, groups, hidden and vocabulary
// split; an MoE block's experts [first_expert, first_expert + experts) of n_experts.
struct LocalDims {
  int64_t heads, kv_heads, ffn, d_inner, mamba_heads, groups, conv_channels, in_proj_rows;
  int64_t vocab, vocab_offset;
  int64_t moe_ffn, experts, first_expert;
  LocalDims(const config::ModelConfig& c, const TpInfo& tp, const EpInfo& ep);
};

// What a segment of a pass reads and writes, [rows, D] each, in the storage type the runtime keeps them in
// between units (f32, or bf16 under train.precision bf16: Model::storage_dtype), which every unit computes
// on. Each segment of one pass gets the same arguments.
struct PassArgs {
  const MicroBatch* mb = nullptr;  // FWD: the tokens
  backend::ConstTensorView x;      // the input activation [rows, D] (not the embedding's)
  backend::ConstTensorView dy;     // backward: gradient of the output [rows, D] (not the head's)
  backend::TensorView y;           // FWD: the output [rows, D] (not the head's), final after the last segment
  backend::TensorView dx;          // BWD_I, BWD: the input gradient (not the embedding's), after the last segment
};

// The buffer a communication point moves over its group: an all-reduce
// sums `send` in place (recv == send); an all-gather puts every rank's
// `count` floats of `send` into `recv`, rank order; an all-to-all sends
// send_counts[j] elements of `send` to group rank j and receives recv_counts[j]
// from it (empty counts: count / group size each way), in storage type `dtype`.
struct CommBuffer {
  void* send = nullptr;
  void* recv = nullptr;
  int64_t count = 0;  // elements this rank contributes
  std::vector<int64_t> send_counts, recv_counts;
  backend::DType dtype = backend::DType::DTYPE_F32;  // f32 but for an all-to-all of activations
  // The f32 buffers of a reduction or a gather (a logic_error for another dtype).
  float* send_floats() const { return floats(send); }
  float* recv_floats() const { return floats(recv); }

 private:
  float* floats(void* p) const;
};

class Unit {
 public:
  Unit(const ir::UnitSpec& spec, const config::ModelConfig& cfg, ParamStore& params,
       backend::Backend& be, TpInfo tp = {}, EpInfo ep = {});
  virtual ~Unit() = default;
  Unit(const Unit&) = delete;
  Unit& operator=(const Unit&) = delete;

  const ir::UnitSpec& spec() const { return spec_; }
  // The communicator of the unit's collectives over `g` (GROUP_TP or GROUP_EP); null when not given.
  comm::Communicator* group(ir::GroupDim g) const { return g == ir::GroupDim::GROUP_EP ? ep_.comm : tp_.comm; }
  // Segments and communication points of a pass (ir::pass_shape for this unit).
  const ir::PassShape& shape(ir::NodeKind pass) const;

  // Segment k of `pass` (FWD, BWD_I, BWD_W or BWD) for microbatch `slot`;
  // segment k > 0 runs once communication point k - 1 has completed. FWD
  // saves what backward needs under `slot`; BWD_I accumulates the cheap
  // parameter gradients and keeps what BWD_W needs; BWD_W accumulates the
  // matrix weight gradients and releases the slot; BWD does both. The
  // embedding has no input gradient: its BWD_W is its whole backward and
  // reads dy. Returns the sum of token losses for the head's last forward
  // segment, 0 otherwise.
  double run(ir::NodeKind pass, int k, int slot, const PassArgs& a);
  // The buffer communication point k of `pass` moves (after segment k ran).
  virtual CommBuffer point(ir::NodeKind pass, int k, int slot) = 0;
  // Drops a slot's saved state without a backward (inference).
  virtual void release(int slot) = 0;
  // Activation recomputation (a block's; the embedding and the head throw std::logic_error):
  // drop() after the forward's last segment frees what `mode` recomputes (selective: the
  // mixer's inner activations; full: also the normalised input and its rstd); recompute(),
  // before the backward, runs that part of the forward again from the unit's input `x`
  // into scratch, restoring exactly the state the backward reads. No collective.
  virtual void drop(int slot, ir::Recompute mode);
  virtual void recompute(int slot, const MicroBatch& mb, backend::ConstTensorView x, ir::Recompute mode);
  // The head keeps logits [rows, V] of an inference forward; nullptr elsewhere.
  virtual const float* logits(int /*slot*/) const { return nullptr; }
  // An MoE block's routing since the last take: the sum over this rank's
  // sequences of the balance loss aux(s), and the rows routed to each expert
  // (n_experts entries). Counted on tp rank 0 only (the tp group routes the
  // same tokens). Other units: empty.
  struct Routing {
    double aux_sum = 0;
    std::vector<double> tokens;
  };
  virtual Routing take_routing() { return {}; }
  // The storage type of the activations a unit keeps from a forward for its backward (kept()), and of
  // the rows an MoE block moves between ranks: f32 to begin with; bf16 under train.precision bf16
  // (Model::set_precision).
  void keep_activations_in(backend::DType t) { kept_dtype_ = t; }

 protected:
  virtual double forward(int k, int slot, const PassArgs& a) = 0;
  virtual void backward_input(int k, int slot, const PassArgs& a) = 0;
  // Accumulates the matrix weight gradients; the slot stays until release.
  virtual void weight_grads(int slot, const PassArgs& a) = 0;
  bool last(ir::NodeKind pass, int k) const { return k + 1 == shape(pass).segments; }
  // The segment of a fused BWD after which the weight gradients can run (the first, unless the
  // mixer's backward spans segments).
  virtual int weight_segment() const { return 0; }
  // What a unit computes in f32 and keeps from the forward for the backward in the kept storage type
  // (the head's d(loss)/d(logits)): narrowed when the forward (and a split backward's input half) ends,
  // widened to f32 again when the backward begins. What a unit computes on the storage type needs no
  // narrowing; statistics (rstd, lse, the scan's states), the router's tensors and the small per-head
  // tensors stay f32 and are not listed.
  virtual std::vector<Tensor*> kept(int /*slot*/) { return {}; }
  // kept(slot) in the kept storage type, as a forward leaves them (a recomputation too).
  void narrow(int slot) { convert_kept(slot, kept_dtype_); }
  backend::DType activation_storage() const { return kept_dtype_; }
  // The type of what a pass sums over the tp group before it is final (a partial output or input gradient)
  // beside activations of `storage`: f32 under tp > 1 (the collectives sum f32), else `storage` itself.
  backend::DType partial_dtype(backend::DType storage) const {
    return tp_.size > 1 ? backend::DType::DTYPE_F32 : storage;
  }

  // Parameter i in f32, as the scan and the step sizes read it (ParamStore::value).
  const float* w(size_t i) { return params_.value(spec_.index, i); }
  // Parameter i as the products and the embedding's lookup read it (ParamStore::compute_view: bf16 under
  // train.precision bf16), elements from `offset` seen as `shape`.
  backend::ConstTensorView weight(size_t i, backend::Shape shape, int64_t offset = 0) {
    return params_.compute_view(spec_.index, i, offset, shape);
  }
  // Parameter i in storage type t, for an op whose data tensors share one type (a norm's weight, the
  // conv's): weight(i) where it is of t (the compute copy under bf16), else converted into `held`.
  backend::ConstTensorView weight_as(size_t i, backend::Shape shape, backend::DType t, Tensor& held);
  float* g(size_t i) { return params_.grad(spec_.index, i); }
  Tensor act(int64_t n) { return Tensor(be_, n, backend::MemCategory::MEM_ACTIVATIONS); }
  Tensor scratch(int64_t n) { return Tensor(be_, n, backend::MemCategory::MEM_BUFFERS); }
  // The same in storage type t: what a mixer computes on in the activations' storage type (activation_storage()).
  Tensor act(int64_t n, backend::DType t) { return Tensor(be_, {n}, backend::MemCategory::MEM_ACTIVATIONS, t); }
  Tensor scratch(int64_t n, backend::DType t) { return Tensor(be_, {n}, backend::MemCategory::MEM_BUFFERS, t); }

  const ir::UnitSpec& spec_;
  const config::ModelConfig& cfg_;
  ParamStore& params_;
  backend::Backend& be_;
  TpInfo tp_;
  EpInfo ep_;
  LocalDims dims_;
  ir::PassShape shapes_[4];  // FWD, BWD_I, BWD_W, BWD

 private:
  void convert_kept(int slot, backend::DType to);
  // The kept activation t in storage type `to` (nothing to do when empty or of that type already).
  void store_as(Tensor& t, backend::DType to);
  backend::DType kept_dtype_ = backend::DType::DTYPE_F32;
};

// Plays one pass of `unit` alone: its segments in order, each communication
// point as a blocking collective over the unit's group (Unit::group). Adds the
// time in the segments, not in the collectives, to *compute_ms when given.
// Returns what the pass returns (the head's forward: the loss sum). For
// inference, calibration and tests; training plays DAG nodes instead.
double play_pass(Unit& unit, ir::NodeKind pass, int slot, const PassArgs& a, double* compute_ms = nullptr);

// A residual pre-norm block: y = x + mixer(rmsnorm(x, norm.weight)).
// Parameter 0 is norm.weight; the mixer's follow in spec order. The block computes on the activations'
// storage type: under bf16 its norm reads x and writes xn in bf16 (with its weight from the compute copy),
// the mixer reads xn and writes its output in bf16, and the residual adds in bf16, as Megatron's bf16
// training without fp32 residual connections; the backward likewise. Only a sum over the tp group (and an
// MoE mixer's combine) needs its output and input gradient in f32 (mixer_dtype), rounded once summed.
class Block : public Unit {
 public:
  using Unit::Unit;
  // The sum over the tp group of the mixer's output (forward) or input gradient (backward).
  CommBuffer point(ir::NodeKind pass, int k, int slot) override;
  void release(int slot) final;
  void drop(int slot, ir::Recompute mode) final;
  void recompute(int slot, const MicroBatch& mb, backend::ConstTensorView x, ir::Recompute mode) final;

 protected:
  double forward(int k, int slot, const PassArgs& a) final;
  void backward_input(int k, int slot, const PassArgs& a) final;
  void weight_grads(int slot, const PassArgs& a) final;
  // xn [rows, D] in the storage type; out [rows, D] in mixer_dtype(). Saves under `slot`.
  virtual void mixer_forward(int slot, const MicroBatch& mb, backend::ConstTensorView xn,
                             backend::TensorView out) = 0;
  // dout [rows, D] in the storage type -> dxn [rows, D] in mixer_dtype() (overwritten); keeps the
  // weight-gradient stash.
  virtual void mixer_backward_input(int slot, backend::ConstTensorView xn, backend::ConstTensorView dout,
                                    backend::TensorView dxn) = 0;
  virtual void mixer_backward_weight(int slot, backend::ConstTensorView xn) = 0;
  virtual void mixer_release(int slot) = 0;
  // A mixer with communication inside (an MoE block's all-to-alls) runs the
  // rest of its forward and input-gradient backward as segments k > 0 of the
  // pass, between its points; the others do all in segment 0. The mixer's
  // output `out` and `dxn` are final after the segment before the block's
  // own sum over tp (or the last one).
  virtual void mixer_forward_segment(int /*k*/, int /*slot*/) {}
  virtual void mixer_backward_segment(int /*k*/, int /*slot*/) {}
  // What the mixer adds to the loss sum for `slot` (the MoE balance loss), once its forward is done.
  virtual double mixer_loss(int /*slot*/) const { return 0.0; }
  // Whether the mixer writes its output and input gradient in f32 whatever the storage type (an MoE
  // block's combine and dispatch backward accumulate its rows in f32).
  virtual bool mixer_writes_f32() const { return false; }
  // The type of the mixer's output and input gradient beside activations of `storage`: the storage type,
  // or f32 where the tp group sums them (the collectives sum f32) or the mixer writes f32.
  backend::DType mixer_dtype(backend::DType storage) const;

 private:
  struct Saved {
    int64_t rows = 0;
    Tensor xn, rstd;          // in the storage type, f32; dropped under full recomputation until recompute()
    backend::TensorView out;  // the mixer's output: the block's y, or `sum` where its type is not y's
    Tensor sum;               // the mixer's output in mixer_dtype() when not y's, stored into y once final
    Tensor dxn;               // backward: the mixer's input gradient in mixer_dtype(), summed over tp at point 0
  };
  std::map<int, Saved> saved_;
};

// Builds the unit for `spec` (its parameters must be in `params`).
std::unique_ptr<Unit> make_unit(const ir::UnitSpec& spec, const config::ModelConfig& cfg,
                                ParamStore& params, backend::Backend& be, TpInfo tp = {}, EpInfo ep = {});

}  // namespace piper::model
