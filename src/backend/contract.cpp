// contract.cpp — the checks of every op's tensors (contract.hpp), shared by every backend.
#include "backend/contract.hpp"

#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

namespace piper::backend::contract {

void Check::fail(const std::string& what) const {
  throw std::invalid_argument(std::string("backend ") + self_->name() + ", op " + op_ + ": " + what);
}

void Check::that(bool ok, const std::string& what) const {
  if (!ok) fail(what);
}

void Check::is(const char* name, const ConstTensorView& t, Kind kind) {
  if (t.device != self_)
    fail(std::string("tensor ") + name + " is not on this backend (" +
         (t.device ? t.device->name() : "no device") + ")");
  const std::string tensor = std::string("tensor ") + name + " has dtype " + dtype_name(t.dtype);
  switch (kind) {
    case Kind::KIND_I32:
      that(t.dtype == DType::DTYPE_I32, tensor + ", expected i32 (an index tensor)");
      break;
    case Kind::KIND_F32:
      that(t.dtype == DType::DTYPE_F32, tensor + ", expected f32 (statistics, router tensors, " +
                                             "parameter gradients and optimiser state are f32)");
      break;
    case Kind::KIND_FLOAT:
    case Kind::KIND_WEIGHT:
    case Kind::KIND_DATA:
      that(t.dtype != DType::DTYPE_I32, tensor + ", expected a float type (f32 or bf16)");
      if (!self_->supports(t.dtype)) {
        std::string types;
        for (DType f : {DType::DTYPE_F32, DType::DTYPE_BF16})
          if (self_->supports(f)) types += std::string(types.empty() ? "" : " or ") + dtype_name(f);
        fail(tensor + ", expected " + types + " (the float types backend " + self_->name() +
             " computes in)");
      }
      if (kind == Kind::KIND_FLOAT) break;
      if (kind == Kind::KIND_WEIGHT) {
        if (!storage_set_) fail(std::string("weight ") + name + " checked before the op's data tensors");
        const std::string allowed = storage_ == DType::DTYPE_BF16 ? "bf16" : std::string(dtype_name(storage_)) + " or bf16";
        that(t.dtype == storage_ || t.dtype == DType::DTYPE_BF16,
             tensor + ", expected " + allowed + " (a weight is in the op's storage type, or a unit's bf16 compute copy)");
        break;
      }
      if (!storage_set_) {
        storage_ = t.dtype;
        storage_set_ = true;
      }
      that(t.dtype == storage_, tensor + ", expected " + dtype_name(storage_) +
                                    " (an op's data tensors share one storage type)");
      break;
  }
  if (!t.ptr && t.numel() > 0) fail(std::string("tensor ") + name + " has no data");
}

void Check::shape(const char* name, const ConstTensorView& t, const Shape& want, Kind kind) {
  is(name, t, kind);
  if (t.shape != want)
    fail(std::string("tensor ") + name + " has shape " + t.shape.str() + ", expected " + want.str());
}

void Check::rank(const char* name, const ConstTensorView& t, int r, Kind kind) {
  is(name, t, kind);
  if (t.shape.rank() != r)
    fail(std::string("tensor ") + name + " has shape " + t.shape.str() + ", expected rank " +
         std::to_string(r));
}

void Check::ids(const char* name, const ConstTensorView& t, int64_t rows) {
  is(name, t, Kind::KIND_I32);
  if (t.numel() != rows)
    fail(std::string("tensor ") + name + " has " + std::to_string(t.numel()) +
         " values, expected one per row (" + std::to_string(rows) + ")");
}

namespace {

std::vector<int32_t> host_values(Backend* self, const ConstTensorView& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  if (!v.empty()) self->to_host(v.data(), t.ptr, v.size() * sizeof(int32_t));
  return v;
}

}  // namespace

void Check::indices(const char* name, const ConstTensorView& t, int64_t bound, const std::string& of) {
  is(name, t, Kind::KIND_I32);
  const std::vector<int32_t> v = host_values(self_, t);
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] < 0 || v[i] >= bound)
      fail(std::string("tensor ") + name + " holds " + std::to_string(v[i]) + " at element " +
           std::to_string(i) + ", outside [0, " + std::to_string(bound) + ") (" + of + ")");
}

