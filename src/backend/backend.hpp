// backend.hpp — the device interface: memory, copies, streams and events, and the
// op table (every op the model and the optimiser compute, forward and backward).
// The CPU backend implements it with the kernels of kernels/; a GPU backend
// implements the same table. Knows nothing of ranks or models.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace piper::backend {

constexpr int kBackendVersion = 2;

enum class DeviceKind : uint8_t { DEVICE_CPU, DEVICE_CUDA };

// What a buffer holds, for per-category memory accounting.
enum class MemCategory : uint8_t {
  MEM_PARAMS,
  MEM_GRADS,
  MEM_OPTIMIZER,
  MEM_ACTIVATIONS,
  MEM_BUFFERS,  // communication, scratch and kernel workspaces
};
constexpr int kMemCategoryCount = 5;
const char* mem_category_name(MemCategory c);

// How f32 matrix products (linear_*) compute: in f32 throughout; with their inputs rounded to TF32
// (10-bit mantissa) where the device has TF32 units (NVIDIA Ampere and later; the CPU has none and
// computes f32); or with their inputs rounded to bf16 (8-bit mantissa) on every device, the rate of a
// GPU's bf16 tensor cores. Accumulation and outputs are f32 in all three (gradients too). bf16
// storage is unaffected.
enum class MatmulPrecision : uint8_t { MATMUL_FP32, MATMUL_TF32, MATMUL_BF16 };

// Storage type of a tensor's elements. Float ops accumulate in
// accumulation_dtype(storage): bf16 storage computes in fp32.
enum class DType : uint8_t { DTYPE_F32, DTYPE_BF16, DTYPE_I32 };
const char* dtype_name(DType t);
size_t dtype_size(DType t);
DType accumulation_dtype(DType storage);

struct MemoryStats {
  std::array<int64_t, kMemCategoryCount> current{};
  std::array<int64_t, kMemCategoryCount> peak{};  // per category
  int64_t total_current = 0;
  int64_t total_peak = 0;  // of the sum

  // `delta` bytes of category c allocated (> 0) or freed (< 0); the peaks follow.
  void add(MemCategory c, int64_t delta) {
    const auto i = static_cast<size_t>(c);
    current[i] += delta;
    total_current += delta;
    if (current[i] > peak[i]) peak[i] = current[i];
    if (total_current > total_peak) total_peak = total_current;
  }
  // The peaks start again from what is held now.
  void reset_peak() {
    peak = current;
    total_peak = total_current;
  }
};

// Row-major extents, outermost first; rank 0 is a scalar.
class Shape {
 public:
  static constexpr int kMaxRank = 5;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dim_[static_cast<size_t>(i)]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;  // "[2,3,4]"

 private:
  std::array<int64_t, kMaxRank> dim_{};
  int rank_ = 0;
};

class Backend;

// A tensor's storage as an op sees it: the device that owns it, the element
// type, the shape and the data (contiguous, row-major). Views own nothing.
struct TensorView {
  Backend* device = nullptr;
  DType dtype = DType::DTYPE_F32;
  Shape shape;
  void* ptr = nullptr;
  int64_t numel() const { return shape.numel(); }
  float* f32() const { return static_cast<float*>(ptr); }
  int32_t* i32() const { return static_cast<int32_t*>(ptr); }
};
struct ConstTensorView {
  Backend* device = nullptr;
  DType dtype = DType::DTYPE_F32;
  Shape shape;
  const void* ptr = nullptr;
  ConstTensorView() = default;
  ConstTensorView(Backend* d, DType t, Shape s, const void* p) : device(d), dtype(t), shape(s), ptr(p) {}
  ConstTensorView(const TensorView& v)  // NOLINT: a view converts to its read-only form
      : device(v.device), dtype(v.dtype), shape(v.shape), ptr(v.ptr) {}
  int64_t numel() const { return shape.numel(); }
  const float* f32() const { return static_cast<const float*>(ptr); }
  const int32_t* i32() const { return static_cast<const int32_t*>(ptr); }
};

