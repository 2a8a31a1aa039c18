// Small-tensor arithmetic (see small_arith.h).
#include "host/small_arith.h"

#include <ATen/EmptyTensor.h>

#include <cstdint>

namespace anatomy {
namespace {

// The dispatch keys of a tensor made by a CPU factory: dense CPU plus the
// autograd and inplace-or-view keys every tensor carries. Anything more
// (conjugate, negative, zero-tensor, sparse, a subclass) takes ATen's path.
c10::DispatchKeySet plain_cpu_keys() {
  static const c10::DispatchKeySet keys = at::detail::empty_cpu({1}, at::kFloat).key_set();
  return keys;
}

bool plain_small(const at::Tensor& t) {
  return t.defined() && t.key_set() == plain_cpu_keys() && t.numel() <= kSmallArithMaxNumel &&
         !t.requires_grad() && t.is_contiguous();
}

template <typename T>
T apply(char op, T x, T y) {
  switch (op) {
    case '+': return x + y;
    case '-': return x - y;
    case '*': return x * y;
    default: return x / y;
  }
}

// Two's-complement wrap-around, as ATen's integer kernels do on overflow
// (signed overflow is undefined in C++, so compute unsigned).
template <>
int64_t apply<int64_t>(char op, int64_t x, int64_t y) {
  auto ux = static_cast<uint64_t>(x), uy = static_cast<uint64_t>(y);
  switch (op) {
    case '+': return static_cast<int64_t>(ux + uy);
    case '-': return static_cast<int64_t>(ux - uy);
    default: return static_cast<int64_t>(ux * uy);
  }
}

template <typename T>
at::Tensor run(char op, const at::Tensor& a, const T* x, const T* y, bool x_scalar, bool y_scalar) {
  at::Tensor out = at::detail::empty_cpu(a.sizes(), a.scalar_type());
  T* o = out.data_ptr<T>();
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) o[i] = apply<T>(op, x[x_scalar ? 0 : i], y[y_scalar ? 0 : i]);
  return out;
}

bool known_op(char op) { return op == '+' || op == '-' || op == '*' || op == '/'; }

}  // namespace

std::optional<at::Tensor> small_arith(char op, const at::Tensor& a, const at::Tensor& b) {
  if (!known_op(op) || !plain_small(a) || !plain_small(b)) return std::nullopt;
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return std::nullopt;
  switch (a.scalar_type()) {
    case at::kFloat: return run<float>(op, a, a.data_ptr<float>(), b.data_ptr<float>(), false, false);
    case at::kDouble: return run<double>(op, a, a.data_ptr<double>(), b.data_ptr<double>(), false, false);
    case at::kLong:
      if (op == '/') return std::nullopt;  // true division promotes to float
      return run<int64_t>(op, a, a.data_ptr<int64_t>(), b.data_ptr<int64_t>(), false, false);
    default: return std::nullopt;
  }
}

std::optional<at::Tensor> small_arith(char op, const at::Tensor& a, double v, bool number_first) {
  if (!known_op(op) || !plain_small(a)) return std::nullopt;
  switch (a.scalar_type()) {
    case at::kFloat: {
      const float s = static_cast<float>(v);
      const float* p = a.data_ptr<float>();
      return number_first ? run<float>(op, a, &s, p, true, false) : run<float>(op, a, p, &s, false, true);
    }
    case at::kDouble: {
      const double* p = a.data_ptr<double>();
      return number_first ? run<double>(op, a, &v, p, true, false) : run<double>(op, a, p, &v, false, true);
    }
    default: return std::nullopt;
  }
}

}  // namespace anatomy
