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

/// A CUDA graph: the kernels issued between capture_begin and capture_end are
/// recorded (on a side stream, as CUDA requires) and run again by replay, on
/// the same memory. Tensors made during capture live in the graph's pool.
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