// Views of memory `b` allocated (parameters, activations handed in by the runtime).
TensorView view(Backend& b, float* p, Shape s);
ConstTensorView view(Backend& b, const float* p, Shape s);
ConstTensorView view(Backend& b, const int32_t* p, Shape s);

// One AdamW step (torch.optim.AdamW): t is the 1-based step count; decay turns
// weight decay on; the gradient is multiplied by grad_scale (clipping) first.
struct AdamWStep {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  int64_t t = 1;
  bool decay = true;
  float grad_scale = 1.0f;
};

// A point in a stream's work; waiting on it orders work across streams.
struct Event {
  int stream = 0;
  uint64_t seq = 0;
};

// The op table: X(name, return type, parameter list), V an input view and O
// an output view (Backend::V, Backend::O). Shapes use M rows, B batch, T
// sequence, D width; docs/backend.md states every op's contract. Gradients of
// inputs are overwritten, gradients of parameters accumulated.
#define PIPER_BACKEND_OPS(X)                                                                     \
  /* y[M,N] = x[M,K] @ w[N,K]^T */                                                               \
  X(linear_fwd, void, (V x, V w, O y))                                                           \
  /* dx[M,K] = dy[M,N] @ w[N,K], or += when accumulate */                                        \
  X(linear_bwd_input, void, (V dy, V w, O dx, bool accumulate))                                  \
  /* dw[N,K] += dy[M,N]^T @ x[M,K] */                                                            \
  X(linear_bwd_weight, void, (V dy, V x, O dw))                                                  \
  /* y[M,D] = x / rms(x) * w[D]; rstd[M] saved */                                                \
  X(rmsnorm_fwd, void, (V x, V w, O y, O rstd, float eps))                                       \
  X(rmsnorm_bwd, void, (V dy, V x, V w, V rstd, O dx, O dw))                                     \
  /* out[M,Di] = grouped_rmsnorm(y * silu(z)) * w[Di]; rstd[M,G] gives the G groups */           \
  X(gated_rmsnorm_fwd, void, (V y, V z, V w, O out, O rstd, float eps))                          \
  X(gated_rmsnorm_bwd, void, (V dout, V y, V z, V w, V rstd, O dy, O dz, O dw))                  \
  /* rotate-half RoPE of x[B,T,H,hd]; y may be x */                                              \
  X(rope_fwd, void, (V x, O y, double theta))                                                    \
  X(rope_bwd, void, (V dy, O dx, double theta))                                                  \
  /* causal GQA: q[B,T,H,hd], k, v[B,T,KV,hd] -> out[B,T,H,hd], lse[B,H,T] */                    \
  X(attention_fwd, void, (V q, V k, V v, O out, O lse))                                          \
  X(attention_bwd, void, (V dout, V q, V k, V v, V out, V lse, O dq, O dk, O dv))                \
  /* causal depthwise conv: x[B,T,C], w[C,K], bias[C] -> y[B,T,C] */                             \
  X(conv1d_fwd, void, (V x, V w, V bias, O y))                                                   \
  X(conv1d_bwd, void, (V dy, V x, V w, O dx, O dw, O dbias))                                     \
  /* Mamba-2 scan: x[B,T,Hm,P], dt[B,T,Hm], A_log, D[Hm], Bm, Cm[B,T,G,N] -> y[B,T,Hm,P];  */    \
  /* saved[ssd_saved_numel] is the state the backward needs */                                   \
  X(ssd_fwd, void, (V x, V dt, V A_log, V Bm, V Cm, V D, O y, O saved, int64_t chunk))           \
  X(ssd_bwd, void,                                                                               \
    (V dy, V x, V dt, V A_log, V Bm, V Cm, V D, V saved, O dx, O ddt, O dA_log, O dBm, O dCm,    \
     O dD, int64_t chunk))                                                                       \
  X(silu_fwd, void, (V x, O y))                                                                  \
  X(silu_bwd, void, (V dy, V x, O dx))                                                           \
  /* h = silu(gate) * up */                                                                      \
  X(swiglu_fwd, void, (V gate, V up, O h))                                                       \
  X(swiglu_bwd, void, (V dh, V gate, V up, O dgate, O dup))                                      \
  /* MoE router: probs[M,E] = softmax over each row of logits[M,E]; i32 experts[M,K]: the K */   \
  /* largest probs of each row in descending order (ties: lower expert index first);        */   \
  /* weights[M,K] = those probs / their sum                                                 */   \
  X(moe_route_fwd, void, (V logits, O probs, O experts, O weights))                              \
  /* dlogits[M,E] (overwritten) = the gradient through the renormalisation and the softmax */    \
  /* of dweights[M,K] plus dprobs[M,E] (the balance loss's gradient of probs, added before */    \
  /* the softmax backward)                                                                  */   \
  X(moe_route_bwd, void, (V dweights, V dprobs, V probs, V experts, V weights, O dlogits))       \
  /* Sequence-wise balance loss over M/seq sequences of seq rows each: for sequence s,      */   \
  /* f_e = (assignments of s's rows to e in experts[M,K]) / (seq*K), P_e = mean over s's    */   \
  /* rows of probs[:,e]; returns sum over sequences of E * sum_e f_e * P_e (as double);     */   \
  /* dprobs[M,E] (overwritten) = scale * E * f_e(s) / seq for every row of s                */   \
  X(moe_balance, double, (V probs, V experts, int64_t seq, O dprobs, float scale))               \
  /* Permutation into per-expert contiguous groups: counts[E] (i32) assignments per expert; */   \
  /* rows[P] (i32): the token row of each permuted row, expert-major, rows ascending within */   \
  /* an expert; pos[M,K] (i32): the permuted row of each (row, slot). (A stable counting    */   \
  /* sort.)                                                                                 */   \
  X(moe_permute_index, void, (V experts, O counts, O rows, O pos))                               \
  /* dst[P,D]: dst[p] = src[rows[p]] (src[N,D], any N; rows i32[P])                         */   \
  X(gather_rows, void, (V src, V rows, O dst))                                                   \
  /* out[M,D] (overwritten) = sum over k of weights[m,k] * y[pos[m,k]] (y[P,D], pos i32[M,K]) */ \
  /* out of any float type: bf16 rows combine into an f32 output, summed in double          */   \
  X(moe_combine, void, (V y, V pos, V weights, O out))                                           \
  /* dy[P,D] (overwritten): dy[pos[m,k]] = weights[m,k] * dout[m];                          */   \
  /* dweights[M,K] (overwritten) = dot(dout[m], y[pos[m,k]])                                */   \
  X(moe_combine_bwd, void, (V dout, V y, V pos, V weights, O dy, O dweights))                    \
  /* dispatch backward: dx[M,D] += sum over k of dxp[pos[m,k]] (accumulated; dxp[P,D])      */   \
  /* dx of any float type, as moe_combine's out                                             */   \
  X(moe_dispatch_bwd, void, (V dxp, V pos, O dx))                                                \
  /* dt[M,Hm] = softplus(dt_raw + dt_bias[Hm]) */                                                \
  X(dt_softplus_fwd, void, (V dt_raw, V dt_bias, O dt))                                          \
  X(dt_softplus_bwd, void, (V ddt, V dt_raw, V dt_bias, O ddt_raw, O ddt_bias))                  \
  /* out[m] = table[ids[m] - offset] (i32 ids[M], table [V,D]); ids outside the table give 0 */  \
  X(embedding_fwd, void, (V ids, V table, O out, int64_t vocab_offset))                          \
  X(embedding_bwd, void, (V ids, V dout, O dtable, int64_t vocab_offset))                        \
  /* logits[M,V], i32 targets[M] -> loss sum; dlogits = (softmax - onehot) * scale */            \
  X(cross_entropy, double, (V logits, V targets, O dlogits, float scale))                        \
  /* out[M] = max over each row of x[M,N] */                                                     \
  X(row_max, void, (V x, O out))                                                                 \
  /* vocab-parallel loss, per shard [M,V] of the vocabulary at vocab_offset, given the    */     \
  /* group's row_max[M]: exps = exp(logits - max); sums[2,M] = (sum of exps | target logit) */   \
  X(vocab_ce_partials, void, (V logits, V row_max, V targets, int64_t vocab_offset, O exps, O sums)) \
  /* with the group's sums: exps -> dlogits in place; returns the loss sum */                    \
  X(vocab_ce_finish, double, (V sums, V row_max, V targets, int64_t vocab_offset, O dlogits, float scale)) \
  /* dst[M,n] = src[M,S][:, col:col+n] */                                                        \
  X(gather_cols, void, (V src, int64_t col, O dst))                                              \
  /* dst[M,S][:, col:col+n] = src[M,n] */                                                        \
  X(scatter_cols, void, (V src, O dst, int64_t col))                                             \
  /* y += x */                                                                                   \
  X(add_inplace, void, (O y, V x))                                                               \
  /* dst = src in dst's storage type (f32 <-> bf16 rounding to nearest even; alike: a copy) */   \
  X(convert, void, (V src, O dst))                                                               \
  X(adamw_update, void, (O p, V g, O m, O v, const AdamWStep& step))                             \
  /* sum of x^2 in double, independent of the thread count */                                    \
  X(sum_squares, double, (V x))

