// cpu_backend.cpp — the CPU implementation of the backend interface: memory
// from an aligned block cache, one in-order stream, and the op table computed
// by the kernels of kernels/ (the same calls the units made before it).
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "kernels.hpp"

namespace piper::backend {

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::MEM_PARAMS: return "params";
    case MemCategory::MEM_GRADS: return "grads";
    case MemCategory::MEM_OPTIMIZER: return "optimizer";
    case MemCategory::MEM_ACTIVATIONS: return "activations";
    case MemCategory::MEM_BUFFERS: return "buffers";
  }
  return "?";
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::DTYPE_F32: return "f32";
    case DType::DTYPE_BF16: return "bf16";
    case DType::DTYPE_I32: return "i32";
  }
  return "?";
}

size_t dtype_size(DType t) { return t == DType::DTYPE_BF16 ? 2 : 4; }

DType accumulation_dtype(DType storage) {
  return storage == DType::DTYPE_BF16 ? DType::DTYPE_F32 : storage;
}

const char* op_name(Op op) {
  static constexpr const char* kNames[] = {
#define PIPER_OP_NAME(name, ret, params) #name,
      PIPER_BACKEND_OPS(PIPER_OP_NAME)
#undef PIPER_OP_NAME
  };
  const auto i = static_cast<size_t>(op);
  return i < static_cast<size_t>(kOpCount) ? kNames[i] : "?";
}

Shape::Shape(std::initializer_list<int64_t> dims) {
  if (dims.size() > static_cast<size_t>(kMaxRank))
    throw std::invalid_argument("shape of rank " + std::to_string(dims.size()) + ": at most " +
                                std::to_string(kMaxRank) + " dimensions");
  for (int64_t d : dims) {
    if (d < 0) throw std::invalid_argument("shape with a negative extent " + std::to_string(d));
    dim_[static_cast<size_t>(rank_++)] = d;
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dim_[static_cast<size_t>(i)];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dim_[static_cast<size_t>(i)] != o.dim_[static_cast<size_t>(i)]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) s += (i ? "," : "") + std::to_string(dim_[static_cast<size_t>(i)]);
  return s + "]";
}

TensorView view(Backend& b, float* p, Shape s) { return {&b, DType::DTYPE_F32, s, p}; }
ConstTensorView view(Backend& b, const float* p, Shape s) { return {&b, DType::DTYPE_F32, s, p}; }
ConstTensorView view(Backend& b, const int32_t* p, Shape s) { return {&b, DType::DTYPE_I32, s, p}; }

namespace {

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string("backend cpu, op ") + op + ": " + what);
}

// The checks every op makes of its tensors: on this backend, the dtype it computes on,
// the shape the op's contract asks for.
class Check {
 public:
  Check(const char* op, const Backend* self) : op_(op), self_(self) {}
  void f32(const char* name, const ConstTensorView& t) const { is(name, t, DType::DTYPE_F32); }
  void i32(const char* name, const ConstTensorView& t) const { is(name, t, DType::DTYPE_I32); }
  void shape(const char* name, const ConstTensorView& t, const Shape& want,
             DType dtype = DType::DTYPE_F32) const {
    is(name, t, dtype);
    if (t.shape != want)
      fail(op_, std::string("tensor ") + name + " has shape " + t.shape.str() + ", expected " +
                    want.str());
  }
  void rank(const char* name, const ConstTensorView& t, int r, DType dtype = DType::DTYPE_F32) const {
    is(name, t, dtype);
    if (t.shape.rank() != r)
      fail(op_, std::string("tensor ") + name + " has shape " + t.shape.str() + ", expected rank " +
                    std::to_string(r));
  }
  // i32 ids or targets, one per row of a [rows, ...] tensor.
  void ids(const char* name, const ConstTensorView& t, int64_t rows) const {
    i32(name, t);
    if (t.numel() != rows)
      fail(op_, std::string("tensor ") + name + " has " + std::to_string(t.numel()) +
                    " values, expected one per row (" + std::to_string(rows) + ")");
  }
  void that(bool ok, const std::string& what) const {
    if (!ok) fail(op_, what);
  }
  // Every value of the i32 tensor t in [0, bound), the range of `of`.
  void indices(const char* name, const ConstTensorView& t, int64_t bound, const std::string& of) const {
    i32(name, t);
    for (int64_t i = 0; i < t.numel(); ++i)
      if (t.i32()[i] < 0 || t.i32()[i] >= bound)
        fail(op_, std::string("tensor ") + name + " holds " + std::to_string(t.i32()[i]) +
                      " at element " + std::to_string(i) + ", outside [0, " + std::to_string(bound) +
                      ") (" + of + ")");
  }
  // The i32 tensor t holds each of 0 .. n-1 once.
  void permutation(const char* name, const ConstTensorView& t, int64_t n) const {
    indices(name, t, n, "the permuted rows");
    std::vector<char> seen(static_cast<size_t>(n), 0);
    for (int64_t i = 0; i < t.numel(); ++i)
      if (seen[static_cast<size_t>(t.i32()[i])]++)
        fail(op_, std::string("tensor ") + name + " holds " + std::to_string(t.i32()[i]) +
                      " twice (again at element " + std::to_string(i) + "), expected a permutation of [0, " +
                      std::to_string(n) + ")");
  }