void Check::permutation(const char* name, const ConstTensorView& t, int64_t n) {
  indices(name, t, n, "the permuted rows");
  const std::vector<int32_t> v = host_values(self_, t);
  std::vector<char> seen(static_cast<size_t>(n), 0);
  for (size_t i = 0; i < v.size(); ++i)
    if (seen[static_cast<size_t>(v[i])]++)
      fail(std::string("tensor ") + name + " holds " + std::to_string(v[i]) + " twice (again at element " +
           std::to_string(i) + "), expected a permutation of [0, " + std::to_string(n) + ")");
}

namespace {

constexpr Kind F32 = Kind::KIND_F32;
constexpr Kind I32 = Kind::KIND_I32;
// The embedding's table: the unit's parameters as it computes with them (bf16 under train.precision
// bf16, beside f32 rows).
constexpr Kind WEIGHT = Kind::KIND_WEIGHT;
// A product's operands and output: f32 and bf16 mix (a unit's bf16 weights and activations beside f32
// ones); the backend brings the operands to one type and rounds a bf16 output from f32 accumulation.
constexpr Kind OPERAND = Kind::KIND_FLOAT;

AttentionDims attention_dims(Check& c, V q, V k, V v) {
  c.rank("q", q, 4), c.rank("k", k, 4);
  const int64_t B = q.shape[0], T = q.shape[1], H = q.shape[2], hd = q.shape[3], KV = k.shape[2];
  c.shape("k", k, {B, T, KV, hd}), c.shape("v", v, k.shape);
  c.that(KV > 0 && H % KV == 0,
         "query heads " + std::to_string(H) + " are not a multiple of kv heads " + std::to_string(KV));
  return {B, T, H, KV, hd};
}

// E experts, counted by `of`; [M,K] from the i32 experts, 1 <= K <= E.
MoeDims moe_dims(Check& c, int64_t E, const std::string& of, V experts) {
  c.rank("experts", experts, 2, I32);
  const int64_t M = experts.shape[0], K = experts.shape[1];
  c.that(K >= 1 && K <= E, "top-k " + std::to_string(K) + " (experts " + experts.shape.str() +
                               ") must be in [1, " + std::to_string(E) + "], the experts of " + of);
  return {M, E, K};
}

// [M,E] from `name` (f32 probs or logits), [M,K] from the i32 experts, 1 <= K <= E.
MoeDims moe_dims(Check& c, const char* name, V per_expert, V experts) {
  c.rank(name, per_expert, 2, F32);
  const MoeDims d =
      moe_dims(c, per_expert.shape[1], std::string(name) + " " + per_expert.shape.str(), experts);
  c.shape(name, per_expert, {d.M, d.E}, F32);
  return d;
}

// pos i32 [M,K] and the permuted rows [M*K, D] of `name`.
PermutedDims permuted_dims(Check& c, const char* name, V permuted, V pos) {
  c.rank("pos", pos, 2, I32), c.rank(name, permuted, 2);
  const int64_t M = pos.shape[0], K = pos.shape[1], D = permuted.shape[1];
  c.shape(name, permuted, {M * K, D});
  return {M, K, D};
}

kernels::SsdShape ssd_dims(Check& c, V x, V dt, V A_log, V Bm, V Cm, V D, int64_t chunk) {
  c.rank("x", x, 4), c.rank("Bm", Bm, 4);
  const kernels::SsdShape s = ssd_shape_of(x.shape, Bm.shape, chunk);
  c.shape("dt", dt, {s.B, s.Tn, s.Hm}), c.shape("A_log", A_log, {s.Hm}, F32), c.shape("D", D, {s.Hm}, F32);
  c.shape("Bm", Bm, {s.B, s.Tn, s.G, s.N}), c.shape("Cm", Cm, Bm.shape);
  c.that(s.G > 0 && s.Hm % s.G == 0,
         "heads " + std::to_string(s.Hm) + " are not a multiple of groups " + std::to_string(s.G));
  return s;
}

}  // namespace

