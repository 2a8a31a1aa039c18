// Operator and synchronisation counts (see op_count.h).
#include "host/profile/op_count.h"

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>

#include <cstring>
#include <mutex>
#include <stdexcept>

#include "host/accel/accel.h"

namespace anatomy::profile {
namespace {

std::mutex g_mutex;
OpCounts* g_counts = nullptr;  // the live counter's, under g_mutex

// On a device, not the CPU (and not meta, which holds no values to wait for).
bool on_device(const c10::IValue& v) {
  if (!v.isTensor()) return false;
  const at::Tensor& t = v.toTensor();
  return t.defined() && !t.is_cpu() && !t.is_meta();
}

// Operators whose output size is read from a device tensor's values.
bool data_dependent(const char* name) {
  static const char* const names[] = {"aten::nonzero", "aten::masked_select", "aten::_unique2", "aten::unique_consecutive",
                                      "aten::unique_dim", "aten::repeat_interleave"};
  for (const char* n : names)
    if (std::strcmp(name, n) == 0) return true;
  return false;
}

bool is_sync(const at::RecordFunction& fn) {
  const char* name = fn.name();
  auto in = fn.inputs();
  if (std::strcmp(name, "aten::_local_scalar_dense") == 0) return !in.empty() && on_device(in[0]);
  if (std::strcmp(name, "aten::copy_") == 0 && in.size() >= 2 && in[0].isTensor() && in[1].isTensor()) {
    // copy_(self, src, non_blocking): into the CPU from a device waits for
    // the device; into a device from the CPU waits too unless non_blocking
    // (PyTorch synchronises the stream after a blocking host-to-device copy)
    bool non_blocking = in.size() >= 3 && in[2].isBool() && in[2].toBool();
    if (in[0].toTensor().is_cpu() && on_device(in[1])) return true;
    return on_device(in[0]) && in[1].toTensor().is_cpu() && !non_blocking;
  }
  return data_dependent(name) && !in.empty() && on_device(in[0]);
}

// Inside accel's fallback the kernels are the CPU's, and their tensors the
// CPU's: what reads a device tensor back on a GPU reads a CPU one there. One
// such read is counted as the device would have it: the LAPACK status check
// of every linalg decomposition (eigh, svd, cholesky, inv, ...), which on CUDA
// reads its info tensor back with an item() once a call.
void count_device_code_sync(const char* name) {
  if (std::strcmp(name, "aten::_linalg_check_errors") != 0) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_counts) return;
  ++g_counts->syncs;
  ++g_counts->syncs_by_name[name];
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  const char* name = fn.name();
  if (accel::in_device_code()) {
    count_device_code_sync(name);
    return nullptr;
  }
  if (std::strncmp(name, "aten::", 6) != 0) return nullptr;
  bool sync = is_sync(fn);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_counts) return nullptr;
  ++g_counts->ops;
  ++g_counts->by_name[name];
  if (sync) {
    ++g_counts->syncs;
    ++g_counts->syncs_by_name[name];
  }
  return nullptr;
}

}  // namespace

OpCounter::OpCounter() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_counts) throw std::logic_error("an operator count is already under way (one at a time)");
    g_counts = new OpCounts();
  }
  handle_ = at::addGlobalCallback(
      at::RecordFunctionCallback(on_start).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
}

OpCounter::~OpCounter() {
  at::removeCallback(handle_);
  std::lock_guard<std::mutex> lock(g_mutex);
  delete g_counts;
  g_counts = nullptr;
}

OpCounts OpCounter::counts() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return *g_counts;
}

}  // namespace anatomy::profile
