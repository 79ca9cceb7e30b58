// backend.hpp — the narrow device interface: memory, copies and streams.
// The CPU backend implements it here; the CUDA backend implements the same
// table. Knows nothing of ranks or models.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace piper::backend {

constexpr int kBackendVersion = 1;

enum class DeviceKind : uint8_t { DEVICE_CPU, DEVICE_CUDA };

// What a buffer holds, for per-category memory accounting.
enum class MemCategory : uint8_t {
  MEM_PARAMS,
  MEM_GRADS,
  MEM_OPTIMIZER,
  MEM_ACTIVATIONS,
  MEM_BUFFERS,  // communication and scratch
};
constexpr int kMemCategoryCount = 5;
const char* mem_category_name(MemCategory c);

struct MemoryStats {
  std::array<int64_t, kMemCategoryCount> current{};
  std::array<int64_t, kMemCategoryCount> peak{};  // per category
  int64_t total_current = 0;
  int64_t total_peak = 0;  // of the sum
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind kind() const = 0;
  virtual const char* name() const = 0;
  // Device memory, 64-byte aligned, uninitialised. Freed blocks may be kept
  // for reuse; memory() counts only blocks in use.
  virtual void* allocate(size_t bytes, MemCategory category) = 0;
  virtual void deallocate(void* p, size_t bytes, MemCategory category) = 0;
  // Returns cached free blocks to the system.
  virtual void release_cached() = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  // Logical streams; the CPU runs everything in order on stream 0.
  virtual int stream_count() const = 0;
  virtual void synchronize(int stream) = 0;
  virtual MemoryStats memory() const = 0;
  virtual void reset_peak() = 0;
};

// The process-wide CPU backend.
Backend& cpu();

// A float buffer on a backend, released when it goes out of scope.
class Tensor {
 public:
  Tensor() = default;
  // Uninitialised storage for numel floats.
  Tensor(Backend& b, int64_t numel, MemCategory category);
  ~Tensor();
  Tensor(Tensor&& o) noexcept;
  Tensor& operator=(Tensor&& o) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  int64_t numel() const { return numel_; }
  bool empty() const { return numel_ == 0; }
  void zero();

 private:
  void release();
  Backend* backend_ = nullptr;
  float* data_ = nullptr;
  int64_t numel_ = 0;
  MemCategory category_ = MemCategory::MEM_BUFFERS;
};

}  // namespace piper::backend
