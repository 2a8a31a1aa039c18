// Process-wide settings: devices, threads, seed (see runtime.h).
#include "host/runtime.h"

#include "host/accel/accel.h"
#include "host/log/log.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/api/include/torch/version.h>

#include <cstdlib>
#include <stdexcept>
#include <thread>

namespace anatomy {
namespace {
c10::Device g_default_device(c10::kCPU);

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n <= 0) {
    log::warn(std::string("ignoring ") + name + "=" + v + " (expected a positive integer)");
    return fallback;
  }
  return static_cast<int>(n);
}
}  // namespace

bool is_device_name(const std::string& name) {
  return name == "cpu" || name == "meta" || name.rfind("cuda", 0) == 0 || name.rfind(accel::kName, 0) == 0;
}

c10::Device parse_device(const std::string& name) {
  if (name == "cpu") return c10::Device(c10::kCPU);
  if (name == "meta") return c10::Device(c10::kMeta);
  if (name.rfind("cuda", 0) == 0) {
    int index = -1;
    if (name.size() > 4) {
      if (name[4] != ':' || name.size() == 5) throw std::invalid_argument("unknown device '" + name + "', expected cpu, cuda, cuda:N, accel or meta");
      std::string digits = name.substr(5);
      for (char c : digits)
        if (c < '0' || c > '9') throw std::invalid_argument("unknown device '" + name + "', expected cpu, cuda, cuda:N, accel or meta");
      index = std::stoi(digits);
    }
    if (!at::hasCUDA())
      throw std::invalid_argument("device '" + name + "' is not available: this LibTorch has no CUDA, or no GPU is visible");
    return index < 0 ? c10::Device(c10::kCUDA) : c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  if (name == "accel" || name == "accel:0") {
    if (!accel::available()) throw std::invalid_argument("device '" + name + "' is not available: " + accel::unavailable_reason());
    return c10::Device(c10::DeviceType::PrivateUse1, 0);
  }
  if (name.rfind("accel:", 0) == 0)
    throw std::invalid_argument("unknown device '" + name + "', accel has one device: accel or accel:0");
  throw std::invalid_argument("unknown device '" + name + "', expected cpu, cuda, cuda:N, accel or meta");
}

bool cuda_available() { return at::hasCUDA(); }

int64_t max_num_threads() {
  int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  return std::max<int64_t>(8, 4 * cores);
}

void set_num_threads(int64_t n) {
  if (n < 1) throw std::invalid_argument("thread count must be positive, got " + std::to_string(n));
  if (n > max_num_threads()) {
    unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    throw std::invalid_argument("thread count " + std::to_string(n) + " is far beyond this machine's " +
                                std::to_string(cores) + " core" + (cores == 1 ? "" : "s") + " (at most " +
                                std::to_string(max_num_threads()) + ")");
  }
  at::set_num_threads(static_cast<int>(n));
}

void configure_runtime(const RuntimeOptions& options) {
  // before any backward: the autograd engine sizes its device threads once;
  // never beside CUDA, whose place a PrivateUse1 backend would take
  accel::install(cuda_available());
  int64_t threads = options.threads > 0 ? options.threads : env_int("ANATOMY_THREADS", 0);
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  set_num_threads(threads);
  install_memory_guard();

  std::string device = options.device;
  if (device.empty()) {
    const char* env = std::getenv("ANATOMY_DEVICE");
    device = env && *env ? env : (cuda_available() ? "cuda" : "cpu");
  }
  set_default_device(parse_device(device));
  if (options.seed) at::manual_seed(*options.seed);
}

namespace {
thread_local bool g_trusted_ids = false;
}
TrustedIds::TrustedIds() : previous_(g_trusted_ids) { g_trusted_ids = true; }
TrustedIds::~TrustedIds() { g_trusted_ids = previous_; }
bool TrustedIds::active() { return g_trusted_ids; }

namespace {
thread_local bool g_skip_init = false;
}
SkipInit::SkipInit() : previous_(g_skip_init) { g_skip_init = true; }
SkipInit::~SkipInit() { g_skip_init = previous_; }
bool SkipInit::active() { return g_skip_init; }

c10::Device default_device() { return g_default_device; }
// As torch.get_default_device(): a device given without an index ("cuda") is
// the current one, so the default names the device tensors report ("cuda:0").
void set_default_device(c10::Device device) {
  if (!device.has_index() && (device.is_cuda() || device.type() == c10::DeviceType::PrivateUse1))
    device = c10::impl::getDeviceGuardImpl(device.type())->getDevice();
  g_default_device = device;
}

std::string device_name(c10::Device device) {
  if (device.is_cpu()) return "cpu";
  return device.str();
}

std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

std::string cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/anatomy";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/anatomy";
}

}  // namespace anatomy
