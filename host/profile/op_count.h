// Counting what one piece of work asks of LibTorch: every operator the
// dispatcher runs (nested ones included, as PyTorch's profiler lists them)
// and the host synchronisations among them: reads of a device tensor back to
// the host (item, a copy to the CPU), blocking copies from the CPU to a device
// (PyTorch waits for the stream after one), and operators whose output size
// depends on a device tensor's values (nonzero, masked_select, unique). Through
// LibTorch's RecordFunction callbacks, on every thread (the autograd engine
// runs a device's backward on a thread of its own).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace anatomy::profile {

/// What a counter saw.
struct OpCounts {
  int64_t ops = 0;    ///< operators dispatched ("aten::..." events)
  int64_t syncs = 0;  ///< of which host synchronisations
  std::map<std::string, int64_t> by_name;        ///< ops per operator name
  std::map<std::string, int64_t> syncs_by_name;  ///< syncs per operator name
};

/// Counts from construction to counts(); one counter at a time in a process
/// (a second one throws std::logic_error). Work the accel device does inside
/// an operator (its fallback's conversions) is the device's, not counted.
class OpCounter {
 public:
  OpCounter();
  ~OpCounter();
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;
  OpCounts counts() const;

 private:
  uint64_t handle_;
};

}  // namespace anatomy::profile
