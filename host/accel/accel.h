// accel: a second device that lives in CPU memory, so that every CI run can
// check that the library keeps a model's tensors on the model's device. It is
// LibTorch's PrivateUse1 backend under the name "accel" (`--device=accel`,
// `m:to('accel')`); its kernels are the CPU's, reached through a boxed
// fallback that first refuses, with CUDA's message, an operation whose tensors
// sit on two devices. A CPU tensor mixed into a model on a GPU fails here too.
#pragma once

#include <string>

namespace anatomy::accel {

/// The device's name, as `x.device` prints it ("accel:0") without the index.
inline const char* const kName = "accel";

/// Registers the backend's name, allocator, device guard, hooks and kernels;
/// idempotent. False where this LibTorch cannot host it (before 2.1) or where
/// `cuda_present`: LibTorch keeps one accelerator a process, and a registered
/// PrivateUse1 backend takes CUDA's place in it (at::getAccelerator prefers
/// it), so the autograd engine would look for accel's streams on CUDA tensors
/// and pin_memory for accel's pinned allocator. Then "accel" is an error
/// saying why.
bool install(bool cuda_present);
/// True once install() succeeded.
bool available();
/// Why accel is unavailable, for an error message; empty when it is available.
std::string unavailable_reason();
/// True (on this thread) while accel's own code runs inside an operator: its
/// fallback's conversions and CPU kernels, which a GPU would do in one kernel.
/// host/profile's counts leave them out.
bool in_device_code();

}  // namespace anatomy::accel
