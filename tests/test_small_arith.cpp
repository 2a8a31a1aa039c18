// The small-tensor fast path (host/small_arith.h) against ATen: same
// values bit for bit, same dtype and shape, and ATen's path for every case it
// must not take.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "host/small_arith.h"

using anatomy::small_arith;

namespace {

at::Tensor aten(char op, const at::Tensor& a, const at::Tensor& b) {
  switch (op) {
    case '+': return at::add(a, b);
    case '-': return at::sub(a, b);
    case '*': return at::mul(a, b);
    default: return at::div(a, b);
  }
}

bool bitwise_equal(const at::Tensor& x, const at::Tensor& y) {
  return x.scalar_type() == y.scalar_type() && x.sizes() == y.sizes() && x.is_contiguous() && y.is_contiguous() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// awkward values: signed zeros, infinities, NaN, subnormals, huge and tiny
at::Tensor awkward(at::ScalarType dtype, int64_t n, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor t = at::randn({n}, at::TensorOptions().dtype(dtype)) * 1e3;
  const double specials[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1e-310, -3e-39, 1e38, 1.0 / 3};
  for (int64_t i = 0; i < n; i += 3) t[i] = specials[(i / 3 + seed) % 9];
  return t;
}

}  // namespace

TEST_CASE("small arithmetic equals ATen's bit for bit", "[small_arith]") {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    for (char op : {'+', '-', '*', '/'}) {
      for (int64_t n : {1, 5, 16}) {
        at::Tensor a = awkward(dtype, n, 1), b = awkward(dtype, n, 2);
        auto fast = small_arith(op, a, b);
        REQUIRE(fast);
        CHECK(bitwise_equal(*fast, aten(op, a, b)));
        CHECK_FALSE(fast->requires_grad());
        for (double v : {0.1, -2.0, 1e-40, 3e39, 0.0}) {
          auto right = small_arith(op, a, v, false), left = small_arith(op, a, v, true);
          REQUIRE(right);
          REQUIRE(left);
          at::Tensor s = at::scalar_tensor(v, at::kDouble);
          s.unsafeGetTensorImpl()->set_wrapped_number(true);  // as a Lua number reaches ATen
          CHECK(bitwise_equal(*right, aten(op, a, s)));
          CHECK(bitwise_equal(*left, aten(op, s, a)));
        }
      }
    }
  }
  at::Tensor i = at::tensor(std::vector<int64_t>{INT64_MAX, -5, 7}), j = at::tensor(std::vector<int64_t>{1, -9, 0});
  for (char op : {'+', '-', '*'}) CHECK(bitwise_equal(*small_arith(op, i, j), aten(op, i, j)));  // wraps as ATen does
  at::Tensor zero_dim = at::scalar_tensor(2.5), other = at::scalar_tensor(-1.0);
  CHECK(bitwise_equal(*small_arith('*', zero_dim, other), at::mul(zero_dim, other)));
  CHECK(small_arith('*', zero_dim, other)->dim() == 0);
}

TEST_CASE("small arithmetic leaves every other case to ATen", "[small_arith]") {
  at::Tensor a = at::ones({3}), b = at::ones({3});
  CHECK_FALSE(small_arith('+', at::ones({17}), at::ones({17})));  // too many elements
  CHECK_FALSE(small_arith('+', a, at::ones({1})));                // broadcasting
  CHECK_FALSE(small_arith('+', a, at::ones({3}, at::kDouble)));   // type promotion
  CHECK_FALSE(small_arith('/', at::ones({3}, at::kLong), at::ones({3}, at::kLong)));  // int / int is float
  CHECK_FALSE(small_arith('*', at::ones({3}, at::kLong), 2.0, false));                // numbers: floating only
  CHECK_FALSE(small_arith('%', a, b));
  at::Tensor g = at::ones({3}).requires_grad_();
  CHECK_FALSE(small_arith('+', g, b));  // autograd records the op
  CHECK_FALSE(small_arith('+', a, 1.0, true).value().requires_grad());
  at::Tensor strided = at::ones({3, 2}).t();
  CHECK_FALSE(small_arith('+', strided, strided));  // not contiguous
  at::Tensor c = at::ones({2}, at::kComplexFloat);
  CHECK_FALSE(small_arith('+', c.conj(), c.conj()));                                  // conjugate bit
  CHECK_FALSE(small_arith('+', at::ones({2}, at::kHalf), at::ones({2}, at::kHalf)));  // other dtypes
  // an operand that requires grad still gets its graph through ATen
  at::Tensor y = at::add(g, b);
  CHECK(y.requires_grad());
}
