// emulator.cpp — the emulated CUDA device behind include/*.h: memory, streams, events, kernel
// launches played one block at a time with one fiber per CUDA thread, cuBLAS's GemmEx and cub's
// radix sort (docs/testing.md, "The emulated GPU").
//
// Streams: work is queued, not run, until the host synchronises or waits on it (or a stream's
// queue is long); then the emulator runs the queued work of all streams, choosing at random at
// each step among the streams whose next item may run (a wait on an event not yet reached may
// not), so work that two streams race for runs in either order from one run to the next.
//
// Threads: a block's threads run as fibers on the host thread, each up to its next barrier
// (__syncthreads, or a warp shuffle or wmma operation for its warp), in a random order each round;
// a barrier lets its threads on once every thread it names has reached it (a thread that has returned counts as
// arrived at __syncthreads; a shuffle that reads a returned lane is a fault). A round in which no
// barrier can let anyone on is a fault.
//
// A fault stops the process with a report on stderr naming the kernel, its block and threads.
// Randomness is seeded from PIPER_CUDA_EMULATOR_SEED (default 1), so a run repeats.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <boost/context/fiber.hpp>
#include <boost/context/preallocated.hpp>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cub/device/device_radix_sort.cuh>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define PIPER_EMULATOR_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PIPER_EMULATOR_ASAN 1
#endif
#endif
#ifdef PIPER_EMULATOR_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

struct CUevent_st {
  uint64_t recorded = 0;       // generations recorded, the newest last
  std::set<uint64_t> pending;  // recorded and not yet reached by their stream
  int refs = 0;                // queued records and waits that name this event
  bool destroyed = false;
};

namespace {

using piper::cuda_emulator::Place;

[[noreturn]] void fault(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::fprintf(stderr, "piper cuda emulator: ");
  std::vfprintf(stderr, format, args);
  std::fprintf(stderr, "\n");
  va_end(args);
  std::fflush(stderr);
  std::abort();
}

// ---- the device's state, all of it under one lock ----------------------------------------------

constexpr size_t kDeviceBytes = size_t(16) << 30;      // what cudaMemGetInfo reports as the device's
constexpr size_t kDefaultSharedBytes = 48 << 10;       // dynamic shared memory without the attribute
constexpr size_t kMaxSharedBytes = 227 << 10;          // sm_90's opt-in limit per block
constexpr size_t kQueueLimit = 4096;                   // queued items past which the device catches up
constexpr double kStepsLimitS = 300;                   // an operation in steps that waits longer is a fault

struct Item {
  enum Kind { kWork, kRecord, kWait } kind;
  std::string what;
  std::function<bool()> work;  // one step of it: true once done (most work is done in one)
  CUevent_st* event = nullptr;
  uint64_t generation = 0;
};

}  // namespace

struct CUstream_st {
  std::deque<Item> queue;
};

namespace {

struct Device {
  std::mutex lock;
  std::mt19937_64 random{[] {
    const char* s = std::getenv("PIPER_CUDA_EMULATOR_SEED");
    return s ? std::strtoull(s, nullptr, 10) : 1ull;
  }()};
  cudaError_t last_error = cudaSuccess;
  std::map<uintptr_t, size_t> device_memory, pinned_memory;  // start -> bytes
  size_t device_bytes = 0;
  std::set<CUstream_st*> streams;
  std::set<CUevent_st*> events;
  std::map<const void*, size_t> shared_limit;  // kernel -> cudaFuncAttributeMaxDynamicSharedMemorySize
  size_t queued = 0;
};

Device& device() {
  static Device* d = new Device;  // never destroyed: work may still be queued at exit
  return *d;
}

cudaError_t failed(Device& d, cudaError_t e) {
  d.last_error = e;
  return e;
}

// The allocation of `memory` that holds p (p may be its end when `end_ok`), or memory.end().
std::map<uintptr_t, size_t>::const_iterator holder(const std::map<uintptr_t, size_t>& memory, const void* p,
                                                   bool end_ok) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = memory.upper_bound(a);
  if (it == memory.begin()) return memory.end();
  --it;
  return a < it->first + it->second + (end_ok ? 1 : 0) ? it : memory.end();
}

bool device_range(const Device& d, const void* p, size_t bytes) {
  if (bytes == 0) return true;
  const auto it = holder(d.device_memory, p, false);
  return it != d.device_memory.end() && reinterpret_cast<uintptr_t>(p) + bytes <= it->first + it->second;
}

