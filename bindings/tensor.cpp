// The Lua-visible Tensor: userdata holding an at::Tensor by value, its
// metatable (operators, indexing, printing) and conversions. Shape methods
// live in tensor_shape.cpp, math in tensor_math.cpp and tensor_reduce.cpp,
// autograd in tensor_autograd.cpp.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>

#include <cmath>

#include "bindings/common.h"
#include "bindings/parts.h"
#include "host/runtime.h"
#include "host/tensor_format.h"

namespace anatomy::lua {
namespace {

// ---- metamethods ------------------------------------------------------------

int tensor_gc(lua_State* L) {
  // The collector runs it once per userdata; the at::Tensor was
  // placement-new'ed into it. debug.getmetatable(x).__gc reaches it too, with
  // any argument: only a tensor is freed, and a freed one loses its metatable
  // (later uses are type errors; the collector then leaves it alone).
  at::Tensor* t = to_tensor(L, 1);
  if (!t) return 0;
  t->~Tensor();
  lua_pushnil(L);
  lua_setmetatable(L, 1);
  return 0;
}

int tensor_tostring(lua_State* L) {
  std::string s = format_tensor(check_tensor(L, 1));
  lua_pushlstring(L, s.data(), s.size());
  return 1;
}

// Two userdata are the same tensor when they share storage and view.
int tensor_eq(lua_State* L) {
  at::Tensor* a = to_tensor(L, 1);
  at::Tensor* b = to_tensor(L, 2);
  lua_pushboolean(L, a && b && a->unsafeGetTensorImpl() == b->unsafeGetTensorImpl());
  return 1;
}

int tensor_len(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  if (t.dim() == 0) throw CallError("attempt to get length of a 0-dimensional tensor");
  lua_pushnumber(L, static_cast<lua_Number>(t.size(0)));
  return 1;
}

// Operands of an arithmetic operator: tensors or numbers, broadcastable.
struct Operands {
  at::Tensor a, b;
};

Operands operands(lua_State* L, const char* op) {
  const at::Tensor* ta = to_tensor(L, 1);
  const at::Tensor* tb = to_tensor(L, 2);
  auto kind = [&](int i, const at::Tensor* t) { return t || lua_type(L, i) == LUA_TNUMBER; };
  if (!kind(1, ta) || !kind(2, tb))
    throw CallError(std::string("bad operands to '") + op + "' (" + type_name(L, 1) + " and " + type_name(L, 2) + ")");
  if (ta && tb && !broadcastable(ta->sizes(), tb->sizes()))
    throw CallError(std::string("bad operands to '") + op + "' (shapes " + shape_string(ta->sizes()) + " and " +
                    shape_string(tb->sizes()) + " cannot be broadcast)");
  return {tensor_or_scalar(L, 1), tensor_or_scalar(L, 2)};
}

// The arithmetic metamethods share one body; upvalue 1 is their Operator entry.
struct Operator {
  const char* event;   // "__add"
  const char* symbol;  // "+", for messages
  at::Tensor (*fn)(const at::Tensor&, const at::Tensor&);
};

const Operator operators[] = {
    {"__add", "+", [](const at::Tensor& a, const at::Tensor& b) { return at::add(a, b); }},
    {"__sub", "-", [](const at::Tensor& a, const at::Tensor& b) { return at::sub(a, b); }},
    {"__mul", "*", [](const at::Tensor& a, const at::Tensor& b) { return at::mul(a, b); }},
    {"__div", "/", [](const at::Tensor& a, const at::Tensor& b) { return at::div(a, b); }},
    {"__mod", "%", [](const at::Tensor& a, const at::Tensor& b) { return lua::remainder(a, b); }},
};

int tensor_operator(lua_State* L) {
  auto* op = static_cast<const Operator*>(lua_touserdata(L, lua_upvalueindex(1)));
  if (push_small_arith(L, op->symbol[0])) return 1;  // a few elements, no autograd
  auto o = operands(L, op->symbol);
  push_tensor(L, op->fn(o.a, o.b));
  return 1;
}

int tensor_pow(lua_State* L) {
  auto o = operands(L, "^");
  if (lua_type(L, 2) == LUA_TNUMBER)
    push_tensor(L, at::pow(o.a, number_scalar(lua_tonumber(L, 2))));
  else if (lua_type(L, 1) == LUA_TNUMBER)
    push_tensor(L, at::pow(number_scalar(lua_tonumber(L, 1)), o.b));
  else
    push_tensor(L, at::pow(o.a, o.b));
  return 1;
}
int tensor_unm(lua_State* L) {
  push_tensor(L, at::neg(check_tensor(L, 1)));
  return 1;
}

// ---- indexing ---------------------------------------------------------------
//
// x[i]                  select along the first dimension (1-based, negative from the end)
// x[{i, j}]             one entry per dimension: a number selects (the dim goes away),
//                       {} keeps the dim, {a} narrows to a, {a, b} to a..b inclusive,
//                       {a, b, step} strides (Torch7's form)
// x[mask]               a bool tensor selects elements (masked_select)
// x[index]              an integer tensor picks rows (index_select along dim 1)

int64_t entry_integer(lua_State* L, int idx, int k) {
  double v = lua_tonumber(L, idx);
  if (lua_type(L, idx) != LUA_TNUMBER || v != std::floor(v) || !(v > -9223372036854775808.0 && v < 9223372036854775808.0))
    throw CallError("bad index entry " + std::to_string(k) + " (integer expected, got " +
                    (lua_type(L, idx) == LUA_TNUMBER ? std::to_string(v) : type_name(L, idx)) + ")");
  return static_cast<int64_t>(v);
}

at::Tensor index_with_table(lua_State* L, at::Tensor t, int key) {
  int n;
  try {
    n = static_cast<int>(check_list_length(L, key, key, "the index table"));
  } catch (const ArgError& e) {
    throw CallError(std::string("bad index (") + e.what() + ")");
  }
  if (n > t.dim())
    throw CallError("too many indices for a " + std::to_string(t.dim()) + "-dimensional tensor (got " +
                    std::to_string(n) + ")");
  int64_t d = 0;  // the dimension of `t` that entry k addresses
  for (int k = 1; k <= n; ++k) {
    lua_rawgeti(L, key, k);
    int type = lua_type(L, -1);
    if (type == LUA_TNUMBER) {
      int64_t i = entry_integer(L, -1, k);
      t = t.select(d, wrap_index(i, t.size(d), 0, k - 1));
    } else if (type == LUA_TTABLE) {
      if (lua_objlen(L, -1) > 0) {
        int64_t size = t.size(d);
        lua_rawgeti(L, -1, 1);
        lua_rawgeti(L, -2, 2);
        lua_rawgeti(L, -3, 3);  // entry, first, last, step
        int64_t first = wrap_index(entry_integer(L, -3, k), size, 0, k - 1);
        int64_t last = lua_isnil(L, -2) ? first : wrap_index(entry_integer(L, -2, k), size, 0, k - 1);
        int64_t step = lua_isnil(L, -1) ? 1 : entry_integer(L, -1, k);
        lua_pop(L, 3);
        if (step < 1) throw CallError("slice step must be positive (got " + std::to_string(step) + ")");
        t = t.slice(d, first, std::max(first, last + 1), step);  // {3, 2} is an empty range
      }
      ++d;
    } else {
      std::string got = type_name(L, -1);
      lua_pop(L, 1);
      throw CallError("bad index entry " + std::to_string(k) + " (number or table expected, got " + got + ")");
    }
    lua_pop(L, 1);
  }
  return t;
}

at::Tensor index_view(lua_State* L, const at::Tensor& t, int key) {
  switch (lua_type(L, key)) {
    case LUA_TNUMBER: {
      if (t.dim() == 0) throw CallError("cannot index a 0-dimensional tensor (use x:item())");
      return t.select(0, wrap_index(check_integer(L, key), t.size(0), 0, 0));
    }
    case LUA_TTABLE:
      return index_with_table(L, t, key);
    default:
      throw CallError("bad index (number, table or Tensor expected, got " + type_name(L, key) + ")");
  }
}

// Properties read as fields: x.shape, x.grad, x.dtype, ...
bool push_property(lua_State* L, const at::Tensor& t, const char* key) {
  std::string k(key);
  if (k == "shape") push_sizes(L, t.sizes());
  else if (k == "grad") push_tensor(L, t.grad());
  else if (k == "requires_grad") lua_pushboolean(L, t.requires_grad());
  else if (k == "dtype") lua_pushstring(L, dtype_name(t.scalar_type()));
  else if (k == "device") lua_pushstring(L, t.device().is_cpu() ? "cpu" : t.device().str().c_str());
  else if (k == "is_leaf") lua_pushboolean(L, t.is_leaf());
  else if (k == "ndim") lua_pushnumber(L, static_cast<lua_Number>(t.dim()));
  else if (k == "grad_fn") {
    if (t.grad_fn()) lua_pushstring(L, t.grad_fn()->name().c_str());
    else lua_pushnil(L);
  } else if (k == "T") push_tensor(L, t.dim() < 2 ? t : t.permute([&] {
             std::vector<int64_t> p(t.dim());
             for (int64_t i = 0; i < t.dim(); ++i) p[i] = t.dim() - 1 - i;
             return p;
           }()));
  else if (k == "is_cuda") lua_pushboolean(L, t.is_cuda());
  else if (k == "data") push_tensor(L, t.detach());
  else return false;
  return true;
}

// __index(x, key); upvalue 1 is the methods table (torch.Tensor).
int tensor_index(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  if (lua_type(L, 2) == LUA_TSTRING) {
    lua_pushvalue(L, 2);
    lua_rawget(L, lua_upvalueindex(1));
    if (!lua_isnil(L, -1)) return 1;
    lua_pop(L, 1);
    if (push_property(L, t, lua_tostring(L, 2))) return 1;
    lua_pushnil(L);  // unknown field: nil, as for any Lua value
    return 1;
  }
  if (at::Tensor* key = to_tensor(L, 2)) {
    // x[idx], x[mask]: as PyTorch's advanced indexing, an index on the CPU
    // serves a tensor anywhere (checked on the CPU, then moved)
    if (key->scalar_type() == at::kBool) {
      push_tensor(L, t.masked_select(key->to(t.device())));
    } else {
      if (t.dim() == 0) throw CallError("cannot index a 0-dimensional tensor");
      push_tensor(L, t.index_select(0, zero_based_index(*key, t.size(0), 2).reshape({-1}).to(t.device())));
    }
    return 1;
  }
  push_tensor(L, index_view(L, t, 2));
  return 1;
}

// __newindex(x, key, value): x[...] = v copies into the view; a few fields are settable.
int tensor_newindex(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  if (lua_type(L, 2) == LUA_TSTRING) {
    std::string k = lua_tostring(L, 2);
    if (k == "requires_grad") {
      t.requires_grad_(lua_toboolean(L, 3));
    } else if (k == "data") {
      // x.data = y: x takes y's values, shape, dtype and device, and keeps its
      // identity (what an optimizer or a module holds), as in PyTorch.
      t.set_data(check_tensor(L, 3));
    } else if (k == "grad") {
      if (lua_isnil(L, 3)) {
        t.mutable_grad() = at::Tensor();
      } else {
        // PyTorch's rules: a gradient of the tensor's own shape, dtype and
        // device, and not the tensor itself
        const at::Tensor& g = check_tensor(L, 3);
        if (g.is_same(t)) throw ArgError(3, "a tensor cannot be its own grad");
        if (g.sizes() != t.sizes())
          throw ArgError(3, "grad has shape " + shape_string(g.sizes()) + ", the tensor " + shape_string(t.sizes()));
        if (g.scalar_type() != t.scalar_type() || g.device() != t.device())
          throw ArgError(3, std::string("grad is ") + dtype_name(g.scalar_type()) + " on " + g.device().str() + ", the tensor " +
                                dtype_name(t.scalar_type()) + " on " + t.device().str());
        t.mutable_grad() = g;
      }
    } else {
      throw CallError("cannot set field '" + k + "' of a Tensor (settable: requires_grad, grad, data)");
    }
    return 0;
  }
  at::Tensor* key = to_tensor(L, 2);
  if (key && key->scalar_type() == at::kBool) {  // a CPU mask or index serves any tensor, as in x[idx] above
    if (lua_type(L, 3) == LUA_TNUMBER) t.masked_fill_(key->to(t.device()), lua_tonumber(L, 3));
    else t.index_put_({key->to(t.device())}, check_tensor(L, 3));
    return 0;
  }
  at::Tensor view = key ? at::Tensor() : index_view(L, t, 2);
  if (key) {
    at::Tensor idx = zero_based_index(*key, t.size(0), 2).reshape({-1}).to(t.device());
    if (lua_type(L, 3) == LUA_TNUMBER) t.index_fill_(0, idx, lua_tonumber(L, 3));
    else t.index_copy_(0, idx, check_tensor(L, 3).expand_as(t.index_select(0, idx)));
    return 0;
  }
  if (lua_type(L, 3) == LUA_TNUMBER) view.fill_(lua_tonumber(L, 3));
  else if (lua_type(L, 3) == LUA_TBOOLEAN) view.fill_(static_cast<bool>(lua_toboolean(L, 3)));
  else if (at::Tensor* v = to_tensor(L, 3)) view.copy_(*v);
  else throw CallError("bad value for tensor assignment (number or Tensor expected, got " + type_name(L, 3) + ")");
  return 0;
}

// ---- conversion -------------------------------------------------------------

// x:to('float64'), x:to('cuda'), x:to(other), x:to{dtype=, device=}
int tensor_to(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  if (at::Tensor* o = to_tensor(L, 2)) {
    push_tensor(L, t.to(o->device(), o->scalar_type()));
    return 1;
  }
  at::TensorOptions opts = at::TensorOptions().dtype(t.scalar_type()).device(t.device());
  bool non_blocking = false;
  for (int i = 2; i <= lua_gettop(L); ++i) {
    if (lua_type(L, i) == LUA_TSTRING) {
      std::string s = lua_tostring(L, i);
      bool is_device = is_device_name(s);
      if (is_device) opts = opts.device(parse_device_arg(s, i));
      else opts = opts.dtype(parse_dtype(s, i));
    } else if (is_options(L, i)) {
      check_option_keys(L, i, {"dtype", "device", "non_blocking"});
      if (auto v = option<std::string>(L, i, "dtype")) opts = opts.dtype(parse_dtype(*v, i));
      // non_blocking: a copy from pinned host memory to a GPU does not wait (as in PyTorch)
      non_blocking = option<bool>(L, i, "non_blocking").value_or(false);
      if (auto v = option<std::string>(L, i, "device")) opts = opts.device(parse_device_arg(*v, i));
    } else {
      throw ArgError(i, "dtype, device, Tensor or options expected, got " + type_name(L, i));
    }
  }
  push_tensor(L, t.to(opts.device(), opts.dtype().toScalarType(), non_blocking));
  return 1;
}

// t:pin_memory() -> a copy in page-locked host memory (needs CUDA), for
// copies to the GPU that do not wait; t:is_pinned() -> whether t is in it.
int tensor_pin_memory(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  if (!t.is_cpu()) throw CallError("pin_memory: only CPU tensors can be pinned, this one is on " + t.device().str());
  if (!at::hasCUDA()) throw CallError("pin_memory: pinned memory needs a GPU, and none is visible");
  push_tensor(L, t.pin_memory());
  return 1;
}

int tensor_is_pinned(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  lua_pushboolean(L, t.is_cpu() && at::hasCUDA() && t.is_pinned());
  return 1;
}

template <c10::ScalarType T>
int tensor_cast(lua_State* L) {
  push_tensor(L, check_tensor(L, 1).to(T));
  return 1;
}

int tensor_cpu(lua_State* L) {
  push_tensor(L, check_tensor(L, 1).to(at::kCPU));
  return 1;
}

int tensor_cuda(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  push_tensor(L, t.to(parse_device_arg(lua_isnoneornil(L, 2) ? "cuda" : check_string(L, 2), 2)));
  return 1;
}

void push_scalar(lua_State* L, const at::Tensor& e) {
  if (e.scalar_type() == at::kBool) lua_pushboolean(L, e.item<bool>());
  else lua_pushnumber(L, e.item<double>());
}

// item and tolist read values: a meta tensor has none (PyTorch's own message speaks of fake kernels)
void require_values(const at::Tensor& t) {
  if (t.is_meta()) throw ArgError(1, "a meta tensor has a shape and a dtype but no values to read");
}

int tensor_item(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  require_values(t);
  if (t.numel() != 1)
    throw ArgError(1, "item() needs a tensor with one element, got " + std::to_string(t.numel()) + " of shape " +
                          shape_string(t.sizes()));
  push_scalar(L, t);
  return 1;
}

// Nested Lua tables, one level per dimension.
void push_list(lua_State* L, const at::Tensor& t, const double* data, const bool* flags, int64_t dim, int64_t offset,
               const std::vector<int64_t>& strides) {
  if (dim == t.dim()) {
    if (flags) lua_pushboolean(L, flags[offset]);
    else lua_pushnumber(L, data[offset]);
    return;
  }
  int64_t n = t.size(dim);
  lua_createtable(L, static_cast<int>(n), 0);
  for (int64_t i = 0; i < n; ++i) {
    push_list(L, t, data, flags, dim + 1, offset + i * strides[dim], strides);
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
}

int tensor_tolist(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  require_values(t);
  bool is_bool = t.scalar_type() == at::kBool;
  at::Tensor c = t.detach().to(at::kCPU, is_bool ? at::kBool : at::kDouble).contiguous();
  std::vector<int64_t> strides = c.strides().vec();
  if (is_bool) push_list(L, c, nullptr, c.data_ptr<bool>(), 0, 0, strides);
  else push_list(L, c, c.data_ptr<double>(), nullptr, 0, 0, strides);
  return 1;
}

const luaL_Reg tensor_metamethods[] = {
    {"__gc", tensor_gc},                     // plain: must not raise
    {"__tostring", guarded<tensor_tostring>},
    {"__eq", guarded<tensor_eq>},
    {"__len", guarded<tensor_len>},
    {"__pow", guarded<tensor_pow>},
    {"__unm", guarded<tensor_unm>},
    {"__newindex", guarded<tensor_newindex>},
    {nullptr, nullptr},
};

const luaL_Reg tensor_methods[] = {
    {"to", guarded<tensor_to>},
    {"pin_memory", guarded<tensor_pin_memory>},
    {"is_pinned", guarded<tensor_is_pinned>},
    {"float", guarded<tensor_cast<at::kFloat>>},
    {"double", guarded<tensor_cast<at::kDouble>>},
    {"half", guarded<tensor_cast<at::kHalf>>},
    {"bfloat16", guarded<tensor_cast<at::kBFloat16>>},
    {"long", guarded<tensor_cast<at::kLong>>},
    {"int", guarded<tensor_cast<at::kInt>>},
    {"bool", guarded<tensor_cast<at::kBool>>},
    {"cpu", guarded<tensor_cpu>},
    {"cuda", guarded<tensor_cuda>},
    {"item", guarded<tensor_item>},
    {"tolist", guarded<tensor_tolist>},
    {nullptr, nullptr},
};

}  // namespace

void push_tensor_table(lua_State* L, const std::vector<at::Tensor>& ts) {
  lua_createtable(L, static_cast<int>(ts.size()), 0);
  for (size_t i = 0; i < ts.size(); ++i) {
    push_tensor(L, ts[i]);
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
}

std::vector<at::Tensor> check_tensor_table(lua_State* L, int idx) {
  if (lua_type(L, idx) != LUA_TTABLE) throw ArgError(idx, "table of tensors expected, got " + type_name(L, idx));
  std::vector<at::Tensor> ts;
  size_t n = check_list_length(L, idx, idx, "the table of tensors");
  for (size_t i = 1; i <= n; ++i) {
    lua_rawgeti(L, idx, static_cast<int>(i));
    at::Tensor* t = to_tensor(L, -1);
    if (!t) {
      std::string got = type_name(L, -1);
      lua_pop(L, 1);
      throw ArgError(idx, "entry " + std::to_string(i) + " is " + got + ", expected a Tensor");
    }
    ts.push_back(*t);
    lua_pop(L, 1);
  }
  if (ts.empty()) throw ArgError(idx, "expected a non-empty table of tensors");
  return ts;
}

// Creates the Tensor metatable and its methods table (left on the stack:
// it becomes torch.Tensor, which Lua code may extend like any class).
int luaopen_anatomy_tensor(lua_State* L) {
  luaL_newmetatable(L, kTensorMeta);   // mt
  lua_pushlightuserdata(L, &g_tensor_meta_key);
  lua_pushvalue(L, -2);
  lua_rawset(L, LUA_REGISTRYINDEX);    // registry[&key] = mt, for push_tensor and to_tensor
  luaL_register(L, nullptr, tensor_metamethods);
  for (const Operator& op : operators) {
    lua_pushlightuserdata(L, const_cast<Operator*>(&op));
    lua_pushcclosure(L, guarded<tensor_operator>, 1);
    lua_setfield(L, -2, op.event);
  }
  lua_pushliteral(L, "Tensor");
  lua_setfield(L, -2, "__metatable");  // getmetatable(x) gives a string: __gc stays put
  lua_newtable(L);                     // mt methods
  luaL_register(L, nullptr, tensor_methods);
  register_tensor_shape(L, lua_gettop(L));
  register_tensor_math(L, lua_gettop(L));
  register_tensor_reduce(L, lua_gettop(L));
  register_tensor_autograd(L, lua_gettop(L));
  lua_pushvalue(L, -1);
  lua_pushcclosure(L, guarded<tensor_index>, 1);
  lua_setfield(L, -3, "__index");
  lua_remove(L, -2);                   // methods
  return 1;
}

}  // namespace anatomy::lua
