// The one place where LibTorch versions differ. anatomy builds against
// Debian's LibTorch 1.13 (CPU, the default) and PyPI's 2.x (with CUDA); every
// difference in the API the two expose is bridged here, and nowhere else.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>  // at::GradMode, at::AutoGradMode (2.x no longer brings it through ATen.h)
#include <ATen/autocast_mode.h>
#include <torch/csrc/api/include/torch/version.h>

#include <string>

#define ANATOMY_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#if ANATOMY_TORCH_AT_LEAST(2, 1)
#include <ATen/ops/scaled_dot_product_attention.h>
#endif

namespace anatomy::compat {

/// The key of a parameter's state in LibTorch's optimizers: its TensorImpl
/// address, as a string in 1.13 and as the pointer itself in 2.x.
#if ANATOMY_TORCH_AT_LEAST(2, 0)
inline void* optimizer_state_key(const at::Tensor& p) { return p.unsafeGetTensorImpl(); }
#else
inline std::string optimizer_state_key(const at::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }
#endif

/// Autocast on `device` (kCPU or kCUDA): bfloat16 or float16 compute of the
/// ops autocast lists. 1.13 has a function per device; 2.4 and later take the
/// device type.
inline void set_autocast(at::DeviceType device, bool enabled, at::ScalarType dtype) {
#if ANATOMY_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device, enabled);
  at::autocast::set_autocast_dtype(device, dtype);
#else
  bool cpu = device == at::kCPU;
  cpu ? at::autocast::set_cpu_enabled(enabled) : at::autocast::set_enabled(enabled);
  cpu ? at::autocast::set_autocast_cpu_dtype(dtype) : at::autocast::set_autocast_gpu_dtype(dtype);
#endif
}
inline bool autocast_enabled(at::DeviceType device) {
#if ANATOMY_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device);
#else
  return device == at::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}
inline at::ScalarType autocast_dtype(at::DeviceType device) {
#if ANATOMY_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device);
#else
  return device == at::kCPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
#endif
}

/// softmax(q kᵀ·scale (0: 1/√d), masked) v as one fused kernel (PyTorch's
/// scaled_dot_product_attention), for (B, H, T, D) q, k, v. `allowed` (bool,
/// true where a query may attend) or `causal` gives the mask. Returns an
/// undefined tensor where this LibTorch has no such kernel (1.13): the caller
/// computes it step by step.
inline at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                                  bool causal, double scale = 0.0) {
#if ANATOMY_TORCH_AT_LEAST(2, 1)
  return at::scaled_dot_product_attention(q, k, v, allowed.defined() ? std::optional<at::Tensor>(allowed) : std::nullopt, 0.0,
                                          causal && !allowed.defined(), scale > 0 ? std::optional<double>(scale) : std::nullopt);
#else
  (void)q, (void)k, (void)v, (void)allowed, (void)causal, (void)scale;
  return at::Tensor();
#endif
}

}  // namespace anatomy::compat
