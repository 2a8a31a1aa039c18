// Autograd for Lua tensors: backward, gradients, detach/clone, and gradient
// hooks that call a Lua function (it receives the gradient and may replace it).
#include <ATen/ATen.h>

#include "bindings/common.h"
#include "bindings/parts.h"
#include "host/tensor_format.h"

#include <memory>

namespace anatomy::lua {
namespace {

// The state hooks run on: set by backward() for the duration of the pass
// (a hook may fire on an autograd thread while the caller waits in backward).
lua_State* g_hook_state = nullptr;
// Shared with every hook; false once the state is closing.
std::shared_ptr<bool> g_state_alive = std::make_shared<bool>(true);
lua_State* g_main_state = nullptr;

// A Lua function kept in the registry for as long as a tensor holds the hook.
struct LuaFunctionRef {
  int ref;
  std::shared_ptr<bool> alive;
  LuaFunctionRef(int r, std::shared_ptr<bool> a) : ref(r), alive(std::move(a)) {}
  ~LuaFunctionRef() {
    if (*alive && g_main_state) luaL_unref(g_main_state, LUA_REGISTRYINDEX, ref);
  }
};

// Restores the previous hook state when backward() returns or throws.
struct HookStateScope {
  lua_State* saved;
  explicit HookStateScope(lua_State* L) : saved(g_hook_state) { g_hook_state = L; }
  ~HookStateScope() { g_hook_state = saved; }
};

// x:backward([gradient], [{retain_graph=, create_graph=}])
int tensor_backward(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  at::Tensor gradient;
  int opts = 0;
  if (at::Tensor* g = to_tensor(L, 2)) {
    if (!g->sizes().equals(t.sizes()))
      throw ArgError(2, "gradient has shape " + shape_string(g->sizes()) + ", expected " + shape_string(t.sizes()));
    gradient = *g;
    opts = is_options(L, 3) ? 3 : 0;
  } else if (is_options(L, 2)) {
    opts = 2;
  } else if (!lua_isnoneornil(L, 2)) {
    throw ArgError(2, "gradient Tensor or options expected, got " + type_name(L, 2));
  }
  if (!t.requires_grad())
    throw ArgError(1, "tensor does not require grad; set requires_grad on a leaf it depends on");
  if (!gradient.defined() && t.numel() != 1)
    throw ArgError(1, "backward() without a gradient needs a tensor with one element, got shape " + shape_string(t.sizes()));
  bool create_graph = false;
  c10::optional<bool> retain_graph;
  if (opts) {
    check_option_keys(L, opts, {"retain_graph", "create_graph"});
    if (auto v = option<bool>(L, opts, "retain_graph")) retain_graph = *v;
    if (auto v = option<bool>(L, opts, "create_graph")) create_graph = *v;
  }
  HookStateScope scope(L);
  t.backward(gradient, retain_graph, create_graph);
  return 0;
}

int tensor_detach(lua_State* L) {
  push_tensor(L, check_tensor(L, 1).detach());
  return 1;
}

int tensor_detach_(lua_State* L) {
  check_tensor(L, 1).detach_();
  lua_settop(L, 1);
  return 1;
}

int tensor_clone(lua_State* L) {
  push_tensor(L, check_tensor(L, 1).clone());
  return 1;
}

int tensor_requires_grad_(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  bool flag = opt_boolean(L, 2, true);
  if (flag && !at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type()))
    throw ArgError(1, "only floating-point tensors can require gradients");
  if (!t.is_leaf() && !flag) throw ArgError(1, "requires_grad can only be turned off on a leaf tensor (use detach)");
  t.requires_grad_(flag);
  lua_settop(L, 1);
  return 1;
}

int tensor_retain_grad(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  if (!t.requires_grad()) throw ArgError(1, "retain_grad() on a tensor that does not require grad");
  t.retain_grad();
  lua_settop(L, 1);
  return 1;
}

// x:zero_grad([{set_to_none = true}]): forgets the gradient (or zeroes it in place).
int tensor_zero_grad(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  bool set_to_none = true;
  if (!lua_isnoneornil(L, 2)) {
    check_option_keys(L, 2, {"set_to_none"});
    if (auto v = option<bool>(L, 2, "set_to_none")) set_to_none = *v;
  }
  if (set_to_none) t.mutable_grad() = at::Tensor();
  else if (t.grad().defined()) t.mutable_grad().zero_();
  lua_settop(L, 1);
  return 1;
}

// x:_register_hook(fn) -> hook id (torch.Tensor.register_hook wraps it in a handle)
int tensor_register_hook(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  if (lua_type(L, 2) != LUA_TFUNCTION) throw ArgError(2, "function expected, got " + type_name(L, 2));
  if (!t.requires_grad()) throw ArgError(1, "cannot register a hook on a tensor that does not require grad");
  lua_pushvalue(L, 2);
  auto fn = std::make_shared<LuaFunctionRef>(luaL_ref(L, LUA_REGISTRYINDEX), g_state_alive);
  unsigned id = t.register_hook([fn](const at::Tensor& grad) -> at::Tensor {
    lua_State* HL = g_hook_state;
    if (!HL || !*fn->alive) return at::Tensor();
    int top = lua_gettop(HL);
    lua_rawgeti(HL, LUA_REGISTRYINDEX, fn->ref);
    push_tensor(HL, grad);
    if (lua_pcall(HL, 1, 1, 0) != 0) {
      std::string msg = lua_tostring(HL, -1) ? lua_tostring(HL, -1) : "error object is not a string";
      lua_settop(HL, top);
      throw std::runtime_error("in gradient hook: " + msg);
    }
    at::Tensor out;
    if (at::Tensor* r = to_tensor(HL, -1)) {
      out = *r;
    } else if (!lua_isnil(HL, -1)) {
      std::string got = type_name(HL, -1);
      lua_settop(HL, top);
      throw std::runtime_error("gradient hook returned " + got + ", expected a Tensor or nil");
    }
    lua_settop(HL, top);
    if (out.defined() && !out.sizes().equals(grad.sizes()))
      throw std::runtime_error("gradient hook returned shape " + shape_string(out.sizes()) + ", expected " +
                               shape_string(grad.sizes()));
    return out;
  });
  lua_pushnumber(L, id);
  return 1;
}

int tensor_remove_hook(lua_State* L) {
  check_tensor(L, 1).remove_hook(static_cast<unsigned>(check_integer(L, 2)));
  return 0;
}

const luaL_Reg autograd_methods[] = {
    {"backward", guarded<tensor_backward>},
    {"detach", guarded<tensor_detach>},
    {"detach_", guarded<tensor_detach_>},
    {"clone", guarded<tensor_clone>},
    {"requires_grad_", guarded<tensor_requires_grad_>},
    {"retain_grad", guarded<tensor_retain_grad>},
    {"zero_grad", guarded<tensor_zero_grad>},
    {"_register_hook", guarded<tensor_register_hook>},
    {"_remove_hook", guarded<tensor_remove_hook>},
    {nullptr, nullptr},
};

}  // namespace

void set_hook_state(lua_State* L) {
  g_main_state = L;
  g_state_alive = std::make_shared<bool>(true);
}

void close_hook_state() {
  *g_state_alive = false;
  g_main_state = nullptr;
  g_hook_state = nullptr;
}

void register_tensor_autograd(lua_State* L, int methods) { luaL_register(L, nullptr, autograd_methods); }

}  // namespace anatomy::lua
