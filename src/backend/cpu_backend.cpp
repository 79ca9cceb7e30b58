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
#include "backend/contract.hpp"
#include "bf16.hpp"
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

namespace k = piper::kernels;
namespace ct = piper::backend::contract;
using ct::Check;

// Where the CPU backend's memory is: at the address its pointers hold (cpu()), or, for
// cpu_detached(), at that address less a tag that puts every pointer it hands out outside the
// canonical address space, so a host access faults and only the backend's own code, which
// removes the tag, reaches the memory.
class Addresses {
 public:
  explicit Addresses(bool detached) : tag_(detached ? kTag : 0) {}
  bool detached() const { return tag_ != 0; }
  void* device(void* local) const { return local ? to(local, tag_) : nullptr; }
  void* local(const void* device) const { return device ? to(device, -tag_) : nullptr; }

 private:
  static constexpr uintptr_t kTag = uintptr_t{1} << 62;
  static void* to(const void* p, uintptr_t delta) { return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) + delta); }
  uintptr_t tag_;
};

// Host memory the bf16 emulation widens into (Widened), cached by size and kept out of the backend's
// accounting: the CUDA kernels convert in registers, so these copies stand for nothing a device holds.
class HostBlocks {
 public:
  HostBlocks() = default;
  HostBlocks(const HostBlocks&) = delete;
  HostBlocks& operator=(const HostBlocks&) = delete;
  ~HostBlocks() {
    for (auto& [n, blocks] : free_)
      for (float* p : blocks) std::free(p);
  }
  float* take(int64_t n) {
    auto& blocks = free_[n];
    if (!blocks.empty()) {
      float* p = blocks.back();
      blocks.pop_back();
      return p;
    }
    void* p = std::aligned_alloc(64, (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return static_cast<float*>(p);
  }
  void give(float* p, int64_t n) { free_[n].push_back(p); }

 private:
  std::map<int64_t, std::vector<float*>> free_;
};

// The views of one op as the kernels read them: at their local addresses, and bf16 storage as f32.
// An op's bf16 tensors are widened to f32 copies for the kernels, which compute in f32, and its bf16
// outputs are rounded back when the op ends (an output is widened first too: an op may accumulate
// into it). f32 and i32 tensors are used as they are. The same arithmetic as the CUDA backend's
// bf16 kernels: bf16 in memory, f32 in registers; the copies come from `host`, outside the accounting.
class Widened {
 public:
  Widened(Backend& be, const Addresses& at, HostBlocks& host, std::initializer_list<ConstTensorView*> in,
          std::initializer_list<TensorView*> out)
      : be_(be), at_(at), host_(host) {
    for (ConstTensorView* v : in) {
      v->ptr = at_.local(v->ptr);
      if (v->dtype != DType::DTYPE_BF16) continue;
      v->ptr = widen(v->ptr, v->numel());
      v->dtype = DType::DTYPE_F32;
    }
    for (TensorView* v : out) {
      v->ptr = at_.local(v->ptr);
      if (v->dtype != DType::DTYPE_BF16) continue;
      outs_.push_back({static_cast<uint16_t*>(v->ptr), v->numel(), nullptr});
      v->ptr = widen(v->ptr, v->numel());
      v->dtype = DType::DTYPE_F32;
      outs_.back().wide = static_cast<const float*>(v->ptr);
    }
  }
  ~Widened() {
    for (const Out& o : outs_) k::f32_to_bf16(o.wide, o.bf16, o.n);
    for (const auto& [p, n] : taken_) host_.give(p, n);
  }
  Widened(const Widened&) = delete;
  Widened& operator=(const Widened&) = delete;

  // Scratch of n floats for the kernels, at its local address, alive as long as the op.
  float* scratch(int64_t n) {
    copies_.emplace_back(be_, n, MemCategory::MEM_BUFFERS);
    return static_cast<float*>(at_.local(copies_.back().data()));
  }
  // A bf16 product's inputs: each view replaced by a copy rounded to bf16 (kept as f32).
  void round_to_bf16(std::initializer_list<ConstTensorView*> in) {
    for (ConstTensorView* v : in) {
      float* r = host(v->numel());
      k::round_to_bf16(v->f32(), r, v->numel());
      v->ptr = r;
    }
  }

 private:
  float* host(int64_t n) {
    taken_.emplace_back(host_.take(n), n);
    return taken_.back().first;
  }
  float* widen(const void* bf16, int64_t n) {
    float* wide = host(n);
    k::bf16_to_f32(static_cast<const uint16_t*>(bf16), wide, n);
    return wide;
  }
  struct Out {
    uint16_t* bf16;
    int64_t n;
    const float* wide;
  };
  Backend& be_;
  const Addresses& at_;
  HostBlocks& host_;
  std::vector<std::pair<float*, int64_t>> taken_;
  std::vector<Tensor> copies_;
  std::vector<Out> outs_;
};

// Every block, device or host, is a whole number of 64-byte lines.
size_t rounded_size(size_t bytes) { return (bytes + 63) / 64 * 64; }

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(bool detached) : at_(detached) {}
  DeviceKind kind() const override { return DeviceKind::DEVICE_CPU; }
  const char* name() const override { return at_.detached() ? "cpu_detached" : "cpu"; }
  bool host_addressable() const override { return !at_.detached(); }

  ~CpuBackend() override { release_cached(); }

  // Blocks are cached by size and reused: a training step allocates the same
  // sizes every time, and fresh pages would cost a page fault each.
  void* allocate(size_t bytes, MemCategory c) override {
    if (bytes == 0) return nullptr;
    const size_t rounded = rounded_size(bytes);
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
    stats_.add(c, static_cast<int64_t>(bytes));
    return at_.device(p);
  }
  void deallocate(void* p, size_t bytes, MemCategory c) noexcept override {
    if (!p) return;
    const size_t rounded = rounded_size(bytes);
    cache_[rounded].push_back(at_.local(p));
    cached_bytes_ += rounded;
    stats_.add(c, -static_cast<int64_t>(bytes));
  }
  void release_cached() override {
    for (auto& [size, blocks] : cache_)
      for (void* p : blocks) std::free(p);
    cache_.clear();
    cached_bytes_ = 0;
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(at_.local(dst), at_.local(src), bytes);
  }
  void to_device(void* dst, const void* host, size_t bytes) override {
    if (bytes) std::memcpy(at_.local(dst), host, bytes);
  }
  void to_host(void* host, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(host, at_.local(src), bytes);
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes) std::memset(at_.local(dst), 0, bytes);
  }
  // The host's own memory: a host buffer is what the detached backend stages through.
  void* allocate_host(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = std::aligned_alloc(64, rounded_size(bytes));
    if (!p) throw std::bad_alloc();
    return p;
  }
  void deallocate_host(void* p, size_t) override { std::free(p); }
  MemoryStats memory() const override { return stats_; }
  void reset_peak() override { stats_.reset_peak(); }

