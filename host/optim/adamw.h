// The optimizer: LibTorch's AdamW over two parameter groups (with and without
// weight decay), its learning rate, and its per-parameter state read and
// written in parameter order, for checkpoints. No Lua here: bindings/optim.cpp
// exposes it, lua/anatomy/optim.lua wraps it as optim.AdamW.
#pragma once
#include <ATen/core/Tensor.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace anatomy::optim {

/// AdamW's settings; each is checked once, by AdamW's constructor.
struct AdamWOptions {
  /// learning rate, >= 0
  AdamWOptions& lr(double v) { lr_ = v; return *this; }
  /// the moments' decay rates, each in [0, 1)
  AdamWOptions& betas(double b1, double b2) { beta1_ = b1; beta2_ = b2; return *this; }
  /// added to the denominator, > 0
  AdamWOptions& eps(double v) { eps_ = v; return *this; }
  /// decoupled weight decay of the decayed group, >= 0
  AdamWOptions& weight_decay(double v) { weight_decay_ = v; return *this; }

  double lr_ = 1e-3, beta1_ = 0.9, beta2_ = 0.999, eps_ = 1e-8, weight_decay_ = 0.01;
};

/// One parameter's moments and step count (absent before its first step).
struct ParamState {
  int64_t step = 0;
  at::Tensor exp_avg, exp_avg_sq;
};

/// An invalid setting or state; `field` names it (as the Lua options do).
struct OptionError : std::invalid_argument {
  OptionError(std::string field, const std::string& message) : std::invalid_argument(message), field(std::move(field)) {}
  std::string field;
};

class AdamW {
 public:
  /// Weight decay applies to `decayed` only. Throws OptionError for a bad
  /// setting or when both groups are empty.
  AdamW(std::vector<at::Tensor> decayed, std::vector<at::Tensor> plain, const AdamWOptions& options);

  /// One step: LibTorch's AdamW on the CPU; on a device (cuda, accel)
  /// PyTorch's fused AdamW kernel, one call for a whole group instead of a
  /// dozen operators a parameter (the same update up to rounding, as
  /// torch.optim.AdamW(fused=True)); in capturable mode the update made of
  /// tensor ops only (see set_capturable).
  void step();
  /// Drops every gradient (PyTorch's set_to_none).
  void zero_grad();
  /// Sets the learning rate of both groups (>= 0).
  void set_lr(double lr);
  double lr() const;
  /// Every parameter's state, in parameter order (decayed group first).
  std::vector<std::optional<ParamState>> state() const;
  /// The inverse of state(): tensors are copied to each parameter's device and
  /// dtype. Throws OptionError("state", ...) naming the parameter whose moments do not match its shape.
  void load_state(const std::vector<std::optional<ParamState>>& states);
  /// The number of parameters.
  size_t size() const;

  /// Capturable mode (PyTorch's `capturable`): the step count and the learning
  /// rate live in tensors on the parameters' device, and a step reads nothing
  /// back to the host, so it can be recorded in a CUDA graph and replayed.
  /// The update is AdamW's, made of tensor ops (equal to LibTorch's up to
  /// rounding); the step count is one for all parameters. Turning it on gives
  /// every parameter a state (zero moments at step 0 when it had none) and
  /// needs their step counts equal; turning it off writes the count back.
  void set_capturable(bool on);
  bool capturable() const { return capturable_; }

 private:
  void capturable_step();
  bool fused_step();
  std::unique_ptr<torch::optim::AdamW> adamw_;
  // the fused kernel's step counts: a float32 scalar a parameter on its
  // device, kept equal to the state's count (dropped when states are loaded)
  std::unordered_map<const void*, at::Tensor> fused_steps_;
  bool capturable_ = false;
  at::Tensor step_t_, lr_t_;  // capturable mode: float64 scalars on the parameters' device
};

}  // namespace anatomy::optim
