// A CPU allocator in front of LibTorch's: a request for more memory than the
// machine has left is refused with an error that says both sizes, instead of
// being granted by the kernel's overcommit and ending, when the pages are
// touched, in the OOM killer taking the whole session (see runtime.h).
#include "host/runtime.h"

#include "host/torch_compat.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
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

// $ANATOMY_MAX_ALLOCATION: the largest single CPU allocation allowed, in
// bytes (a suffix K, M or G multiplies by 1024s); unset or 0: no cap beyond
// the memory left. The fuzzers set it, so that a huge request is an error at
// once rather than minutes of filling memory; a user can keep a session small.
uint64_t max_allocation() {
  static const uint64_t cap = [] {
    const char* v = std::getenv("ANATOMY_MAX_ALLOCATION");
    if (!v || !*v) return uint64_t(0);
    char* end = nullptr;
    double n = std::strtod(v, &end);
    double unit = 1;
    if (end && (*end == 'K' || *end == 'k')) unit = 1024.0;
    if (end && (*end == 'M' || *end == 'm')) unit = 1024.0 * 1024;
    if (end && (*end == 'G' || *end == 'g')) unit = 1024.0 * 1024 * 1024;
    return n > 0 ? static_cast<uint64_t>(n * unit) : uint64_t(0);
  }();
  return cap;
}

class GuardedCPUAllocator final : public c10::Allocator {
 public:
  explicit GuardedCPUAllocator(c10::Allocator* base) : base_(base) {}

#if ANATOMY_TORCH_AT_LEAST(2, 3)
  c10::DataPtr allocate(size_t n) override {
    check(n);
    return base_->allocate(n);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#else
  c10::DataPtr allocate(size_t n) const override {
    check(n);
    return base_->allocate(n);
  }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return base_->raw_deleter(); }

 private:
  static void check(size_t n) {
    uint64_t cap = max_allocation();
    if (cap > 0 && n > cap)
      TORCH_CHECK(false, "cannot allocate ", gib(n), " (", n, " bytes): more than the ", gib(cap),
                  " a single allocation may take ($ANATOMY_MAX_ALLOCATION)");
    if (n < kCheckFrom) return;
    uint64_t available = available_memory();
    if (available > 0 && n > available) {
      TORCH_CHECK(false, "cannot allocate ", gib(n), " (", n, " bytes): this machine has ", gib(available),
                  " of memory left (RAM available and free swap", cgroup_limited() ? ", within its cgroup's limit" : "",
                  ")");
    }
  }
  static bool cgroup_limited() { return cgroup_value("/sys/fs/cgroup/memory.max") > 0; }
  c10::Allocator* base_;
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
  c10::SetCPUAllocator(&guard, /*priority=*/1);
}

}  // namespace anatomy