enum class Op : uint8_t {
#define PIPER_OP_ENUM(name, ret, params) OP_##name,
  PIPER_BACKEND_OPS(PIPER_OP_ENUM)
#undef PIPER_OP_ENUM
};
constexpr int kOpCount = 0
#define PIPER_OP_COUNT(name, ret, params) +1
    PIPER_BACKEND_OPS(PIPER_OP_COUNT)
#undef PIPER_OP_COUNT
    ;
const char* op_name(Op op);

class Backend {
 public:
  using V = ConstTensorView;
  using O = TensorView;
  virtual ~Backend() = default;
  virtual DeviceKind kind() const = 0;
  virtual const char* name() const = 0;
  // Whether host code may read and write this backend's memory through its pointers (the CPU
  // backend). Where not (a GPU, cpu_detached()), only the backend's ops and copies reach it, and
  // host code moves data with to_host / to_device.
  virtual bool host_addressable() const = 0;
  // Device memory, 64-byte aligned, uninitialised. Freed blocks may be kept
  // for reuse; memory() counts only blocks in use.
  virtual void* allocate(size_t bytes, MemCategory category) = 0;
  // Never throws: it runs in destructors, while an exception unwinds too.
  virtual void deallocate(void* p, size_t bytes, MemCategory category) noexcept = 0;
  // Returns cached free blocks to the system.
  virtual void release_cached() = 0;
  // Copies within device memory, and between host memory and the device.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void to_device(void* dst, const void* host, size_t bytes) = 0;
  virtual void to_host(void* host, const void* src, size_t bytes) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  // Host memory to stage copies to and from the device through: page-locked where that makes the
  // device's copies faster (a GPU's cudaMallocHost), plain on the CPU; 64-byte aligned, uninitialised,
  // cached by size like device blocks, and not counted in memory() (HostBuffer holds it).
  virtual void* allocate_host(size_t bytes) = 0;
  virtual void deallocate_host(void* p, size_t bytes) = 0;
  virtual MemoryStats memory() const = 0;
  virtual void reset_peak() = 0;

