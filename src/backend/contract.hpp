// contract.hpp — the op table's contract, checked: for every op of PIPER_BACKEND_OPS, the checks
// of its tensors (on the calling backend, of the right storage type, of the shapes docs/backend.md
// states) and the extents a kernel is called with. Every backend calls the same function before
// it computes, so an op is refused alike on every device, with the backend, op and tensor named.
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.hpp"
#include "ssd.hpp"

namespace piper::backend::contract {

using V = Backend::V;
using O = Backend::O;

// What a tensor of an op holds: data (activations, their gradients, parameters read by the op)
// in the op's storage type — f32 or bf16, one for all its data tensors, one the backend computes
// on; f32 always (saved statistics, router tensors, parameter gradients, optimiser state); or
// i32 indices; or any float type the backend computes on, apart from the op's storage type (the
// two sides of a conversion; a product's operands and output, which mix f32 and bf16); or a weight:
// the embedding's table, in the op's storage type or in bf16 (a unit's compute copy under
// train.precision bf16, read beside f32 rows), checked after a data tensor has set the storage type.
enum class Kind : uint8_t { KIND_DATA, KIND_F32, KIND_I32, KIND_FLOAT, KIND_WEIGHT };

class Check {
 public:
  Check(const char* op, Backend* self) : op_(op), self_(self) {}
  void is(const char* name, const ConstTensorView& t, Kind kind = Kind::KIND_DATA);
  void shape(const char* name, const ConstTensorView& t, const Shape& want, Kind kind = Kind::KIND_DATA);
  void rank(const char* name, const ConstTensorView& t, int r, Kind kind = Kind::KIND_DATA);
  // i32 ids or targets, one per row of a [rows, ...] tensor.
  void ids(const char* name, const ConstTensorView& t, int64_t rows);
  void that(bool ok, const std::string& what) const;
  // Every value of the i32 tensor t in [0, bound), the range of `of` (read through to_host).
  void indices(const char* name, const ConstTensorView& t, int64_t bound, const std::string& of);
  // The i32 tensor t holds each of 0 .. n-1 once.
  void permutation(const char* name, const ConstTensorView& t, int64_t n);
  // The storage type of the op's data tensors (f32 when it has none yet).
  DType storage() const { return storage_; }
  [[noreturn]] void fail(const std::string& what) const;

 private:
  const char* op_;
  Backend* self_;
  DType storage_ = DType::DTYPE_F32;
  bool storage_set_ = false;
};

struct MatDims { int64_t M, K, N; };
struct RowDims { int64_t M, D; };
struct GroupDims { int64_t M, D, G; };
struct AttentionDims { int64_t B, T, H, KV, hd; };
struct ConvDims { int64_t B, T, C, K; };
struct MoeDims { int64_t M, E, K; };
struct PermutedDims { int64_t M, K, D; };
struct TableDims { int64_t M, V, D; };
struct ColDims { int64_t M, S, n; };

kernels::SsdShape ssd_shape_of(const Shape& x, const Shape& Bm, int64_t chunk);

// One function per op: the checks, then the extents. Elementwise ops return the element count.
MatDims linear_fwd(Check& c, V x, V w, O y);
MatDims linear_bwd_input(Check& c, V dy, V w, O dx);
MatDims linear_bwd_weight(Check& c, V dy, V x, O dw);
RowDims rmsnorm_fwd(Check& c, V x, V w, O y, O rstd);
RowDims rmsnorm_bwd(Check& c, V dy, V x, V w, V rstd, O dx, O dw);
GroupDims gated_rmsnorm_fwd(Check& c, V y, V z, V w, O out, O rstd);
GroupDims gated_rmsnorm_bwd(Check& c, V dout, V y, V z, V w, V rstd, O dy, O dz, O dw);
void rope(Check& c, const char* in, V x, const char* outn, O y);
AttentionDims attention_fwd(Check& c, V q, V k, V v, O out, O lse);
AttentionDims attention_bwd(Check& c, V dout, V q, V k, V v, V out, V lse, O dq, O dk, O dv);
ConvDims conv1d_fwd(Check& c, V x, V w, V bias, O y);
ConvDims conv1d_bwd(Check& c, V dy, V x, V w, O dx, O dw, O dbias);
// `saved_numel`: the backend's own ssd_saved_numel for these shapes.
kernels::SsdShape ssd_fwd(Check& c, V x, V dt, V A_log, V Bm, V Cm, V D, O y, O saved, int64_t chunk,
                          int64_t saved_numel);
kernels::SsdShape ssd_bwd(Check& c, V dy, V x, V dt, V A_log, V Bm, V Cm, V D, V saved, O dx, O ddt,
                          O dA_log, O dBm, O dCm, O dD, int64_t chunk, int64_t saved_numel);
int64_t silu_fwd(Check& c, V x, O y);
int64_t silu_bwd(Check& c, V dy, V x, O dx);
int64_t swiglu_fwd(Check& c, V gate, V up, O h);
int64_t swiglu_bwd(Check& c, V dh, V gate, V up, O dgate, O dup);
MoeDims moe_route_fwd(Check& c, V logits, O probs, O experts, O weights);
MoeDims moe_route_bwd(Check& c, V dweights, V dprobs, V probs, V experts, V weights, O dlogits);
MoeDims moe_balance(Check& c, V probs, V experts, int64_t seq, O dprobs);
MoeDims moe_permute_index(Check& c, V experts, O counts, O rows, O pos);
RowDims gather_rows(Check& c, V src, V rows, O dst);  // {P, D}
PermutedDims moe_combine(Check& c, V y, V pos, V weights, O out);
PermutedDims moe_combine_bwd(Check& c, V dout, V y, V pos, V weights, O dy, O dweights);
PermutedDims moe_dispatch_bwd(Check& c, V dxp, V pos, O dx);
RowDims dt_softplus_fwd(Check& c, V dt_raw, V dt_bias, O dt);
RowDims dt_softplus_bwd(Check& c, V ddt, V dt_raw, V dt_bias, O ddt_raw, O ddt_bias);
TableDims embedding_fwd(Check& c, V ids, V table, O out);
TableDims embedding_bwd(Check& c, V ids, V dout, O dtable);
RowDims cross_entropy(Check& c, V logits, V targets, O dlogits);
RowDims row_max(Check& c, V x, O out);
RowDims vocab_ce_partials(Check& c, V logits, V row_max, V targets, O exps, O sums);
RowDims vocab_ce_finish(Check& c, V sums, V row_max, V targets, O dlogits);
ColDims gather_cols(Check& c, V src, int64_t col, O dst);
ColDims scatter_cols(Check& c, V src, O dst, int64_t col);
int64_t add_inplace(Check& c, O y, V x);
int64_t convert(Check& c, V src, O dst);
int64_t adamw_update(Check& c, O p, V g, O m, O v, const AdamWStep& step);
int64_t sum_squares(Check& c, V x);

}  // namespace piper::backend::contract
