// Reductions of Tensor (sum, mean, std, norm, max, topk, ...), selection with
// index tensors (gather, scatter, masked_fill, where) and in-place fills.
// Dims and indices are 1-based, and index results are too (common.h).
#include <ATen/ATen.h>

#include "bindings/parts.h"
#include "bindings/common.h"
#include "host/tensor_format.h"

namespace anatomy::lua {
namespace {

// ---- reductions -----------------------------------------------------------------

// (dim?, keepdim?, {dim=, keepdim=, ...}?) from `start`: dim is a number or a
// table of numbers; the options table may come in any of the three places.
struct Reduce {
  bool has_dims = false;
  std::vector<int64_t> dims;
  bool keepdim = false;
  int options = 0;  // stack index of the options table, 0 if none
};

Reduce reduce_args(lua_State* L, int start, int64_t ndim, std::vector<const char*> keys = {"dim", "keepdim"}) {
  Reduce r;
  int64_t n = std::max<int64_t>(ndim, 1);
  auto read_dims = [&](int idx) {
    r.has_dims = true;
    if (lua_type(L, idx) == LUA_TNUMBER) {
      r.dims = {check_dim(L, idx, n)};
    } else {
      r.dims = check_sizes(L, idx);
      for (auto& d : r.dims) d = wrap_dim(d, n, idx);
    }
  };
  for (int i = start; i < start + 3 && i <= lua_gettop(L); ++i) {
    if (is_options(L, i)) {
      r.options = i;
      check_option_keys(L, i, keys);
      if (get_option(L, i, "dim") != LUA_TNIL) read_option(i, "dim", [&] { read_dims(lua_gettop(L)); });
      lua_pop(L, 1);
      if (auto v = option<bool>(L, i, "keepdim")) r.keepdim = *v;
      break;
    }
    if (i == start && (lua_type(L, i) == LUA_TNUMBER || lua_type(L, i) == LUA_TTABLE)) read_dims(i);
    else if (i == start + 1 && lua_type(L, i) == LUA_TBOOLEAN) r.keepdim = lua_toboolean(L, i);
    else if (!lua_isnil(L, i)) throw ArgError(i, (i == start ? "dimension" : "keepdim (boolean)") + std::string(" expected, got ") + type_name(L, i));
  }
  return r;
}

int tensor_sum(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  Reduce r = reduce_args(L, 2, t.dim());
  push_tensor(L, r.has_dims ? at::sum(t, r.dims, r.keepdim) : t.sum());
  return 1;
}

int tensor_mean(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  if (!at::isFloatingType(t.scalar_type()))
    throw ArgError(1, std::string("mean needs a floating-point tensor, got ") + dtype_name(t.scalar_type()));
  Reduce r = reduce_args(L, 2, t.dim());
  push_tensor(L, r.has_dims ? at::mean(t, r.dims, r.keepdim) : t.mean());
  return 1;
}

int tensor_logsumexp(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  Reduce r = reduce_args(L, 2, t.dim());
  if (!r.has_dims) throw ArgError(2, "dimension expected, got " + type_name(L, 2));
  push_tensor(L, at::logsumexp(t, r.dims, r.keepdim));
  return 1;
}

bool unbiased_option(lua_State* L, const Reduce& r) {
  bool unbiased = true;
  if (r.options) unbiased = option<bool>(L, r.options, "unbiased").value_or(true);
  return unbiased;
}

// x:std(dim, keepdim, {unbiased = true}) and x:var(...): the spread over dims (all by default)
template <bool Var>
int tensor_spread(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  Reduce r = reduce_args(L, 2, t.dim(), {"dim", "keepdim", "unbiased"});
  bool unbiased = unbiased_option(L, r);
  at::Tensor out;
  if (r.has_dims)
    out = Var ? at::var(t, at::OptionalIntArrayRef(r.dims), unbiased, r.keepdim)
              : at::std(t, at::OptionalIntArrayRef(r.dims), unbiased, r.keepdim);
  else
    out = Var ? at::var(t, unbiased) : at::std(t, unbiased);
  push_tensor(L, out);
  return 1;
}

// x:norm(p = 2, dim, keepdim); p may be 'fro' (the 2-norm of all elements).
int tensor_norm(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  double p = 2;
  if (lua_type(L, 2) == LUA_TNUMBER) {
    p = lua_tonumber(L, 2);
  } else if (lua_type(L, 2) == LUA_TSTRING) {
    std::string s = lua_tostring(L, 2);
    if (s != "fro") throw ArgError(2, "norm type must be a number or 'fro', got '" + s + "'");
  } else if (!lua_isnoneornil(L, 2)) {
    throw ArgError(2, "number or 'fro' expected, got " + type_name(L, 2));
  }
  Reduce r = reduce_args(L, 3, t.dim());
  push_tensor(L, r.has_dims ? at::norm(t, p, r.dims, r.keepdim) : at::norm(t, p));
  return 1;
}

// x:max() | x:max(dim, keepdim) -> values, indices | x:max(y) elementwise
int extremum(lua_State* L, bool is_max) {
  at::Tensor& t = check_tensor(L, 1);
  if (at::Tensor* other = to_tensor(L, 2)) {
    check_broadcast(t, *other, 2);
    push_tensor(L, is_max ? at::maximum(t, *other) : at::minimum(t, *other));
    return 1;
  }
  Reduce r = reduce_args(L, 2, t.dim());
  if (t.numel() == 0) throw ArgError(1, std::string(is_max ? "max" : "min") + " of an empty tensor");
  if (!r.has_dims) {
    push_tensor(L, is_max ? t.max() : t.min());
    return 1;
  }
  if (r.dims.size() != 1) throw ArgError(2, "max and min take one dimension");
  auto [values, indices] = is_max ? at::max(t, r.dims[0], r.keepdim) : at::min(t, r.dims[0], r.keepdim);
  push_tensor(L, values);
  push_tensor(L, indices + 1);
  return 2;
}
int tensor_max(lua_State* L) { return extremum(L, true); }

// x:median() -> the lower median of all elements | x:median(dim, keepdim) -> values, indices (1-based)
int tensor_median(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  Reduce r = reduce_args(L, 2, t.dim());
  if (t.numel() == 0) throw ArgError(1, "median of an empty tensor");
  if (!r.has_dims) {
    push_tensor(L, t.median());
    return 1;
  }
  if (r.dims.size() != 1) throw ArgError(2, "median takes one dimension");
  auto [values, indices] = at::median(t, r.dims[0], r.keepdim);
  push_tensor(L, values);
  push_tensor(L, indices + 1);
  return 2;
}
int tensor_min(lua_State* L) { return extremum(L, false); }

int arg_extremum(lua_State* L, bool is_max) {
  at::Tensor& t = check_tensor(L, 1);
  Reduce r = reduce_args(L, 2, t.dim());
  if (r.dims.size() > 1) throw ArgError(2, "argmax and argmin take one dimension");
  c10::optional<int64_t> dim;
  if (r.has_dims) dim = r.dims[0];
  push_tensor(L, (is_max ? at::argmax(t, dim, r.keepdim) : at::argmin(t, dim, r.keepdim)) + 1);
  return 1;
}
int tensor_argmax(lua_State* L) { return arg_extremum(L, true); }
int tensor_argmin(lua_State* L) { return arg_extremum(L, false); }

int tensor_cumsum(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  push_tensor(L, at::cumsum(t, check_dim(L, 2, std::max<int64_t>(t.dim(), 1))));
  return 1;
}

int tensor_all(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  Reduce r = reduce_args(L, 2, t.dim());
  push_tensor(L, r.has_dims ? at::all(t, r.dims.at(0), r.keepdim) : at::all(t));
  return 1;
}

int tensor_any(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  Reduce r = reduce_args(L, 2, t.dim());
  push_tensor(L, r.has_dims ? at::any(t, r.dims.at(0), r.keepdim) : at::any(t));
  return 1;
}

// x:topk(k, dim = -1, {largest = true, sorted = true}) -> values, indices
int tensor_topk(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  int64_t k = check_integer(L, 2);
  int64_t d = lua_type(L, 3) == LUA_TNUMBER ? check_dim(L, 3, std::max<int64_t>(t.dim(), 1)) : std::max<int64_t>(t.dim(), 1) - 1;
  int opts = is_options(L, 3) ? 3 : (is_options(L, 4) ? 4 : 0);
  bool largest = true, sorted = true;
  if (opts) {
    check_option_keys(L, opts, {"largest", "sorted"});
    if (auto v = option<bool>(L, opts, "largest")) largest = *v;
    if (auto v = option<bool>(L, opts, "sorted")) sorted = *v;
  }
  int64_t size = t.dim() == 0 ? 1 : t.size(d);
  if (k < 0 || k > size) throw ArgError(2, "k = " + std::to_string(k) + " out of range for a dimension of size " + std::to_string(size));
  auto [values, indices] = at::topk(t, k, d, largest, sorted);
  push_tensor(L, values);
  push_tensor(L, indices + 1);
  return 2;
}

// x:sort(dim = -1, descending = false) -> values, indices
int tensor_sort(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  int64_t d = lua_isnoneornil(L, 2) ? std::max<int64_t>(t.dim(), 1) - 1 : check_dim(L, 2, std::max<int64_t>(t.dim(), 1));
  auto [values, indices] = at::sort(t, d, opt_boolean(L, 3, false));
  push_tensor(L, values);
  push_tensor(L, indices + 1);
  return 2;
}

// x:multinomial(n, replacement = false) -> 1-based indices drawn with weights x (rows)
int tensor_multinomial(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  if (t.dim() < 1 || t.dim() > 2) throw ArgError(1, "multinomial needs a 1- or 2-dimensional tensor of weights");
  int64_t n = check_integer(L, 2);
  bool replacement = opt_boolean(L, 3, false);
  if (n < 1 || (!replacement && n > t.size(-1)))
    throw ArgError(2, "cannot draw " + std::to_string(n) + " of " + std::to_string(t.size(-1)) + " categories");
  push_tensor(L, at::multinomial(t, n, replacement) + 1);
  return 1;
}

// ---- selection with index tensors ------------------------------------------

int tensor_index_select(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  int64_t d = check_dim(L, 2, t.dim());
  at::Tensor& index = check_tensor(L, 3);
  if (index.dim() > 1) throw ArgError(3, "index must be 1-dimensional, got shape " + shape_string(index.sizes()));
  push_tensor(L, t.index_select(d, zero_based_index(index, t.size(d), 3)));
  return 1;
}

void check_gather_shape(const at::Tensor& t, const at::Tensor& index, int64_t d, int arg) {
  if (index.dim() != t.dim())
    throw ArgError(arg, "index must have as many dimensions as the tensor (" + std::to_string(t.dim()) + "), got " +
                            std::to_string(index.dim()));
  for (int64_t i = 0; i < t.dim(); ++i)
    if (i != d && index.size(i) > t.size(i))
      throw ArgError(arg, "index shape " + shape_string(index.sizes()) + " exceeds tensor shape " +
                              shape_string(t.sizes()) + " at dimension " + std::to_string(i + 1));
}

int tensor_gather(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  int64_t d = check_dim(L, 2, t.dim());
  at::Tensor& index = check_tensor(L, 3);
  check_gather_shape(t, index, d, 3);
  push_tensor(L, t.gather(d, zero_based_index(index, t.size(d), 3)));
  return 1;
}

int scatter(lua_State* L, bool add) {
  at::Tensor& t = check_tensor(L, 1);
  int64_t d = check_dim(L, 2, t.dim());
  at::Tensor& index = check_tensor(L, 3);
  check_gather_shape(t, index, d, 3);
  at::Tensor i0 = zero_based_index(index, t.size(d), 3);
  if (lua_type(L, 4) == LUA_TNUMBER && !add) {
    push_tensor(L, t.scatter(d, i0, lua_tonumber(L, 4)));
  } else {
    at::Tensor& src = check_tensor(L, 4);
    for (int64_t i = 0; i < index.dim(); ++i)
      if (src.dim() != index.dim() || index.size(i) > src.size(i))
        throw ArgError(4, "source shape " + shape_string(src.sizes()) + " is smaller than index shape " + shape_string(index.sizes()));
    push_tensor(L, add ? t.scatter_add(d, i0, src) : t.scatter(d, i0, src));
  }
  return 1;
}
int tensor_scatter(lua_State* L) { return scatter(L, false); }
int tensor_scatter_add(lua_State* L) { return scatter(L, true); }

int masked_fill(lua_State* L, bool in_place) {
  at::Tensor& t = check_tensor(L, 1);
  at::Tensor& mask = check_tensor(L, 2);
  if (mask.scalar_type() != at::kBool)
    throw ArgError(2, std::string("mask must be a bool tensor, got ") + dtype_name(mask.scalar_type()));
  check_broadcast(t, mask, 2);
  at::Tensor value = tensor_or_scalar(L, 3, "number or 0-dimensional Tensor");
  if (in_place) push_tensor(L, t.masked_fill_(mask, value));
  else push_tensor(L, t.masked_fill(mask, value));
  return 1;
}
int tensor_masked_fill(lua_State* L) { return masked_fill(L, false); }
int tensor_masked_fill_(lua_State* L) { return masked_fill(L, true); }

int tensor_masked_select(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  at::Tensor& mask = check_tensor(L, 2);
  if (mask.scalar_type() != at::kBool)
    throw ArgError(2, std::string("mask must be a bool tensor, got ") + dtype_name(mask.scalar_type()));
  check_broadcast(t, mask, 2);
  push_tensor(L, t.masked_select(mask));
  return 1;
}

// x:where(condition, y): x where condition holds, else y (PyTorch's Tensor.where)
int tensor_where(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  at::Tensor& cond = check_tensor(L, 2);
  if (cond.scalar_type() != at::kBool)
    throw ArgError(2, std::string("condition must be a bool tensor, got ") + dtype_name(cond.scalar_type()));
  at::Tensor other = tensor_or_scalar(L, 3);
  check_broadcast(t, cond, 2);
  check_broadcast(t, other, 3);
  push_tensor(L, at::where(cond, t, other));
  return 1;
}

int tensor_tril(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  if (t.dim() < 2) throw ArgError(1, "tril needs at least 2 dimensions, got " + std::to_string(t.dim()));
  push_tensor(L, t.tril(lua_isnoneornil(L, 2) ? 0 : check_integer(L, 2)));
  return 1;
}

int tensor_triu(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  if (t.dim() < 2) throw ArgError(1, "triu needs at least 2 dimensions, got " + std::to_string(t.dim()));
  push_tensor(L, t.triu(lua_isnoneornil(L, 2) ? 0 : check_integer(L, 2)));
  return 1;
}

// ---- in place ---------------------------------------------------------------

int tensor_fill_(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  if (lua_type(L, 2) == LUA_TBOOLEAN) t.fill_(static_cast<bool>(lua_toboolean(L, 2)));
  else if (at::Tensor* v = to_tensor(L, 2)) t.fill_(*v);
  else t.fill_(check_number(L, 2));
  lua_settop(L, 1);
  return 1;
}

// x:uniform_(from = 0, to = 1) and x:normal_(mean = 0, std = 1): x filled in place with draws
template <bool Normal>
int tensor_random_(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  double a = lua_isnoneornil(L, 2) ? 0 : check_number(L, 2);
  double b = lua_isnoneornil(L, 3) ? 1 : check_number(L, 3);
  if (Normal && b < 0) throw ArgError(3, "standard deviation must be non-negative");
  if (!Normal && a > b) throw ArgError(3, "upper bound must not be below lower bound");
  if (Normal) t.normal_(a, b);
  else t.uniform_(a, b);
  lua_settop(L, 1);
  return 1;
}

const luaL_Reg reduce_methods[] = {
    {"sum", guarded<tensor_sum>},
    {"mean", guarded<tensor_mean>},
    {"logsumexp", guarded<tensor_logsumexp>},
    {"std", guarded<tensor_spread<false>>},
    {"var", guarded<tensor_spread<true>>},
    {"norm", guarded<tensor_norm>},
    {"max", guarded<tensor_max>},
    {"min", guarded<tensor_min>},
    {"argmax", guarded<tensor_argmax>},
    {"argmin", guarded<tensor_argmin>},
    {"cumsum", guarded<tensor_cumsum>},
    {"all", guarded<tensor_all>},
    {"any", guarded<tensor_any>},
    {"topk", guarded<tensor_topk>},
    {"median", guarded<tensor_median>},
    {"sort", guarded<tensor_sort>},
    {"index_select", guarded<tensor_index_select>},
    {"gather", guarded<tensor_gather>},
    {"scatter", guarded<tensor_scatter>},
    {"scatter_add", guarded<tensor_scatter_add>},
    {"masked_fill", guarded<tensor_masked_fill>},
    {"masked_fill_", guarded<tensor_masked_fill_>},
    {"masked_select", guarded<tensor_masked_select>},
    {"where", guarded<tensor_where>},
    {"tril", guarded<tensor_tril>},
    {"triu", guarded<tensor_triu>},
    {"fill_", guarded<tensor_fill_>},
    {"uniform_", guarded<tensor_random_<false>>},
    {"normal_", guarded<tensor_random_<true>>},
    {"multinomial", guarded<tensor_multinomial>},
    {nullptr, nullptr},
};

}  // namespace

void register_tensor_reduce(lua_State* L, int methods) { luaL_register(L, nullptr, reduce_methods); }

}  // namespace anatomy::lua