bool is_device(const Device& d, const void* p) { return holder(d.device_memory, p, false) != d.device_memory.end(); }
bool is_pinned(const Device& d, const void* p) { return holder(d.pinned_memory, p, false) != d.pinned_memory.end(); }

bool live_stream(const Device& d, cudaStream_t s) { return s == nullptr || d.streams.count(s) != 0; }

void release_event_ref(Device& d, CUevent_st* e) {
  if (--e->refs == 0 && e->destroyed) {
    d.events.erase(e);
    delete e;
  }
}

bool runnable(const Item& item) {
  return item.kind != Item::kWait || item.event->pending.count(item.generation) == 0;
}

// One step of a runnable item: true once it is done.
bool step(Device& d, Item& item) {
  switch (item.kind) {
    case Item::kWork:
      return item.work();
    case Item::kRecord:
      item.event->pending.erase(item.generation);
      release_event_ref(d, item.event);
      return true;
    case Item::kWait:
      release_event_ref(d, item.event);
      return true;
  }
  return true;
}

// Runs queued work, a random runnable stream's next item at a time, until done() holds; returns
// whether it does. An operation in steps that cannot go on yet (it waits for other processes) lets
// the other streams go on; when only such operations are left, the host waits for them (the device's
// lock released, so the process's other threads may use it) or, when `wait` is false, returns.
template <class Done>
bool progress(Device& d, Done done, bool wait = true) {
  std::vector<CUstream_st*> ready;
  std::set<CUstream_st*> stalled;  // at an operation in steps that could not go on this round
  auto since = std::chrono::steady_clock::now();
  while (!done()) {
    ready.clear();
    for (CUstream_st* s : d.streams)
      if (!s->queue.empty() && runnable(s->queue.front()) && !stalled.count(s)) ready.push_back(s);
    if (ready.empty() && stalled.empty()) {
      if (!wait) return false;
      fault("queued work waits on events that no stream will reach (%zu items queued)", d.queued);
    }
    if (ready.empty()) {
      if (!wait) return false;
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count() > kStepsLimitS)
        fault("%s has waited %.0f s for other processes", (*stalled.begin())->queue.front().what.c_str(), kStepsLimitS);
      stalled.clear();
      d.lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      d.lock.lock();
      continue;
    }
    CUstream_st* s = ready[std::uniform_int_distribution<size_t>(0, ready.size() - 1)(d.random)];
    if (!step(d, s->queue.front())) {
      stalled.insert(s);
      continue;
    }
    since = std::chrono::steady_clock::now();
    s->queue.pop_front();
    --d.queued;
  }
  return true;
}

void drain(Device& d) {
  progress(d, [&] { return d.queued == 0; });
}

// Queues an item on s; the legacy default stream (nullptr) runs it at once, after everything queued.
void push(Device& d, cudaStream_t s, Item item) {
  if (s == nullptr) {
    drain(d);
    while (!step(d, item)) std::this_thread::sleep_for(std::chrono::microseconds(100));
    return;
  }
  s->queue.push_back(std::move(item));
  if (++d.queued > kQueueLimit) progress(d, [&] { return d.queued <= kQueueLimit / 2; });
}

// Queues `work` on s and, when the host must wait for it (a copy into pageable memory), runs the
// streams until it is done.
cudaError_t queue_work(Device& d, cudaStream_t s, std::string what, std::function<void()> work, bool wait) {
  if (!live_stream(d, s)) return failed(d, cudaErrorInvalidResourceHandle);
  if (!wait || s == nullptr) {
    push(d, s, {Item::kWork, std::move(what), [w = std::move(work)] {
                  w();
                  return true;
                }});
    return cudaSuccess;
  }
  bool done = false;
  push(d, s, {Item::kWork, std::move(what), [w = std::move(work), &done] {
                w();
                done = true;
                return true;
              }});
  progress(d, [&] { return done; });
  return cudaSuccess;
}

// ---- kernels: fibers, barriers, shuffles ---------------------------------------------------------

constexpr size_t kStackBytes = 256 << 10;
constexpr size_t kGuardBytes = 4096;
constexpr int kWarpSize = 32;

// A fiber switch is Boost.Context's fcontext: registers and stack pointer, no system call. A fiber
// plays one CUDA thread after another and is kept for the process, its stack (and AddressSanitizer's
// fake stack for it) with it, so a launch maps no memory.
namespace context = boost::context;

struct KeptStack {  // the fibers' stacks are the emulator's, mapped once
  void deallocate(context::stack_context&) noexcept {}
};

