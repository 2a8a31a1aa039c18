// Plain arguments (see common.h): numbers, integers, strings, booleans,
// options tables, sizes, dtypes and devices, and the one place where 1-based
// indices and dimensions become 0-based.
#include "bindings/common.h"

#include <ATen/ATen.h>

#include "host/runtime.h"
#include "host/tensor_format.h"

#include <cmath>
#include <cstdio>

namespace anatomy::lua {

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
  // a double at or past 2^63 has no int64 (the conversion would wrap, or worse)
  if (v < -9223372036854775808.0 || v >= 9223372036854775808.0) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "integer out of range (-2^63 .. 2^63 - 1), got %.14g", v);
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

size_t check_list_length(lua_State* L, int idx, int arg, const char* what) {
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  size_t n = lua_objlen(L, idx);
  // A nil inside a list ({2, nil, 3}) may end Lua's length early, or not:
  // any positive integer key past the length means a hole, an error rather
  // than a shorter list. (A nil at the very end, {2, nil}, leaves no trace
  // a C function can see: that table is {2}.)
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    if (lua_type(L, -1) == LUA_TNUMBER) {
      double key = lua_tonumber(L, -1);
      if (key == std::floor(key) && key > static_cast<double>(n)) {
        lua_pop(L, 1);
        char shown[32];  // the key as Lua prints it (a key may be 1e308: no integer type holds it)
        std::snprintf(shown, sizeof shown, "%.14g", key);
        throw ArgError(arg, std::string(what) + " has a hole: entry " + std::to_string(n + 1) + " is nil but entry " +
                                shown + " is not");
      }
    }
  }
  return n;
}

std::vector<int64_t> check_sizes(lua_State* L, int start, int* next) {
  std::vector<int64_t> sizes;
  int i = start;
  if (lua_type(L, start) == LUA_TTABLE && !is_options(L, start)) {
    size_t n = check_list_length(L, start, start, "the size list");
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
      if (!(v > -9223372036854775808.0 && v < 9223372036854775808.0))
        throw ArgError(start, "sizes must be integers below 2^63 (entry " + std::to_string(k) + " is not)");
      sizes.push_back(static_cast<int64_t>(v));
    }
    i = start + 1;
  } else {
    while (lua_type(L, i) == LUA_TNUMBER) sizes.push_back(check_integer(L, i++));
    // A nil among the sizes (ones(2, nil, 3), randn(nil, 3)) would end the
    // list there and make a tensor of another shape: an error instead, as is
    // a nil given where the sizes start (zeros(n) with n nil).
    // Without `next` the sizes are the last arguments, so any nil given
    // after them is one too (view(6, n) with n nil).
    int top = lua_gettop(L);
    if (i <= top && lua_isnil(L, i)) {
      bool later = i == start || !next;
      for (int j = i + 1; j <= top; ++j) later = later || lua_type(L, j) == LUA_TNUMBER;
      if (later) throw ArgError(i, "size expected, got nil (a size is missing)");
    }
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
      // the short names mixed-precision settings use (train.fit's dtype = 'bf16')
      {"bf16", at::kBFloat16}, {"fp16", at::kHalf},      {"fp32", at::kFloat},
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
  if (auto v = option<std::string>(L, idx, "dtype")) f.options = f.options.dtype(parse_dtype(*v, idx));
  if (auto v = option<std::string>(L, idx, "device")) f.options = f.options.device(parse_device_arg(*v, idx));
  if (auto v = option<bool>(L, idx, "requires_grad")) f.requires_grad = *v;
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

std::vector<int64_t> check_token_ids(lua_State* L, int idx) {
  std::vector<int64_t> ids;
  if (at::Tensor* t = to_tensor(L, idx)) {
    if (!at::isIntegralType(t->scalar_type(), false)) throw ArgError(idx, "token ids must be an integer tensor");
    at::Tensor flat = t->detach().to(at::kCPU, at::kLong).contiguous().reshape({-1});
    ids.assign(flat.data_ptr<int64_t>(), flat.data_ptr<int64_t>() + flat.numel());
  } else if (lua_type(L, idx) == LUA_TTABLE) {
    ids = check_sizes(L, idx);
  } else {
    throw ArgError(idx, "Tensor or table of token ids expected, got " + type_name(L, idx));
  }
  return ids;
}

at::Tensor zero_based_index(const at::Tensor& index, int64_t size, int arg) {
  if (!at::isIntegralType(index.scalar_type(), /*includeBool=*/false))
    throw ArgError(arg, std::string("index tensor must have an integer dtype, got ") + dtype_name(index.scalar_type()));
  if (index.numel() > 0 && (index.is_cpu() || !TrustedIds::active())) {  // host/runtime.h
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