  // One stream: every op has finished when its call returns, so events are already complete.
  int stream_count() const override { return 1; }
  void set_stream(int stream) override { check_stream("set_stream", stream); }
  void* native_stream() override { return nullptr; }
  Event record(int stream) override {
    check_stream("record", stream);
    return {stream, ++events_};
  }
  void wait(int stream, Event e) override {
    check_stream("wait", stream);
    check_stream("wait", e.stream);
  }
  void synchronize(int) override {}

  bool supports(DType) const override { return true; }  // bf16 through Widened
  std::vector<int64_t> attention_head_dims() const override { return {}; }
  // No TF32 units: TF32 products stay f32; bf16 products round their inputs (the GPU's arithmetic).
  void set_matmul_precision(MatmulPrecision p) override { matmul_ = p; }
  bool bf16_products() const { return matmul_ == MatmulPrecision::MATMUL_BF16; }
  int64_t ssd_saved_numel(const Shape& x, const Shape& Bm, int64_t chunk) const override {
    return k::ssd_saved_size(ct::ssd_shape_of(x, Bm, chunk));
  }

  // ---- the op table: contract.hpp checks, kernels/ computes ----
  void linear_fwd(V x, V w, O y) override {
    Check c("linear_fwd", this);
    const auto d = ct::linear_fwd(c, x, w, y);
    Widened wide(*this, at_, host_, {&x, &w}, {&y});
    if (bf16_products()) wide.round_to_bf16({&x, &w});
    k::linear_fwd(x.f32(), w.f32(), y.f32(), d.M, d.K, d.N);
  }
  void linear_bwd_input(V dy, V w, O dx, bool accumulate) override {
    Check c("linear_bwd_input", this);
    const auto d = ct::linear_bwd_input(c, dy, w, dx);
    Widened wide(*this, at_, host_, {&dy, &w}, {&dx});
    if (bf16_products()) wide.round_to_bf16({&dy, &w});
    k::linear_bwd_input(dy.f32(), w.f32(), dx.f32(), d.M, d.K, d.N, accumulate);
  }
  void linear_bwd_weight(V dy, V x, O dw) override {
    Check c("linear_bwd_weight", this);
    const auto d = ct::linear_bwd_weight(c, dy, x, dw);
    Widened wide(*this, at_, host_, {&dy, &x}, {&dw});
    if (bf16_products()) wide.round_to_bf16({&dy, &x});
    k::linear_bwd_weight(dy.f32(), x.f32(), dw.f32(), d.M, d.K, d.N);
  }
  void rmsnorm_fwd(V x, V w, O y, O rstd, float eps) override {
    Check c("rmsnorm_fwd", this);
    const auto d = ct::rmsnorm_fwd(c, x, w, y, rstd);
    Widened wide(*this, at_, host_, {&x, &w}, {&y, &rstd});
    k::rmsnorm_fwd(x.f32(), w.f32(), y.f32(), rstd.f32(), d.M, d.D, eps);
  }
  void rmsnorm_bwd(V dy, V x, V w, V rstd, O dx, O dw) override {
    Check c("rmsnorm_bwd", this);
    const auto d = ct::rmsnorm_bwd(c, dy, x, w, rstd, dx, dw);
    Widened wide(*this, at_, host_, {&dy, &x, &w, &rstd}, {&dx, &dw});
    k::rmsnorm_bwd(dy.f32(), x.f32(), w.f32(), rstd.f32(), dx.f32(), dw.f32(), d.M, d.D);
  }
  void gated_rmsnorm_fwd(V y, V z, V w, O out, O rstd, float eps) override {
    Check c("gated_rmsnorm_fwd", this);
    const auto d = ct::gated_rmsnorm_fwd(c, y, z, w, out, rstd);
    Widened wide(*this, at_, host_, {&y, &z, &w}, {&out, &rstd});
    k::gated_rmsnorm_fwd(y.f32(), z.f32(), w.f32(), out.f32(), rstd.f32(), d.M, d.D, d.G, eps);
  }
  void gated_rmsnorm_bwd(V dout, V y, V z, V w, V rstd, O dy, O dz, O dw) override {
    Check c("gated_rmsnorm_bwd", this);
    const auto d = ct::gated_rmsnorm_bwd(c, dout, y, z, w, rstd, dy, dz, dw);
    Widened wide(*this, at_, host_, {&dout, &y, &z, &w, &rstd}, {&dy, &dz, &dw});
    k::gated_rmsnorm_bwd(dout.f32(), y.f32(), z.f32(), w.f32(), rstd.f32(), dy.f32(), dz.f32(),
                         dw.f32(), d.M, d.D, d.G);
  }
  void rope_fwd(V x, O y, double theta) override {
    Check c("rope_fwd", this);
    ct::rope(c, "x", x, "y", y);
    Widened wide(*this, at_, host_, {&x}, {&y});
    k::rope_fwd(x.f32(), y.f32(), x.shape[0], x.shape[1], x.shape[2], x.shape[3], theta);
  }
  void rope_bwd(V dy, O dx, double theta) override {
    Check c("rope_bwd", this);
    ct::rope(c, "dy", dy, "dx", dx);
    Widened wide(*this, at_, host_, {&dy}, {&dx});
    k::rope_bwd(dy.f32(), dx.f32(), dy.shape[0], dy.shape[1], dy.shape[2], dy.shape[3], theta);
  }
  void attention_fwd(V q, V kk, V v, O out, O lse) override {
    Check c("attention_fwd", this);
    const auto [B, T, H, KV, hd] = ct::attention_fwd(c, q, kk, v, out, lse);
    Widened wide(*this, at_, host_, {&q, &kk, &v}, {&out, &lse});
    k::attention_fwd(q.f32(), kk.f32(), v.f32(), out.f32(), lse.f32(), B, T, H, KV, hd);
  }
  void attention_bwd(V dout, V q, V kk, V v, V out, V lse, O dq, O dk, O dv) override {
    Check c("attention_bwd", this);
    const auto [B, T, H, KV, hd] = ct::attention_bwd(c, dout, q, kk, v, out, lse, dq, dk, dv);
    Widened wide(*this, at_, host_, {&dout, &q, &kk, &v, &out, &lse}, {&dq, &dk, &dv});
    k::attention_bwd(dout.f32(), q.f32(), kk.f32(), v.f32(), out.f32(), lse.f32(), dq.f32(),
                     dk.f32(), dv.f32(), B, T, H, KV, hd);
  }
  void conv1d_fwd(V x, V w, V bias, O y) override {
    Check c("conv1d_fwd", this);
    const auto d = ct::conv1d_fwd(c, x, w, bias, y);
    Widened wide(*this, at_, host_, {&x, &w, &bias}, {&y});
    k::conv1d_fwd(x.f32(), w.f32(), bias.f32(), y.f32(), d.B, d.T, d.C, d.K);
  }
  void conv1d_bwd(V dy, V x, V w, O dx, O dw, O dbias) override {
    Check c("conv1d_bwd", this);
    const auto d = ct::conv1d_bwd(c, dy, x, w, dx, dw, dbias);
    Widened wide(*this, at_, host_, {&dy, &x, &w}, {&dx, &dw, &dbias});
    k::conv1d_bwd(dy.f32(), x.f32(), w.f32(), dx.f32(), dw.f32(), dbias.f32(), d.B, d.T, d.C, d.K);
  }
  void ssd_fwd(V x, V dt, V A_log, V Bm, V Cm, V D, O y, O saved, int64_t chunk) override {
    Check c("ssd_fwd", this);
    const k::SsdShape s = ct::ssd_fwd(c, x, dt, A_log, Bm, Cm, D, y, saved, chunk,
                                      ssd_saved_numel(x.shape, Bm.shape, chunk));
    Widened wide(*this, at_, host_, {&x, &dt, &A_log, &Bm, &Cm, &D}, {&y, &saved});
    k::ssd_fwd(s, x.f32(), dt.f32(), A_log.f32(), Bm.f32(), Cm.f32(), D.f32(), y.f32(),
               saved.f32(), wide.scratch(k::ssd_fwd_workspace_size(s)));
  }
  void ssd_bwd(V dy, V x, V dt, V A_log, V Bm, V Cm, V D, V saved, O dx, O ddt, O dA_log, O dBm,
               O dCm, O dD, int64_t chunk) override {
    Check c("ssd_bwd", this);
    const k::SsdShape s = ct::ssd_bwd(c, dy, x, dt, A_log, Bm, Cm, D, saved, dx, ddt, dA_log, dBm, dCm,
                                      dD, chunk, ssd_saved_numel(x.shape, Bm.shape, chunk));
    Widened wide(*this, at_, host_, {&dy, &x, &dt, &A_log, &Bm, &Cm, &D, &saved}, {&dx, &ddt, &dA_log, &dBm, &dCm, &dD});
    k::ssd_bwd(s, dy.f32(), x.f32(), dt.f32(), A_log.f32(), Bm.f32(), Cm.f32(), D.f32(),
               saved.f32(), dx.f32(), ddt.f32(), dA_log.f32(), dBm.f32(), dCm.f32(), dD.f32(),
               wide.scratch(k::ssd_bwd_workspace_size(s)));
  }
  void silu_fwd(V x, O y) override {
    Check c("silu_fwd", this);
    const int64_t n = ct::silu_fwd(c, x, y);
    Widened wide(*this, at_, host_, {&x}, {&y});
    k::silu_fwd(x.f32(), y.f32(), n);
  }
  void silu_bwd(V dy, V x, O dx) override {
    Check c("silu_bwd", this);
    const int64_t n = ct::silu_bwd(c, dy, x, dx);
    Widened wide(*this, at_, host_, {&dy, &x}, {&dx});
    k::silu_bwd(dy.f32(), x.f32(), dx.f32(), n);
  }
  void swiglu_fwd(V gate, V up, O h) override {
    Check c("swiglu_fwd", this);
    const int64_t n = ct::swiglu_fwd(c, gate, up, h);
    Widened wide(*this, at_, host_, {&gate, &up}, {&h});
    k::swiglu_fwd(gate.f32(), up.f32(), h.f32(), n);
  }
  void swiglu_bwd(V dh, V gate, V up, O dgate, O dup) override {
    Check c("swiglu_bwd", this);
    const int64_t n = ct::swiglu_bwd(c, dh, gate, up, dgate, dup);
    Widened wide(*this, at_, host_, {&dh, &gate, &up}, {&dgate, &dup});
    k::swiglu_bwd(dh.f32(), gate.f32(), up.f32(), dgate.f32(), dup.f32(), n);
  }
  void moe_route_fwd(V logits, O probs, O experts, O weights) override {
    Check c("moe_route_fwd", this);
    const auto [M, E, K] = ct::moe_route_fwd(c, logits, probs, experts, weights);
    Widened wide(*this, at_, host_, {&logits}, {&probs, &experts, &weights});
    k::moe_route_fwd(logits.f32(), probs.f32(), experts.i32(), weights.f32(), M, E, K);
  }
  void moe_route_bwd(V dweights, V dprobs, V probs, V experts, V weights, O dlogits) override {
    Check c("moe_route_bwd", this);
    const auto [M, E, K] = ct::moe_route_bwd(c, dweights, dprobs, probs, experts, weights, dlogits);
    Widened wide(*this, at_, host_, {&dweights, &dprobs, &probs, &experts, &weights}, {&dlogits});
    k::moe_route_bwd(dweights.f32(), dprobs.f32(), probs.f32(), experts.i32(), weights.f32(),
                     dlogits.f32(), M, E, K);
  }
  double moe_balance(V probs, V experts, int64_t seq, O dprobs, float scale) override {
    Check c("moe_balance", this);
    const auto [M, E, K] = ct::moe_balance(c, probs, experts, seq, dprobs);
    Widened wide(*this, at_, host_, {&probs, &experts}, {&dprobs});
    return k::moe_balance(probs.f32(), experts.i32(), dprobs.f32(), M, E, K, seq, scale);
  }
  void moe_permute_index(V experts, O counts, O rows, O pos) override {
    Check c("moe_permute_index", this);
    const auto [M, E, K] = ct::moe_permute_index(c, experts, counts, rows, pos);
    Widened wide(*this, at_, host_, {&experts}, {&counts, &rows, &pos});
    k::moe_permute_index(experts.i32(), counts.i32(), rows.i32(), pos.i32(), M, E, K);
  }
  void gather_rows(V src, V rows, O dst) override {
    Check c("gather_rows", this);
    const auto [P, D] = ct::gather_rows(c, src, rows, dst);
    Widened wide(*this, at_, host_, {&src, &rows}, {&dst});
    k::gather_rows(src.f32(), rows.i32(), dst.f32(), P, D);
  }
  void moe_combine(V y, V pos, V weights, O out) override {
    Check c("moe_combine", this);
    const auto [M, K, D] = ct::moe_combine(c, y, pos, weights, out);
    Widened wide(*this, at_, host_, {&y, &pos, &weights}, {&out});
    k::moe_combine(y.f32(), pos.i32(), weights.f32(), out.f32(), M, K, D);
  }
  void moe_combine_bwd(V dout, V y, V pos, V weights, O dy, O dweights) override {
    Check c("moe_combine_bwd", this);
    const auto [M, K, D] = ct::moe_combine_bwd(c, dout, y, pos, weights, dy, dweights);
    Widened wide(*this, at_, host_, {&dout, &y, &pos, &weights}, {&dy, &dweights});
    k::moe_combine_bwd(dout.f32(), y.f32(), pos.i32(), weights.f32(), dy.f32(), dweights.f32(), M, K,
                       D);
  }
  void moe_dispatch_bwd(V dxp, V pos, O dx) override {
    Check c("moe_dispatch_bwd", this);
    const auto [M, K, D] = ct::moe_dispatch_bwd(c, dxp, pos, dx);
    Widened wide(*this, at_, host_, {&dxp, &pos}, {&dx});
    k::moe_dispatch_bwd(dxp.f32(), pos.i32(), dx.f32(), M, K, D);
  }
  void dt_softplus_fwd(V dt_raw, V dt_bias, O dt) override {
    Check c("dt_softplus_fwd", this);
    const auto [M, Hm] = ct::dt_softplus_fwd(c, dt_raw, dt_bias, dt);
    Widened wide(*this, at_, host_, {&dt_raw, &dt_bias}, {&dt});
    k::dt_softplus_fwd(dt_raw.f32(), dt_bias.f32(), dt.f32(), M, Hm);
  }
  void dt_softplus_bwd(V ddt, V dt_raw, V dt_bias, O ddt_raw, O ddt_bias) override {
    Check c("dt_softplus_bwd", this);
    const auto [M, Hm] = ct::dt_softplus_bwd(c, ddt, dt_raw, dt_bias, ddt_raw, ddt_bias);
    Widened wide(*this, at_, host_, {&ddt, &dt_raw, &dt_bias}, {&ddt_raw, &ddt_bias});
    k::dt_softplus_bwd(ddt.f32(), dt_raw.f32(), dt_bias.f32(), ddt_raw.f32(), ddt_bias.f32(), M, Hm);
  }
  void embedding_fwd(V ids, V table, O out, int64_t vocab_offset) override {
    Check c("embedding_fwd", this);
    const auto [M, Vn, D] = ct::embedding_fwd(c, ids, table, out);
    Widened wide(*this, at_, host_, {&ids, &table}, {&out});
    k::embedding_fwd(ids.i32(), table.f32(), out.f32(), M, D, Vn, vocab_offset);
  }
  void embedding_bwd(V ids, V dout, O dtable, int64_t vocab_offset) override {
    Check c("embedding_bwd", this);
    const auto [M, Vn, D] = ct::embedding_bwd(c, ids, dout, dtable);
    Widened wide(*this, at_, host_, {&ids, &dout}, {&dtable});
    k::embedding_bwd(ids.i32(), dout.f32(), dtable.f32(), M, D, Vn, vocab_offset);
  }
  double cross_entropy(V logits, V targets, O dlogits, float scale) override {
    Check c("cross_entropy", this);
    const auto [M, Vn] = ct::cross_entropy(c, logits, targets, dlogits);
    Widened wide(*this, at_, host_, {&logits, &targets}, {&dlogits});
    return k::cross_entropy(logits.f32(), targets.i32(), dlogits.f32(), M, Vn, scale);
  }
  void row_max(V x, O out) override {
    Check c("row_max", this);
    const auto [M, N] = ct::row_max(c, x, out);
    Widened wide(*this, at_, host_, {&x}, {&out});
    k::row_max(x.f32(), out.f32(), M, N);
  }
  void vocab_ce_partials(V logits, V row_max, V targets, int64_t vocab_offset, O exps,
                         O sums) override {
    Check c("vocab_ce_partials", this);
    const auto [M, Vn] = ct::vocab_ce_partials(c, logits, row_max, targets, exps, sums);
    Widened wide(*this, at_, host_, {&logits, &row_max, &targets}, {&exps, &sums});
    k::vocab_ce_partials(logits.f32(), row_max.f32(), targets.i32(), vocab_offset, exps.f32(),
                         sums.f32(), M, Vn);
  }
  double vocab_ce_finish(V sums, V row_max, V targets, int64_t vocab_offset, O dlogits,
                         float scale) override {
    Check c("vocab_ce_finish", this);
    const auto [M, Vn] = ct::vocab_ce_finish(c, sums, row_max, targets, dlogits);
    Widened wide(*this, at_, host_, {&sums, &row_max, &targets}, {&dlogits});
    return k::vocab_ce_finish(sums.f32(), row_max.f32(), targets.i32(), vocab_offset,
                              dlogits.f32(), M, Vn, scale);
  }
  void gather_cols(V src, int64_t col, O dst) override {
    Check c("gather_cols", this);
    const auto [M, S, n] = ct::gather_cols(c, src, col, dst);
    Widened wide(*this, at_, host_, {&src}, {&dst});
    k::gather_cols(src.f32(), S, col, dst.f32(), n, M);
  }
  void scatter_cols(V src, O dst, int64_t col) override {
    Check c("scatter_cols", this);
    const auto [M, S, n] = ct::scatter_cols(c, src, dst, col);
    Widened wide(*this, at_, host_, {&src}, {&dst});
    k::scatter_cols(src.f32(), n, dst.f32(), S, col, M);
  }
  void add_inplace(O y, V x) override {
    Check c("add_inplace", this);
    const int64_t n = ct::add_inplace(c, y, x);
    Widened wide(*this, at_, host_, {&x}, {&y});
    k::add_inplace(y.f32(), x.f32(), n);
  }
  void convert(V src, O dst) override {
    Check c("convert", this);
    const int64_t n = ct::convert(c, src, dst);
    const void* from = at_.local(src.ptr);
    void* to = at_.local(dst.ptr);
    if (src.dtype == dst.dtype)
      copy(dst.ptr, src.ptr, static_cast<size_t>(n) * dtype_size(src.dtype));
    else if (dst.dtype == DType::DTYPE_BF16)
      k::f32_to_bf16(static_cast<const float*>(from), static_cast<uint16_t*>(to), n);
    else
      k::bf16_to_f32(static_cast<const uint16_t*>(from), static_cast<float*>(to), n);
  }
  void adamw_update(O p, V g, O m, O v, const AdamWStep& st) override {
    Check c("adamw_update", this);
    const int64_t n = ct::adamw_update(c, p, g, m, v, st);
    Widened wide(*this, at_, host_, {&g}, {&p, &m, &v});
    k::adamw_update(p.f32(), g.f32(), m.f32(), v.f32(), n, st.lr, st.beta1, st.beta2, st.eps,
                    st.weight_decay, st.t, st.decay, st.grad_scale);
  }
  double sum_squares(V x) override {
    Check c("sum_squares", this);
    const int64_t n = ct::sum_squares(c, x);
    Widened wide(*this, at_, host_, {&x}, {});
    return k::sum_squares(x.f32(), n);
  }