 private:
  void is(const char* name, const ConstTensorView& t, DType want) const {
    if (t.device != self_)
      fail(op_, std::string("tensor ") + name + " is not on this backend (" +
                    (t.device ? t.device->name() : "no device") + ")");
    if (t.dtype != want)
      fail(op_, std::string("tensor ") + name + " has dtype " + dtype_name(t.dtype) + ", expected " +
                    dtype_name(want) +
                    (want == DType::DTYPE_I32 ? " (an index tensor)" : " (the cpu backend computes in f32)"));
    if (!t.ptr && t.numel() > 0) fail(op_, std::string("tensor ") + name + " has no data");
  }
  const char* op_;
  const Backend* self_;
};

namespace k = piper::kernels;

k::SsdShape ssd_shape_of(const Shape& x, const Shape& Bm, int64_t chunk) {
  return {x[0], x[1], x[2], x[3], Bm[2], Bm[3], chunk};
}

class CpuBackend final : public Backend {
 public:
  DeviceKind kind() const override { return DeviceKind::DEVICE_CPU; }
  const char* name() const override { return "cpu"; }

  ~CpuBackend() override { release_cached(); }

  // Blocks are cached by size and reused: a training step allocates the same
  // sizes every time, and fresh pages would cost a page fault each.
  void* allocate(size_t bytes, MemCategory c) override {
    if (bytes == 0) return nullptr;
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = nullptr;
    auto it = cache_.find(rounded);
    if (it != cache_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= rounded;
    } else {
      p = std::aligned_alloc(64, rounded);
      if (!p) throw std::bad_alloc();
    }
    account(c, static_cast<int64_t>(bytes));
    return p;
  }
  void deallocate(void* p, size_t bytes, MemCategory c) override {
    if (!p) return;
    const size_t rounded = (bytes + 63) / 64 * 64;
    cache_[rounded].push_back(p);
    cached_bytes_ += rounded;
    account(c, -static_cast<int64_t>(bytes));
  }
  void release_cached() override {
    for (auto& [size, blocks] : cache_)
      for (void* p : blocks) std::free(p);
    cache_.clear();
    cached_bytes_ = 0;
  }
  void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void to_device(void* dst, const void* host, size_t bytes) override { std::memcpy(dst, host, bytes); }
  void to_host(void* host, const void* src, size_t bytes) override { std::memcpy(host, src, bytes); }
  void fill_zero(void* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
  MemoryStats memory() const override { return stats_; }
  void reset_peak() override {
    stats_.peak = stats_.current;
    stats_.total_peak = stats_.total_current;
  }

  // One stream: every op has finished when its call returns, so events are already complete.
  int stream_count() const override { return 1; }
  void set_stream(int stream) override { check_stream("set_stream", stream); }
  Event record(int stream) override {
    check_stream("record", stream);
    return {stream, ++events_};
  }
  void wait(int stream, Event e) override {
    check_stream("wait", stream);
    check_stream("wait", e.stream);
  }
  void synchronize(int) override {}

  bool supports(DType storage) const override { return storage != DType::DTYPE_BF16; }
  int64_t ssd_saved_numel(const Shape& x, const Shape& Bm, int64_t chunk) const override {
    return k::ssd_saved_size(ssd_shape_of(x, Bm, chunk));
  }

  // ---- the op table ----
  void linear_fwd(V x, V w, O y) override {
    const Check c("linear_fwd", this);
    c.rank("x", x, 2), c.rank("w", w, 2);
    const int64_t M = x.shape[0], K = x.shape[1], N = w.shape[0];
    c.shape("w", w, {N, K}), c.shape("y", y, {M, N});
    k::linear_fwd(x.f32(), w.f32(), y.f32(), M, K, N);
  }
  void linear_bwd_input(V dy, V w, O dx, bool accumulate) override {
    const Check c("linear_bwd_input", this);
    c.rank("dy", dy, 2), c.rank("w", w, 2);
    const int64_t M = dy.shape[0], N = dy.shape[1], K = w.shape[1];
    c.shape("w", w, {N, K}), c.shape("dx", dx, {M, K});
    k::linear_bwd_input(dy.f32(), w.f32(), dx.f32(), M, K, N, accumulate);
  }
  void linear_bwd_weight(V dy, V x, O dw) override {
    const Check c("linear_bwd_weight", this);
    c.rank("dy", dy, 2), c.rank("x", x, 2);
    const int64_t M = dy.shape[0], N = dy.shape[1], K = x.shape[1];
    c.shape("x", x, {M, K}), c.shape("dw", dw, {N, K});
    k::linear_bwd_weight(dy.f32(), x.f32(), dw.f32(), M, K, N);
  }
  void rmsnorm_fwd(V x, V w, O y, O rstd, float eps) override {
    const Check c("rmsnorm_fwd", this);
    c.rank("x", x, 2);
    const int64_t M = x.shape[0], D = x.shape[1];
    c.shape("w", w, {D}), c.shape("y", y, {M, D}), c.shape("rstd", rstd, {M});
    k::rmsnorm_fwd(x.f32(), w.f32(), y.f32(), rstd.f32(), M, D, eps);
  }
  void rmsnorm_bwd(V dy, V x, V w, V rstd, O dx, O dw) override {
    const Check c("rmsnorm_bwd", this);
    c.rank("x", x, 2);
    const int64_t M = x.shape[0], D = x.shape[1];
    c.shape("dy", dy, {M, D}), c.shape("w", w, {D}), c.shape("rstd", rstd, {M});
    c.shape("dx", dx, {M, D}), c.shape("dw", dw, {D});
    k::rmsnorm_bwd(dy.f32(), x.f32(), w.f32(), rstd.f32(), dx.f32(), dw.f32(), M, D);
  }
  void gated_rmsnorm_fwd(V y, V z, V w, O out, O rstd, float eps) override {
    const Check c("gated_rmsnorm_fwd", this);
    c.rank("y", y, 2), c.rank("rstd", rstd, 2);
    const int64_t M = y.shape[0], Di = y.shape[1], G = rstd.shape[1];
    c.shape("z", z, {M, Di}), c.shape("w", w, {Di}), c.shape("out", out, {M, Di});
    c.shape("rstd", rstd, {M, G});
    c.that(G > 0 && Di % G == 0,
           "groups " + std::to_string(G) + " do not divide width " + std::to_string(Di));
    k::gated_rmsnorm_fwd(y.f32(), z.f32(), w.f32(), out.f32(), rstd.f32(), M, Di, G, eps);
  }
  void gated_rmsnorm_bwd(V dout, V y, V z, V w, V rstd, O dy, O dz, O dw) override {
    const Check c("gated_rmsnorm_bwd", this);
    c.rank("y", y, 2), c.rank("rstd", rstd, 2);
    const int64_t M = y.shape[0], Di = y.shape[1], G = rstd.shape[1];
    for (auto [n, t] : {std::pair<const char*, V>{"dout", dout}, {"z", z}, {"dy", dy}, {"dz", dz}})
      c.shape(n, t, {M, Di});
    c.shape("w", w, {Di}), c.shape("dw", dw, {Di}), c.shape("rstd", rstd, {M, G});
    k::gated_rmsnorm_bwd(dout.f32(), y.f32(), z.f32(), w.f32(), rstd.f32(), dy.f32(), dz.f32(),
                         dw.f32(), M, Di, G);
  }
  void rope_fwd(V x, O y, double theta) override {
    const Check c("rope_fwd", this);
    c.rank("x", x, 4), c.shape("y", y, x.shape);
    k::rope_fwd(x.f32(), y.f32(), x.shape[0], x.shape[1], x.shape[2], x.shape[3], theta);
  }
  void rope_bwd(V dy, O dx, double theta) override {
    const Check c("rope_bwd", this);
    c.rank("dy", dy, 4), c.shape("dx", dx, dy.shape);
    k::rope_bwd(dy.f32(), dx.f32(), dy.shape[0], dy.shape[1], dy.shape[2], dy.shape[3], theta);
  }
  void attention_fwd(V q, V kk, V v, O out, O lse) override {
    const Check c("attention_fwd", this);
    const auto [B, T, H, KV, hd] = attention_dims(c, q, kk, v);
    c.shape("out", out, q.shape), c.shape("lse", lse, {B, H, T});
    k::attention_fwd(q.f32(), kk.f32(), v.f32(), out.f32(), lse.f32(), B, T, H, KV, hd);
  }
  void attention_bwd(V dout, V q, V kk, V v, V out, V lse, O dq, O dk, O dv) override {
    const Check c("attention_bwd", this);
    const auto [B, T, H, KV, hd] = attention_dims(c, q, kk, v);
    c.shape("dout", dout, q.shape), c.shape("out", out, q.shape), c.shape("lse", lse, {B, H, T});
    c.shape("dq", dq, q.shape), c.shape("dk", dk, kk.shape), c.shape("dv", dv, kk.shape);
    k::attention_bwd(dout.f32(), q.f32(), kk.f32(), v.f32(), out.f32(), lse.f32(), dq.f32(),
                     dk.f32(), dv.f32(), B, T, H, KV, hd);
  }
  void conv1d_fwd(V x, V w, V bias, O y) override {
    const Check c("conv1d_fwd", this);
    c.rank("x", x, 3), c.rank("w", w, 2);
    const int64_t C = x.shape[2], K = w.shape[1];
    c.shape("w", w, {C, K}), c.shape("bias", bias, {C}), c.shape("y", y, x.shape);
    k::conv1d_fwd(x.f32(), w.f32(), bias.f32(), y.f32(), x.shape[0], x.shape[1], C, K);
  }
  void conv1d_bwd(V dy, V x, V w, O dx, O dw, O dbias) override {
    const Check c("conv1d_bwd", this);
    c.rank("x", x, 3), c.rank("w", w, 2);
    const int64_t C = x.shape[2], K = w.shape[1];
    c.shape("dy", dy, x.shape), c.shape("w", w, {C, K}), c.shape("dx", dx, x.shape);
    c.shape("dw", dw, {C, K}), c.shape("dbias", dbias, {C});
    k::conv1d_bwd(dy.f32(), x.f32(), w.f32(), dx.f32(), dw.f32(), dbias.f32(), x.shape[0],
                  x.shape[1], C, K);
  }
  void ssd_fwd(V x, V dt, V A_log, V Bm, V Cm, V D, O y, O saved, int64_t chunk) override {
    const Check c("ssd_fwd", this);
    const k::SsdShape s = ssd_dims(c, x, dt, A_log, Bm, Cm, D, chunk);
    c.shape("y", y, x.shape), c.shape("saved", saved, {k::ssd_saved_size(s)});
    Tensor work(*this, k::ssd_fwd_workspace_size(s), MemCategory::MEM_BUFFERS);
    k::ssd_fwd(s, x.f32(), dt.f32(), A_log.f32(), Bm.f32(), Cm.f32(), D.f32(), y.f32(),
               saved.f32(), work.data());
  }
  void ssd_bwd(V dy, V x, V dt, V A_log, V Bm, V Cm, V D, V saved, O dx, O ddt, O dA_log, O dBm,
               O dCm, O dD, int64_t chunk) override {
    const Check c("ssd_bwd", this);
    const k::SsdShape s = ssd_dims(c, x, dt, A_log, Bm, Cm, D, chunk);
    c.shape("dy", dy, x.shape), c.shape("saved", saved, {k::ssd_saved_size(s)});
    c.shape("dx", dx, x.shape), c.shape("ddt", ddt, dt.shape), c.shape("dA_log", dA_log, A_log.shape);
    c.shape("dBm", dBm, Bm.shape), c.shape("dCm", dCm, Bm.shape), c.shape("dD", dD, D.shape);
    Tensor work(*this, k::ssd_bwd_workspace_size(s), MemCategory::MEM_BUFFERS);
    k::ssd_bwd(s, dy.f32(), x.f32(), dt.f32(), A_log.f32(), Bm.f32(), Cm.f32(), D.f32(),
               saved.f32(), dx.f32(), ddt.f32(), dA_log.f32(), dBm.f32(), dCm.f32(), dD.f32(),
               work.data());
  }
  void silu_fwd(V x, O y) override {
    const Check c("silu_fwd", this);
    c.f32("x", x), c.shape("y", y, x.shape);
    k::silu_fwd(x.f32(), y.f32(), x.numel());
  }
  void silu_bwd(V dy, V x, O dx) override {
    const Check c("silu_bwd", this);
    c.f32("x", x), c.shape("dy", dy, x.shape), c.shape("dx", dx, x.shape);
    k::silu_bwd(dy.f32(), x.f32(), dx.f32(), x.numel());
  }
  void swiglu_fwd(V gate, V up, O h) override {
    const Check c("swiglu_fwd", this);
    c.f32("gate", gate), c.shape("up", up, gate.shape), c.shape("h", h, gate.shape);
    k::swiglu_fwd(gate.f32(), up.f32(), h.f32(), gate.numel());
  }
  void swiglu_bwd(V dh, V gate, V up, O dgate, O dup) override {
    const Check c("swiglu_bwd", this);
    c.f32("gate", gate);
    for (auto [n, t] : {std::pair<const char*, V>{"dh", dh}, {"up", up}, {"dgate", dgate}, {"dup", dup}})
      c.shape(n, t, gate.shape);
    k::swiglu_bwd(dh.f32(), gate.f32(), up.f32(), dgate.f32(), dup.f32(), gate.numel());
  }
  void moe_route_fwd(V logits, O probs, O experts, O weights) override {
    const Check c("moe_route_fwd", this);
    const auto [M, E, K] = moe_dims(c, "logits", logits, experts);
    c.shape("probs", probs, {M, E}), c.shape("weights", weights, {M, K});
    k::moe_route_fwd(logits.f32(), probs.f32(), experts.i32(), weights.f32(), M, E, K);
  }
  void moe_route_bwd(V dweights, V dprobs, V probs, V experts, V weights, O dlogits) override {
    const Check c("moe_route_bwd", this);
    const auto [M, E, K] = moe_dims(c, "probs", probs, experts);
    c.indices("experts", experts, E, "the experts of probs " + probs.shape.str());
    c.shape("dweights", dweights, {M, K}), c.shape("weights", weights, {M, K});
    c.shape("dprobs", dprobs, {M, E}), c.shape("dlogits", dlogits, {M, E});
    k::moe_route_bwd(dweights.f32(), dprobs.f32(), probs.f32(), experts.i32(), weights.f32(),
                     dlogits.f32(), M, E, K);
  }
  double moe_balance(V probs, V experts, int64_t seq, O dprobs, float scale) override {
    const Check c("moe_balance", this);
    const auto [M, E, K] = moe_dims(c, "probs", probs, experts);
    c.indices("experts", experts, E, "the experts of probs " + probs.shape.str());
    c.that(seq >= 1 && M % seq == 0, "sequence length " + std::to_string(seq) +
                                         " does not divide the " + std::to_string(M) +
                                         " rows of probs " + probs.shape.str());
    c.shape("dprobs", dprobs, {M, E});
    return k::moe_balance(probs.f32(), experts.i32(), dprobs.f32(), M, E, K, seq, scale);
  }
  void moe_permute_index(V experts, O counts, O rows, O pos) override {
    const Check c("moe_permute_index", this);
    c.rank("counts", counts, 1, DType::DTYPE_I32);
    const auto [M, E, K] = moe_dims(c, counts.shape[0], "counts " + counts.shape.str(), experts);
    c.indices("experts", experts, E, "the experts of counts " + counts.shape.str());
    c.that(M * K <= std::numeric_limits<int32_t>::max(),
           std::to_string(M * K) + " permuted rows exceed the i32 range of rows and pos");
    c.shape("rows", rows, {M * K}, DType::DTYPE_I32), c.shape("pos", pos, {M, K}, DType::DTYPE_I32);
    k::moe_permute_index(experts.i32(), counts.i32(), rows.i32(), pos.i32(), M, E, K);
  }
  void gather_rows(V src, V rows, O dst) override {
    const Check c("gather_rows", this);
    c.rank("src", src, 2);
    const int64_t D = src.shape[1], P = rows.numel();
    c.indices("rows", rows, src.shape[0], "the rows of src " + src.shape.str());
    c.shape("dst", dst, {P, D});
    k::gather_rows(src.f32(), rows.i32(), dst.f32(), P, D);
  }
  void moe_combine(V y, V pos, V weights, O out) override {
    const Check c("moe_combine", this);
    const auto [M, K, D] = permuted_dims(c, "y", y, pos);
    c.indices("pos", pos, M * K, "the rows of y " + y.shape.str());
    c.shape("weights", weights, {M, K}), c.shape("out", out, {M, D});
    k::moe_combine(y.f32(), pos.i32(), weights.f32(), out.f32(), M, K, D);
  }
  void moe_combine_bwd(V dout, V y, V pos, V weights, O dy, O dweights) override {
    const Check c("moe_combine_bwd", this);
    const auto [M, K, D] = permuted_dims(c, "y", y, pos);
    c.permutation("pos", pos, M * K);
    c.shape("dout", dout, {M, D}), c.shape("weights", weights, {M, K});
    c.shape("dy", dy, y.shape), c.shape("dweights", dweights, {M, K});
    k::moe_combine_bwd(dout.f32(), y.f32(), pos.i32(), weights.f32(), dy.f32(), dweights.f32(), M, K,
                       D);
  }
  void moe_dispatch_bwd(V dxp, V pos, O dx) override {
    const Check c("moe_dispatch_bwd", this);
    const auto [M, K, D] = permuted_dims(c, "dxp", dxp, pos);
    c.indices("pos", pos, M * K, "the rows of dxp " + dxp.shape.str());
    c.shape("dx", dx, {M, D});
    k::moe_dispatch_bwd(dxp.f32(), pos.i32(), dx.f32(), M, K, D);
  }
  void dt_softplus_fwd(V dt_raw, V dt_bias, O dt) override {
    const Check c("dt_softplus_fwd", this);
    c.rank("dt_raw", dt_raw, 2);
    const int64_t M = dt_raw.shape[0], Hm = dt_raw.shape[1];
    c.shape("dt_bias", dt_bias, {Hm}), c.shape("dt", dt, dt_raw.shape);
    k::dt_softplus_fwd(dt_raw.f32(), dt_bias.f32(), dt.f32(), M, Hm);
  }
  void dt_softplus_bwd(V ddt, V dt_raw, V dt_bias, O ddt_raw, O ddt_bias) override {
    const Check c("dt_softplus_bwd", this);
    c.rank("dt_raw", dt_raw, 2);
    const int64_t M = dt_raw.shape[0], Hm = dt_raw.shape[1];
    c.shape("ddt", ddt, dt_raw.shape), c.shape("dt_bias", dt_bias, {Hm});
    c.shape("ddt_raw", ddt_raw, dt_raw.shape), c.shape("ddt_bias", ddt_bias, {Hm});
    k::dt_softplus_bwd(ddt.f32(), dt_raw.f32(), dt_bias.f32(), ddt_raw.f32(), ddt_bias.f32(), M, Hm);
  }
  void embedding_fwd(V ids, V table, O out, int64_t vocab_offset) override {
    const Check c("embedding_fwd", this);
    c.i32("ids", ids), c.rank("table", table, 2);
    const int64_t M = ids.numel(), Vn = table.shape[0], D = table.shape[1];
    c.shape("out", out, {M, D});
    k::embedding_fwd(ids.i32(), table.f32(), out.f32(), M, D, Vn, vocab_offset);
  }
  void embedding_bwd(V ids, V dout, O dtable, int64_t vocab_offset) override {
    const Check c("embedding_bwd", this);
    c.i32("ids", ids), c.rank("dtable", dtable, 2);
    const int64_t M = ids.numel(), Vn = dtable.shape[0], D = dtable.shape[1];
    c.shape("dout", dout, {M, D});
    k::embedding_bwd(ids.i32(), dout.f32(), dtable.f32(), M, D, Vn, vocab_offset);
  }
  double cross_entropy(V logits, V targets, O dlogits, float scale) override {
    const Check c("cross_entropy", this);
    c.rank("logits", logits, 2);
    const int64_t M = logits.shape[0], Vn = logits.shape[1];
    c.ids("targets", targets, M);
    c.shape("dlogits", dlogits, logits.shape);
    return k::cross_entropy(logits.f32(), targets.i32(), dlogits.f32(), M, Vn, scale);
  }
  void row_max(V x, O out) override {
    const Check c("row_max", this);
    c.rank("x", x, 2), c.shape("out", out, {x.shape[0]});
    k::row_max(x.f32(), out.f32(), x.shape[0], x.shape[1]);
  }
  void vocab_ce_partials(V logits, V row_max, V targets, int64_t vocab_offset, O exps,
                         O sums) override {
    const Check c("vocab_ce_partials", this);
    c.rank("logits", logits, 2);
    const int64_t M = logits.shape[0], Vn = logits.shape[1];
    c.ids("targets", targets, M), c.shape("row_max", row_max, {M});
    c.shape("exps", exps, logits.shape), c.shape("sums", sums, {2, M});
    k::vocab_ce_partials(logits.f32(), row_max.f32(), targets.i32(), vocab_offset, exps.f32(),
                         sums.f32(), M, Vn);
  }
  double vocab_ce_finish(V sums, V row_max, V targets, int64_t vocab_offset, O dlogits,
                         float scale) override {
    const Check c("vocab_ce_finish", this);
    c.rank("dlogits", dlogits, 2);
    const int64_t M = dlogits.shape[0], Vn = dlogits.shape[1];
    c.ids("targets", targets, M), c.shape("sums", sums, {2, M}), c.shape("row_max", row_max, {M});
    return k::vocab_ce_finish(sums.f32(), row_max.f32(), targets.i32(), vocab_offset,
                              dlogits.f32(), M, Vn, scale);
  }
  void gather_cols(V src, int64_t col, O dst) override {
    const Check c("gather_cols", this);
    c.rank("src", src, 2), c.rank("dst", dst, 2);
    const int64_t M = src.shape[0], S = src.shape[1], n = dst.shape[1];
    c.shape("dst", dst, {M, n});
    c.that(col >= 0 && col + n <= S, "columns [" + std::to_string(col) + ", " + std::to_string(col + n) +
                                         ") outside src " + src.shape.str());
    k::gather_cols(src.f32(), S, col, dst.f32(), n, M);
  }
  void scatter_cols(V src, O dst, int64_t col) override {
    const Check c("scatter_cols", this);
    c.rank("src", src, 2), c.rank("dst", dst, 2);
    const int64_t M = src.shape[0], n = src.shape[1], S = dst.shape[1];
    c.shape("dst", dst, {M, S});
    c.that(col >= 0 && col + n <= S, "columns [" + std::to_string(col) + ", " + std::to_string(col + n) +
                                         ") outside dst " + dst.shape.str());
    k::scatter_cols(src.f32(), n, dst.f32(), S, col, M);
  }
  void add_inplace(O y, V x) override {
    const Check c("add_inplace", this);
    c.f32("y", y), c.shape("x", x, y.shape);
    k::add_inplace(y.f32(), x.f32(), y.numel());
  }
  void adamw_update(O p, V g, O m, O v, const AdamWStep& st) override {
    const Check c("adamw_update", this);
    c.f32("p", p), c.shape("g", g, p.shape), c.shape("m", m, p.shape), c.shape("v", v, p.shape);
    c.that(st.t >= 1, "step " + std::to_string(st.t) + " must count from 1");
    k::adamw_update(p.f32(), g.f32(), m.f32(), v.f32(), p.numel(), st.lr, st.beta1, st.beta2,
                    st.eps, st.weight_decay, st.t, st.decay, st.grad_scale);
  }
  double sum_squares(V x) override {
    const Check c("sum_squares", this);
    c.f32("x", x);
    return k::sum_squares(x.f32(), x.numel());
  }

 private:
  struct AttentionDims {
    int64_t B, T, H, KV, hd;
  };
  static AttentionDims attention_dims(const Check& c, V q, V kk, V v) {
    c.rank("q", q, 4), c.rank("k", kk, 4);
    const int64_t B = q.shape[0], T = q.shape[1], H = q.shape[2], hd = q.shape[3], KV = kk.shape[2];
    c.shape("k", kk, {B, T, KV, hd}), c.shape("v", v, kk.shape);
    c.that(KV > 0 && H % KV == 0, "query heads " + std::to_string(H) + " are not a multiple of kv heads " +
                                      std::to_string(KV));
    return {B, T, H, KV, hd};
  }
  struct MoeDims {
    int64_t M, E, K;
  };
  // [M,E] from `name` (f32 probs or logits), [M,K] from the i32 experts, 1 <= K <= E.
  static MoeDims moe_dims(const Check& c, const char* name, V per_expert, V experts) {
    c.rank(name, per_expert, 2);
    const MoeDims d = moe_dims(c, per_expert.shape[1], std::string(name) + " " + per_expert.shape.str(),
                               experts);
    c.shape(name, per_expert, {d.M, d.E});
    return d;
  }
  // E experts, counted by `of`; [M,K] from the i32 experts, 1 <= K <= E.
  static MoeDims moe_dims(const Check& c, int64_t E, const std::string& of, V experts) {
    c.rank("experts", experts, 2, DType::DTYPE_I32);
    const int64_t M = experts.shape[0], K = experts.shape[1];
    c.that(K >= 1 && K <= E, "top-k " + std::to_string(K) + " (experts " + experts.shape.str() +
                                 ") must be in [1, " + std::to_string(E) + "], the experts of " + of);
    return {M, E, K};
  }
  struct PermutedDims {
    int64_t M, K, D;
  };
  // pos i32 [M,K] and the permuted rows [M*K, D] of `name`.
  static PermutedDims permuted_dims(const Check& c, const char* name, V permuted, V pos) {
    c.rank("pos", pos, 2, DType::DTYPE_I32), c.rank(name, permuted, 2);
    const int64_t M = pos.shape[0], K = pos.shape[1], D = permuted.shape[1];
    c.shape(name, permuted, {M * K, D});
    return {M, K, D};
  }
  static k::SsdShape ssd_dims(const Check& c, V x, V dt, V A_log, V Bm, V Cm, V D, int64_t chunk) {
    c.rank("x", x, 4), c.rank("Bm", Bm, 4);
    const k::SsdShape s = ssd_shape_of(x.shape, Bm.shape, chunk);
    c.shape("dt", dt, {s.B, s.Tn, s.Hm}), c.shape("A_log", A_log, {s.Hm}), c.shape("D", D, {s.Hm});
    c.shape("Bm", Bm, {s.B, s.Tn, s.G, s.N}), c.shape("Cm", Cm, Bm.shape);
    c.that(s.G > 0 && s.Hm % s.G == 0, "heads " + std::to_string(s.Hm) + " are not a multiple of groups " +
                                           std::to_string(s.G));
    return s;
  }
  void check_stream(const char* what, int stream) const {
    if (stream != 0)
      throw std::invalid_argument(std::string("backend cpu: ") + what + " on stream " +
                                  std::to_string(stream) + "; the cpu backend has stream 0 only");
  }
  void account(MemCategory c, int64_t delta) {
    auto i = static_cast<size_t>(c);
    stats_.current[i] += delta;
    stats_.total_current += delta;
    if (stats_.current[i] > stats_.peak[i]) stats_.peak[i] = stats_.current[i];
    if (stats_.total_current > stats_.total_peak) stats_.total_peak = stats_.total_current;
  }
  MemoryStats stats_;
  std::map<size_t, std::vector<void*>> cache_;  // free blocks by rounded size
  size_t cached_bytes_ = 0;
  uint64_t events_ = 0;
};

}  // namespace

