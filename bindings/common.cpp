// Shared binding helpers (see common.h): argument checks, tensor userdata,
// the 1-based index helper and the error translation.
#include "bindings/common.h"

#include <ATen/ATen.h>

#include "host/kernels/small_arith.h"
#include "host/runtime.h"
#include "host/tensor_format.h"

#include <cmath>
#include <cstring>

namespace anatomy::lua {

volatile int g_interrupted = 0;

void check_interrupt() {
  g_interrupted = 0;
  throw CallError("interrupted");
}

namespace {
// The running C function's name, as init.lua recorded it for that function
// (registry "anatomy.names"), else as Lua's debug info gives it. Debug info
// names the call site, which a tail call (`return x:f()`) replaces with the
// caller's; so it decides only whether the call was written obj:name(...).
std::string current_function_name(lua_State* L, bool* method) {
  lua_Debug ar;
  *method = false;
  if (!lua_getstack(L, 0, &ar)) return "?";
  lua_getinfo(L, "nf", &ar);  // pushes the function
  std::string name;
  lua_getfield(L, LUA_REGISTRYINDEX, "anatomy.names");
  if (lua_istable(L, -1)) {
    lua_pushvalue(L, -2);
    lua_rawget(L, -2);
    if (lua_isstring(L, -1)) name = lua_tostring(L, -1);
    lua_pop(L, 1);
  }
  lua_pop(L, 2);
  if (ar.name && (name.empty() || name == ar.name)) {
    *method = std::strcmp(ar.namewhat, "method") == 0;
    name = ar.name;
  }
  return name.empty() ? "?" : name;
}

// ATen's messages can run to several lines (notes, hints); keep the first.
std::string first_line(const std::string& message) {
  std::string s = message.substr(0, message.find('\n'));
  while (!s.empty() && (s.back() == ' ' || s.back() == '.')) s.pop_back();
  return s;
}
}  // namespace

// "file:line: " of the code that made the failing call: the first Lua frame
// outside anatomy's own Lua library (registry "anatomy.lua_dir"), so that an
// error inside nn.Linear's forward points at the user's line, not the library's.
void push_where(lua_State* L) {
  lua_getfield(L, LUA_REGISTRYINDEX, "anatomy.lua_dir");
  std::string library = lua_isstring(L, -1) ? "@" + std::string(lua_tostring(L, -1)) : "";
  lua_pop(L, 1);
  lua_Debug ar;
  for (int level = 1; !library.empty() && lua_getstack(L, level, &ar); ++level) {
    lua_getinfo(L, "Sl", &ar);
    if (ar.currentline <= 0) continue;
    if (std::strncmp(ar.source, library.c_str(), library.size()) == 0) continue;
    lua_pushfstring(L, "%s:%d: ", ar.short_src, ar.currentline);
    return;
  }
  luaL_where(L, 1);
}

int raise_error(lua_State* L, int kind, int arg) {
  std::string text;
  {
    bool method = false;
    std::string name = current_function_name(L, &method);
    std::string msg = lua_tostring(L, -1) ? lua_tostring(L, -1) : "?";
    if (kind == 1) {
      // Lua's own convention (luaL_argerror): in obj:f(x), x is argument #1.
      if (method && --arg == 0) text = "calling '" + name + "' on bad self (" + msg + ")";
      else text = "bad argument #" + std::to_string(arg) + " to '" + name + "' (" + msg + ")";
    } else if (kind == 2) {
      text = msg;
    } else {
      text = "error in '" + name + "' (" + first_line(msg) + ")";
    }
  }
  lua_pop(L, 1);
  push_where(L);
  lua_pushlstring(L, text.data(), text.size());
  text = std::string();  // nothing of ours may be left to free: lua_error unwinds
  lua_concat(L, 2);
  return lua_error(L);
}

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
    r = kernels::small_arith(op, *a, *b);
  else if (a && lua_type(L, 2) == LUA_TNUMBER)
    r = kernels::small_arith(op, *a, lua_tonumber(L, 2), /*number_first=*/false);
  else if (b && lua_type(L, 1) == LUA_TNUMBER)
    r = kernels::small_arith(op, *b, lua_tonumber(L, 1), /*number_first=*/true);
  if (!r) return false;
  push_tensor(L, std::move(*r));
  return true;
}

