// cuda_runtime.h — the CUDA runtime as piper's CUDA backend and kernels use it, on an emulated
// device: the host compiler builds kernels/*.cu (translated by translate.cmake: a launch
// `k<<<g, b, smem, s>>>(args)` becomes `Launch(g, b, smem, s).run("k", k, args)`) and
// src/backend/cuda/ against this header, and the emulator (emulator.cpp) plays the kernels on
// the CPU, one fiber per CUDA thread (docs/testing.md, "The emulated GPU").
//
// Only what piper calls is here, with CUDA's semantics where a test could tell them apart:
// streams run their work in order and apart from each other (an emulated stream's work waits
// until something synchronises or waits on it, and the emulator interleaves the streams at
// random), events order streams, page-locked host memory is copied asynchronously and pageable
// memory synchronously, a kernel's launch is checked as the driver checks it, device memory is
// filled with NaNs when allocated and freed. A kernel's fault (a barrier not every thread
// reaches, a shuffle from a lane that has returned, a pointer argument outside device memory)
// stops the process with the kernel's name, the block and the threads.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static  // one block runs at a time, so a static is its block's shared memory
#define __align__(n) __attribute__((aligned(n)))

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventDisableTiming 0x02

struct CUstream_st;
struct CUevent_st;
typedef CUstream_st* cudaStream_t;
typedef CUevent_st* cudaEvent_t;

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaDeviceGetPCIBusId(char* bus, int length, int device);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);

cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);

cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocHost(void** p, size_t bytes);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s = nullptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t bytes);

template <class T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
template <class T>
cudaError_t cudaMallocHost(T** p, size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(p), bytes);
}

namespace piper::cuda_emulator {

// Where the calling emulated thread is: CUDA's built-in variables.
struct Place {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
};
// Initial-exec: the emulator is linked into executables only, and each read of threadIdx is then a
// register-relative load, not a call through __tls_get_addr (which AddressSanitizer intercepts).
extern thread_local const Place* current_place __attribute__((tls_model("initial-exec")));

// The calling block's dynamic shared memory (the launch's third argument), as T.
void* dynamic_shared_bytes();
template <class T>
T* dynamic_shared() {
  return static_cast<T*>(dynamic_shared_bytes());
}

// Barriers of the calling thread's block and warp; each returns once every thread they name
// has reached it.
void sync_block();
int sync_block_or(int predicate);
uint64_t shuffle_xor(unsigned mask, uint64_t bits, int lane_mask, int width);
// A warp-wide operation (mma.h's wmma calls): every lane of the calling warp calls warp_collective
// with the same operation and its own argument; once all 32 have, the operation runs once with the
// lanes' arguments in lane order and returns what is wrong with the call ("" when nothing is; the
// emulator then faults, naming the kernel, the block and the warp).
using WarpCollective = std::string (*)(void* const* lanes);
void warp_collective(WarpCollective operation, void* arg);

cudaError_t set_function_attribute(const void* function, cudaFuncAttribute attribute, int value);
// Stops the process: a launch's pointer argument outside device and page-locked memory.
void check_argument(const char* kernel, int index, const void* p);

// One kernel launch: checks its configuration as the driver does (a bad one leaves
// cudaErrorInvalidConfiguration for cudaGetLastError) and queues it on its stream.
class Launch {
 public:
  Launch(dim3 grid, dim3 block, size_t shared_bytes = 0, cudaStream_t stream = nullptr)
      : grid_(grid), block_(block), shared_(shared_bytes), stream_(stream) {}

  template <class... P, class... A>
  void run(const char* name, void (*kernel)(P...), A&&... args) {
    static_assert(sizeof...(P) == sizeof...(A), "a kernel launch passes one argument per parameter");
    std::tuple<std::decay_t<P>...> bound(static_cast<std::decay_t<P>>(std::forward<A>(args))...);
    check_pointers(name, bound, std::index_sequence_for<P...>{});
    submit(name, reinterpret_cast<const void*>(kernel), [kernel, bound] { std::apply(kernel, bound); });
  }

 private:
  template <class Tuple, size_t... I>
  static void check_pointers(const char* name, const Tuple& t, std::index_sequence<I...>) {
    (check_one(name, static_cast<int>(I), std::get<I>(t)), ...);
  }
  template <class V>
  static void check_one(const char* name, int index, const V& v) {
    if constexpr (std::is_pointer_v<V>) check_argument(name, index, static_cast<const void*>(v));
  }
  void submit(const char* name, const void* function, std::function<void()> body);

  dim3 grid_, block_;
  size_t shared_;
  cudaStream_t stream_;
};

// Runs `work` on stream s in its turn (the cuBLAS and cub emulations queue their work here).
// `what` names the work in a fault's report.
cudaError_t enqueue(cudaStream_t s, const char* what, std::function<void()> work);
// Queues on s an operation played in steps (the emulated NCCL's): step() runs whenever s may run it
// and returns true once the operation is done; until then s waits at it and the other streams go on.
void enqueue_steps(cudaStream_t s, std::string what, std::function<bool()> step);
// Runs queued work as far as it goes without waiting: what the device does while the host polls it.
void poll_device();
// Whether [p, p + bytes) lies inside one device allocation (nullptr with bytes 0 does).
bool is_device_range(const void* p, size_t bytes);

}  // namespace piper::cuda_emulator

template <class F>
cudaError_t cudaFuncSetAttribute(F* function, cudaFuncAttribute attribute, int value) {
  return ::piper::cuda_emulator::set_function_attribute(reinterpret_cast<const void*>(function), attribute, value);
}

#define threadIdx (::piper::cuda_emulator::current_place->thread)
#define blockIdx (::piper::cuda_emulator::current_place->block)
#define blockDim (::piper::cuda_emulator::current_place->block_dim)
#define gridDim (::piper::cuda_emulator::current_place->grid_dim)

inline void __syncthreads() { ::piper::cuda_emulator::sync_block(); }
inline int __syncthreads_or(int predicate) { return ::piper::cuda_emulator::sync_block_or(predicate); }

template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(uint64_t), "a shuffled value is a word");
  uint64_t bits = 0;
  __builtin_memcpy(&bits, &v, sizeof(T));
  bits = ::piper::cuda_emulator::shuffle_xor(mask, bits, lane_mask, width);
  __builtin_memcpy(&v, &bits, sizeof(T));
  return v;
}

// Integer atomics: a block's threads run one at a time between barriers, so a plain update is atomic.
template <class T>
T atomicAdd(T* address, T value) {
  static_assert(std::is_integral_v<T>, "piper's kernels add floats in a fixed order, never atomically");
  const T old = *address;
  *address = old + value;
  return old;
}

// The device functions of CUDA's math library that the host's lacks, at f32 precision (a GPU's
// intrinsics __expf and rsqrtf are approximations within a few ulp of these).
inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
using std::isnan;
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
