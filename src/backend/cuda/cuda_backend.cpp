// cuda_backend.cpp — the CUDA implementation of the backend interface: device memory from a
// block cache with per-category accounting, several streams with real events, cuBLAS for the
// linear products and the kernels of kernels/*.cu for the rest of the op table, in f32 or bf16
// storage with f32 arithmetic.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <climits>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "adamw_cuda.hpp"
#include "backend/backend.hpp"
#include "backend/contract.hpp"
#include "cuda_check.hpp"
#include "rmsnorm_cuda.hpp"
#include "rope_cuda.hpp"
#include "silu_cuda.hpp"
#include "tensor_ops_cuda.hpp"
#include "attention_cuda.hpp"
#include "conv1d_cuda.hpp"
#include "cross_entropy_cuda.hpp"
#include "dt_softplus_cuda.hpp"
#include "gated_rmsnorm_cuda.hpp"
#include "embedding_cuda.hpp"
#include "moe_cuda.hpp"
#include "ssd_cuda.hpp"

namespace piper::backend {
namespace {

namespace kc = piper::kernels::cuda;
namespace ct = piper::backend::contract;
using ct::Check;
using bf16 = __nv_bfloat16;

void check_cublas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("backend cuda: cuBLAS ") + what + " failed: " +
                             cublasGetStatusName(st) + " (" + cublasGetStatusString(st) + ")");
}

template <class T>
T* ptr(const TensorView& v) {
  return static_cast<T*>(v.ptr);
}
template <class T>
const T* ptr(const ConstTensorView& v) {
  return static_cast<const T*>(v.ptr);
}
float* f32(const TensorView& v) { return static_cast<float*>(v.ptr); }
const float* f32(const ConstTensorView& v) { return static_cast<const float*>(v.ptr); }
int32_t* i32(const TensorView& v) { return static_cast<int32_t*>(v.ptr); }
const int32_t* i32(const ConstTensorView& v) { return static_cast<const int32_t*>(v.ptr); }

// Calls f.template operator()<T>() with T the op's storage type (float or bf16).
template <class F>
void by_storage(const Check& c, F&& f) {
  if (c.storage() == DType::DTYPE_BF16)
    f.template operator()<bf16>();
  else
    f.template operator()<float>();
}

// Calls f.template operator()<U>() with U the float type t (float or bf16).
template <class F>
void by_type(DType t, F&& f) {
  if (t == DType::DTYPE_BF16)
    f.template operator()<bf16>();
  else
    f.template operator()<float>();
}

