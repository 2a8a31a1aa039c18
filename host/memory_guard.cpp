// A CPU allocator in front of LibTorch's. A request for more memory than the
// machine has left is refused with an error that says both sizes, instead of
// being granted by the kernel's overcommit and ending, when the pages are
// touched, in the OOM killer taking the whole session (see runtime.h).
//
// It also keeps freed buffers of 1 MiB and more for reuse. glibc serves a
// buffer above 32 MiB with its own mmap and gives it back on free, and trims
// its heap once more than 1 GiB of it is free (main.cpp's settings), so the
// next buffer starts as fresh pages the kernel must clear: a pretrained
// autopsy, which reads a (B*T, vocab) logits matrix through the head 23 times,
// spent 16% of its time in the kernel's clear_page, and a full activation
// cache (2 GiB) freed and made again up to 41%. Freed buffers stay in a pool
// (up to a limit), by size class, and serve the next request of that class,
// as CUDA's caching allocator does for GPU memory.
#include "host/runtime.h"

#include "host/torch_compat.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <unordered_map>
#include <sstream>
#include <string>

namespace anatomy {
namespace {

// Requests below this size are passed through unchecked: the check reads
// /proc, and a small request cannot be the one that takes the machine down.
constexpr uint64_t kCheckFrom = uint64_t(1) << 30;

// A value of /proc/meminfo in bytes ("MemAvailable:  123 kB"), or 0.
uint64_t meminfo(const std::string& text, const char* key) {
  size_t at = text.find(key);
  if (at == std::string::npos) return 0;
  return std::strtoull(text.c_str() + at + std::strlen(key), nullptr, 10) * 1024;
}

// A cgroup v2 file holding a number of bytes (or "max"): the number, or 0.
uint64_t cgroup_value(const char* path) {
  std::ifstream in(path);
  std::string v;
  if (!(in >> v) || v == "max") return 0;
  return std::strtoull(v.c_str(), nullptr, 10);
}

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / double(uint64_t(1) << 30));
  return buf;
}

// Parses "512M", "4G", "0": bytes (a suffix K, M or G multiplies by 1024s).
uint64_t parse_bytes(const char* v) {
  char* end = nullptr;
  double n = std::strtod(v, &end);
  double unit = 1;
  if (end && (*end == 'K' || *end == 'k')) unit = 1024.0;
  if (end && (*end == 'M' || *end == 'm')) unit = 1024.0 * 1024;
  if (end && (*end == 'G' || *end == 'g')) unit = 1024.0 * 1024 * 1024;
  return n > 0 ? static_cast<uint64_t>(n * unit) : uint64_t(0);
}

// $ANATOMY_MAX_ALLOCATION: the largest single CPU allocation allowed, in
// bytes (a suffix K, M or G multiplies by 1024s); unset or 0: no cap beyond
// the memory left. The fuzzers set it, so that a huge request is an error at
// once rather than minutes of filling memory; a user can keep a session small.
uint64_t max_allocation() {
  static const uint64_t cap = [] {
    const char* v = std::getenv("ANATOMY_MAX_ALLOCATION");
    if (!v || !*v) return uint64_t(0);
    return parse_bytes(v);
  }();
  return cap;
}

// Buffers from this size on are pooled when freed. Smaller ones stay with
// glibc's heap, which keeps and reuses them itself.
constexpr uint64_t kPoolFrom = uint64_t(1) << 20;

// The size class of a request of n bytes: n rounded up to an eighth of the
// power of two below it (at most 12.5% more), so that a pooled buffer serves
// every request of nearly its size.
uint64_t size_class(uint64_t n) {
  int log2 = 63 - __builtin_clzll(n);
  uint64_t step = uint64_t(1) << (log2 - 3);
  return (n + step - 1) / step * step;
}

uint64_t total_memory() {
  std::ifstream in("/proc/meminfo");
  std::stringstream ss;
  ss << in.rdbuf();
  return meminfo(ss.str(), "MemTotal:");
}

#if defined(__SANITIZE_ADDRESS__)
#define ANATOMY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ANATOMY_ASAN 1
#endif
#endif

// $ANATOMY_CPU_CACHE_LIMIT: the most bytes of freed buffers the pool keeps
// (0: none); default a quarter of the machine's memory, at most 4 GiB; none
// under AddressSanitizer, which must see every buffer freed to find a use
// after free.
uint64_t default_pool_limit() {
  const char* v = std::getenv("ANATOMY_CPU_CACHE_LIMIT");
  if (v && *v) return parse_bytes(v);
#ifdef ANATOMY_ASAN
  return 0;
#endif
  uint64_t quarter = total_memory() / 4;
  uint64_t most = uint64_t(4) << 30;
  return quarter > 0 && quarter < most ? quarter : most;
}

class GuardedCPUAllocator;
GuardedCPUAllocator* the_allocator = nullptr;

// A pooled buffer: LibTorch's own allocation (freed by its own deleter when
// the pool lets it go) and the rounded size it was made with.
struct Block {
  c10::DataPtr inner;
  uint64_t size;
};

