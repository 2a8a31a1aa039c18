// Arithmetic on tensors of a few elements without the dispatcher.
//
// For a one-element `a + b`, at::add spends ~5,800 instructions on dispatch,
// type promotion, broadcasting and TensorIterator set-up around one addition.
// When the case is the plain one (CPU, contiguous, same shape and dtype, no
// autograd, no conjugate/negative/zero-tensor bits) the answer is known without
// that work: a fresh contiguous tensor of the same shape and dtype holding the
// elementwise IEEE result, which is what ATen's kernels compute too (add and
// sub with alpha 1 are exact in either form), so the values are bit-identical.
// Everything else returns nothing and goes to ATen.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>

namespace anatomy {

/// Largest element count taken by the fast path; bigger tensors go to ATen,
/// whose vectorised loops win once there is work to amortise their set-up.
constexpr int64_t kSmallArithMaxNumel = 16;

/// a op b for op one of '+', '-', '*', '/' when both are plain small tensors
/// of the same shape and dtype (float32, float64 or int64; '/' floating only);
/// otherwise std::nullopt.
std::optional<at::Tensor> small_arith(char op, const at::Tensor& a, const at::Tensor& b);

/// a op v (or v op a when number_first) for a plain small floating tensor and
/// a Lua number; the number is rounded to a's dtype first, as ATen does with a
/// wrapped number of the same category. std::nullopt when not applicable.
std::optional<at::Tensor> small_arith(char op, const at::Tensor& a, double v, bool number_first);

}  // namespace anatomy