  // Streams: ops and copies go to the current stream and run in issue order
  // within it; events order work across streams.
  virtual int stream_count() const = 0;
  virtual void set_stream(int stream) = 0;
  virtual Event record(int stream) = 0;
  virtual void wait(int stream, Event e) = 0;  // later work on `stream` waits for e
  virtual void synchronize(int stream) = 0;    // the host waits for the stream
  // The platform's handle of the current stream, for a library that queues its own work on the
  // device in order with the backend's (NCCL): a cudaStream_t on CUDA, nullptr on the CPU.
  virtual void* native_stream() = 0;

  // Storage types the op table computes on (i32 index tensors always).
  virtual bool supports(DType storage) const = 0;
  // The head dims attention_fwd/attention_bwd take; empty where they take any even one.
  virtual std::vector<int64_t> attention_head_dims() const = 0;
  // The precision of f32 matrix products from now on (linear_*; MATMUL_FP32 to begin with).
  virtual void set_matmul_precision(MatmulPrecision p) = 0;
  // Elements of the state ssd_fwd saves for ssd_bwd.
  virtual int64_t ssd_saved_numel(const Shape& x, const Shape& Bm, int64_t chunk) const = 0;

#define PIPER_OP_VIRTUAL(name, ret, params) virtual ret name params = 0;
  PIPER_BACKEND_OPS(PIPER_OP_VIRTUAL)
#undef PIPER_OP_VIRTUAL
};