kernels::SsdShape ssd_shape_of(const Shape& x, const Shape& Bm, int64_t chunk) {
  return {x[0], x[1], x[2], x[3], Bm[2], Bm[3], chunk};
}

MatDims linear_fwd(Check& c, V x, V w, O y) {
  c.rank("x", x, 2, OPERAND), c.rank("w", w, 2, OPERAND);
  const int64_t M = x.shape[0], K = x.shape[1], N = w.shape[0];
  c.shape("w", w, {N, K}, OPERAND), c.shape("y", y, {M, N}, OPERAND);
  return {M, K, N};
}

MatDims linear_bwd_input(Check& c, V dy, V w, O dx) {
  c.rank("dy", dy, 2, OPERAND), c.rank("w", w, 2, OPERAND);
  const int64_t M = dy.shape[0], N = dy.shape[1], K = w.shape[1];
  c.shape("w", w, {N, K}, OPERAND), c.shape("dx", dx, {M, K}, OPERAND);
  return {M, K, N};
}

MatDims linear_bwd_weight(Check& c, V dy, V x, O dw) {
  c.rank("dy", dy, 2, OPERAND), c.rank("x", x, 2, OPERAND);
  const int64_t M = dy.shape[0], N = dy.shape[1], K = x.shape[1];
  c.shape("x", x, {M, K}, OPERAND), c.shape("dw", dw, {N, K}, F32);
  return {M, K, N};
}

RowDims rmsnorm_fwd(Check& c, V x, V w, O y, O rstd) {
  c.rank("x", x, 2);
  const int64_t M = x.shape[0], D = x.shape[1];
  c.shape("w", w, {D}), c.shape("y", y, {M, D}), c.shape("rstd", rstd, {M}, F32);
  return {M, D};
}

RowDims rmsnorm_bwd(Check& c, V dy, V x, V w, V rstd, O dx, O dw) {
  c.rank("x", x, 2);
  const int64_t M = x.shape[0], D = x.shape[1];
  c.shape("dy", dy, {M, D}), c.shape("w", w, {D}), c.shape("rstd", rstd, {M}, F32);
  c.shape("dx", dx, {M, D}), c.shape("dw", dw, {D}, F32);
  return {M, D};
}

GroupDims gated_rmsnorm_fwd(Check& c, V y, V z, V w, O out, O rstd) {
  c.rank("y", y, 2), c.rank("rstd", rstd, 2, F32);
  const int64_t M = y.shape[0], Di = y.shape[1], G = rstd.shape[1];
  c.shape("z", z, {M, Di}), c.shape("w", w, {Di}), c.shape("out", out, {M, Di});
  c.shape("rstd", rstd, {M, G}, F32);
  c.that(G > 0 && Di % G == 0, "groups " + std::to_string(G) + " do not divide width " + std::to_string(Di));
  return {M, Di, G};
}

GroupDims gated_rmsnorm_bwd(Check& c, V dout, V y, V z, V w, V rstd, O dy, O dz, O dw) {
  c.rank("y", y, 2), c.rank("rstd", rstd, 2, F32);
  const int64_t M = y.shape[0], Di = y.shape[1], G = rstd.shape[1];
  for (auto [n, t] : {std::pair<const char*, V>{"dout", dout}, {"z", z}, {"dy", dy}, {"dz", dz}})
    c.shape(n, t, {M, Di});
  c.shape("w", w, {Di}), c.shape("dw", dw, {Di}, F32), c.shape("rstd", rstd, {M, G}, F32);
  c.that(G > 0 && Di % G == 0, "groups " + std::to_string(G) + " do not divide width " + std::to_string(Di));
  return {M, Di, G};
}

void rope(Check& c, const char* in, V x, const char* outn, O y) {
  c.rank(in, x, 4), c.shape(outn, y, x.shape);
}

AttentionDims attention_fwd(Check& c, V q, V k, V v, O out, O lse) {
  const AttentionDims d = attention_dims(c, q, k, v);
  c.shape("out", out, q.shape), c.shape("lse", lse, {d.B, d.H, d.T}, F32);
  return d;
}

