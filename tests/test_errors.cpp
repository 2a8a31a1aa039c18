// Bad input from Lua: each case runs real Lua through the host and checks the
// exact error text (function, argument, both sides of a mismatch, the line),
// then that the state is still usable and its variables intact.
#include <catch2/catch.hpp>

#include "embed/state.h"

#include <string>

namespace {

anatomy::LuaState& shared_state() {
  static anatomy::LuaState state;
  static bool ready = state.run_string(
      "a = torch.ones(4, 3); b = torch.ones(5, 2); kept = 'still here'", "=setup");
  REQUIRE(ready);
  return state;
}

// The first line of the error raised by `code` (chunk name "test").
std::string error_of(const std::string& code) {
  auto& s = shared_state();
  REQUIRE_FALSE(s.run_string(code, "=test"));
  return s.error().substr(0, s.error().find('\n'));
}

}  // namespace

TEST_CASE("bad inputs raise Lua errors with exact texts", "[errors]") {
  CHECK(error_of("local c = a:matmul(b)") ==
        "test:1: bad argument #1 to 'matmul' (shapes 4x3 and 5x2 cannot be multiplied)");
  CHECK(error_of("local c = torch.matmul(a, b)") ==
        "test:1: bad argument #2 to 'matmul' (shapes 4x3 and 5x2 cannot be multiplied)");
  CHECK(error_of("local c = a + b") == "test:1: bad operands to '+' (shapes 4x3 and 5x2 cannot be broadcast)");
  CHECK(error_of("local c = a * nil") == "test:1: bad operands to '*' (Tensor and nil)");
  CHECK(error_of("local c = a:sum(3)") ==
        "test:1: bad argument #1 to 'sum' (dimension 3 out of range for a 2-dimensional tensor, expected 1..2 or -2..-1)");
  CHECK(error_of("local c = a[5]") == "test:1: index 5 out of range for dimension 1 of size 4");
  CHECK(error_of("local c = a[0]") == "test:1: index 0 out of range for dimension 1 of size 4; indices start at 1");
  CHECK(error_of("local c = a[{1, -4}]") == "test:1: index -4 out of range for dimension 2 of size 3");
  CHECK(error_of("local c = torch.zeros(2, {dtype = 'float33'})") ==
        "test:1: bad argument #2 to 'zeros' (unknown dtype 'float33', expected float32, float64, float16, bfloat16, "
        "int64, int32, int16, int8, uint8 or bool)");
  CHECK(error_of("local c = torch.ones(2, {device = 'tpu'})") ==
        "test:1: bad argument #2 to 'ones' (unknown device 'tpu', expected cpu, cuda, cuda:N, accel or meta)");
  CHECK(error_of("local c = torch.ones(2, {dtyp = 'float64'})") ==
        "test:1: bad argument #2 to 'ones' (unknown option 'dtyp', expected dtype, device, requires_grad)");
  CHECK(error_of("local c = a:view(5, 5)") ==
        "test:1: bad argument #1 to 'view' (shape 5x5 does not match 12 elements of shape 4x3)");
  CHECK(error_of("local c = torch.tensor({{1, 2}, {3}})") ==
        "test:1: bad argument #1 to 'tensor' (ragged nested table: a row of 1 at depth 2, expected 2)");
  CHECK(error_of("local c = a:gather(1, torch.tensor({{5}}, {dtype = 'int64'}))") ==
        "test:1: bad argument #2 to 'gather' (index 5 out of range of size 4)");
  CHECK(error_of("local c = a:item()") ==
        "test:1: calling 'item' on bad self (item() needs a tensor with one element, got 12 of shape 4x3)");
  CHECK(error_of("a.foo = 1") == "test:1: cannot set field 'foo' of a Tensor (settable: requires_grad, grad, data)");
  CHECK(error_of("setmetatable(a, nil)") == "test:1: bad argument #1 to 'setmetatable' (table expected, got userdata)");
  CHECK(error_of("local c = torch.cat({a, torch.ones(2, 2)})") ==
        "test:1: bad argument #1 to 'cat' (tensor 2 has shape 2x2 and tensor 1 has 4x3; all dimensions but 1 must match)");
  CHECK(error_of("local c = a:softmax()") == "test:1: bad argument #1 to 'softmax' (dimension expected, got no value)");
  CHECK(error_of("torch.randn(2):sum():backward()") ==
        "test:1: calling 'backward' on bad self (tensor does not require grad; set requires_grad on a leaf it "
        "depends on)");
  CHECK(error_of("local c = a:transpose(1, 'x')") == "test:1: bad argument #2 to 'transpose' (dimension expected, got string)");
  CHECK(error_of("local c = torch.randn(2, 2.5)") == "test:1: bad argument #2 to 'randn' (integer expected, got 2.5)");
}

TEST_CASE("errors from inside LibTorch name the function", "[errors]") {
  std::string e = error_of("local c = torch.einsum('ij,jk->ik', a, b)");
  CHECK(e.rfind("test:1: error in 'einsum' (", 0) == 0);
  CHECK(e.back() == ')');
  CHECK(e.find('\n') == std::string::npos);
}

TEST_CASE("a tail call still names the function", "[errors]") {
  // `return f(x)` drops the caller's frame; the name comes from the registry.
  auto& s = shared_state();
  REQUIRE_FALSE(s.run_string("local function f() return a:matmul(b) end f()", "=test"));
  CHECK(s.error().find("bad argument #2 to 'matmul' (shapes 4x3 and 5x2 cannot be multiplied)") != std::string::npos);
}

TEST_CASE("the state survives errors with its variables", "[errors]") {
  auto& s = shared_state();
  for (int i = 0; i < 3; ++i) REQUIRE_FALSE(s.run_string("local c = a:matmul(b)", "=test"));
  REQUIRE(s.run_string("assert(kept == 'still here'); assert(a:sum():item() == 12)", "=test"));
}

TEST_CASE("the tensor metatable is protected", "[errors]") {
  auto& s = shared_state();
  REQUIRE(s.run_string("assert(getmetatable(a) == 'Tensor')", "=test"));
}