// The process-wide CPU backend.
Backend& cpu();
// The CPU backend with its memory out of the host's reach, as a GPU's is: its pointers carry a tag
// that makes any host access fault, and only its ops and copies remove it. The same kernels and so
// the same numbers as cpu(): running the runtime on it shows that nothing above the backend reads
// or writes device memory directly (docs/backend.md).
Backend& cpu_detached();
// The process-wide CUDA backend, made at the first call on the node's GPU local rank % GPUs (the
// local rank from OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or LOCAL_RANK, else 0); nullptr where
// there is none, and then `why` (when given) says why: a build without PIPER_CUDA, no CUDA device
// or driver, or a device that refused the backend's streams, events or cuBLAS handle.
Backend* cuda(std::string* why = nullptr);
// Sets what the CUDA runtime reads when it starts, where the environment leaves it unset: enough
// hardware queues for the backend's and the NCCL communicator's streams (CUDA_DEVICE_MAX_CONNECTIONS
// 32). A program's first statement, before MPI or any thread starts (setenv races with a thread's
// getenv); nothing in a build without CUDA.
void set_cuda_environment();
// Every backend this process can compute on, the CPU first: what the op runner tests.
std::vector<Backend*> registered_backends();

// Staging memory on the host for a backend (Backend::allocate_host), n floats, released when it goes
// out of scope.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(Backend& b, size_t n);
  ~HostBuffer();
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }

 private:
  void release();
  Backend* backend_ = nullptr;
  float* data_ = nullptr;
  size_t n_ = 0;
};

// A buffer on a backend, released when it goes out of scope.
class Tensor {
 public:
  Tensor() = default;
  // Uninitialised storage for numel f32 values, shape [numel].
  Tensor(Backend& b, int64_t numel, MemCategory category);
  // Uninitialised storage of `shape` elements of `dtype`.
  Tensor(Backend& b, Shape shape, MemCategory category, DType dtype = DType::DTYPE_F32);
  ~Tensor();
  Tensor(Tensor&& o) noexcept;
  Tensor& operator=(Tensor&& o) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  // The f32 data (a logic_error for other dtypes).
  float* data();
  const float* data() const;
  int64_t numel() const { return shape_.numel(); }
  bool empty() const { return numel() == 0; }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Backend* device() const { return backend_; }
  void zero();
  // The whole tensor, or the same storage seen with another shape of as many elements.
  TensorView view();
  ConstTensorView view() const;
  TensorView view(Shape s);
  ConstTensorView view(Shape s) const;
  // Elements [offset, offset + s.numel()) seen as s: a run of rows, in any storage type.
  TensorView part(int64_t offset, Shape s);
  ConstTensorView part(int64_t offset, Shape s) const;

 private:
  void release();
  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  Shape shape_{0};
  DType dtype_ = DType::DTYPE_F32;
  MemCategory category_ = MemCategory::MEM_BUFFERS;
};

// A new tensor of `category` on src's backend holding src in storage type `to` (its convert op).
Tensor converted(ConstTensorView src, DType to, MemCategory category);

}  // namespace piper::backend