AttentionDims attention_bwd(Check& c, V dout, V q, V k, V v, V out, V lse, O dq, O dk, O dv) {
  const AttentionDims d = attention_dims(c, q, k, v);
  c.shape("dout", dout, q.shape), c.shape("out", out, q.shape), c.shape("lse", lse, {d.B, d.H, d.T}, F32);
  c.shape("dq", dq, q.shape), c.shape("dk", dk, k.shape), c.shape("dv", dv, k.shape);
  return d;
}

ConvDims conv1d_fwd(Check& c, V x, V w, V bias, O y) {
  c.rank("x", x, 3), c.rank("w", w, 2);
  const int64_t C = x.shape[2], K = w.shape[1];
  c.shape("w", w, {C, K}), c.shape("bias", bias, {C}), c.shape("y", y, x.shape);
  return {x.shape[0], x.shape[1], C, K};
}

ConvDims conv1d_bwd(Check& c, V dy, V x, V w, O dx, O dw, O dbias) {
  c.rank("x", x, 3), c.rank("w", w, 2);
  const int64_t C = x.shape[2], K = w.shape[1];
  c.shape("dy", dy, x.shape), c.shape("w", w, {C, K}), c.shape("dx", dx, x.shape);
  c.shape("dw", dw, {C, K}, F32), c.shape("dbias", dbias, {C}, F32);
  return {x.shape[0], x.shape[1], C, K};
}

kernels::SsdShape ssd_fwd(Check& c, V x, V dt, V A_log, V Bm, V Cm, V D, O y, O saved, int64_t chunk,
                          int64_t saved_numel) {
  const kernels::SsdShape s = ssd_dims(c, x, dt, A_log, Bm, Cm, D, chunk);
  c.shape("y", y, x.shape), c.shape("saved", saved, {saved_numel}, F32);
  return s;
}

kernels::SsdShape ssd_bwd(Check& c, V dy, V x, V dt, V A_log, V Bm, V Cm, V D, V saved, O dx, O ddt,
                          O dA_log, O dBm, O dCm, O dD, int64_t chunk, int64_t saved_numel) {
  const kernels::SsdShape s = ssd_dims(c, x, dt, A_log, Bm, Cm, D, chunk);
  c.shape("dy", dy, x.shape), c.shape("saved", saved, {saved_numel}, F32);
  c.shape("dx", dx, x.shape), c.shape("ddt", ddt, dt.shape), c.shape("dA_log", dA_log, A_log.shape, F32);
  c.shape("dBm", dBm, Bm.shape), c.shape("dCm", dCm, Bm.shape), c.shape("dD", dD, D.shape, F32);
  return s;
}

int64_t silu_fwd(Check& c, V x, O y) {
  c.is("x", x), c.shape("y", y, x.shape);
  return x.numel();
}

int64_t silu_bwd(Check& c, V dy, V x, O dx) {
  c.is("x", x), c.shape("dy", dy, x.shape), c.shape("dx", dx, x.shape);
  return x.numel();
}

int64_t swiglu_fwd(Check& c, V gate, V up, O h) {
  c.is("gate", gate), c.shape("up", up, gate.shape), c.shape("h", h, gate.shape);
  return gate.numel();
}

int64_t swiglu_bwd(Check& c, V dh, V gate, V up, O dgate, O dup) {
  c.is("gate", gate);
  for (auto [n, t] : {std::pair<const char*, V>{"dh", dh}, {"up", up}, {"dgate", dgate}, {"dup", dup}})
    c.shape(n, t, gate.shape);
  return gate.numel();
}

MoeDims moe_route_fwd(Check& c, V logits, O probs, O experts, O weights) {
  const MoeDims d = moe_dims(c, "logits", logits, experts);
  c.shape("probs", probs, {d.M, d.E}, F32), c.shape("weights", weights, {d.M, d.K}, F32);
  return d;
}