struct Fiber {
  enum State { kReady, kAtBlockBarrier, kAtShuffle, kAtWarpCollective, kDone };
  context::fiber context;
  char* stack = nullptr;
  State state = kReady;
  Place place{};
  int predicate = 0, result = 0;  // __syncthreads_or
  uint64_t bits = 0;              // a shuffle's value, then its result
  unsigned mask = 0;
  int lane_mask = 0, width = kWarpSize;
  piper::cuda_emulator::WarpCollective collective = nullptr;  // a warp-wide operation, and this lane's part
  void* collective_arg = nullptr;
  void* fake_stack = nullptr;  // AddressSanitizer's, while the fiber is switched out
};

struct Scheduler {
  context::fiber host;  // where the fiber running now returns to
  const void* host_stack = nullptr;
  size_t host_stack_bytes = 0;
  std::vector<std::unique_ptr<Fiber>> fibers;
  Fiber* current = nullptr;
  const std::function<void()>* body = nullptr;
  const char* kernel = nullptr;
  // The block's dynamic shared memory, 256-byte aligned as a GPU's is (wmma's tiles need 32).
  struct alignas(256) SharedLine {
    unsigned char bytes[256];
  };
  std::vector<SharedLine> shared;
  unsigned char* shared_bytes() { return shared.front().bytes; }
};

Scheduler& scheduler() {
  static Scheduler* s = new Scheduler;
  return *s;
}

void start_switch(void** fake_stack, const void* bottom, size_t bytes) {
#ifdef PIPER_EMULATOR_ASAN
  __sanitizer_start_switch_fiber(fake_stack, bottom, bytes);
#else
  (void)fake_stack, (void)bottom, (void)bytes;
#endif
}
void finish_switch(void* fake_stack, const void** bottom, size_t* bytes) {
#ifdef PIPER_EMULATOR_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, bottom, bytes);
#else
  (void)fake_stack, (void)bottom, (void)bytes;
#endif
}

// Back to the scheduler until a barrier lets this thread on (or, kDone, until the fiber plays its next
// thread). The host thread that resumes it may be another one: the device runs on whichever host thread
// waits for it, so the fiber side reads no thread-local state of its own (resume sets current_place).
void wait_at(Fiber::State state) {
  Scheduler& s = scheduler();
  Fiber& f = *s.current;
  f.state = state;
  start_switch(&f.fake_stack, s.host_stack, s.host_stack_bytes);
  s.host = std::move(s.host).resume();
  finish_switch(f.fake_stack, &s.host_stack, &s.host_stack_bytes);
}

context::fiber fiber_main(context::fiber&& host) {
  Scheduler& s = scheduler();
  s.host = std::move(host);
  finish_switch(nullptr, &s.host_stack, &s.host_stack_bytes);
  for (;;) {
    (*s.body)();
    wait_at(Fiber::kDone);
  }
}

void resume(Scheduler& s, Fiber& f) {
  s.current = &f;
  piper::cuda_emulator::current_place = &f.place;
  void* fake = nullptr;
  start_switch(&fake, f.stack + kGuardBytes, kStackBytes);
  f.context = std::move(f.context).resume();
  finish_switch(fake, nullptr, nullptr);
  piper::cuda_emulator::current_place = nullptr;
}

Fiber& fiber(Scheduler& s, size_t i) {
  while (s.fibers.size() <= i) {
    auto f = std::make_unique<Fiber>();
    void* m = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) fault("cannot map a fiber's stack of %zu bytes", kStackBytes);
    mprotect(m, kGuardBytes, PROT_NONE);  // an overflowing stack faults here
    f->stack = static_cast<char*>(m);
    context::stack_context stack;
    stack.sp = f->stack + kGuardBytes + kStackBytes;
    stack.size = kStackBytes;
    f->context = context::fiber(std::allocator_arg, context::preallocated(stack.sp, stack.size, stack), KeptStack{},
                                fiber_main);
    s.fibers.push_back(std::move(f));
  }
  return *s.fibers[i];
}

std::string where(const Scheduler& s, const Place& p) {
  char b[160];
  std::snprintf(b, sizeof b, "block (%u,%u,%u) of grid (%u,%u,%u), %u threads", p.block.x, p.block.y, p.block.z,
                p.grid_dim.x, p.grid_dim.y, p.grid_dim.z, p.block_dim.x * p.block_dim.y * p.block_dim.z);
  return std::string(s.kernel) + ", " + b;
}