cudaDataType_t cuda_type(DType t) { return t == DType::DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

int gemm_extent(int64_t v, const char* op) {
  if (v > INT_MAX)
    throw std::invalid_argument(std::string("backend cuda, op ") + op + ": extent " + std::to_string(v) +
                                " exceeds cuBLAS's int range");
  return static_cast<int>(v);
}

class CudaBackend final : public Backend {
 public:
  static constexpr int kStreams = 4;
  static constexpr size_t kEventRing = 4096;  // events recorded and not yet waited for, at most
  static constexpr size_t kAlign = 512;
  // cuBLAS's workspace for one stream, the size its documentation recommends on Hopper: taken from
  // the backend's memory (MEM_BUFFERS) when a stream's first product runs and held from then on, so
  // the accounting sees it; a stream's own, as cuBLAS needs (one workspace serves one stream at a time).
  static constexpr size_t kBlasWorkspace = size_t(32) << 20;

  explicit CudaBackend(int device) : device_(device) {
    PIPER_CUDA_CHECK(cudaSetDevice(device_));
    for (auto& s : streams_) PIPER_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (auto& e : ring_) PIPER_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    check_cublas(cublasCreate(&blas_), "cublasCreate");
    PIPER_CUDA_CHECK(cudaMalloc(&scalar_, sizeof(double)));
    PIPER_CUDA_CHECK(cudaMallocHost(&host_scalar_, sizeof(double)));
  }

  DeviceKind kind() const override { return DeviceKind::DEVICE_CUDA; }
  bool host_addressable() const override { return false; }
  const char* name() const override { return "cuda"; }

  // ---- memory: blocks cached by rounded size. A freed block may still be read or written by
  // queued work, so freeing records an event on every stream and the next user of the block
  // waits for them on its stream (no host synchronisation): a block is first used on the stream
  // current when it is allocated, or on one ordered after it.
  void* allocate(size_t bytes, MemCategory c) override {
    if (bytes == 0) return nullptr;
    const size_t rounded = rounded_size(bytes);
    void* p = nullptr;
    auto it = cache_.find(rounded);
    if (it != cache_.end() && !it->second.empty()) {
      Cached blk = std::move(it->second.back());
      it->second.pop_back();
      for (cudaEvent_t e : blk.freed) {
        PIPER_CUDA_CHECK(cudaStreamWaitEvent(streams_[static_cast<size_t>(stream_)], e, 0));
        free_events_.push_back(e);
      }
      p = blk.ptr;
      cached_bytes_ -= rounded;
    } else {
      p = device_malloc(rounded, c);
    }
    stats_.add(c, static_cast<int64_t>(bytes));
    return p;
  }
  // After a CUDA error (a kernel's fault is sticky: every later call reports it) the block is
  // dropped, not cached: the error is reported by the call that met it first, not from here.
  void deallocate(void* p, size_t bytes, MemCategory c) noexcept override {
    if (!p) return;
    stats_.add(c, -static_cast<int64_t>(bytes));
    const size_t rounded = rounded_size(bytes);
    Cached blk{p, {}};
    for (cudaStream_t s : streams_) {
      cudaEvent_t e = nullptr;
      if (!free_events_.empty()) {
        e = free_events_.back();
        free_events_.pop_back();
      } else if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
        e = nullptr;
      }
      if (!e || cudaEventRecord(e, s) != cudaSuccess) {
        cudaGetLastError();  // a passing error is not left for the next launch to report as its own
        if (e) cudaEventDestroy(e);
        for (cudaEvent_t f : blk.freed) cudaEventDestroy(f);
        return;
      }
      blk.freed.push_back(e);
    }
    cache_[rounded].push_back(std::move(blk));
    cached_bytes_ += rounded;
  }
  void release_cached() override {
    for (auto& [size, blocks] : cache_)
      for (Cached& blk : blocks) {
        for (cudaEvent_t e : blk.freed) {
          cudaEventSynchronize(e);
          free_events_.push_back(e);
        }
        cudaFree(blk.ptr);
      }
    cache_.clear();
    cached_bytes_ = 0;
  }
  // Page-locked, so to_host and to_device copy at the link's speed; cached by size, since
  // cudaMallocHost costs milliseconds. A freed host buffer is free at once: to_host and to_device
  // have waited for their copies before they returned.
  void* allocate_host(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const size_t rounded = rounded_size(bytes);
    std::lock_guard<std::mutex> lock(host_mutex_);
    auto it = host_cache_.find(rounded);
    if (it != host_cache_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      return p;
    }
    void* p = nullptr;
    if (cudaMallocHost(&p, rounded) != cudaSuccess) {
      cudaGetLastError();
      release_host_cache();
      PIPER_CUDA_CHECK(cudaMallocHost(&p, rounded));
    }
    return p;
  }
  void deallocate_host(void* p, size_t bytes) override {
    if (!p) return;
    std::lock_guard<std::mutex> lock(host_mutex_);
    host_cache_[rounded_size(bytes)].push_back(p);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) PIPER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, current()));
  }
  // Host memory is the caller's again when these return: both wait for the copy.
  void to_device(void* dst, const void* host, size_t bytes) override {
    if (!bytes) return;
    PIPER_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, current()));
    PIPER_CUDA_CHECK(cudaStreamSynchronize(current()));
  }
  void to_host(void* host, const void* src, size_t bytes) override {
    if (!bytes) return;
    PIPER_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, current()));
    PIPER_CUDA_CHECK(cudaStreamSynchronize(current()));
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes) PIPER_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, current()));
  }
  MemoryStats memory() const override { return stats_; }
  void reset_peak() override { stats_.reset_peak(); }

  // ---- streams and events
  int stream_count() const override { return kStreams; }
  void* native_stream() override { return current(); }
  void set_stream(int stream) override {
    check_stream("set_stream", stream);
    stream_ = stream;
  }
  Event record(int stream) override {
    check_stream("record", stream);
    const uint64_t seq = ++events_;
    PIPER_CUDA_CHECK(cudaEventRecord(ring_[seq % kEventRing], streams_[static_cast<size_t>(stream)]));
    return {stream, seq};
  }
  void wait(int stream, Event e) override {
    check_stream("wait", stream);
    check_stream("wait", e.stream);
    if (e.seq == 0 || e.seq > events_ || events_ - e.seq >= kEventRing)
      throw std::invalid_argument("backend cuda: wait on event " + std::to_string(e.seq) +
                                  ", not one of the last " + std::to_string(kEventRing) +
                                  " recorded (the newest is " + std::to_string(events_) + ")");
    PIPER_CUDA_CHECK(cudaStreamWaitEvent(streams_[static_cast<size_t>(stream)], ring_[e.seq % kEventRing], 0));
  }
  void synchronize(int stream) override {
    check_stream("synchronize", stream);
    PIPER_CUDA_CHECK(cudaStreamSynchronize(streams_[static_cast<size_t>(stream)]));
  }

  bool supports(DType storage) const override { return storage != DType::DTYPE_I32; }
  std::vector<int64_t> attention_head_dims() const override {
    return {kc::kAttentionHeadDims.begin(), kc::kAttentionHeadDims.end()};
  }
  void set_matmul_precision(MatmulPrecision p) override { matmul_ = p; }
  int64_t ssd_saved_numel(const Shape& x, const Shape& Bm, int64_t chunk) const override {
    return kc::ssd_saved_numel(ct::ssd_shape_of(x, Bm, chunk));
  }

  // ---- the op table: contract.hpp checks, cuBLAS and kernels/*.cu compute
  void linear_fwd(V x, V w, O y) override {
    Check c("linear_fwd", this);
    const auto d = ct::linear_fwd(c, x, w, y);
    // row-major y[M,N] = x[M,K] w[N,K]^T is column-major y^T[N,M] = w^T x^T
    product("linear_fwd", CUBLAS_OP_T, CUBLAS_OP_N, d.N, d.M, d.K, w, d.K, x, d.K, 0.0f, y, d.N);
  }
  void linear_bwd_input(V dy, V w, O dx, bool accumulate) override {
    Check c("linear_bwd_input", this);
    const auto d = ct::linear_bwd_input(c, dy, w, dx);
    // dx[M,K] = dy[M,N] w[N,K]: column-major dx^T[K,M] = w^T[K,N] dy^T[N,M]
    product("linear_bwd_input", CUBLAS_OP_N, CUBLAS_OP_N, d.K, d.M, d.N, w, d.K, dy, d.N, accumulate ? 1.0f : 0.0f,
            dx, d.K);
  }
  void linear_bwd_weight(V dy, V x, O dw) override {
    Check c("linear_bwd_weight", this);
    const auto d = ct::linear_bwd_weight(c, dy, x, dw);
    // dw[N,K] += dy[M,N]^T x[M,K]: column-major dw^T[K,N] += x^T[K,M] dy[M,N]; dw is f32
    product("linear_bwd_weight", CUBLAS_OP_N, CUBLAS_OP_T, d.K, d.N, d.M, x, d.K, dy, d.N, 1.0f, dw, d.K);
  }
  void rmsnorm_fwd(V x, V w, O y, O rstd, float eps) override {
    Check c("rmsnorm_fwd", this);
    const auto d = ct::rmsnorm_fwd(c, x, w, y, rstd);
    by_storage(c, [&]<class T>() { kc::rmsnorm_fwd(ptr<T>(x), ptr<T>(w), ptr<T>(y), f32(rstd), d.M, d.D, eps, current()); });
  }
  void rmsnorm_bwd(V dy, V x, V w, V rstd, O dx, O dw) override {
    Check c("rmsnorm_bwd", this);
    const auto d = ct::rmsnorm_bwd(c, dy, x, w, rstd, dx, dw);
    Tensor work = workspace(kc::rmsnorm_bwd_workspace_bytes(d.M, d.D));
    by_storage(c, [&]<class T>() {
      kc::rmsnorm_bwd(ptr<T>(dy), ptr<T>(x), ptr<T>(w), f32(rstd), ptr<T>(dx), f32(dw), d.M, d.D,
                      work.view().ptr, current());
    });
  }
  void rope_fwd(V x, O y, double theta) override {
    Check c("rope_fwd", this);
    ct::rope(c, "x", x, "y", y);
    by_storage(c, [&]<class T>() {
      kc::rope_fwd(ptr<T>(x), ptr<T>(y), x.shape[0], x.shape[1], x.shape[2], x.shape[3], theta, current());
    });
  }
  void rope_bwd(V dy, O dx, double theta) override {
    Check c("rope_bwd", this);
    ct::rope(c, "dy", dy, "dx", dx);
    by_storage(c, [&]<class T>() {
      kc::rope_bwd(ptr<T>(dy), ptr<T>(dx), dy.shape[0], dy.shape[1], dy.shape[2], dy.shape[3], theta, current());
    });
  }
  void silu_fwd(V x, O y) override {
    Check c("silu_fwd", this);
    const int64_t n = ct::silu_fwd(c, x, y);
    by_storage(c, [&]<class T>() { kc::silu_fwd(ptr<T>(x), ptr<T>(y), n, current()); });
  }
  void silu_bwd(V dy, V x, O dx) override {
    Check c("silu_bwd", this);
    const int64_t n = ct::silu_bwd(c, dy, x, dx);
    by_storage(c, [&]<class T>() { kc::silu_bwd(ptr<T>(dy), ptr<T>(x), ptr<T>(dx), n, current()); });
  }
  void swiglu_fwd(V gate, V up, O h) override {
    Check c("swiglu_fwd", this);
    const int64_t n = ct::swiglu_fwd(c, gate, up, h);
    by_storage(c, [&]<class T>() { kc::swiglu_fwd(ptr<T>(gate), ptr<T>(up), ptr<T>(h), n, current()); });
  }
  void swiglu_bwd(V dh, V gate, V up, O dgate, O dup) override {
    Check c("swiglu_bwd", this);
    const int64_t n = ct::swiglu_bwd(c, dh, gate, up, dgate, dup);
    by_storage(c, [&]<class T>() {
      kc::swiglu_bwd(ptr<T>(dh), ptr<T>(gate), ptr<T>(up), ptr<T>(dgate), ptr<T>(dup), n, current());
    });
  }
  void gather_cols(V src, int64_t col, O dst) override {
    Check c("gather_cols", this);
    const auto d = ct::gather_cols(c, src, col, dst);
    by_storage(c, [&]<class T>() { kc::gather_cols(ptr<T>(src), d.S, col, ptr<T>(dst), d.n, d.M, current()); });
  }
  void scatter_cols(V src, O dst, int64_t col) override {
    Check c("scatter_cols", this);
    const auto d = ct::scatter_cols(c, src, dst, col);
    by_storage(c, [&]<class T>() { kc::scatter_cols(ptr<T>(src), d.n, ptr<T>(dst), d.S, col, d.M, current()); });
  }
  void add_inplace(O y, V x) override {
    Check c("add_inplace", this);
    const int64_t n = ct::add_inplace(c, y, x);
    by_storage(c, [&]<class T>() { kc::add_inplace(ptr<T>(y), ptr<T>(x), n, current()); });
  }
  void convert(V src, O dst) override {
    Check c("convert", this);
    const int64_t n = ct::convert(c, src, dst);
    if (src.dtype == dst.dtype)
      copy(dst.ptr, src.ptr, static_cast<size_t>(n) * dtype_size(src.dtype));
    else if (dst.dtype == DType::DTYPE_BF16)
      kc::convert(f32(src), ptr<bf16>(dst), n, current());
    else
      kc::convert(ptr<bf16>(src), f32(dst), n, current());
  }
  void adamw_update(O p, V g, O m, O v, const AdamWStep& st) override {
    Check c("adamw_update", this);
    const int64_t n = ct::adamw_update(c, p, g, m, v, st);
    kc::adamw_update(f32(p), f32(g), f32(m), f32(v), n, st.lr, st.beta1, st.beta2, st.eps, st.weight_decay,
                     st.t, st.decay, st.grad_scale, current());
  }
  double sum_squares(V x) override {
    Check c("sum_squares", this);
    const int64_t n = ct::sum_squares(c, x);
    Tensor work = workspace(kc::sum_squares_workspace_bytes(n));
    by_storage(c, [&]<class T>() { kc::sum_squares(ptr<T>(x), n, scalar_, work.view().ptr, current()); });
    return read_scalar();
  }
  void gated_rmsnorm_fwd(V y, V z, V w, O out, O rstd, float eps) override {
    Check c("gated_rmsnorm_fwd", this);
    const auto d = ct::gated_rmsnorm_fwd(c, y, z, w, out, rstd);
    by_storage(c, [&]<class T>() {
      kc::gated_rmsnorm_fwd(ptr<T>(y), ptr<T>(z), ptr<T>(w), ptr<T>(out), f32(rstd), d.M, d.D, d.G, eps, current());
    });
  }
  void gated_rmsnorm_bwd(V dout, V y, V z, V w, V rstd, O dy, O dz, O dw) override {
    Check c("gated_rmsnorm_bwd", this);
    const auto d = ct::gated_rmsnorm_bwd(c, dout, y, z, w, rstd, dy, dz, dw);
    Tensor work = workspace(kc::gated_rmsnorm_bwd_workspace_bytes(d.M, d.D));
    by_storage(c, [&]<class T>() {
      kc::gated_rmsnorm_bwd(ptr<T>(dout), ptr<T>(y), ptr<T>(z), ptr<T>(w), f32(rstd), ptr<T>(dy), ptr<T>(dz),
                            f32(dw), d.M, d.D, d.G, work.view().ptr, current());
    });
  }
  void attention_fwd(V q, V k, V v, O out, O lse) override {
    Check c("attention_fwd", this);
    const auto [B, T, H, KV, hd] = ct::attention_fwd(c, q, k, v, out, lse);
    by_storage(c, [&]<class S>() {
      kc::attention_fwd(ptr<S>(q), ptr<S>(k), ptr<S>(v), ptr<S>(out), f32(lse), B, T, H, KV, hd, current());
    });
  }
  void attention_bwd(V dout, V q, V k, V v, V out, V lse, O dq, O dk, O dv) override {
    Check c("attention_bwd", this);
    const auto [B, T, H, KV, hd] = ct::attention_bwd(c, dout, q, k, v, out, lse, dq, dk, dv);
    Tensor work = workspace(kc::attention_bwd_workspace_bytes(B, T, H));
    by_storage(c, [&]<class S>() {
      kc::attention_bwd(ptr<S>(dout), ptr<S>(q), ptr<S>(k), ptr<S>(v), ptr<S>(out), f32(lse), ptr<S>(dq),
                        ptr<S>(dk), ptr<S>(dv), B, T, H, KV, hd, work.view().ptr, current());
    });
  }
  void conv1d_fwd(V x, V w, V bias, O y) override {
    Check c("conv1d_fwd", this);
    const auto d = ct::conv1d_fwd(c, x, w, bias, y);
    by_storage(c, [&]<class T>() {
      kc::conv1d_fwd(ptr<T>(x), ptr<T>(w), ptr<T>(bias), ptr<T>(y), d.B, d.T, d.C, d.K, current());
    });
  }
  void conv1d_bwd(V dy, V x, V w, O dx, O dw, O dbias) override {
    Check c("conv1d_bwd", this);
    const auto d = ct::conv1d_bwd(c, dy, x, w, dx, dw, dbias);
    Tensor work = workspace(kc::conv1d_bwd_workspace_bytes(d.B, d.T, d.C, d.K));
    by_storage(c, [&]<class T>() {
      kc::conv1d_bwd(ptr<T>(dy), ptr<T>(x), ptr<T>(w), ptr<T>(dx), f32(dw), f32(dbias), d.B, d.T, d.C, d.K,
                     work.view().ptr, current());
    });
  }
  void dt_softplus_fwd(V dt_raw, V dt_bias, O dt) override {
    Check c("dt_softplus_fwd", this);
    const auto [M, Hm] = ct::dt_softplus_fwd(c, dt_raw, dt_bias, dt);
    by_storage(c, [&]<class T>() { kc::dt_softplus_fwd(ptr<T>(dt_raw), f32(dt_bias), ptr<T>(dt), M, Hm, current()); });
  }
  void dt_softplus_bwd(V ddt, V dt_raw, V dt_bias, O ddt_raw, O ddt_bias) override {
    Check c("dt_softplus_bwd", this);
    const auto [M, Hm] = ct::dt_softplus_bwd(c, ddt, dt_raw, dt_bias, ddt_raw, ddt_bias);
    Tensor work = workspace(kc::dt_softplus_bwd_workspace_bytes(M, Hm));
    by_storage(c, [&]<class T>() {
      kc::dt_softplus_bwd(ptr<T>(ddt), ptr<T>(dt_raw), f32(dt_bias), ptr<T>(ddt_raw), f32(ddt_bias), M, Hm,
                          work.view().ptr, current());
    });
  }
  double cross_entropy(V logits, V targets, O dlogits, float scale) override {
    Check c("cross_entropy", this);
    const auto [M, Vn] = ct::cross_entropy(c, logits, targets, dlogits);
    Tensor work = workspace(kc::cross_entropy_workspace_bytes(M));
    by_storage(c, [&]<class T>() {
      kc::cross_entropy(ptr<T>(logits), i32(targets), ptr<T>(dlogits), scalar_, M, Vn, scale, work.view().ptr,
                        current());
    });
    return read_scalar();
  }
  void row_max(V x, O out) override {
    Check c("row_max", this);
    const auto [M, N] = ct::row_max(c, x, out);
    by_storage(c, [&]<class T>() { kc::row_max(ptr<T>(x), f32(out), M, N, current()); });
  }
  void vocab_ce_partials(V logits, V row_max, V targets, int64_t vocab_offset, O exps, O sums) override {
    Check c("vocab_ce_partials", this);
    const auto [M, Vn] = ct::vocab_ce_partials(c, logits, row_max, targets, exps, sums);
    by_storage(c, [&]<class T>() {
      kc::vocab_ce_partials(ptr<T>(logits), f32(row_max), i32(targets), vocab_offset, ptr<T>(exps), f32(sums), M,
                            Vn, current());
    });
  }
  double vocab_ce_finish(V sums, V row_max, V targets, int64_t vocab_offset, O dlogits, float scale) override {
    Check c("vocab_ce_finish", this);
    const auto [M, Vn] = ct::vocab_ce_finish(c, sums, row_max, targets, dlogits);
    by_storage(c, [&]<class T>() {
      kc::vocab_ce_finish(f32(sums), f32(row_max), i32(targets), vocab_offset, ptr<T>(dlogits), scalar_, M, Vn,
                          scale, current());
    });
    return read_scalar();
  }
  void moe_route_fwd(V logits, O probs, O experts, O weights) override {
    Check c("moe_route_fwd", this);
    const auto [M, E, K] = ct::moe_route_fwd(c, logits, probs, experts, weights);
    kc::moe_route_fwd(f32(logits), f32(probs), i32(experts), f32(weights), M, E, K, current());
  }
  void moe_route_bwd(V dweights, V dprobs, V probs, V experts, V weights, O dlogits) override {
    Check c("moe_route_bwd", this);
    const auto [M, E, K] = ct::moe_route_bwd(c, dweights, dprobs, probs, experts, weights, dlogits);
    kc::moe_route_bwd(f32(dweights), f32(dprobs), f32(probs), i32(experts), f32(weights), f32(dlogits), M, E, K,
                      current());
  }
  double moe_balance(V probs, V experts, int64_t seq, O dprobs, float scale) override {
    Check c("moe_balance", this);
    const auto [M, E, K] = ct::moe_balance(c, probs, experts, seq, dprobs);
    Tensor work = workspace(kc::moe_balance_workspace_bytes(M, seq));
    kc::moe_balance(f32(probs), i32(experts), f32(dprobs), scalar_, M, E, K, seq, scale, work.view().ptr,
                    current());
    return read_scalar();
  }
  void moe_permute_index(V experts, O counts, O rows, O pos) override {
    Check c("moe_permute_index", this);
    const auto [M, E, K] = ct::moe_permute_index(c, experts, counts, rows, pos);
    Tensor work = workspace(kc::moe_permute_index_workspace_bytes(M, E, K));
    kc::moe_permute_index(i32(experts), i32(counts), i32(rows), i32(pos), M, E, K, work.view().ptr, current());
  }
  void gather_rows(V src, V rows, O dst) override {
    Check c("gather_rows", this);
    const auto [P, D] = ct::gather_rows(c, src, rows, dst);
    by_storage(c, [&]<class T>() { kc::gather_rows(ptr<T>(src), i32(rows), ptr<T>(dst), P, D, current()); });
  }
  void moe_combine(V y, V pos, V weights, O out) override {
    Check c("moe_combine", this);
    const auto [M, K, D] = ct::moe_combine(c, y, pos, weights, out);
    by_storage(c, [&]<class T>() {
      by_type(out.dtype, [&]<class U>() { kc::moe_combine(ptr<T>(y), i32(pos), f32(weights), ptr<U>(out), M, K, D, current()); });
    });
  }
  void moe_combine_bwd(V dout, V y, V pos, V weights, O dy, O dweights) override {
    Check c("moe_combine_bwd", this);
    const auto [M, K, D] = ct::moe_combine_bwd(c, dout, y, pos, weights, dy, dweights);
    by_storage(c, [&]<class T>() {
      kc::moe_combine_bwd(ptr<T>(dout), ptr<T>(y), i32(pos), f32(weights), ptr<T>(dy), f32(dweights), M, K, D,
                          current());
    });
  }
  void moe_dispatch_bwd(V dxp, V pos, O dx) override {
    Check c("moe_dispatch_bwd", this);
    const auto [M, K, D] = ct::moe_dispatch_bwd(c, dxp, pos, dx);
    by_storage(c, [&]<class T>() {
      by_type(dx.dtype, [&]<class U>() { kc::moe_dispatch_bwd(ptr<T>(dxp), i32(pos), ptr<U>(dx), M, K, D, current()); });
    });
  }
  void embedding_fwd(V ids, V table, O out, int64_t vocab_offset) override {
    Check c("embedding_fwd", this);
    const auto [M, Vn, D] = ct::embedding_fwd(c, ids, table, out);
    // The rows out in the storage type, the table in it or in bf16 (a unit's compute copy).
    if (table.dtype != c.storage())
      kc::embedding_fwd(i32(ids), ptr<bf16>(table), f32(out), M, D, Vn, vocab_offset, current());
    else
      by_storage(c, [&]<class T>() {
        kc::embedding_fwd(i32(ids), ptr<T>(table), ptr<T>(out), M, D, Vn, vocab_offset, current());
      });
  }
  void embedding_bwd(V ids, V dout, O dtable, int64_t vocab_offset) override {
    Check c("embedding_bwd", this);
    const auto [M, Vn, D] = ct::embedding_bwd(c, ids, dout, dtable);
    Tensor work = workspace(kc::embedding_bwd_workspace_bytes(M, Vn));
    by_storage(c, [&]<class T>() {
      kc::embedding_bwd(i32(ids), ptr<T>(dout), f32(dtable), M, D, Vn, vocab_offset, work.view().ptr, current());
    });
  }
  void ssd_fwd(V x, V dt, V A_log, V Bm, V Cm, V D, O y, O saved, int64_t chunk) override {
    Check c("ssd_fwd", this);
    const auto s = ct::ssd_fwd(c, x, dt, A_log, Bm, Cm, D, y, saved, chunk, ssd_saved_numel(x.shape, Bm.shape, chunk));
    Tensor work = workspace(kc::ssd_fwd_workspace_bytes(s));
    by_storage(c, [&]<class T>() {
      kc::ssd_fwd(s, ptr<T>(x), ptr<T>(dt), f32(A_log), ptr<T>(Bm), ptr<T>(Cm), f32(D), ptr<T>(y), f32(saved),
                  work.view().ptr, current());
    });
  }
  void ssd_bwd(V dy, V x, V dt, V A_log, V Bm, V Cm, V D, V saved, O dx, O ddt, O dA_log, O dBm, O dCm, O dD,
               int64_t chunk) override {
    Check c("ssd_bwd", this);
    const auto s = ct::ssd_bwd(c, dy, x, dt, A_log, Bm, Cm, D, saved, dx, ddt, dA_log, dBm, dCm, dD, chunk,
                               ssd_saved_numel(x.shape, Bm.shape, chunk));
    Tensor work = workspace(kc::ssd_bwd_workspace_bytes(s));
    by_storage(c, [&]<class T>() {
      kc::ssd_bwd(s, ptr<T>(dy), ptr<T>(x), ptr<T>(dt), f32(A_log), ptr<T>(Bm), ptr<T>(Cm), f32(D), f32(saved),
                  ptr<T>(dx), ptr<T>(ddt), f32(dA_log), ptr<T>(dBm), ptr<T>(dCm), f32(dD), work.view().ptr,
                  current());
    });
  }

 private:
  struct Cached {
    void* ptr;
    std::vector<cudaEvent_t> freed;  // one per stream, recorded when the block was freed
  };

  cudaStream_t current() const { return streams_[static_cast<size_t>(stream_)]; }
  // Blocks, device and page-locked host ones, are cached in whole granules of kAlign bytes.
  static size_t rounded_size(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

  void release_host_cache() {
    for (auto& [size, blocks] : host_cache_)
      for (void* p : blocks) cudaFreeHost(p);
    host_cache_.clear();
  }

  // Scratch of `bytes` for one op, counted as buffers and given back when the op returns (the
  // cache's events keep it from being reused before the op's kernels are done).
  Tensor workspace(int64_t bytes) {
    return Tensor(*this, Shape{(bytes + 3) / 4}, MemCategory::MEM_BUFFERS);
  }

  // The double an op's kernels wrote into scalar_, once the current stream has reached it.
  double read_scalar() {
    PIPER_CUDA_CHECK(cudaMemcpyAsync(host_scalar_, scalar_, sizeof(double), cudaMemcpyDeviceToHost, current()));
    PIPER_CUDA_CHECK(cudaStreamSynchronize(current()));
    return *host_scalar_;
  }

  // Column-major C = op(A) op(B) + beta C of a product op, whatever mix of f32 and bf16 its tensors are:
  // A and B enter cuBLAS in one type, bf16 for bf16 products or where both are bf16, else f32 (a bf16
  // operand widened, exactly), converted into scratch where they differ; f32 accumulation; an f32 product
  // into a bf16 C, a type pair cuBLAS lacks, goes through f32 scratch (C widened first to accumulate) and
  // is rounded once.
  void product(const char* op, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
               ConstTensorView A, int64_t lda, ConstTensorView B, int64_t ldb, float beta, TensorView C, int64_t ldc) {
    const bool bf16_in = matmul_ == MatmulPrecision::MATMUL_BF16 ||
                         (A.dtype == DType::DTYPE_BF16 && B.dtype == DType::DTYPE_BF16);
    const DType in = bf16_in ? DType::DTYPE_BF16 : DType::DTYPE_F32;
    Tensor a, b, c;
    if (A.dtype != in) {
      a = backend::converted(A, in, MemCategory::MEM_BUFFERS);
      A = a.view();
    }
    if (B.dtype != in) {
      b = backend::converted(B, in, MemCategory::MEM_BUFFERS);
      B = b.view();
    }
    if (in == DType::DTYPE_F32 && C.dtype == DType::DTYPE_BF16) {
      c = beta != 0.0f ? backend::converted(C, DType::DTYPE_F32, MemCategory::MEM_BUFFERS)
                       : Tensor(*this, C.shape, MemCategory::MEM_BUFFERS);
      gemm(op, ta, tb, m, n, k, A.ptr, lda, B.ptr, ldb, beta, c.view().ptr, ldc, in, DType::DTYPE_F32);
      kc::convert(c.data(), static_cast<bf16*>(C.ptr), C.numel(), current());
      return;
    }
    gemm(op, ta, tb, m, n, k, A.ptr, lda, B.ptr, ldb, beta, C.ptr, ldc, in, C.dtype);
  }

  // f32 accumulation; f32 inputs rounded to TF32 when asked (bf16 inputs are bf16 either way).
  cublasComputeType_t compute_type(DType in) const {
    return in == DType::DTYPE_F32 && matmul_ == MatmulPrecision::MATMUL_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                             : CUBLAS_COMPUTE_32F;
  }

  // Column-major C[m,n] = alpha op(A) op(B) + beta C with f32 accumulation; A and B of `in`, C of `out`.
  void gemm(const char* op, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
            const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc, DType in,
            DType out) {
    if (m == 0 || n == 0) return;
    const float alpha = 1.0f;
    check_cublas(cublasSetStream(blas_, current()), "cublasSetStream");
    void*& work = blas_work_[static_cast<size_t>(stream_)];
    if (!work) work = allocate(kBlasWorkspace, MemCategory::MEM_BUFFERS);
    // after cublasSetStream, which gives the handle cuBLAS's own workspace back
    check_cublas(cublasSetWorkspace(blas_, work, kBlasWorkspace), "cublasSetWorkspace");
    // k = 0 makes C = beta C; cuBLAS still wants every leading dimension at least 1.
    const auto ld = [&](int64_t v) { return gemm_extent(std::max<int64_t>(v, 1), op); };
    check_cublas(cublasGemmEx(blas_, ta, tb, gemm_extent(m, op), gemm_extent(n, op), gemm_extent(k, op), &alpha,
                              A, cuda_type(in), ld(lda), B, cuda_type(in), ld(ldb),
                              &beta, C, cuda_type(out), ld(ldc), compute_type(in),
                              CUBLAS_GEMM_DEFAULT),
                 op);
  }

  void* device_malloc(size_t bytes, MemCategory c) {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation && cached_bytes_ > 0) {
      cudaGetLastError();  // clear it, give the cache back, try once more
      release_cached();
      e = cudaMalloc(&p, bytes);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw std::runtime_error("backend cuda: device " + std::to_string(device_) + " could not allocate " +
                               std::to_string(bytes) + " bytes of " + mem_category_name(c) + " (" +
                               cudaGetErrorString(e) + "; " + std::to_string(stats_.total_current) +
                               " bytes in use by piper, " + std::to_string(free_b) + " of " +
                               std::to_string(total_b) + " free on the device)");
    }
    return p;
  }

  void check_stream(const char* what, int stream) const {
    if (stream < 0 || stream >= kStreams)
      throw std::invalid_argument(std::string("backend cuda: ") + what + " on stream " + std::to_string(stream) +
                                  "; the cuda backend has streams 0.." + std::to_string(kStreams - 1));
  }

  int device_;
  std::array<cudaStream_t, kStreams> streams_{};
  std::array<cudaEvent_t, kEventRing> ring_{};
  std::vector<cudaEvent_t> free_events_;
  cublasHandle_t blas_ = nullptr;
  std::array<void*, kStreams> blas_work_{};  // each stream's cuBLAS workspace, kBlasWorkspace bytes
  double* scalar_ = nullptr;       // device: the double an op returns
  double* host_scalar_ = nullptr;  // pinned host copy of it
  int stream_ = 0;
  uint64_t events_ = 0;
  MatmulPrecision matmul_ = MatmulPrecision::MATMUL_FP32;
  std::mutex host_mutex_;
  std::map<size_t, std::vector<void*>> host_cache_;  // free page-locked host buffers by rounded size
  MemoryStats stats_;
  std::map<size_t, std::vector<Cached>> cache_;
  size_t cached_bytes_ = 0;
};