class GuardedCPUAllocator final : public c10::Allocator {
 public:
  explicit GuardedCPUAllocator(c10::Allocator* base) : base_(base), limit_(default_pool_limit()) {}

#if ANATOMY_TORCH_AT_LEAST(2, 3)
  c10::DataPtr allocate(size_t n) override { return allocate_impl(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#else
  c10::DataPtr allocate(size_t n) const override { return const_cast<GuardedCPUAllocator*>(this)->allocate_impl(n); }
#endif
  // Every buffer's context is its data (raw_allocate needs it), so one
  // deleter serves all: a pooled buffer goes back to the pool, any other to
  // LibTorch's own deleter.
  c10::DeleterFnPtr raw_deleter() const override { return &GuardedCPUAllocator::release; }

  CPUPoolStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    CPUPoolStats s = stats_;
    s.pooled_bytes = pooled_bytes_;
    s.pooled_blocks = pool_.size();
    s.limit = limit_;
    return s;
  }
  uint64_t empty() {
    std::multimap<uint64_t, Block*> gone;
    uint64_t bytes;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      gone.swap(pool_);
      bytes = pooled_bytes_;
      pooled_bytes_ = 0;
    }
    for (auto& kv : gone) delete kv.second;  // outside the lock: LibTorch's deleter frees
    return bytes;
  }
  void set_limit(uint64_t limit) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      limit_ = limit;
    }
    if (pooled_bytes() > limit) empty();
  }

 private:
  uint64_t pooled_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return pooled_bytes_;
  }

  c10::DataPtr allocate_impl(size_t n) {
    check(n);
    if (n < kPoolFrom) return base_->allocate(n);
    uint64_t size = size_class(n);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = pool_.find(size);
      if (it != pool_.end()) {
        Block* block = it->second;
        pooled_bytes_ -= it->first;
        pool_.erase(it);
        ++stats_.reused;
        return track(block);
      }
      ++stats_.fresh;
    }
    // new memory: the pool's blocks go back first where the machine is short
    if (pooled_bytes() > 0) {
      uint64_t available = available_memory();
      if (available > 0 && size + (uint64_t(1) << 30) > available) empty();
    }
    Block* block = new Block{base_->allocate(size), size};
    std::lock_guard<std::mutex> lock(mutex_);
    return track(block);
  }

  // A block handed out (mutex_ held): known by its data until released.
  c10::DataPtr track(Block* block) {
    void* data = block->inner.get();
    live_.emplace(data, block);
    return c10::DataPtr(data, data, &GuardedCPUAllocator::release, c10::Device(c10::DeviceType::CPU));
  }

  static void release(void* data) {
    GuardedCPUAllocator* self = the_allocator;
    Block* block = nullptr;
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      auto it = self->live_.find(data);
      if (it != self->live_.end()) {
        block = it->second;
        self->live_.erase(it);
      }
    }
    if (!block) {  // a small buffer from raw_allocate: LibTorch's own
      self->base_->raw_deleter()(data);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      if (self->pooled_bytes_ + block->size <= self->limit_) {
        self->pool_.emplace(block->size, block);
        self->pooled_bytes_ += block->size;
        return;
      }
    }
    delete block;
  }

  static void check(size_t n) {
    uint64_t cap = max_allocation();
    if (cap > 0 && n > cap)
      TORCH_CHECK(false, "cannot allocate ", gib(n), " (", n, " bytes): more than the ", gib(cap),
                  " a single allocation may take ($ANATOMY_MAX_ALLOCATION)");
    if (n < kCheckFrom) return;
    uint64_t available = available_memory();
    if (the_allocator) available += the_allocator->pooled_bytes();  // the pool gives its blocks back first
    if (available > 0 && n > available) {
      TORCH_CHECK(false, "cannot allocate ", gib(n), " (", n, " bytes): this machine has ", gib(available),
                  " of memory left (RAM available and free swap", cgroup_limited() ? ", within its cgroup's limit" : "",
                  ")");
    }
  }
  static bool cgroup_limited() { return cgroup_value("/sys/fs/cgroup/memory.max") > 0; }
  c10::Allocator* base_;
  std::mutex mutex_;
  std::multimap<uint64_t, Block*> pool_;  // freed blocks by size
  std::unordered_map<void*, Block*> live_;  // pooled-size blocks in use, by data
  uint64_t pooled_bytes_ = 0;
  uint64_t limit_;
  CPUPoolStats stats_;
};

}  // namespace

uint64_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  uint64_t available = meminfo(text, "MemAvailable:") + meminfo(text, "SwapFree:");
  uint64_t limit = cgroup_value("/sys/fs/cgroup/memory.max");
  if (limit > 0) {
    uint64_t used = cgroup_value("/sys/fs/cgroup/memory.current");
    uint64_t left = limit > used ? limit - used : 0;
    if (available == 0 || left < available) available = left;
  }
  return available;
}

void install_memory_guard() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  static GuardedCPUAllocator guard(c10::GetCPUAllocator());
  the_allocator = &guard;
  c10::SetCPUAllocator(&guard, /*priority=*/1);
}

CPUPoolStats cpu_pool_stats() { return the_allocator ? the_allocator->stats() : CPUPoolStats{}; }

uint64_t cpu_pool_empty() { return the_allocator ? the_allocator->empty() : 0; }

void cpu_pool_set_limit(uint64_t bytes) {
  if (the_allocator) the_allocator->set_limit(bytes);
}

}  // namespace anatomy