MoeDims moe_route_bwd(Check& c, V dweights, V dprobs, V probs, V experts, V weights, O dlogits) {
  const MoeDims d = moe_dims(c, "probs", probs, experts);
  c.indices("experts", experts, d.E, "the experts of probs " + probs.shape.str());
  c.shape("dweights", dweights, {d.M, d.K}, F32), c.shape("weights", weights, {d.M, d.K}, F32);
  c.shape("dprobs", dprobs, {d.M, d.E}, F32), c.shape("dlogits", dlogits, {d.M, d.E}, F32);
  return d;
}

MoeDims moe_balance(Check& c, V probs, V experts, int64_t seq, O dprobs) {
  const MoeDims d = moe_dims(c, "probs", probs, experts);
  c.indices("experts", experts, d.E, "the experts of probs " + probs.shape.str());
  c.that(seq >= 1 && d.M % seq == 0, "sequence length " + std::to_string(seq) + " does not divide the " +
                                         std::to_string(d.M) + " rows of probs " + probs.shape.str());
  c.shape("dprobs", dprobs, {d.M, d.E}, F32);
  return d;
}

MoeDims moe_permute_index(Check& c, V experts, O counts, O rows, O pos) {
  c.rank("counts", counts, 1, I32);
  const MoeDims d = moe_dims(c, counts.shape[0], "counts " + counts.shape.str(), experts);
  c.indices("experts", experts, d.E, "the experts of counts " + counts.shape.str());
  c.that(d.M * d.K <= std::numeric_limits<int32_t>::max(),
         std::to_string(d.M * d.K) + " permuted rows exceed the i32 range of rows and pos");
  c.shape("rows", rows, {d.M * d.K}, I32), c.shape("pos", pos, {d.M, d.K}, I32);
  return d;
}

RowDims gather_rows(Check& c, V src, V rows, O dst) {
  c.rank("src", src, 2);
  const int64_t D = src.shape[1], P = rows.numel();
  c.indices("rows", rows, src.shape[0], "the rows of src " + src.shape.str());
  c.shape("dst", dst, {P, D});
  return {P, D};
}

PermutedDims moe_combine(Check& c, V y, V pos, V weights, O out) {
  const PermutedDims d = permuted_dims(c, "y", y, pos);
  c.indices("pos", pos, d.M * d.K, "the rows of y " + y.shape.str());
  c.shape("weights", weights, {d.M, d.K}, F32), c.shape("out", out, {d.M, d.D}, Kind::KIND_FLOAT);
  return d;
}

PermutedDims moe_combine_bwd(Check& c, V dout, V y, V pos, V weights, O dy, O dweights) {
  const PermutedDims d = permuted_dims(c, "y", y, pos);
  c.permutation("pos", pos, d.M * d.K);
  c.shape("dout", dout, {d.M, d.D}), c.shape("weights", weights, {d.M, d.K}, F32);
  c.shape("dy", dy, y.shape), c.shape("dweights", dweights, {d.M, d.K}, F32);
  return d;
}

PermutedDims moe_dispatch_bwd(Check& c, V dxp, V pos, O dx) {
  const PermutedDims d = permuted_dims(c, "dxp", dxp, pos);
  c.indices("pos", pos, d.M * d.K, "the rows of dxp " + dxp.shape.str());
  c.shape("dx", dx, {d.M, d.D}, Kind::KIND_FLOAT);
  return d;
}

RowDims dt_softplus_fwd(Check& c, V dt_raw, V dt_bias, O dt) {
  c.rank("dt_raw", dt_raw, 2);
  const int64_t M = dt_raw.shape[0], Hm = dt_raw.shape[1];
  c.shape("dt_bias", dt_bias, {Hm}, F32), c.shape("dt", dt, dt_raw.shape);
  return {M, Hm};
}

RowDims dt_softplus_bwd(Check& c, V ddt, V dt_raw, V dt_bias, O ddt_raw, O ddt_bias) {
  c.rank("dt_raw", dt_raw, 2);
  const int64_t M = dt_raw.shape[0], Hm = dt_raw.shape[1];
  c.shape("ddt", ddt, dt_raw.shape), c.shape("dt_bias", dt_bias, {Hm}, F32);
  c.shape("ddt_raw", ddt_raw, dt_raw.shape), c.shape("ddt_bias", ddt_bias, {Hm}, F32);
  return {M, Hm};
}

