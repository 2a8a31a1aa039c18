// host/cuda/cuda.h with a CUDA LibTorch: ATen's CUDA API (c10::cuda, the
// caching allocator, at::cuda::CUDAGraph). Compiled only when LibTorch has
// CUDA; it runs on a machine without a GPU, where is_available() is false and
// the rest throws NotAvailable.
#include "host/cuda/cuda.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <optional>

namespace anatomy::cuda {
namespace {

void require() {
  if (!is_available())
    throw NotAvailable("no GPU is visible (this LibTorch has CUDA " + version() + ", but no device answers)");
}

c10::DeviceIndex device_of(int device) {
  require();
  if (device < 0) return c10::cuda::current_device();
  if (device >= device_count())
    throw std::out_of_range("device " + std::to_string(device) + " does not exist (" +
                            std::to_string(device_count()) + " visible)");
  return static_cast<c10::DeviceIndex>(device);
}

int64_t stat(int device, bool peak, bool reserved) {
  auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_of(device));
  const auto& s = (reserved ? stats.reserved_bytes : stats.allocated_bytes)[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  return peak ? s.peak : s.current;
}

}  // namespace

bool built() { return true; }
std::string version() {
  return std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
}
bool is_available() { return c10::cuda::device_count() > 0; }
int device_count() { return c10::cuda::device_count(); }

void synchronize(int device) {
  c10::cuda::CUDAGuard guard(device_of(device));
  c10::cuda::device_synchronize();
}

int64_t memory_allocated(int device) { return stat(device, false, false); }
int64_t max_memory_allocated(int device) { return stat(device, true, false); }
int64_t memory_reserved(int device) { return stat(device, false, true); }
void reset_peak_memory_stats(int device) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(device_of(device));
}

struct Graph::Impl {
  at::cuda::CUDAGraph graph;
  std::optional<c10::cuda::CUDAStreamGuard> on_side_stream;  // held from capture_begin to capture_end
  bool captured = false;
};

Graph::Graph() {
  require();
  impl_ = std::make_unique<Impl>();
}
Graph::~Graph() = default;

void Graph::capture_begin() {
  if (impl_->on_side_stream) throw std::logic_error("CUDAGraph:capture_begin: a capture is already under way");
  if (impl_->captured) throw std::logic_error("CUDAGraph:capture_begin: this graph holds a capture already (reset it first)");
  // Capture cannot happen on the default stream; work queued before it must finish first.
  c10::cuda::device_synchronize();
  impl_->on_side_stream.emplace(c10::cuda::getStreamFromPool());
  impl_->graph.capture_begin();
}

void Graph::capture_end() {
  if (!impl_->on_side_stream) throw std::logic_error("CUDAGraph:capture_end: no capture under way");
  impl_->graph.capture_end();
  impl_->on_side_stream.reset();
  impl_->captured = true;
}

void Graph::replay() {
  if (!impl_->captured) throw std::logic_error("CUDAGraph:replay: nothing captured yet");
  impl_->graph.replay();
}

void Graph::reset() {
  if (impl_->on_side_stream) {
    // Abandoning a capture: end it so the stream leaves capture mode, then drop it.
    try { impl_->graph.capture_end(); } catch (const std::exception&) {}
    impl_->on_side_stream.reset();
  }
  impl_->graph.reset();
  impl_->captured = false;
}

bool Graph::capturing() const { return impl_->on_side_stream.has_value(); }
bool Graph::captured() const { return impl_->captured; }

}  // namespace anatomy::cuda
