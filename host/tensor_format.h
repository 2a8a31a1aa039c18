// Text form of a tensor, following PyTorch's printing rules (precision 4,
// scientific notation when magnitudes spread, summarised past a threshold),
// under a one-line header with shape, dtype, device and autograd state.
#pragma once
#include <ATen/core/Tensor.h>
#include <string>

namespace anatomy {

/// PyTorch's print options (torch.set_printoptions), with its defaults.
struct PrintOptions {
  int precision = 4;     ///< digits after the decimal point
  int64_t threshold = 1000;  ///< more elements than this are summarised
  int64_t edgeitems = 3;     ///< items kept at each end of a summarised dimension
  int linewidth = 80;    ///< characters per line
  int sci_mode = -1;     ///< -1: decide per tensor; 0: never; 1: always
};

PrintOptions& print_options();

/// "float32", "int64", ...: the names anatomy uses for dtypes.
const char* dtype_name(c10::ScalarType type);
/// "2x3" ("scalar" for a 0-dim tensor).
std::string shape_string(at::IntArrayRef sizes);
/// The body as PyTorch prints it without keyword suffixes: "tensor([1., 2.])".
std::string format_tensor_body(const at::Tensor& t);
/// "[Tensor 2x3 float32 cpu requires_grad grad_fn=AddBackward0]"
std::string format_tensor_header(const at::Tensor& t);
/// Header and body on two lines; what tostring(x) returns.
std::string format_tensor(const at::Tensor& t);

}  // namespace anatomy
