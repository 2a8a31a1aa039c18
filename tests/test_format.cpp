// Tensor printing: the body must read exactly as PyTorch 1.13 prints the same
// tensor (expected strings are PyTorch's own output), and the header must
// carry shape, dtype, device and autograd state.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "host/tensor_format.h"

using anatomy::format_tensor_body;
using anatomy::format_tensor_header;

TEST_CASE("tensor bodies print as in PyTorch", "[format]") {
  SECTION("integral floats print with a trailing point") {
    CHECK(format_tensor_body(at::tensor({1.f, 2.f, 3.f})) == "tensor([1., 2., 3.])");
  }
  SECTION("fixed point, aligned") {
    CHECK(format_tensor_body(at::tensor({1.5f, -2.25f, 3.125f, 4.0f}).reshape({2, 2})) ==
          "tensor([[ 1.5000, -2.2500],\n        [ 3.1250,  4.0000]])");
  }
  SECTION("scientific notation when magnitudes spread") {
    CHECK(format_tensor_body(at::tensor({1e-5f, 1.0f})) == "tensor([1.0000e-05, 1.0000e+00])");
  }
  SECTION("summarised past the threshold") {
    CHECK(format_tensor_body(at::arange(2000, at::kFloat).reshape({40, 50})) ==
          "tensor([[0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 4.7000e+01, 4.8000e+01,\n         4.9000e+01],\n"
          "        [5.0000e+01, 5.1000e+01, 5.2000e+01,  ..., 9.7000e+01, 9.8000e+01,\n         9.9000e+01],\n"
          "        [1.0000e+02, 1.0100e+02, 1.0200e+02,  ..., 1.4700e+02, 1.4800e+02,\n         1.4900e+02],\n"
          "        ...,\n"
          "        [1.8500e+03, 1.8510e+03, 1.8520e+03,  ..., 1.8970e+03, 1.8980e+03,\n         1.8990e+03],\n"
          "        [1.9000e+03, 1.9010e+03, 1.9020e+03,  ..., 1.9470e+03, 1.9480e+03,\n         1.9490e+03],\n"
          "        [1.9500e+03, 1.9510e+03, 1.9520e+03,  ..., 1.9970e+03, 1.9980e+03,\n         1.9990e+03]])");
  }
  SECTION("bool and integer tensors") {
    CHECK(format_tensor_body(at::tensor({1, 0}).to(at::kBool)) == "tensor([ True, False])");
    CHECK(format_tensor_body(at::tensor({int64_t(1), int64_t(-20), int64_t(300)})) == "tensor([  1, -20, 300])");
  }
  SECTION("empty, scalar and non-finite") {
    CHECK(format_tensor_body(at::zeros({0, 3})) == "tensor([], size=(0, 3))");
    CHECK(format_tensor_body(at::scalar_tensor(3.5, at::kFloat)) == "tensor(3.5000)");
    CHECK(format_tensor_body(at::tensor({1.f, NAN, INFINITY})) == "tensor([1., nan, inf])");
  }
  SECTION("three dimensions leave a blank line between blocks") {
    CHECK(format_tensor_body(at::arange(8, at::kFloat).reshape({2, 2, 2})) ==
          "tensor([[[0., 1.],\n         [2., 3.]],\n\n        [[4., 5.],\n         [6., 7.]]])");
  }
  SECTION("long vectors wrap at 80 columns") {
    CHECK(format_tensor_body(at::arange(30, at::kFloat) * 1.5) ==
          "tensor([ 0.0000,  1.5000,  3.0000,  4.5000,  6.0000,  7.5000,  9.0000, 10.5000,\n"
          "        12.0000, 13.5000, 15.0000, 16.5000, 18.0000, 19.5000, 21.0000, 22.5000,\n"
          "        24.0000, 25.5000, 27.0000, 28.5000, 30.0000, 31.5000, 33.0000, 34.5000,\n"
          "        36.0000, 37.5000, 39.0000, 40.5000, 42.0000, 43.5000])");
  }
}

TEST_CASE("the header names shape, dtype, device and autograd state", "[format]") {
  at::Tensor x = at::ones({2, 3}, at::kDouble);
  CHECK(format_tensor_header(x) == "[Tensor 2x3 float64 cpu]");
  x.requires_grad_(true);
  CHECK(format_tensor_header(x) == "[Tensor 2x3 float64 cpu requires_grad]");
  CHECK(format_tensor_header(x * x) == "[Tensor 2x3 float64 cpu requires_grad grad_fn=MulBackward0]");
  CHECK(format_tensor_header(at::scalar_tensor(1)) == "[Tensor scalar float32 cpu]");
}