 private:
  void check_stream(const char* what, int stream) const {
    if (stream != 0)
      throw std::invalid_argument(std::string("backend ") + name() + ": " + what + " on stream " +
                                  std::to_string(stream) + "; the " + name() + " backend has stream 0 only");
  }
  Addresses at_;
  MatmulPrecision matmul_ = MatmulPrecision::MATMUL_FP32;
  MemoryStats stats_;
  std::map<size_t, std::vector<void*>> cache_;  // free blocks by rounded size, at local addresses
  HostBlocks host_;                              // what bf16 ops widen into
  size_t cached_bytes_ = 0;
  uint64_t events_ = 0;
};

}  // namespace

Backend& cpu() {
  static CpuBackend backend(false);
  return backend;
}

Backend& cpu_detached() {
  static CpuBackend backend(true);
  return backend;
}

HostBuffer::HostBuffer(Backend& b, size_t n)
    : backend_(&b), data_(static_cast<float*>(b.allocate_host(n * sizeof(float)))), n_(n) {}

HostBuffer::~HostBuffer() { release(); }

HostBuffer::HostBuffer(HostBuffer&& o) noexcept : backend_(o.backend_), data_(o.data_), n_(o.n_) {
  o.data_ = nullptr;
  o.n_ = 0;
}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    release();
    backend_ = o.backend_;
    data_ = o.data_;
    n_ = o.n_;
    o.data_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}

