// Grad mode and autocast: torch.no_grad, enable_grad, is_grad_enabled,
// set_grad_enabled, autocast and is_autocast_enabled, each restoring the
// previous state when the function it runs returns or raises.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include "bindings/common.h"
#include "bindings/parts.h"
#include "host/accel/accel.h"
#include "host/tensor_format.h"
#include "host/torch_compat.h"

namespace anatomy::lua {
namespace {

// ---- grad mode -------------------------------------------------------------------

// Runs fn(...) with gradient recording switched to `enabled`, restoring the
// previous mode afterwards, also when fn raises (the error is passed on).
int run_with_grad_mode(lua_State* L, bool enabled) {
  if (lua_type(L, 1) != LUA_TFUNCTION) throw ArgError(1, "function expected, got " + type_name(L, 1));
  int base = 0, status;
  {
    at::AutoGradMode mode(enabled);
    base = lua_gettop(L) - 1;  // stack: fn, args...
    status = lua_pcall(L, base, LUA_MULTRET, 0);
  }
  if (status != 0) return lua_error(L);
  return lua_gettop(L);
}
int torch_no_grad(lua_State* L) { return run_with_grad_mode(L, false); }
int torch_enable_grad(lua_State* L) { return run_with_grad_mode(L, true); }

// ---- autocast ---------------------------------------------------------------

// The device type autocast is set for: 'cpu', 'cuda', or 'accel' (the test
// device, which casts as cuda does).
at::DeviceType autocast_device_type(const std::string& device, bool need_gpu) {
  if (device == "cpu") return at::kCPU;
  if (device == "cuda") {
    if (need_gpu && !at::hasCUDA()) throw ArgError(1, "'cuda' autocast needs a GPU, and none is visible");
    return at::kCUDA;
  }
  if (device == accel::kName) {
    if (!accel::available()) throw ArgError(1, "'accel' autocast needs the accel device: " + accel::unavailable_reason());
    return c10::DeviceType::PrivateUse1;
  }
  throw ArgError(1, "device_type must be 'cpu', 'cuda' or 'accel', got '" + device + "'");
}

// torch.autocast(device_type, dtype, fn, ...) -> fn(...): runs fn with
// autocast on for 'cpu', 'cuda' or 'accel' (dtype: 'bfloat16', or 'float16';
// nil means PyTorch's default, bfloat16 on cpu and float16 on cuda and accel),
// restoring the previous state afterwards, also when fn raises. As in PyTorch,
// ops autocast lists compute in the lower precision; parameters keep their own dtype.
int torch_autocast(lua_State* L) {
  std::string device = check_string(L, 1);
  at::DeviceType type = autocast_device_type(device, false);
  at::ScalarType dtype = type == at::kCPU ? at::kBFloat16 : at::kHalf;
  if (!lua_isnil(L, 2)) {
    dtype = parse_dtype(check_string(L, 2), 2);
    if (dtype != at::kBFloat16 && dtype != at::kHalf)
      throw ArgError(2, std::string("autocast computes in bfloat16 or float16, got ") + dtype_name(dtype));
  }
  if (lua_type(L, 3) != LUA_TFUNCTION) throw ArgError(3, "function expected, got " + type_name(L, 3));
  autocast_device_type(device, true);
  bool was_enabled = compat::autocast_enabled(type);
  at::ScalarType was_dtype = compat::autocast_dtype(type);
  compat::set_autocast(type, true, dtype);
  at::autocast::increment_nesting();
  int base = lua_gettop(L) - 3;
  int status = lua_pcall(L, base, LUA_MULTRET, 0);  // fn is at 3, its arguments above it
  // Leaving the outermost autocast drops the cache of casted weights (as PyTorch does).
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast(type, was_enabled, was_dtype);
  if (status != 0) return lua_error(L);
  return lua_gettop(L) - 2;
}

// torch.is_autocast_enabled(device_type = 'cpu') -> boolean
int torch_is_autocast_enabled(lua_State* L) {
  std::string device = lua_isnoneornil(L, 1) ? "cpu" : check_string(L, 1);
  lua_pushboolean(L, compat::autocast_enabled(autocast_device_type(device, false)));
  return 1;
}

int torch_is_grad_enabled(lua_State* L) {
  lua_pushboolean(L, at::GradMode::is_enabled());
  return 1;
}

int torch_set_grad_enabled(lua_State* L) {
  if (lua_type(L, 1) != LUA_TBOOLEAN) throw ArgError(1, "boolean expected, got " + type_name(L, 1));
  at::GradMode::set_enabled(lua_toboolean(L, 1));
  return 0;
}

const luaL_Reg functions[] = {
    {"no_grad", guarded<torch_no_grad>},
    {"enable_grad", guarded<torch_enable_grad>},
    {"is_grad_enabled", guarded<torch_is_grad_enabled>},
    {"set_grad_enabled", guarded<torch_set_grad_enabled>},
    {"autocast", guarded<torch_autocast>},
    {"is_autocast_enabled", guarded<torch_is_autocast_enabled>},
    {nullptr, nullptr},
};

}  // namespace

/// Adds no_grad, enable_grad, is_grad_enabled, set_grad_enabled, autocast and is_autocast_enabled to the torch table at index torch.
void register_grad_mode(lua_State* L, int torch) {
  lua_pushvalue(L, torch);
  luaL_register(L, nullptr, functions);
  lua_pop(L, 1);
}

}  // namespace anatomy::lua
