// host/cuda/cuda.h with a CUDA LibTorch: ATen's CUDA API (c10::cuda, the
// caching allocator, at::cuda::CUDAGraph). Compiled only when LibTorch has
// CUDA; it runs on a machine without a GPU, where is_available() is false and
// the rest throws NotAvailable.
#include "host/cuda/cuda.h"

#include <ATen/Context.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <optional>

namespace anatomy::cuda {
namespace {

void require() {
  if (!is_available())
    throw NotAvailable("no GPU is visible (this LibTorch has CUDA " + version() + ", but no device answers)");
  // CUDA's state (the caching allocator among it) is made on first use, as
  // torch.cuda's calls make it: before it, the allocator's statistics refuse
  // every device ("Invalid device argument").
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
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

struct SideStream::Impl {
  c10::cuda::CUDAStream previous;
  c10::cuda::CUDAStream side;
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  Impl(c10::cuda::CUDAStream p, c10::cuda::CUDAStream s) : previous(p), side(s) {}
};

namespace {
// `waiting` waits for the work queued on `done` so far (an event, no host wait).
void stream_wait(const c10::cuda::CUDAStream& waiting, const c10::cuda::CUDAStream& done) {
  at::cuda::CUDAEvent event;
  event.record(done);
  event.block(waiting);
}
}  // namespace

SideStream::SideStream(int device) {
  c10::DeviceIndex d = device_of(device);
  auto previous = c10::cuda::getCurrentCUDAStream(d);
  impl_ = std::make_unique<Impl>(previous, c10::cuda::getStreamFromPool(false, d));
  stream_wait(impl_->side, previous);
  impl_->guard.emplace(impl_->side);
}

SideStream::~SideStream() {
  impl_->guard.reset();
  try {
    stream_wait(impl_->previous, impl_->side);
  } catch (const std::exception&) {  // a destructor must not throw: the next sync reports a CUDA error
  }
}

struct Graph::Impl {
  std::unique_ptr<at::cuda::CUDAGraph> graph = std::make_unique<at::cuda::CUDAGraph>();
  std::optional<c10::cuda::CUDAStreamGuard> on_side_stream;  // held from capture_begin to capture_end
  bool capturing = false;
  bool captured = false;
  std::string failed_begin;  // why the last capture_begin failed, for capture_end
};

Graph::Graph() {
  require();
  impl_ = std::make_unique<Impl>();
}
Graph::~Graph() = default;

void Graph::capture_begin() {
  if (impl_->capturing) throw std::logic_error("CUDAGraph:capture_begin: a capture is already under way");
  if (impl_->captured) throw std::logic_error("CUDAGraph:capture_begin: this graph holds a capture already (reset it first)");
  impl_->failed_begin.clear();
  // As torch.cuda.graph: the work queued before the capture finishes first,
  // and the capture runs on a side stream (the current one if it is one).
  c10::cuda::device_synchronize();
  auto current = c10::cuda::getCurrentCUDAStream();
  if (current == c10::cuda::getDefaultCUDAStream()) impl_->on_side_stream.emplace(c10::cuda::getStreamFromPool());
  try {
    impl_->graph->capture_begin();
  } catch (const std::exception& e) {
    impl_->failed_begin = e.what();
    impl_->on_side_stream.reset();
    throw;
  }
  impl_->capturing = true;
}

void Graph::capture_end() {
  if (!impl_->capturing)
    throw std::logic_error(impl_->failed_begin.empty()
                               ? std::string("CUDAGraph:capture_end: no capture under way")
                               : "CUDAGraph:capture_end: no capture under way (capture_begin failed: " + impl_->failed_begin + ")");
  try {
    impl_->graph->capture_end();
  } catch (const std::exception&) {
    reset();  // the stream leaves capture mode, the generator its capture state
    throw;
  }
  impl_->on_side_stream.reset();
  impl_->capturing = false;
  impl_->captured = true;
}

void Graph::replay() {
  if (!impl_->captured) throw std::logic_error("CUDAGraph:replay: nothing captured yet");
  impl_->graph->replay();
}

void Graph::reset() {
  if (impl_->capturing) {
    // Abandoning a capture: end the stream's capture (CUDA returns the error
    // that invalidated it, already reported), give the allocator's pool back
    // its stream, and give the default generator a state out of capture mode:
    // LibTorch ends that mode only in a capture_end that succeeds, and until
    // then every random op refuses to run ("Offset increment outside graph
    // capture encountered unexpectedly").
    auto stream = c10::cuda::getCurrentCUDAStream();
    cudaGraph_t abandoned = nullptr;
    if (cudaStreamEndCapture(stream, &abandoned) == cudaSuccess && abandoned) cudaGraphDestroy(abandoned);
    (void)cudaGetLastError();
    try {  // LibTorch's capture_end may have ended the pool's recording before it failed
      c10::cuda::CUDACachingAllocator::endAllocateToPool(stream.device_index(), impl_->graph->pool());
    } catch (const c10::Error&) {
    }
    try {  // and what the abandoned capture allocated goes back
      c10::cuda::CUDACachingAllocator::releasePool(stream.device_index(), impl_->graph->pool());
    } catch (const c10::Error&) {
    }
    auto gen = at::cuda::detail::getDefaultCUDAGenerator(stream.device_index());
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.graphsafe_set_state(gen.clone());
    }
    impl_->on_side_stream.reset();
    impl_->capturing = false;
    impl_->graph = std::make_unique<at::cuda::CUDAGraph>();  // LibTorch's reset() keeps a capture that never ended
  } else {
    impl_->graph->reset();
  }
  impl_->captured = false;
}

bool Graph::capturing() const { return impl_->capturing; }
bool Graph::captured() const { return impl_->captured; }

}  // namespace anatomy::cuda