void HostBuffer::release() {
  if (data_ && backend_) backend_->deallocate_host(data_, n_ * sizeof(float));
  data_ = nullptr;
  n_ = 0;
}

Tensor::Tensor(Backend& b, int64_t numel, MemCategory category)
    : Tensor(b, Shape{numel}, category) {}

Tensor::Tensor(Backend& b, Shape shape, MemCategory category, DType dtype)
    : backend_(&b), shape_(shape), dtype_(dtype), category_(category) {
  data_ = b.allocate(bytes(), category);
}

Tensor::~Tensor() { release(); }

Tensor converted(ConstTensorView src, DType to, MemCategory category) {
  Tensor t(*src.device, src.shape, category, to);
  src.device->convert(src, t.view());
  return t;
}

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

TensorView Tensor::part(int64_t offset, Shape s) {
  if (offset < 0 || offset + s.numel() > shape_.numel())
    throw std::invalid_argument("Tensor::part: elements [" + std::to_string(offset) + ", " +
                                std::to_string(offset + s.numel()) + ") of the tensor " + shape_.str());
  return {backend_, dtype_, s, static_cast<unsigned char*>(data_) + static_cast<size_t>(offset) * dtype_size(dtype_)};
}

ConstTensorView Tensor::part(int64_t offset, Shape s) const { return const_cast<Tensor*>(this)->part(offset, s); }

}  // namespace piper::backend