Backend& cpu() {
  static CpuBackend backend;
  return backend;
}

std::vector<Backend*> registered_backends() { return {&cpu()}; }

Tensor::Tensor(Backend& b, int64_t numel, MemCategory category)
    : Tensor(b, Shape{numel}, category) {}

Tensor::Tensor(Backend& b, Shape shape, MemCategory category, DType dtype)
    : backend_(&b), shape_(shape), dtype_(dtype), category_(category) {
  data_ = b.allocate(bytes(), category);
}

Tensor::~Tensor() { release(); }

Tensor::Tensor(Tensor&& o) noexcept
    : backend_(o.backend_), data_(o.data_), shape_(o.shape_), dtype_(o.dtype_), category_(o.category_) {
  o.data_ = nullptr;
  o.shape_ = Shape{0};
}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    release();
    backend_ = o.backend_;
    data_ = o.data_;
    shape_ = o.shape_;
    dtype_ = o.dtype_;
    category_ = o.category_;
    o.data_ = nullptr;
    o.shape_ = Shape{0};
  }
  return *this;
}

void Tensor::release() {
  if (data_ && backend_) backend_->deallocate(data_, bytes(), category_);
  data_ = nullptr;
  shape_ = Shape{0};
}

float* Tensor::data() {
  if (dtype_ != DType::DTYPE_F32)
    throw std::logic_error(std::string("Tensor::data(): the tensor holds ") + dtype_name(dtype_) +
                           ", not f32");
  return static_cast<float*>(data_);
}

const float* Tensor::data() const { return const_cast<Tensor*>(this)->data(); }

void Tensor::zero() {
  if (data_) backend_->fill_zero(data_, bytes());
}

TensorView Tensor::view() { return {backend_, dtype_, shape_, data_}; }
ConstTensorView Tensor::view() const { return {backend_, dtype_, shape_, data_}; }

TensorView Tensor::view(Shape s) {
  if (s.numel() != shape_.numel())
    throw std::invalid_argument("Tensor::view: shape " + s.str() + " has " + std::to_string(s.numel()) +
                                " elements, the tensor " + shape_.str() + " has " +
                                std::to_string(shape_.numel()));
  return {backend_, dtype_, s, data_};
}

ConstTensorView Tensor::view(Shape s) const { return const_cast<Tensor*>(this)->view(s); }

}  // namespace piper::backend