// Whether every live lane of the warp at `first` waits in `state` (and one at least does); `live`, when
// given, gets how many lanes have not returned.
bool warp_waits_at(const Scheduler& s, size_t first, size_t lanes, Fiber::State state, size_t* live = nullptr) {
  size_t waiting = 0, running = 0;
  for (size_t l = 0; l < lanes; ++l) {
    const Fiber& f = *s.fibers[first + l];
    if (f.state != Fiber::kDone) ++running;
    if (f.state == state) ++waiting;
  }
  if (live) *live = running;
  return waiting > 0 && waiting == running;
}

// Lets a warp whose every live lane waits at a shuffle on; false if it cannot yet.
bool release_warp(Scheduler& s, size_t first, size_t lanes) {
  if (!warp_waits_at(s, first, lanes, Fiber::kAtShuffle)) return false;
  std::vector<uint64_t> result(lanes);
  for (size_t l = 0; l < lanes; ++l) {
    const Fiber& f = *s.fibers[first + l];
    if (f.state != Fiber::kAtShuffle) continue;
    if (f.mask != 0xffffffffu)
      fault("%s: thread %zu shuffles with mask %#x; piper's kernels shuffle whole warps", where(s, f.place).c_str(),
            first + l, f.mask);
    if (f.width != kWarpSize)
      fault("%s: thread %zu shuffles with width %d", where(s, f.place).c_str(), first + l, f.width);
    const size_t src = l ^ static_cast<size_t>(f.lane_mask);
    if (src >= lanes)
      fault("%s: thread %zu shuffles from lane %zu of a warp of %zu threads (the block is not whole warps)",
            where(s, f.place).c_str(), first + l, src, lanes);
    const Fiber& from = *s.fibers[first + src];
    if (from.state == Fiber::kDone)
      fault("%s: thread %zu shuffles from lane %zu, which has returned", where(s, f.place).c_str(), first + l, src);
    result[l] = from.bits;
  }
  for (size_t l = 0; l < lanes; ++l) {
    Fiber& f = *s.fibers[first + l];
    if (f.state != Fiber::kAtShuffle) continue;
    f.bits = result[l];
    f.state = Fiber::kReady;
  }
  return true;
}

// Plays a warp-wide operation (a wmma load, store or product) once every lane of the warp has reached
// it: the whole warp must take part, every lane in the same operation; false if it cannot yet.
bool release_collective(Scheduler& s, size_t first, size_t lanes) {
  size_t live = 0;
  if (!warp_waits_at(s, first, lanes, Fiber::kAtWarpCollective, &live)) return false;
  const Fiber& lead = *s.fibers[first];
  if (lanes != kWarpSize || live != lanes)
    fault("%s: a warp-wide operation (wmma) at threads %zu..%zu with %zu of its 32 lanes (the others have "
          "returned or the block is not whole warps); every lane of the warp must take part",
          where(s, lead.place).c_str(), first, first + lanes - 1, live);
  void* args[kWarpSize];
  for (size_t l = 0; l < lanes; ++l) {
    const Fiber& f = *s.fibers[first + l];
    if (f.collective != lead.collective)
      fault("%s: lanes 0 and %zu of the warp at thread %zu reach different warp-wide operations",
            where(s, lead.place).c_str(), l, first);
    args[l] = f.collective_arg;
  }
  const std::string error = lead.collective(args);
  if (!error.empty()) fault("%s, warp at thread %zu: %s", where(s, lead.place).c_str(), first, error.c_str());
  for (size_t l = 0; l < lanes; ++l) s.fibers[first + l]->state = Fiber::kReady;
  return true;
}