TableDims embedding_fwd(Check& c, V ids, V table, O out) {
  c.is("ids", ids, I32), c.rank("out", out, 2), c.rank("table", table, 2, WEIGHT);
  const int64_t M = ids.numel(), Vn = table.shape[0], D = table.shape[1];
  c.shape("out", out, {M, D});
  return {M, Vn, D};
}

TableDims embedding_bwd(Check& c, V ids, V dout, O dtable) {
  c.is("ids", ids, I32), c.rank("dtable", dtable, 2, F32);
  const int64_t M = ids.numel(), Vn = dtable.shape[0], D = dtable.shape[1];
  c.shape("dout", dout, {M, D});
  return {M, Vn, D};
}

RowDims cross_entropy(Check& c, V logits, V targets, O dlogits) {
  c.rank("logits", logits, 2);
  const int64_t M = logits.shape[0], Vn = logits.shape[1];
  c.ids("targets", targets, M), c.shape("dlogits", dlogits, logits.shape);
  c.indices("targets", targets, Vn, "the vocabulary of logits " + logits.shape.str());
  return {M, Vn};
}

RowDims row_max(Check& c, V x, O out) {
  c.rank("x", x, 2), c.shape("out", out, {x.shape[0]}, F32);
  return {x.shape[0], x.shape[1]};
}

RowDims vocab_ce_partials(Check& c, V logits, V row_max, V targets, O exps, O sums) {
  c.rank("logits", logits, 2);
  const int64_t M = logits.shape[0], Vn = logits.shape[1];
  c.ids("targets", targets, M), c.shape("row_max", row_max, {M}, F32);
  c.shape("exps", exps, logits.shape), c.shape("sums", sums, {2, M}, F32);
  return {M, Vn};
}

RowDims vocab_ce_finish(Check& c, V sums, V row_max, V targets, O dlogits) {
  c.rank("dlogits", dlogits, 2);
  const int64_t M = dlogits.shape[0], Vn = dlogits.shape[1];
  c.ids("targets", targets, M), c.shape("sums", sums, {2, M}, F32), c.shape("row_max", row_max, {M}, F32);
  return {M, Vn};
}

ColDims gather_cols(Check& c, V src, int64_t col, O dst) {
  c.rank("src", src, 2), c.rank("dst", dst, 2);
  const int64_t M = src.shape[0], S = src.shape[1], n = dst.shape[1];
  c.shape("dst", dst, {M, n});
  c.that(col >= 0 && col + n <= S, "columns [" + std::to_string(col) + ", " + std::to_string(col + n) +
                                       ") outside src " + src.shape.str());
  return {M, S, n};
}

ColDims scatter_cols(Check& c, V src, O dst, int64_t col) {
  c.rank("src", src, 2), c.rank("dst", dst, 2);
  const int64_t M = src.shape[0], n = src.shape[1], S = dst.shape[1];
  c.shape("dst", dst, {M, S});
  c.that(col >= 0 && col + n <= S, "columns [" + std::to_string(col) + ", " + std::to_string(col + n) +
                                       ") outside dst " + dst.shape.str());
  return {M, S, n};
}

int64_t add_inplace(Check& c, O y, V x) {
  c.is("y", y), c.shape("x", x, y.shape);
  return y.numel();
}

int64_t convert(Check& c, V src, O dst) {
  c.is("src", src, Kind::KIND_FLOAT), c.shape("dst", dst, src.shape, Kind::KIND_FLOAT);
  return src.numel();
}

int64_t adamw_update(Check& c, O p, V g, O m, O v, const AdamWStep& step) {
  c.is("p", p, F32), c.shape("g", g, p.shape, F32), c.shape("m", m, p.shape, F32);
  c.shape("v", v, p.shape, F32);
  c.that(step.t >= 1, "step " + std::to_string(step.t) + " must count from 1");
  return p.numel();
}

int64_t sum_squares(Check& c, V x) {
  c.is("x", x);
  return x.numel();
}

}  // namespace piper::backend::contract
