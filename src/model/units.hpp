// units.hpp — the concrete units: embedding, the three block kinds, head.
#pragma once

#include "kernels.hpp"
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
    std::vector<int32_t> ids;
    float* out = nullptr;  // tp > 1: the partial lookup, summed over the group at point 0
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

 private:
  struct Saved {
    int64_t rows = 0;
    Tensor xn, rstd;
    Tensor dlogits;  // [rows, V]: d(loss)/d(logits), or the logits of an inference forward
    bool inference = false;
    // The vocab-parallel loss between its points: logits [rows, V/tp] until
    // the exponential sums, this rank's row maxima, everyone's, their max,
    // and [sum of exp | target logit] per row.
    Tensor logits;
    Tensor local_max, all_max, row_max, sums;
    Tensor dxn;  // backward: the partial input gradient of the norm, summed at point 0
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
  void mixer_forward(int slot, const MicroBatch& mb, const float* xn, float* out) override;
  void mixer_backward_input(int slot, const float* xn, const float* dout, float* dxn) override;
  void mixer_backward_weight(int slot, const float* xn) override;
  void mixer_release(int slot) override;

 private:
  struct Saved {
    int64_t rows = 0;
    Tensor gate, up, h;         // [rows, F]
    Tensor dout, dgate, dup;    // weight-gradient stash
  };
  std::map<int, Saved> saved_;
};

class AttentionBlock final : public Block {
 public:
  using Block::Block;

 protected:
  void mixer_forward(int slot, const MicroBatch& mb, const float* xn, float* out) override;
  void mixer_backward_input(int slot, const float* xn, const float* dout, float* dxn) override;
  void mixer_backward_weight(int slot, const float* xn) override;
  void mixer_release(int slot) override;

 private:
  struct Saved {
    int64_t batch = 0, seq = 0;
    Tensor q, k, v;    // after RoPE: [B,T,H,hd], [B,T,KV,hd], [B,T,KV,hd]
    Tensor att, lse;   // [B,T,H,hd], [B,H,T]
    Tensor dout, dq, dk, dv;  // weight-gradient stash
  };
  std::map<int, Saved> saved_;
};

class MambaBlock final : public Block {
 public:
  using Block::Block;

 protected:
  void mixer_forward(int slot, const MicroBatch& mb, const float* xn, float* out) override;
  void mixer_backward_input(int slot, const float* xn, const float* dout, float* dxn) override;
  void mixer_backward_weight(int slot, const float* xn) override;
  void mixer_release(int slot) override;

 private:
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
