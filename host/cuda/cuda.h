// CUDA, as far as anatomy uses it beyond tensors: availability, device
// synchronization, the caching allocator's statistics and CUDA graphs. No CUDA
// header here: with a CUDA LibTorch, cuda.cpp implements it with ATen's CUDA
// API; without one, none.cpp answers "not available" and every other call
// throws NotAvailable with the reason.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace anatomy::cuda {

/// Thrown by every call that needs CUDA when this build or machine has none.
struct NotAvailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// True when this LibTorch was built with CUDA (whether or not a GPU is visible).
bool built();
/// The CUDA version this LibTorch was built with ("13.0"), or "" without CUDA.
std::string version();
/// True when built with CUDA and at least one GPU is visible.
bool is_available();
/// Visible GPUs (0 without CUDA).
int device_count();
/// Waits for every kernel queued on `device` (-1: the current one).
void synchronize(int device = -1);

/// The caching allocator's counters for `device` (-1: the current one), bytes.
int64_t memory_allocated(int device = -1);
int64_t max_memory_allocated(int device = -1);
int64_t memory_reserved(int device = -1);
void reset_peak_memory_stats(int device = -1);

/// While one is alive (on this thread), the current stream of `device` (-1:
/// the current one) is a side stream from LibTorch's pool instead of the
/// legacy default stream: it first waits for the work queued before it, and
/// when it ends the stream it replaced waits for its work. A CUDA graph is
/// captured off the legacy stream, and the steps that warm it up run there
/// too, as PyTorch's torch.cuda.graph asks: autograd keeps each parameter's
/// gradient accumulator on the stream of its first backward, and a captured
/// backward that joins the legacy stream fails.
class SideStream {
 public:
  explicit SideStream(int device = -1);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A CUDA graph: the kernels issued between capture_begin and capture_end are
/// recorded and run again by replay, on the same memory. Capture happens on
/// the current stream when it is a side stream (a SideStream), else on one
/// from the pool; never on the legacy default stream. The default CUDA
/// generator is registered with the graph (random ops replay with fresh
/// numbers). A capture that fails (an operation that waits for the host, a
/// copy to the CPU) is ended and its generator state restored by reset(), so
/// that random numbers work again afterwards; capture_end after a failed
/// capture_begin reports the first error. Tensors made during capture live
/// in the graph's pool.
class Graph {
 public:
  Graph();
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void capture_begin();
  void capture_end();
  void replay();
  void reset();
  bool capturing() const;
  bool captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace anatomy::cuda
