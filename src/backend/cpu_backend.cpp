// cpu_backend.cpp — the CPU implementation of the backend interface.
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <vector>

#include "backend/backend.hpp"

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

namespace {

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
  void fill_zero(void* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
  int stream_count() const override { return 1; }
  void synchronize(int) override {}
  MemoryStats memory() const override { return stats_; }
  void reset_peak() override {
    stats_.peak = stats_.current;
    stats_.total_peak = stats_.total_current;
  }

 private:
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
};

}  // namespace

Backend& cpu() {
  static CpuBackend backend;
  return backend;
}

Tensor::Tensor(Backend& b, int64_t numel, MemCategory category)
    : backend_(&b), numel_(numel), category_(category) {
  data_ = static_cast<float*>(b.allocate(static_cast<size_t>(numel) * sizeof(float), category));
}

Tensor::~Tensor() { release(); }

Tensor::Tensor(Tensor&& o) noexcept
    : backend_(o.backend_), data_(o.data_), numel_(o.numel_), category_(o.category_) {
  o.data_ = nullptr;
  o.numel_ = 0;
}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    release();
    backend_ = o.backend_;
    data_ = o.data_;
    numel_ = o.numel_;
    category_ = o.category_;
    o.data_ = nullptr;
    o.numel_ = 0;
  }
  return *this;
}

void Tensor::release() {
  if (data_ && backend_)
    backend_->deallocate(data_, static_cast<size_t>(numel_) * sizeof(float), category_);
  data_ = nullptr;
  numel_ = 0;
}

void Tensor::zero() {
  if (data_) backend_->fill_zero(data_, static_cast<size_t>(numel_) * sizeof(float));
}

}  // namespace piper::backend