void run_block(Scheduler& s, const Place& base, size_t threads, size_t shared_bytes) {
  std::fill(s.shared_bytes(), s.shared_bytes() + shared_bytes, 0xff);  // NaN until written
  for (size_t i = 0; i < threads; ++i) {
    Fiber& f = fiber(s, i);
    f.state = Fiber::kReady;
    f.place = base;
    const unsigned bx = base.block_dim.x, by = base.block_dim.y;
    f.place.thread = {static_cast<unsigned>(i % bx), static_cast<unsigned>(i / bx % by),
                      static_cast<unsigned>(i / (size_t(bx) * by))};
  }
  Device& d = device();
  std::vector<size_t> order;
  for (;;) {
    order.clear();
    for (size_t i = 0; i < threads; ++i)
      if (s.fibers[i]->state == Fiber::kReady) order.push_back(i);
    if (!order.empty()) {
      std::shuffle(order.begin(), order.end(), d.random);
      for (size_t i : order) resume(s, *s.fibers[i]);
      continue;
    }
    bool released = false;
    for (size_t w = 0; w < threads; w += kWarpSize) {
      const size_t lanes = std::min<size_t>(kWarpSize, threads - w);
      released |= release_warp(s, w, lanes);
      released |= release_collective(s, w, lanes);
    }
    if (released) continue;
    size_t at_barrier = 0, at_shuffle = 0, done = 0;
    for (size_t i = 0; i < threads; ++i) {
      const Fiber& f = *s.fibers[i];
      at_barrier += f.state == Fiber::kAtBlockBarrier;
      at_shuffle += f.state == Fiber::kAtShuffle || f.state == Fiber::kAtWarpCollective;
      done += f.state == Fiber::kDone;
    }
    if (done == threads) return;
    if (at_barrier > 0 && at_barrier + done == threads) {
      int any = 0;
      for (size_t i = 0; i < threads; ++i)
        if (s.fibers[i]->state == Fiber::kAtBlockBarrier) any |= s.fibers[i]->predicate != 0;
      for (size_t i = 0; i < threads; ++i) {
        Fiber& f = *s.fibers[i];
        if (f.state != Fiber::kAtBlockBarrier) continue;
        f.result = any;
        f.state = Fiber::kReady;
      }
      continue;
    }
    fault("%s: the threads cannot go on: %zu wait at __syncthreads, %zu at a warp shuffle whose warp is elsewhere, "
          "%zu have returned",
          where(s, base).c_str(), at_barrier, at_shuffle, done);
  }
}

void run_grid(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body) {
  Scheduler& s = scheduler();
  s.kernel = kernel;
  s.body = &body;
  const size_t lines = (shared_bytes + sizeof(Scheduler::SharedLine) - 1) / sizeof(Scheduler::SharedLine);
  if (s.shared.size() < std::max<size_t>(lines, 1)) s.shared.resize(std::max<size_t>(lines, 1));
  const size_t threads = size_t(block.x) * block.y * block.z;
  Place base{};
  base.block_dim = block;
  base.grid_dim = grid;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        base.block = {x, y, z};
        run_block(s, base, threads, shared_bytes);
      }
  s.body = nullptr;
}

}  // namespace

namespace piper::cuda_emulator {

thread_local const Place* current_place __attribute__((tls_model("initial-exec"))) = nullptr;

void* dynamic_shared_bytes() { return scheduler().shared_bytes(); }

void sync_block() {
  Fiber& f = *scheduler().current;
  f.predicate = 0;
  wait_at(Fiber::kAtBlockBarrier);
}

int sync_block_or(int predicate) {
  Fiber& f = *scheduler().current;
  f.predicate = predicate;
  wait_at(Fiber::kAtBlockBarrier);
  return f.result;
}

uint64_t shuffle_xor(unsigned mask, uint64_t bits, int lane_mask, int width) {
  Fiber& f = *scheduler().current;
  f.mask = mask;
  f.bits = bits;
  f.lane_mask = lane_mask;
  f.width = width;
  wait_at(Fiber::kAtShuffle);
  return f.bits;
}

void warp_collective(WarpCollective operation, void* arg) {
  Fiber& f = *scheduler().current;
  f.collective = operation;
  f.collective_arg = arg;
  wait_at(Fiber::kAtWarpCollective);
}

cudaError_t set_function_attribute(const void* function, cudaFuncAttribute attribute, int value) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || size_t(value) > kMaxSharedBytes)
    return failed(d, cudaErrorInvalidValue);
  d.shared_limit[function] = static_cast<size_t>(value);
  return cudaSuccess;
}

void check_argument(const char* kernel, int index, const void* p) {
  if (p == nullptr) return;
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  if (holder(d.device_memory, p, true) == d.device_memory.end() && !is_pinned(d, p))
    fault("launch of %s: argument %d is %p, which is neither device nor page-locked host memory", kernel, index, p);
}

void Launch::submit(const char* name, const void* function, std::function<void()> body) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  const uint64_t threads = uint64_t(block_.x) * block_.y * block_.z;
  const auto limit = d.shared_limit.find(function);
  const size_t shared_limit = limit == d.shared_limit.end() ? kDefaultSharedBytes : limit->second;
  if (threads == 0 || threads > 1024 || block_.x > 1024 || block_.y > 1024 || block_.z > 64 || grid_.x == 0 ||
      grid_.x > 0x7fffffffu || grid_.y == 0 || grid_.y > 65535 || grid_.z == 0 || grid_.z > 65535) {
    failed(d, cudaErrorInvalidConfiguration);
    return;
  }
  if (shared_ > shared_limit) {
    failed(d, cudaErrorInvalidValue);
    return;
  }
  const dim3 grid = grid_, block = block_;
  const size_t shared = shared_;
  queue_work(d, stream_, name, [name, grid, block, shared, b = std::move(body)] { run_grid(name, grid, block, shared, b); },
             false);  // a stream that is not live leaves its error for cudaGetLastError
}