void push_sizes(lua_State* L, at::IntArrayRef sizes) {
  lua_createtable(L, static_cast<int>(sizes.size()), 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    lua_pushnumber(L, static_cast<lua_Number>(sizes[i]));
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
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

// ---- plain arguments ------------------------------------------------------

std::string type_name(lua_State* L, int idx) {
  if (lua_type(L, idx) == LUA_TNONE) return "no value";
  if (to_tensor(L, idx)) return "Tensor";
  return luaL_typename(L, idx);
}

double check_number(lua_State* L, int idx) {
  if (lua_type(L, idx) != LUA_TNUMBER) throw ArgError(idx, "number expected, got " + type_name(L, idx));
  return lua_tonumber(L, idx);
}

int64_t check_integer(lua_State* L, int idx) {
  if (lua_type(L, idx) != LUA_TNUMBER) throw ArgError(idx, "integer expected, got " + type_name(L, idx));
  double v = lua_tonumber(L, idx);
  if (v != std::floor(v) || !std::isfinite(v)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "integer expected, got %.14g", v);
    throw ArgError(idx, buf);
  }
  return static_cast<int64_t>(v);
}

bool opt_boolean(lua_State* L, int idx, bool fallback) {
  if (lua_isnoneornil(L, idx)) return fallback;
  if (lua_type(L, idx) != LUA_TBOOLEAN) throw ArgError(idx, "boolean expected, got " + type_name(L, idx));
  return lua_toboolean(L, idx);
}

std::string check_string(lua_State* L, int idx) {
  if (lua_type(L, idx) != LUA_TSTRING) throw ArgError(idx, "string expected, got " + type_name(L, idx));
  size_t n;
  const char* s = lua_tolstring(L, idx, &n);
  return std::string(s, n);
}

bool is_options(lua_State* L, int idx) {
  if (lua_type(L, idx) != LUA_TTABLE) return false;
  lua_rawgeti(L, idx, 1);
  bool array = !lua_isnil(L, -1);
  lua_pop(L, 1);
  return !array;
}

void check_option_keys(lua_State* L, int idx, const std::vector<const char*>& allowed) {
  if (lua_type(L, idx) != LUA_TTABLE) return;
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    bool ok = false;
    if (lua_type(L, -1) == LUA_TSTRING) {
      const char* key = lua_tostring(L, -1);
      for (const char* a : allowed) ok = ok || std::strcmp(a, key) == 0;
    }
    if (!ok) {
      std::string names;
      for (const char* a : allowed) names += (names.empty() ? "" : ", ") + std::string(a);
      std::string key = lua_type(L, -1) == LUA_TSTRING ? "'" + std::string(lua_tostring(L, -1)) + "'" : type_name(L, -1);
      lua_pop(L, 1);
      throw ArgError(idx, "unknown option " + key + ", expected " + names);
    }
  }
}

int get_option(lua_State* L, int idx, const char* key) {
  if (lua_type(L, idx) != LUA_TTABLE) {
    lua_pushnil(L);
    return LUA_TNIL;
  }
  lua_getfield(L, idx, key);
  return lua_type(L, -1);
}

std::vector<int64_t> check_sizes(lua_State* L, int start, int* next) {
  std::vector<int64_t> sizes;
  int i = start;
  if (lua_type(L, start) == LUA_TTABLE && !is_options(L, start)) {
    size_t n = lua_objlen(L, start);
    for (size_t k = 1; k <= n; ++k) {
      lua_rawgeti(L, start, static_cast<int>(k));
      if (lua_type(L, -1) != LUA_TNUMBER) {
        std::string got = type_name(L, -1);
        lua_pop(L, 1);
        throw ArgError(start, "sizes must be integers (entry " + std::to_string(k) + " is " + got + ")");
      }
      double v = lua_tonumber(L, -1);
      lua_pop(L, 1);
      if (v != std::floor(v)) throw ArgError(start, "sizes must be integers (entry " + std::to_string(k) + " is not)");
      sizes.push_back(static_cast<int64_t>(v));
    }
    i = start + 1;
  } else {
    while (lua_type(L, i) == LUA_TNUMBER) sizes.push_back(check_integer(L, i++));
  }
  if (next) *next = i;
  return sizes;
}

