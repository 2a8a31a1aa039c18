// The Tensor userdata (see common.h): finding it on the stack fast, pushing
// results with the collector paced by tensor bytes, the small-tensor
// arithmetic fast path, and tensor-or-number operands with broadcasting checks.
#include "bindings/common.h"

#include <ATen/ATen.h>

#include "host/small_arith.h"
#include "host/tensor_format.h"

#include <cmath>

namespace anatomy::lua {

// ---- tensors --------------------------------------------------------------

// The tensor metatable is also kept in the registry under a light userdata
// key (no string hashing), and the last one seen is remembered by address so
// that the common case of to_tensor is one pointer comparison.
char g_tensor_meta_key;
static const void* g_tensor_meta_seen = nullptr;

void forget_tensor_metatable() { g_tensor_meta_seen = nullptr; }

at::Tensor* to_tensor(lua_State* L, int idx) {
  void* p = lua_touserdata(L, idx);
  if (!p || !lua_getmetatable(L, idx)) return nullptr;
  const void* mt = lua_topointer(L, -1);
  if (mt == g_tensor_meta_seen) {
    lua_pop(L, 1);
    return static_cast<at::Tensor*>(p);
  }
  lua_pushlightuserdata(L, &g_tensor_meta_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  bool same = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  if (!same) return nullptr;
  g_tensor_meta_seen = mt;
  return static_cast<at::Tensor*>(p);
}

at::Tensor& check_tensor(lua_State* L, int idx) {
  at::Tensor* t = to_tensor(L, idx);
  if (!t) throw ArgError(idx, "Tensor expected, got " + type_name(L, idx));
  return *t;
}

namespace {
// Lua's collector sees a tensor as a few bytes of userdata, so on its own it
// would let megabytes of dead intermediate tensors pile up between cycles:
// memory grows, and each new buffer comes from fresh pages (a page fault per
// 4 KiB, which made a 3 MB elementwise op ~15x slower than in PyTorch, whose
// reference counting frees and reuses the buffer at once). So the bytes of
// tensors handed to Lua are counted, and every kCollectBytes a full cycle
// frees the dead ones; their buffers go back to malloc and are reused.
constexpr size_t kCollectBytes = size_t(16) << 20;
size_t g_bytes_since_collect = 0;
}  // namespace

void push_tensor(lua_State* L, at::Tensor t) {
  if (!t.defined()) {
    lua_pushnil(L);
    return;
  }
  size_t bytes = t.is_view() ? 0 : t.nbytes();
  void* p = lua_newuserdata(L, sizeof(at::Tensor));
  new (p) at::Tensor(std::move(t));
  lua_pushlightuserdata(L, &g_tensor_meta_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  lua_setmetatable(L, -2);
  g_bytes_since_collect += bytes;
  if (g_bytes_since_collect >= kCollectBytes) {
    g_bytes_since_collect = 0;
    lua_gc(L, LUA_GCCOLLECT, 0);  // the new tensor is on the stack, so it survives
  }
}

bool push_small_arith(lua_State* L, char op) {
  const at::Tensor* a = to_tensor(L, 1);
  const at::Tensor* b = to_tensor(L, 2);
  std::optional<at::Tensor> r;
  if (a && b)
    r = small_arith(op, *a, *b);
  else if (a && lua_type(L, 2) == LUA_TNUMBER)
    r = small_arith(op, *a, lua_tonumber(L, 2), /*number_first=*/false);
  else if (b && lua_type(L, 1) == LUA_TNUMBER)
    r = small_arith(op, *b, lua_tonumber(L, 1), /*number_first=*/true);
  if (!r) return false;
  push_tensor(L, std::move(*r));
  return true;
}

namespace {
char g_size_meta_key;  // registry[&g_size_meta_key]: the metatable of sizes

// tostring(size) -> "{2, 3}". Reachable from Lua with any argument
// (getmetatable(x:size()).__tostring(4)): anything but a table is a Lua
// error, and an entry that is not a number prints as its type. No C++
// object lives here, so luaL_checktype's longjmp leaks nothing.
int size_tostring(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addchar(&b, '{');
  size_t n = lua_objlen(L, 1);
  for (size_t i = 1; i <= n; ++i) {
    if (i > 1) luaL_addstring(&b, ", ");
    lua_rawgeti(L, 1, static_cast<int>(i));
    if (lua_type(L, -1) == LUA_TNUMBER) {
      luaL_addvalue(&b);
    } else {
      const char* type = luaL_typename(L, -1);
      lua_pop(L, 1);
      luaL_addstring(&b, type);
    }
  }
  luaL_addchar(&b, '}');
  luaL_pushresult(&b);
  return 1;
}
}  // namespace

void push_size_metatable(lua_State* L) {
  lua_pushlightuserdata(L, &g_size_meta_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  if (lua_istable(L, -1)) return;
  lua_pop(L, 1);
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, size_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pushlightuserdata(L, &g_size_meta_key);
  lua_pushvalue(L, -2);
  lua_rawset(L, LUA_REGISTRYINDEX);
}

// A size is a plain Lua list whose metatable prints it as {2, 3}.
void push_sizes(lua_State* L, at::IntArrayRef sizes) {
  lua_createtable(L, static_cast<int>(sizes.size()), 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    lua_pushnumber(L, static_cast<lua_Number>(sizes[i]));
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
  lua_pushlightuserdata(L, &g_size_meta_key);  // found by address: no string hashing per call
  lua_rawget(L, LUA_REGISTRYINDEX);
  if (lua_istable(L, -1)) lua_setmetatable(L, -2);
  else lua_pop(L, 1);
}

at::Scalar number_scalar(double v) {
  if (v == std::floor(v) && std::fabs(v) < 9.007199254740992e15) return at::Scalar(static_cast<int64_t>(v));
  return at::Scalar(v);
}

at::Tensor tensor_or_scalar(lua_State* L, int idx, const char* expected) {
  if (at::Tensor* t = to_tensor(L, idx)) return *t;
  if (lua_type(L, idx) == LUA_TNUMBER) {
    at::Scalar v = number_scalar(lua_tonumber(L, idx));
    at::Tensor s = at::scalar_tensor(v, at::TensorOptions().dtype(v.type()));
    s.unsafeGetTensorImpl()->set_wrapped_number(true);
    return s;
  }
  if (lua_type(L, idx) == LUA_TBOOLEAN) {
    at::Tensor s = at::scalar_tensor(static_cast<bool>(lua_toboolean(L, idx)), at::kBool);
    s.unsafeGetTensorImpl()->set_wrapped_number(true);
    return s;
  }
  throw ArgError(idx, std::string(expected) + " expected, got " + type_name(L, idx));
}

bool broadcastable(at::IntArrayRef a, at::IntArrayRef b) {
  size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1;
    int64_t y = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (x != y && x != 1 && y != 1) return false;
  }
  return true;
}

void check_broadcast(const at::Tensor& a, const at::Tensor& b, int arg) {
  if (!broadcastable(a.sizes(), b.sizes()))
    throw ArgError(arg, "shapes " + shape_string(a.sizes()) + " and " + shape_string(b.sizes()) + " cannot be broadcast");
}

at::Tensor remainder(const at::Tensor& a, const at::Tensor& b) {
  if (!c10::isIntegralType(at::result_type(a, b), /*includeBool=*/true)) return at::remainder(a, b);
  if ((b == 0).any().item<bool>()) throw CallError("integer remainder by zero (a divisor is 0)");
  return at::remainder(a, at::where(b == -1, at::ones_like(b), b));
}

}  // namespace anatomy::lua
