// work.hpp — the work of one call of a model unit, op by op: floating-point
// operations and a lower bound of memory traffic per tensor-parallel rank,
// following docs/model.md and the kernels piper runs; the activation memory a
// unit holds, counted as the CPU runtime allocates it; AdamW's traffic per
// element; each unit's cost for balancing pipeline stages. sim/hardware.hpp
// turns these into times. docs/hardware.md derives every formula.
//
// Conventions:
//   - rows M = batch x seq_len tokens of the microbatch; seq_len T is fixed, so
//     every count is linear in rows.
//   - A matrix product [m, k] x [k, n] is 2 m n k FLOPs ("matmul" FLOPs).
//   - Causal products (attention scores, the SSD's intra-chunk matrix) count
//     the lower triangle with its diagonal: n (n + 1) / 2 entries of n x n.
//   - Elementwise ops, norms, softmax, exp and the conv1d are "other" FLOPs
//     with nominal per-element counts; their time is their memory traffic.
//   - Traffic: every operand read once, every result written once (an
//     accumulated result read and written), weights read once per call, at
//     `elem_bytes` per element. Kernels' private scratch that stays in cache
//     is not counted; materialised intermediates (the SSD's C B^T) are.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "ir/graph.hpp"
#include "ir/model_graph.hpp"
#include "ir/unit_passes.hpp"

namespace piper::ir {

// One kernel-sized piece of a unit call.
struct OpWork {
  std::string name;           // "q_proj", "attention", "rmsnorm", "ssd_scan", ...
  double matmul_flops = 0.0;  // in matrix products (tensor cores on GPUs)
  double other_flops = 0.0;   // elementwise, reductions, exp (vector units)
  double bytes = 0.0;         // memory traffic lower bound
  double flops() const { return matmul_flops + other_flops; }
};

// A collective a unit issues over its tensor-parallel group inside the call
// (Megatron's all-reduces, the vocab-parallel loss): `op` is the collective
// node kind (ALLREDUCE, ALLGATHER) the DAG gives it. `bytes` has the meaning
// of a collective node's bytes in ir/build.cpp: the whole buffer each rank
// reduces or gathers, not its shard.
struct TpCollective {
  NodeKind op = NodeKind::ALLREDUCE;
  double bytes = 0.0;
};

// One call of a unit in one pass on one tensor-parallel rank.
struct Work {
  std::vector<OpWork> ops;
  std::vector<TpCollective> tp_comm;  // empty at tp 1
  double flops() const;
  double matmul_flops() const;
  double other_flops() const;
  double bytes() const;
  const OpWork* op(const std::string& name) const;  // nullptr when the call has no such op
  void append(const Work& w);
};

// The work of one call of unit kind `kind` ('e' embedding, 'M' Mamba-2,
// '*' attention, '-' MLP, 'E' MoE under balanced routing, 'h' head: final
// norm, lm_head, cross-entropy) in
// pass `pass` (F forward; BI input gradients and the scan's backward; BW
// weight-gradient products; B = BI then BW) over `rows` rows of sequences of
// `seq_len` tokens, on one of `tp` tensor-parallel ranks, at `elem_bytes`
// bytes per tensor element (4: piper's fp32; 2: bf16).
// Throws std::invalid_argument for 'E' without its sizes, an unknown kind, pass U or C, rows, seq_len or tp < 1,
// and a size the kind splits over tp that does not divide by it.
Work unit_work(const config::ModelConfig& m, char kind, Pass pass, int64_t rows, int64_t seq_len, int tp = 1,
               int elem_bytes = 4);

// Activation memory of one call, in bytes, as the runtime allocates it
// (MemCategory ACTIVATIONS and BUFFERS of src/model/*.cpp), beyond the
// unit's output (the simulator counts that: rows x d_model elements) and the
// input gradient the executor allocates. The activations a unit keeps from its
// forward for its backward are stored at `kept_bytes` per element
// (Strategy::compute_elem_bytes: 2 under bf16, 4 under fp32); the statistics
// (rstd, lse, dt, the router's probabilities, the scan's chunk states), the
// backward's stash and all a pass computes on are f32. Below 4 bytes a pass
// also holds the f32 forms of its input, output and gradients (Unit::run) and,
// in a backward, the kept activations widened back to f32.
struct UnitMemory {
  double saved = 0.0;       // held from the forward until the backward ends
  double kept_for_w = 0.0;  // held between BWD_I and BWD_W: what of `saved` the weight half reads
                            // (the input half frees the rest) plus the weight-gradient stash BWD_I keeps
  double transient = 0.0;   // at the peak inside a pass, above `saved` (BWD_I counts its stash)
};
UnitMemory unit_memory(const config::ModelConfig& m, char kind, int64_t rows, int64_t seq_len, int tp = 1,
                       int kept_bytes = 4);

// What recomputing one call of block kind `kind` costs and frees, as shares of
// its forward (Recompute): full, all of the forward's time and saved
// activations; selective, the mixer's share of the forward's FLOPs (not the
// norm nor the residual) and of its saved activations (all but the block's
// normalised input and rstd); none, nothing.
struct RecomputeShare {
  double time = 0.0;   // of the forward's time
  double saved = 0.0;  // of the saved activations (OpCost::saved)
};
// `kept_bytes` as unit_memory's: the saved state's bytes, and so the share of them, follow it.
RecomputeShare recompute_share(const config::ModelConfig& m, char kind, Recompute mode, int64_t rows,
                               int64_t seq_len, int tp = 1, int kept_bytes = 4);

// The shares of a unit pass's time that each of its segments (ir::pass_shape)
// runs, summing to 1: all in the first segment, except an MoE block's pass
// with all-to-all points, whose experts run between the dispatch and the
// return, and whose combine (forward) or dispatch and router backward
// (backward, with the weight gradients of a fused BWD) after the return. From
// the FLOPs of unit_work's ops at `rows`.
std::vector<double> segment_shares(const config::ModelConfig& m, char kind, NodeKind pass, const PassShape& shape,
                                   int64_t rows, int64_t seq_len, int tp = 1);

// The cost of each unit of `g` (the model graph of `m`) for balancing pipeline stages
// (ir::balance_stages) when no cost model is at hand: the FLOPs of its forward and its backward
// (unit_work, passes F and B) over one sequence of `seq_len` rows at tp 1. Throws as unit_work does.
std::vector<double> unit_costs(const config::ModelConfig& m, const ModelGraph& g, int64_t seq_len);

// AdamW update of one parameter element: reads p, g, m, v and writes p, m, v,
// each `state_bytes` wide (4: fp32 master weights and moments): 7 x state_bytes.
double adamw_bytes_per_element(int state_bytes = 4);
// Nominal arithmetic of the same update (decay, two moments, bias
// corrections, square root, division).
double adamw_flops_per_element();

}  // namespace piper::ir