c10::ScalarType parse_dtype(const std::string& name, int arg) {
  struct Entry { const char* name; c10::ScalarType type; };
  static const Entry table[] = {
      {"float32", at::kFloat}, {"float", at::kFloat},    {"float64", at::kDouble}, {"double", at::kDouble},
      {"float16", at::kHalf},  {"half", at::kHalf},      {"bfloat16", at::kBFloat16}, {"int64", at::kLong},
      {"long", at::kLong},     {"int32", at::kInt},      {"int", at::kInt},        {"int16", at::kShort},
      {"int8", at::kChar},     {"uint8", at::kByte},     {"bool", at::kBool},
  };
  std::string n = name.rfind("torch.", 0) == 0 ? name.substr(6) : name;
  for (const auto& e : table)
    if (n == e.name) return e.type;
  throw ArgError(arg, "unknown dtype '" + name +
                          "', expected float32, float64, float16, bfloat16, int64, int32, int16, int8, uint8 or bool");
}

c10::Device parse_device_arg(const std::string& name, int arg) {
  try {
    return parse_device(name);
  } catch (const std::invalid_argument& e) {
    throw ArgError(arg, e.what());
  }
}

FactoryOptions check_factory_options(lua_State* L, int idx, c10::ScalarType default_dtype) {
  FactoryOptions f;
  f.options = at::TensorOptions().dtype(default_dtype).device(default_device());
  if (lua_isnoneornil(L, idx)) return f;
  if (!is_options(L, idx)) throw ArgError(idx, "options table expected, got " + type_name(L, idx));
  check_option_keys(L, idx, {"dtype", "device", "requires_grad"});
  if (get_option(L, idx, "dtype") != LUA_TNIL) {
    if (lua_type(L, -1) != LUA_TSTRING) throw ArgError(idx, "option 'dtype' must be a string such as 'float32'");
    f.options = f.options.dtype(parse_dtype(lua_tostring(L, -1), idx));
  }
  lua_pop(L, 1);
  if (get_option(L, idx, "device") != LUA_TNIL) {
    if (lua_type(L, -1) != LUA_TSTRING) throw ArgError(idx, "option 'device' must be a string such as 'cpu'");
    f.options = f.options.device(parse_device_arg(lua_tostring(L, -1), idx));
  }
  lua_pop(L, 1);
  if (get_option(L, idx, "requires_grad") != LUA_TNIL) f.requires_grad = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return f;
}

// ---- 1-based indices and dimensions --------------------------------------

int64_t wrap_dim(int64_t dim, int64_t ndim, int arg) {
  if (dim >= 1 && dim <= ndim) return dim - 1;
  if (dim <= -1 && dim >= -ndim) return dim + ndim;
  std::string range = ndim == 0 ? "the tensor has no dimensions"
                                : "expected 1.." + std::to_string(ndim) + " or -" + std::to_string(ndim) + "..-1";
  std::string msg = "dimension " + std::to_string(dim) + " out of range for a " + std::to_string(ndim) +
                    "-dimensional tensor, " + range;
  if (arg > 0) throw ArgError(arg, msg);
  throw CallError(msg);
}

int64_t wrap_index(int64_t index, int64_t size, int arg, int64_t dim_for_message) {
  if (index >= 1 && index <= size) return index - 1;
  if (index <= -1 && index >= -size) return index + size;
  std::string where = dim_for_message >= 0 ? " for dimension " + std::to_string(dim_for_message + 1) : "";
  std::string msg = "index " + std::to_string(index) + " out of range" + where + " of size " + std::to_string(size) +
                    (index == 0 ? "; indices start at 1" : "");
  if (arg > 0) throw ArgError(arg, msg);
  throw CallError(msg);
}

int64_t check_dim(lua_State* L, int idx, int64_t ndim) {
  if (lua_type(L, idx) != LUA_TNUMBER) throw ArgError(idx, "dimension expected, got " + type_name(L, idx));
  return wrap_dim(check_integer(L, idx), ndim, idx);
}

at::Tensor zero_based_index(const at::Tensor& index, int64_t size, int arg) {
  if (!at::isIntegralType(index.scalar_type(), /*includeBool=*/false))
    throw ArgError(arg, std::string("index tensor must have an integer dtype, got ") + dtype_name(index.scalar_type()));
  if (index.numel() > 0) {
    int64_t lo = index.min().item<int64_t>(), hi = index.max().item<int64_t>();
    if (lo < 1 || hi > size) {
      int64_t bad = lo < 1 ? lo : hi;
      throw ArgError(arg, "index " + std::to_string(bad) + " out of range of size " + std::to_string(size) +
                              (bad == 0 ? "; indices start at 1" : ""));
    }
  }
  return index.to(at::kLong) - 1;
}

}  // namespace anatomy::lua