cudaError_t enqueue(cudaStream_t s, const char* what, std::function<void()> work) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  return queue_work(d, s, what, std::move(work), false);
}

void enqueue_steps(cudaStream_t s, std::string what, std::function<bool()> step) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  if (!live_stream(d, s)) fault("%s is queued on stream %p, which is not live", what.c_str(), static_cast<void*>(s));
  push(d, s, {Item::kWork, std::move(what), std::move(step)});
}

void poll_device() {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  progress(d, [&] { return d.queued == 0; }, false);
}

bool is_device_range(const void* p, size_t bytes) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  return device_range(d, p, bytes);
}

}  // namespace piper::cuda_emulator

// ---- the runtime API --------------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) { return dev == 0 ? cudaSuccess : failed(device(), cudaErrorInvalidDevice); }

cudaError_t cudaGetDevice(int* dev) {
  *dev = 0;
  return cudaSuccess;
}

// One process, one emulated device: the bus id tells the processes' devices apart.
cudaError_t cudaDeviceGetPCIBusId(char* bus, int length, int dev) {
  if (dev != 0 || length <= 0) return failed(device(), cudaErrorInvalidValue);
  std::snprintf(bus, static_cast<size_t>(length), "emulated:%d", static_cast<int>(getpid()));
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  drain(d);
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  const cudaError_t e = d.last_error;
  d.last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  return d.last_error;
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
  }
  return "unknown error";
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  if (flags != cudaStreamNonBlocking)  // piper's streams never order themselves behind the legacy stream
    return failed(d, cudaErrorInvalidValue);
  *s = new CUstream_st;
  d.streams.insert(*s);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  if (!s || !d.streams.count(s)) return failed(d, cudaErrorInvalidResourceHandle);
  progress(d, [&] { return s->queue.empty(); });
  d.streams.erase(s);
  delete s;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  if (!live_stream(d, s)) return failed(d, cudaErrorInvalidResourceHandle);
  if (s == nullptr)
    drain(d);
  else
    progress(d, [&] { return s->queue.empty(); });
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  if (!live_stream(d, s) || !e || !d.events.count(e) || e->destroyed || flags != 0)
    return failed(d, cudaErrorInvalidResourceHandle);
  if (e->recorded == 0) return cudaSuccess;  // an event never recorded is complete
  ++e->refs;
  Item wait{Item::kWait, "wait", {}, e, e->recorded};
  if (s == nullptr) {
    progress(d, [&] { return runnable(wait); });
    step(d, wait);  // a wait is done in one
  } else {
    push(d, s, std::move(wait));
  }
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  if (flags & ~unsigned(cudaEventDisableTiming)) return failed(d, cudaErrorInvalidValue);
  *e = new CUevent_st;
  d.events.insert(*e);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  if (!e || !d.events.count(e) || e->destroyed) return failed(d, cudaErrorInvalidResourceHandle);
  e->destroyed = true;  // queued records and waits still name it: gone with the last of them
  ++e->refs;
  release_event_ref(d, e);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  if (!e || !d.events.count(e) || e->destroyed || !live_stream(d, s)) return failed(d, cudaErrorInvalidResourceHandle);
  const uint64_t generation = ++e->recorded;
  e->pending.insert(generation);
  ++e->refs;
  push(d, s, {Item::kRecord, "record", {}, e, generation});
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  if (!e || !d.events.count(e) || e->destroyed) return failed(d, cudaErrorInvalidResourceHandle);
  const uint64_t generation = e->recorded;
  progress(d, [&] { return e->pending.count(generation) == 0; });
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  if (!e || !d.events.count(e) || e->destroyed) return failed(d, cudaErrorInvalidResourceHandle);
  const uint64_t generation = e->recorded;  // the device works while the host looks
  return progress(d, [&] { return e->pending.count(generation) == 0; }, false) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  const size_t rounded = (bytes + 255) / 256 * 256;
  if (d.device_bytes + rounded > kDeviceBytes) return failed(d, cudaErrorMemoryAllocation);
  void* m = std::aligned_alloc(256, rounded);
  if (!m) return failed(d, cudaErrorMemoryAllocation);
  std::memset(m, 0xff, rounded);  // NaN until written
  d.device_memory[reinterpret_cast<uintptr_t>(m)] = bytes;
  d.device_bytes += rounded;
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  if (!p) return cudaSuccess;
  drain(d);  // cudaFree waits for the device
  const auto it = d.device_memory.find(reinterpret_cast<uintptr_t>(p));
  if (it == d.device_memory.end()) return failed(d, cudaErrorInvalidDevicePointer);
  std::memset(p, 0xff, it->second);
  d.device_bytes -= (it->second + 255) / 256 * 256;
  d.device_memory.erase(it);
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  void* m = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (!m) return failed(d, cudaErrorMemoryAllocation);
  d.pinned_memory[reinterpret_cast<uintptr_t>(m)] = bytes;
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  if (!p) return cudaSuccess;
  drain(d);
  const auto it = d.pinned_memory.find(reinterpret_cast<uintptr_t>(p));
  if (it == d.pinned_memory.end()) return failed(d, cudaErrorInvalidValue);
  d.pinned_memory.erase(it);
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  *free_bytes = kDeviceBytes - d.device_bytes;
  *total_bytes = kDeviceBytes;
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  if (bytes == 0) return cudaSuccess;
  if (kind == cudaMemcpyDefault)
    kind = is_device(d, dst) ? (is_device(d, src) ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                             : (is_device(d, src) ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind == cudaMemcpyHostToHost) return failed(d, cudaErrorInvalidMemcpyDirection);
  if ((dst_device && !device_range(d, dst, bytes)) || (src_device && !device_range(d, src, bytes)) ||
      (!dst_device && is_device(d, dst)) || (!src_device && is_device(d, src)))
    return failed(d, cudaErrorInvalidValue);
  if (kind == cudaMemcpyHostToDevice && !is_pinned(d, src)) {
    // From pageable memory the source is staged before the call returns.
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + bytes);
    return queue_work(d, s, "copy to the device", [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); },
                      false);
  }
  const bool wait = kind == cudaMemcpyDeviceToHost && !is_pinned(d, dst);  // into pageable memory: synchronous
  return queue_work(d, s, "copy", [dst, src, bytes] { std::memmove(dst, src, bytes); }, wait);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t s) {
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  if (bytes == 0) return cudaSuccess;
  if (!device_range(d, dst, bytes)) return failed(d, cudaErrorInvalidValue);
  return queue_work(d, s, "memset", [dst, value, bytes] { std::memset(dst, value, bytes); }, false);
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) { return cudaMemsetAsync(dst, value, bytes, nullptr); }

