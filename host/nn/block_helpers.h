// What the built-in blocks' files share (blocks.cpp, attention.cpp): input
// checks that say what they expected, parameter making, and the padding
// mask's positions. Not part of the blocks' interface (blocks.h).
#pragma once
#include <ATen/ATen.h>

#include <string>

#include "host/nn/blocks.h"
#include "host/runtime.h"
#include "host/tensor_format.h"

namespace anatomy::nn::detail {

inline std::string bool_str(bool b) { return b ? "true" : "false"; }

inline std::string number_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

inline void require_positive(int64_t v, const char* field) {
  if (v < 1) throw OptionError(field, std::string(field) + " must be positive, got " + std::to_string(v));
}

inline void require_positive(double v, const char* field) {
  if (!(v > 0)) throw OptionError(field, std::string(field) + " must be positive, got " + number_str(v));
}

// Parameters are made on the default device, like every factory.
inline at::TensorOptions param_options() { return at::TensorOptions().dtype(at::kFloat).device(default_device()); }

// A parameter's initial values, unless a checkpoint is about to fill it (SkipInit).
inline at::Tensor init_uniform(at::Tensor t, double bound) { return SkipInit::active() ? t : t.uniform_(-bound, bound); }
inline at::Tensor init_normal(at::Tensor t) { return SkipInit::active() ? t : t.normal_(); }

inline void require_last_dim(const at::Tensor& x, int64_t dim, const char* what) {
  if (x.dim() == 0 || x.size(-1) != dim)
    throw InputError(std::string(what) + " expects inputs whose last dimension is " + std::to_string(dim) +
                     ", got shape " + shape_string(x.sizes()));
  if (!at::isFloatingType(x.scalar_type()))
    throw InputError(std::string(what) + " expects a floating-point input, got " + dtype_name(x.scalar_type()));
}

inline void require_btc(const at::Tensor& x, int64_t dim, const char* what) {
  if (x.dim() != 3 || (dim > 0 && x.size(2) != dim))
    throw InputError(std::string(what) + " expects input of shape (B, T, " + (dim > 0 ? std::to_string(dim) : "C") +
                     "), got " + shape_string(x.sizes()));
  if (!at::isFloatingType(x.scalar_type()))
    throw InputError(std::string(what) + " expects a floating-point input, got " + dtype_name(x.scalar_type()));
}

// The padding mask a block was given, against the positions it covers
// (B, Tk): x's, and while caching the cached ones before them.
inline void check_mask(const at::Tensor& mask, int64_t B, int64_t Tk, const char* what) {
  if (mask.dim() != 2 || mask.size(0) != B || mask.size(1) != Tk)
    throw InputError(std::string(what) + ": the attention mask is " + shape_string(mask.sizes()) + ", the input needs (" +
                     std::to_string(B) + ", " + std::to_string(Tk) + ")");
}

// Position ids (B, T) of the last T of the mask's positions: how many real
// tokens come before each (padding counts none, so left padding moves none).
inline at::Tensor positions_of(const at::Tensor& mask, int64_t T) {
  at::Tensor p = (mask.to(at::kLong).cumsum(1) - 1).clamp_min(0);
  return p.narrow(1, p.size(1) - T, T);
}

}  // namespace anatomy::nn::detail
