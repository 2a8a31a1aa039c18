// Process-wide settings that sit below Lua: the default device, CPU threads
// and the RNG seed. Kept free of Lua so C++ code and tests can use them alone.
#pragma once
#include <c10/core/Device.h>
#include <cstdint>
#include <optional>
#include <string>

namespace anatomy {

/// What the command line and the environment asked for; empty means "decide".
struct RuntimeOptions {
  /// "cpu", "cuda", "cuda:N", "accel"; empty: $ANATOMY_DEVICE, else cuda when present, else cpu.
  std::string device;
  /// CPU threads; 0: $ANATOMY_THREADS, else the machine's core count.
  int64_t threads = 0;
  /// Seed for torch's generators and math.random; unset: LibTorch's default.
  std::optional<uint64_t> seed;
};

/// Parses "cpu", "cuda", "cuda:1", "accel" (the test device in CPU memory that
/// refuses mixed devices as CUDA does: host/accel/accel.h) and "meta" (tensors with shapes and dtypes
/// but no data: a whole model runs on it without memory, and any tensor a
/// function makes on the CPU instead of its input's device is caught there);
/// throws std::invalid_argument with a readable reason.
c10::Device parse_device(const std::string& name);
/// True when name starts like a device ("cpu", "cuda...", "accel...", "meta") rather than
/// a dtype: how x:to(s) and m:to(s) tell the two apart.
bool is_device_name(const std::string& name);
/// True when LibTorch was built with CUDA and at least one GPU is visible.
bool cuda_available();
/// The most CPU threads set_num_threads takes: 4 per core of this machine
/// (at least 8). More only slows the work down, and past a few thousand
/// OpenMP's thread start-up hangs the process.
int64_t max_num_threads();
/// at::set_num_threads after checking n against 1..max_num_threads(); throws
/// std::invalid_argument naming both sides otherwise.
void set_num_threads(int64_t n);
/// Bytes of memory this process can still get: RAM available plus free swap,
/// and no more than its cgroup's limit leaves; 0 when it cannot be told.
uint64_t available_memory();
/// Puts a check in front of LibTorch's CPU allocator (host/memory_guard.cpp):
/// a request of 1 GiB or more beyond available_memory() is a c10::Error
/// naming both sizes, not an overcommitted allocation the OOM killer ends.
void install_memory_guard();
/// The guard's pool of freed CPU buffers of 1 MiB and more, kept for reuse
/// (a buffer the kernel must clear anew costs as much as a matmul over it).
struct CPUPoolStats {
  uint64_t pooled_bytes = 0;   ///< freed bytes the pool holds now
  uint64_t pooled_blocks = 0;
  uint64_t limit = 0;          ///< the most it holds ($ANATOMY_CPU_CACHE_LIMIT)
  uint64_t reused = 0;         ///< large requests served from the pool
  uint64_t fresh = 0;          ///< large requests that needed new memory
};
CPUPoolStats cpu_pool_stats();
/// Frees every pooled buffer; returns the bytes given back.
uint64_t cpu_pool_empty();
/// Sets the pool's limit (bytes; 0: pool nothing), freeing it if it holds more.
void cpu_pool_set_limit(uint64_t bytes);
/// Applies options: sets threads, seeds, installs the memory guard, and picks the default device.
void configure_runtime(const RuntimeOptions& options);
/// The device that factories and models use when none is named.
c10::Device default_device();
void set_default_device(c10::Device device);
/// The canonical name of a device ("cpu", "cuda:0").
std::string device_name(c10::Device device);
/// While one is alive (on this thread), token ids and class targets that live
/// on a GPU are not range-checked (Embedding, cross_entropy, index ops): the
/// check reads them back to the host, a wait per call, and cannot run inside a
/// CUDA graph. The caller vouches for the ids
/// (train.fit checks its corpus's ids once against the model, then trains
/// under one). CPU ids are always checked.
class TrustedIds {
 public:
  TrustedIds();
  ~TrustedIds();
  TrustedIds(const TrustedIds&) = delete;
  TrustedIds& operator=(const TrustedIds&) = delete;
  static bool active();

 private:
  bool previous_;
};

/// While one is alive (on this thread), built-in blocks allocate their
/// parameters without drawing initial values: a checkpoint fills them next
/// (models.from_pretrained), so the random draw would be wasted time.
class SkipInit {
 public:
  SkipInit();
  ~SkipInit();
  SkipInit(const SkipInit&) = delete;
  SkipInit& operator=(const SkipInit&) = delete;
  static bool active();

 private:
  bool previous_;
};

/// LibTorch's version, e.g. "1.13.0".
std::string torch_version();
/// anatomy's cache folder (trained tokenizers, the default corpus):
/// $XDG_CACHE_HOME/anatomy, else $HOME/.cache/anatomy, else /tmp/.cache/anatomy.
/// Not created here.
std::string cache_dir();

}  // namespace anatomy