// This process's index among the ranks of its node, as the launchers say it (Open MPI, Slurm,
// torchrun's convention), 0 without one: ranks of a node take its GPUs in turn.
int local_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"})
    if (const char* v = std::getenv(var)) return std::max(0, std::atoi(v));
  return 0;
}
}  // namespace

void set_cuda_environment() {
  // Hardware queues for the backend's streams and the communicator's lanes, so a kernel of one waits
  // behind another only where the streams say so (CUDA's default is 8). A user's setting stands.
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
}

Backend* cuda(std::string* why) {
  static std::once_flag once;
  // Never destroyed: the CUDA runtime tears itself down at exit before a static's destructor would
  // run (it starts after the static is made), and a cuBLAS handle destroyed then can crash. The
  // process's exit returns the device memory.
  static CudaBackend* backend = nullptr;
  static std::string reason;
  std::call_once(once, [] {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      cudaGetLastError();
      reason = std::string("no CUDA device: cudaGetDeviceCount says ") + cudaGetErrorName(e) + " (" +
               cudaGetErrorString(e) + ")";
      return;
    }
    if (count == 0) {
      reason = "no CUDA device: cudaGetDeviceCount found 0";
      return;
    }
    const int device = local_rank() % count;
    try {
      backend = new CudaBackend(device);
    } catch (const std::exception& failed) {
      reason = "the CUDA backend did not start on device " + std::to_string(device) + " of " +
               std::to_string(count) + ": " + failed.what();
    }
  });
  if (!backend && why) *why = reason;
  return backend;
}

}  // namespace piper::backend
