// Tensor math for Lua: elementwise functions of one and two operands
// (comparisons included), products, softmax and gelu. Reductions live in
// tensor_reduce.cpp.
#include <ATen/ATen.h>

#include "bindings/parts.h"
#include "bindings/common.h"
#include "host/tensor_format.h"

namespace anatomy::lua {
namespace {

// ---- elementwise, one operand -------------------------------------------------

struct Unary {
  const char* name;
  at::Tensor (*fn)(const at::Tensor&);
};

const Unary unary_ops[] = {
    {"exp", [](const at::Tensor& t) { return t.exp(); }},
    {"log", [](const at::Tensor& t) { return t.log(); }},
    {"log2", [](const at::Tensor& t) { return t.log2(); }},
    {"log10", [](const at::Tensor& t) { return t.log10(); }},
    {"log1p", [](const at::Tensor& t) { return t.log1p(); }},
    {"expm1", [](const at::Tensor& t) { return t.expm1(); }},
    {"sqrt", [](const at::Tensor& t) { return t.sqrt(); }},
    {"rsqrt", [](const at::Tensor& t) { return t.rsqrt(); }},
    {"square", [](const at::Tensor& t) { return t.square(); }},
    {"abs", [](const at::Tensor& t) { return t.abs(); }},
    {"neg", [](const at::Tensor& t) { return t.neg(); }},
    {"sign", [](const at::Tensor& t) { return t.sign(); }},
    {"reciprocal", [](const at::Tensor& t) { return t.reciprocal(); }},
    {"floor", [](const at::Tensor& t) { return t.floor(); }},
    {"ceil", [](const at::Tensor& t) { return t.ceil(); }},
    {"round", [](const at::Tensor& t) { return t.round(); }},
    {"trunc", [](const at::Tensor& t) { return t.trunc(); }},
    {"sin", [](const at::Tensor& t) { return t.sin(); }},
    {"cos", [](const at::Tensor& t) { return t.cos(); }},
    {"tan", [](const at::Tensor& t) { return t.tan(); }},
    {"asin", [](const at::Tensor& t) { return t.asin(); }},
    {"acos", [](const at::Tensor& t) { return t.acos(); }},
    {"atan", [](const at::Tensor& t) { return t.atan(); }},
    {"sinh", [](const at::Tensor& t) { return t.sinh(); }},
    {"cosh", [](const at::Tensor& t) { return t.cosh(); }},
    {"tanh", [](const at::Tensor& t) { return t.tanh(); }},
    {"sigmoid", [](const at::Tensor& t) { return t.sigmoid(); }},
    {"relu", [](const at::Tensor& t) { return t.relu(); }},
    {"silu", [](const at::Tensor& t) { return at::silu(t); }},
    {"erf", [](const at::Tensor& t) { return t.erf(); }},
    {"isnan", [](const at::Tensor& t) { return t.isnan(); }},
    {"isinf", [](const at::Tensor& t) { return t.isinf(); }},
    {"isfinite", [](const at::Tensor& t) { return t.isfinite(); }},
    {"logical_not", [](const at::Tensor& t) { return t.logical_not(); }},
    {"zero_", [](const at::Tensor& t) { return t.zero_(); }},
    {"exp_", [](const at::Tensor& t) { return t.exp_(); }},
    {"relu_", [](const at::Tensor& t) { return t.relu_(); }},
    {"neg_", [](const at::Tensor& t) { return t.neg_(); }},
};

// upvalue 1: the Unary entry
int tensor_unary(lua_State* L) {
  auto* op = static_cast<const Unary*>(lua_touserdata(L, lua_upvalueindex(1)));
  push_tensor(L, op->fn(check_tensor(L, 1)));
  return 1;
}

// ---- elementwise, two operands ------------------------------------------------

struct Binary {
  const char* name;
  at::Tensor (*fn)(const at::Tensor&, const at::Tensor&);
  bool in_place;  // the result must keep self's shape
  char code = 0;  // '+', '-', '*', '/' for the ops push_small_arith computes on small tensors
};

const Binary binary_ops[] = {
    {"add", [](const at::Tensor& a, const at::Tensor& b) { return at::add(a, b); }, false, '+'},
    {"sub", [](const at::Tensor& a, const at::Tensor& b) { return at::sub(a, b); }, false, '-'},
    {"mul", [](const at::Tensor& a, const at::Tensor& b) { return at::mul(a, b); }, false, '*'},
    {"div", [](const at::Tensor& a, const at::Tensor& b) { return at::div(a, b); }, false, '/'},
    {"remainder", [](const at::Tensor& a, const at::Tensor& b) { return lua::remainder(a, b); }, false},
    {"maximum", [](const at::Tensor& a, const at::Tensor& b) { return at::maximum(a, b); }, false},
    {"minimum", [](const at::Tensor& a, const at::Tensor& b) { return at::minimum(a, b); }, false},
    {"atan2", [](const at::Tensor& a, const at::Tensor& b) { return at::atan2(a, b); }, false},
    {"eq", [](const at::Tensor& a, const at::Tensor& b) { return at::eq(a, b); }, false},
    {"ne", [](const at::Tensor& a, const at::Tensor& b) { return at::ne(a, b); }, false},
    {"lt", [](const at::Tensor& a, const at::Tensor& b) { return at::lt(a, b); }, false},
    {"le", [](const at::Tensor& a, const at::Tensor& b) { return at::le(a, b); }, false},
    {"gt", [](const at::Tensor& a, const at::Tensor& b) { return at::gt(a, b); }, false},
    {"ge", [](const at::Tensor& a, const at::Tensor& b) { return at::ge(a, b); }, false},
    {"logical_and", [](const at::Tensor& a, const at::Tensor& b) { return at::logical_and(a, b); }, false},
    {"logical_or", [](const at::Tensor& a, const at::Tensor& b) { return at::logical_or(a, b); }, false},
    {"add_", [](const at::Tensor& a, const at::Tensor& b) { return a.add_(b); }, true},
    {"sub_", [](const at::Tensor& a, const at::Tensor& b) { return a.sub_(b); }, true},
    {"mul_", [](const at::Tensor& a, const at::Tensor& b) { return a.mul_(b); }, true},
    {"div_", [](const at::Tensor& a, const at::Tensor& b) { return a.div_(b); }, true},
    {"copy_", [](const at::Tensor& a, const at::Tensor& b) { return a.copy_(b); }, true},
};

// upvalue 1: the Binary entry. x:op(y[, alpha]) with y a tensor or a number.
int tensor_binary(lua_State* L) {
  auto* op = static_cast<const Binary*>(lua_touserdata(L, lua_upvalueindex(1)));
  at::Tensor& self = check_tensor(L, 1);
  if (op->code && lua_isnoneornil(L, 3) && push_small_arith(L, op->code)) return 1;  // a few elements, no autograd
  at::Tensor other = tensor_or_scalar(L, 2);
  check_broadcast(self, other, 2);
  if (op->in_place && other.dim() > self.dim())
    throw ArgError(2, "shape " + shape_string(other.sizes()) + " cannot be written into " + shape_string(self.sizes()));
  if (!lua_isnoneornil(L, 3)) {  // add(y, alpha) / sub(y, alpha): y scaled by alpha
    std::string n = op->name;
    if (n != "add" && n != "sub" && n != "add_" && n != "sub_") throw ArgError(3, "unexpected argument");
    other = other * check_number(L, 3);
  }
  push_tensor(L, op->fn(self, other));
  return 1;
}

int tensor_pow(lua_State* L) {
  at::Tensor& self = check_tensor(L, 1);
  if (lua_type(L, 2) == LUA_TNUMBER) {
    push_tensor(L, at::pow(self, number_scalar(lua_tonumber(L, 2))));
  } else {
    at::Tensor& e = check_tensor(L, 2);
    check_broadcast(self, e, 2);
    push_tensor(L, at::pow(self, e));
  }
  return 1;
}

// The bounds are Lua numbers taken as integers when integral, so an integer
// tensor stays integer (x:clamp(1, 5) on int64 is int64, as in PyTorch).
int clamp_with(lua_State* L, bool want_lo, bool want_hi) {
  at::Tensor& self = check_tensor(L, 1);
  c10::optional<at::Scalar> lo, hi;
  if (want_lo && want_hi && is_options(L, 2)) {
    check_option_keys(L, 2, {"min", "max"});
    if (auto v = option<double>(L, 2, "min")) lo = number_scalar(*v);
    if (auto v = option<double>(L, 2, "max")) hi = number_scalar(*v);
  } else if (want_lo && want_hi) {
    if (!lua_isnoneornil(L, 2)) lo = number_scalar(check_number(L, 2));
    if (!lua_isnoneornil(L, 3)) hi = number_scalar(check_number(L, 3));
  } else {
    (want_lo ? lo : hi) = number_scalar(check_number(L, 2));
  }
  if (!lo && !hi) throw ArgError(2, "clamp needs a min or a max");
  push_tensor(L, at::clamp(self, lo, hi));
  return 1;
}

int tensor_clamp(lua_State* L) { return clamp_with(L, true, true); }
int tensor_clamp_min(lua_State* L) { return clamp_with(L, true, false); }
int tensor_clamp_max(lua_State* L) { return clamp_with(L, false, true); }

// x:softplus(beta = 1, threshold = 20): log(1 + exp(beta x)) / beta, x itself where beta x > threshold
int tensor_softplus(lua_State* L) {
  at::Tensor& self = check_tensor(L, 1);
  double beta = lua_isnoneornil(L, 2) ? 1.0 : check_number(L, 2);
  double threshold = lua_isnoneornil(L, 3) ? 20.0 : check_number(L, 3);
  push_tensor(L, at::softplus(self, beta, threshold));
  return 1;
}

int tensor_gelu(lua_State* L) {
  at::Tensor& self = check_tensor(L, 1);
  std::string approximate = "none";
  if (lua_type(L, 2) == LUA_TSTRING) {
    approximate = lua_tostring(L, 2);
  } else if (is_options(L, 2)) {
    check_option_keys(L, 2, {"approximate"});
    if (auto v = option<std::string>(L, 2, "approximate")) approximate = *v;
  } else if (!lua_isnoneornil(L, 2)) {
    throw ArgError(2, "'none' or 'tanh' expected, got " + type_name(L, 2));
  }
  if (approximate != "none" && approximate != "tanh")
    throw ArgError(2, "approximate must be 'none' or 'tanh', got '" + approximate + "'");
  push_tensor(L, at::gelu(self, approximate));
  return 1;
}

// x:softmax(dim) and x:log_softmax(dim), over dim (the last by default)
template <bool Log>
int tensor_softmax(lua_State* L) {
  at::Tensor& self = check_tensor(L, 1);
  int64_t dim = check_dim(L, 2, std::max<int64_t>(self.dim(), 1));
  push_tensor(L, Log ? at::log_softmax(self, dim) : at::softmax(self, dim));
  return 1;
}

// ---- products -------------------------------------------------------------------

[[noreturn]] void cannot_multiply(const at::Tensor& a, const at::Tensor& b) {
  throw ArgError(2, "shapes " + shape_string(a.sizes()) + " and " + shape_string(b.sizes()) + " cannot be multiplied");
}

void require_dim(const at::Tensor& t, int64_t dim, int arg, const char* what) {
  if (t.dim() != dim)
    throw ArgError(arg, std::string(what) + " expects " + std::to_string(dim) + "-dimensional tensors, got " +
                            std::to_string(t.dim()) + "-dimensional (shape " + shape_string(t.sizes()) + ")");
}

int tensor_matmul(lua_State* L) {
  at::Tensor& a = check_tensor(L, 1);
  at::Tensor& b = check_tensor(L, 2);
  if (a.dim() == 0) throw ArgError(1, "matmul needs at least 1 dimension, got a 0-dimensional tensor");
  if (b.dim() == 0) throw ArgError(2, "matmul needs at least 1 dimension, got a 0-dimensional tensor");
  int64_t inner_b = b.dim() == 1 ? b.size(0) : b.size(-2);
  if (a.size(-1) != inner_b) cannot_multiply(a, b);
  if (a.dim() > 2 && b.dim() > 2 &&  // batch dimensions broadcast
      !broadcastable(a.sizes().slice(0, a.dim() - 2), b.sizes().slice(0, b.dim() - 2)))
    cannot_multiply(a, b);
  push_tensor(L, at::matmul(a, b));
  return 1;
}

// The products of two tensors of one fixed number of dimensions each.
struct Product {
  const char* name;
  int64_t dim;                                             // of each operand
  bool (*fits)(const at::Tensor& a, const at::Tensor& b);  // the sizes that must agree do
  at::Tensor (*fn)(const at::Tensor& a, const at::Tensor& b);
};

const Product products[] = {
    {"mm", 2, [](const at::Tensor& a, const at::Tensor& b) { return a.size(1) == b.size(0); },
     [](const at::Tensor& a, const at::Tensor& b) { return at::mm(a, b); }},
    {"bmm", 3, [](const at::Tensor& a, const at::Tensor& b) { return a.size(0) == b.size(0) && a.size(2) == b.size(1); },
     [](const at::Tensor& a, const at::Tensor& b) { return at::bmm(a, b); }},
    {"dot", 1, [](const at::Tensor& a, const at::Tensor& b) { return a.size(0) == b.size(0); },
     [](const at::Tensor& a, const at::Tensor& b) { return at::dot(a, b); }},
    {"outer", 1, [](const at::Tensor&, const at::Tensor&) { return true; },
     [](const at::Tensor& a, const at::Tensor& b) { return at::outer(a, b); }},
};

// upvalue 1: the Product entry
int tensor_product(lua_State* L) {
  auto* op = static_cast<const Product*>(lua_touserdata(L, lua_upvalueindex(1)));
  at::Tensor& a = check_tensor(L, 1);
  at::Tensor& b = check_tensor(L, 2);
  require_dim(a, op->dim, 1, op->name);
  require_dim(b, op->dim, 2, op->name);
  if (!op->fits(a, b)) cannot_multiply(a, b);
  push_tensor(L, op->fn(a, b));
  return 1;
}

int tensor_clamp_(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  tensor_clamp(L);
  t.copy_(check_tensor(L, -1));
  lua_settop(L, 1);
  return 1;
}

const luaL_Reg math_methods[] = {
    {"pow", guarded<tensor_pow>},
    {"clamp", guarded<tensor_clamp>},
    {"clip", guarded<tensor_clamp>},
    {"clamp_min", guarded<tensor_clamp_min>},
    {"clamp_max", guarded<tensor_clamp_max>},
    {"softplus", guarded<tensor_softplus>},
    {"clamp_", guarded<tensor_clamp_>},
    {"gelu", guarded<tensor_gelu>},
    {"softmax", guarded<tensor_softmax<false>>},
    {"log_softmax", guarded<tensor_softmax<true>>},
    {"matmul", guarded<tensor_matmul>},
    {nullptr, nullptr},
};

// Each entry of a table as methods[entry.name]: a closure of fn with the entry as upvalue 1.
template <class Op, size_t N>
void register_each(lua_State* L, int methods, const Op (&ops)[N], lua_CFunction fn) {
  for (const Op& op : ops) {
    lua_pushlightuserdata(L, const_cast<Op*>(&op));
    lua_pushcclosure(L, fn, 1);
    lua_setfield(L, methods, op.name);
  }
}

}  // namespace

void register_tensor_math(lua_State* L, int methods) {
  luaL_register(L, nullptr, math_methods);  // registers into the table on top (methods)
  register_each(L, methods, unary_ops, guarded<tensor_unary>);
  register_each(L, methods, binary_ops, guarded<tensor_binary>);
  register_each(L, methods, products, guarded<tensor_product>);
}

}  // namespace anatomy::lua