// ---- cuBLAS ---------------------------------------------------------------------------------------------

struct cublasContext {
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;  // the caller's (cublasSetWorkspace), or null for cuBLAS's own
};

namespace {

float tf32(float x) {  // to nearest even with 10 mantissa bits, as TF32 tensor cores read f32
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  u += 0xfffu + ((u >> 13) & 1u);
  u &= ~0x1fffu;
  std::memcpy(&x, &u, sizeof u);
  return x;
}

float load(const void* p, cudaDataType_t t, size_t i) {
  if (t == CUDA_R_16BF) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

size_t type_bytes(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }

}  // namespace

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  Device& d = device();
  std::lock_guard<std::mutex> hold(d.lock);
  if (!live_stream(d, stream)) return CUBLAS_STATUS_INVALID_VALUE;
  handle->stream = stream;
  handle->workspace = nullptr;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  const bool inside = bytes == 0 || piper::cuda_emulator::is_device_range(workspace, bytes);
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0 || !inside)
    return CUBLAS_STATUS_INVALID_VALUE;
  handle->workspace = workspace;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an unsupported value or parameter was passed to the function";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
  }
  return "unknown status";
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType_t Atype, int lda, const void* B,
                            cudaDataType_t Btype, int ldb, const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  const int a_rows = ta ? k : m, b_rows = tb ? n : k;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m) ||
      algo != CUBLAS_GEMM_DEFAULT)
    return CUBLAS_STATUS_INVALID_VALUE;
  const bool f32_in = Atype == CUDA_R_32F && Btype == CUDA_R_32F;
  const bool bf16_in = Atype == CUDA_R_16BF && Btype == CUDA_R_16BF;
  const bool out_ok = Ctype == CUDA_R_32F || (bf16_in && Ctype == CUDA_R_16BF);
  if (!out_ok || !(f32_in || bf16_in) || (computeType != CUBLAS_COMPUTE_32F && !f32_in))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_FAST_TF32 &&
      computeType != CUBLAS_COMPUTE_32F_FAST_16BF)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const size_t a_cols = ta ? m : k, b_cols = tb ? k : n;
  const auto span = [](size_t rows, size_t cols, int ld, cudaDataType_t t) {
    return rows == 0 || cols == 0 ? 0 : ((cols - 1) * size_t(ld) + rows) * type_bytes(t);
  };
  if (!piper::cuda_emulator::is_device_range(A, span(size_t(a_rows), a_cols, lda, Atype)) ||
      !piper::cuda_emulator::is_device_range(B, span(size_t(b_rows), b_cols, ldb, Btype)) ||
      !piper::cuda_emulator::is_device_range(C, span(size_t(m), size_t(n), ldc, Ctype)))
    fault("cublasGemmEx: an operand of the %dx%dx%d product reaches outside its device allocation", m, n, k);
  const auto work = [=] {
    const auto in = [&](const void* p, cudaDataType_t t, size_t i) {
      const float v = load(p, t, i);
      if (computeType == CUBLAS_COMPUTE_32F_FAST_TF32) return tf32(v);
      if (computeType == CUBLAS_COMPUTE_32F_FAST_16BF) return __bfloat162float(__float2bfloat16_rn(v));
      return v;
    };
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float acc = 0.0f;
        for (int p = 0; p < k; ++p) {
          const size_t ai = ta ? size_t(i) * lda + p : size_t(p) * lda + i;
          const size_t bi = tb ? size_t(p) * ldb + j : size_t(j) * ldb + p;
          acc += in(A, Atype, ai) * in(B, Btype, bi);
        }
        const size_t ci = size_t(j) * ldc + i;
        const float c = a * acc + (b != 0.0f ? b * load(C, Ctype, ci) : 0.0f);  // beta 0: C is not read
        if (Ctype == CUDA_R_16BF)
          static_cast<__nv_bfloat16*>(C)[ci] = __float2bfloat16_rn(c);
        else
          static_cast<float*>(C)[ci] = c;
      }
  };
  return piper::cuda_emulator::enqueue(handle->stream, "cublasGemmEx", work) == cudaSuccess
             ? CUBLAS_STATUS_SUCCESS
             : CUBLAS_STATUS_EXECUTION_FAILED;
}

// ---- cub --------------------------------------------------------------------------------------------------

cudaError_t cub::DeviceRadixSort::SortPairs(void* d_temp_storage, size_t& temp_storage_bytes, const int32_t* d_keys_in,
                                            int32_t* d_keys_out, const int32_t* d_values_in, int32_t* d_values_out,
                                            int num_items, int begin_bit, int end_bit, cudaStream_t stream) {
  const size_t need = 256 + size_t(std::max(num_items, 0)) * 2 * sizeof(int32_t);
  if (d_temp_storage == nullptr) {
    temp_storage_bytes = need;
    return cudaSuccess;
  }
  const size_t bytes = size_t(std::max(num_items, 0)) * sizeof(int32_t);
  if (num_items < 0 || begin_bit < 0 || end_bit > 32 || begin_bit >= end_bit || temp_storage_bytes < need ||
      !piper::cuda_emulator::is_device_range(d_temp_storage, need) ||
      !piper::cuda_emulator::is_device_range(d_keys_in, bytes) ||
      !piper::cuda_emulator::is_device_range(d_keys_out, bytes) ||
      !piper::cuda_emulator::is_device_range(d_values_in, bytes) ||
      !piper::cuda_emulator::is_device_range(d_values_out, bytes))
    return cudaErrorInvalidValue;
  const auto work = [=] {
    const uint32_t mask = end_bit - begin_bit == 32 ? ~0u : ((1u << (end_bit - begin_bit)) - 1u);
    const auto key = [&](int i) { return ((uint32_t(d_keys_in[i]) ^ 0x80000000u) >> begin_bit) & mask; };
    std::vector<int> order(static_cast<size_t>(num_items));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return key(x) < key(y); });
    std::vector<int32_t> keys(order.size()), values(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      keys[i] = d_keys_in[order[i]];
      values[i] = d_values_in[order[i]];
    }
    std::copy(keys.begin(), keys.end(), d_keys_out);
    std::copy(values.begin(), values.end(), d_values_out);
  };
  return piper::cuda_emulator::enqueue(stream, "cub::DeviceRadixSort::SortPairs", work);
}
