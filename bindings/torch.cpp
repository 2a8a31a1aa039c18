// The `torch` table: tensor factories, functions over several tensors
// (cat, stack, einsum, where), seeding, devices, threads and printing, and
// open/close for the embedding. Tensor methods live in tensor*.cpp; grad mode
// and autocast in grad_mode.cpp; torch.linalg, the RNG state, the loss and the
// small services in linalg.cpp, random.cpp, loss.cpp and system.cpp.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>


#include "bindings/common.h"
#include "bindings/bindings.h"
#include "bindings/parts.h"
#include "host/accel/accel.h"
#include "host/runtime.h"
#include "host/tensor_format.h"
#include "host/torch_compat.h"

#include <cmath>

namespace anatomy::lua {
namespace {

// ---- torch.tensor -------------------------------------------------------------

// Walks a nested Lua table: infers the shape from the first entries and
// checks that every level is rectangular; collects values in row-major order.
struct NestedData {
  std::vector<int64_t> shape;
  std::vector<double> values;
  bool any_number = false, any_bool = false;
};

void read_nested(lua_State* L, int idx, size_t depth, NestedData& out, int arg) {
  int type = lua_type(L, idx);
  if (type == LUA_TNUMBER || type == LUA_TBOOLEAN) {
    if (depth != out.shape.size())
      throw ArgError(arg, "ragged nested table: a number at depth " + std::to_string(depth + 1) + ", expected a table");
    if (type == LUA_TNUMBER) {
      out.any_number = true;
      out.values.push_back(lua_tonumber(L, idx));
    } else {
      out.any_bool = true;
      out.values.push_back(lua_toboolean(L, idx) ? 1 : 0);
    }
    return;
  }
  if (type != LUA_TTABLE)
    throw ArgError(arg, "nested table of numbers expected, found " + type_name(L, idx) + " at depth " +
                            std::to_string(depth + 1));
  // a tensor has at most 64 dimensions; deeper is a table that holds itself
  // (this walk would overflow the C stack)
  if (depth >= 64) throw ArgError(arg, "nested table deeper than 64 levels (a table that contains itself?)");
  int64_t n = static_cast<int64_t>(check_list_length(L, idx, arg, "the nested table"));
  if (depth == out.shape.size()) {
    if (!out.values.empty())
      throw ArgError(arg, "ragged nested table: a table at depth " + std::to_string(depth + 1) + ", expected a number");
    out.shape.push_back(n);
  } else if (out.shape[depth] != n) {
    throw ArgError(arg, "ragged nested table: a row of " + std::to_string(n) + " at depth " + std::to_string(depth + 1) +
                            ", expected " + std::to_string(out.shape[depth]));
  }
  for (int64_t i = 1; i <= n; ++i) {
    lua_rawgeti(L, idx, static_cast<int>(i));
    read_nested(L, lua_gettop(L), depth + 1, out, arg);
    lua_pop(L, 1);
  }
}

// torch.tensor(data, {dtype=, device=, requires_grad=}): data is a number, a
// boolean, a nested table or a Tensor (copied). Lua has one number type, so
// the default dtype is float32 (bool for booleans); pass dtype='int64' for ids.
int torch_tensor(lua_State* L) {
  if (at::Tensor* src = to_tensor(L, 1)) {
    FactoryOptions f = check_factory_options(L, 2, src->scalar_type());
    if (!is_options(L, 2) || get_option(L, 2, "device") == LUA_TNIL) f.options = f.options.device(src->device());
    push_tensor(L, src->detach().to(f.options, false, true).requires_grad_(f.requires_grad));
    return 1;
  }
  NestedData data;
  read_nested(L, 1, 0, data, 1);
  if (data.any_bool && data.any_number) throw ArgError(1, "mixes booleans and numbers");
  FactoryOptions f = check_factory_options(L, 2, data.any_bool ? at::kBool : at::kFloat);
  at::Tensor t = at::from_blob(data.values.data(), data.shape, at::kDouble).to(f.options, false, true);
  if (f.requires_grad) t.requires_grad_(true);
  push_tensor(L, t);
  return 1;
}

// ---- factories -------------------------------------------------------------------

// zeros(2, 3), zeros({2, 3}), zeros(2, 3, {dtype = 'float64'})
template <at::Tensor (*Make)(at::IntArrayRef, const at::TensorOptions&)>
int torch_factory(lua_State* L) {
  int next = 1;
  auto sizes = check_sizes(L, 1, &next);
  // zeros(2, n) with n nil: what follows the sizes is an options table or nothing
  if (next > 1 && next <= lua_gettop(L) && lua_isnil(L, next) && lua_type(L, next - 1) == LUA_TNUMBER)
    throw ArgError(next, "size expected, got nil (a size is missing)");
  for (int64_t s : sizes)
    if (s < 0) throw ArgError(1, "sizes must be non-negative, got " + shape_string(sizes));
  FactoryOptions f = check_factory_options(L, next);
  push_tensor(L, Make(sizes, f.options).requires_grad_(f.requires_grad));
  return 1;
}

at::Tensor make_zeros(at::IntArrayRef s, const at::TensorOptions& o) { return at::zeros(s, o); }
at::Tensor make_ones(at::IntArrayRef s, const at::TensorOptions& o) { return at::ones(s, o); }
at::Tensor make_empty(at::IntArrayRef s, const at::TensorOptions& o) { return at::empty(s, o); }
at::Tensor make_rand(at::IntArrayRef s, const at::TensorOptions& o) { return at::rand(s, o); }
at::Tensor make_randn(at::IntArrayRef s, const at::TensorOptions& o) { return at::randn(s, o); }

// full({2, 3}, value, opts)
int torch_full(lua_State* L) {
  if (lua_type(L, 1) != LUA_TTABLE) throw ArgError(1, "sizes table expected, got " + type_name(L, 1));
  auto sizes = check_sizes(L, 1);
  double v = check_number(L, 2);
  FactoryOptions f = check_factory_options(L, 3);
  push_tensor(L, at::full(sizes, v, f.options).requires_grad_(f.requires_grad));
  return 1;
}

// zeros_like(x, opts) and friends: x's dtype and device unless opts say otherwise.
template <int Kind>
int torch_like(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  int opt = Kind == 4 ? 3 : 2;
  FactoryOptions f = check_factory_options(L, opt, t.scalar_type());
  if (!is_options(L, opt) || get_option(L, opt, "device") == LUA_TNIL) f.options = f.options.device(t.device());
  at::Tensor out;
  switch (Kind) {
    case 0: out = at::zeros_like(t, f.options); break;
    case 1: out = at::ones_like(t, f.options); break;
    case 2: out = at::randn_like(t, f.options); break;
    case 3: out = at::rand_like(t, f.options); break;
    case 4: out = at::full_like(t, check_number(L, 2), f.options); break;
    default: out = at::empty_like(t, f.options); break;
  }
  push_tensor(L, out.requires_grad_(f.requires_grad));
  return 1;
}

// randint(high, sizes, opts) in [0, high); randint(low, high, sizes, opts) in [low, high).
// Values, not indices: the bounds are PyTorch's.
int torch_randint(lua_State* L) {
  int64_t low = 0, high;
  int size_arg;
  if (lua_type(L, 2) == LUA_TNUMBER) {
    low = check_integer(L, 1);
    high = check_integer(L, 2);
    size_arg = 3;
  } else {
    high = check_integer(L, 1);
    size_arg = 2;
  }
  if (high <= low) throw ArgError(size_arg - 1, "empty range [" + std::to_string(low) + ", " + std::to_string(high) + ")");
  if (lua_type(L, size_arg) != LUA_TTABLE || is_options(L, size_arg))
    throw ArgError(size_arg, "sizes table expected, got " + type_name(L, size_arg));
  auto sizes = check_sizes(L, size_arg);
  FactoryOptions f = check_factory_options(L, size_arg + 1, at::kLong);
  push_tensor(L, at::randint(low, high, sizes, f.options));
  return 1;
}

// arange(end), arange(start, end[, step]): integer arguments give int64, as in PyTorch.
int torch_arange(lua_State* L) {
  std::vector<double> a;
  int i = 1;
  while (lua_type(L, i) == LUA_TNUMBER && a.size() < 3) a.push_back(lua_tonumber(L, i++));
  if (a.empty()) throw ArgError(1, "number expected, got " + type_name(L, 1));
  double start = a.size() >= 2 ? a[0] : 0, end = a.size() >= 2 ? a[1] : a[0], step = a.size() == 3 ? a[2] : 1;
  if (step == 0) throw ArgError(3, "step must be nonzero");
  if ((end - start) / step < 0) throw ArgError(2, "range is empty in the direction of step");
  bool integral = true;
  for (double v : a) integral = integral && v == std::floor(v);
  FactoryOptions f = check_factory_options(L, i, integral ? at::kLong : at::kFloat);
  push_tensor(L, at::arange(start, end, step, f.options).requires_grad_(f.requires_grad));
  return 1;
}

int torch_linspace(lua_State* L) {
  double start = check_number(L, 1), end = check_number(L, 2);
  int64_t steps = check_integer(L, 3);
  if (steps < 0) throw ArgError(3, "number of steps must be non-negative");
  FactoryOptions f = check_factory_options(L, 4);
  push_tensor(L, at::linspace(start, end, steps, f.options).requires_grad_(f.requires_grad));
  return 1;
}

int torch_eye(lua_State* L) {
  int64_t n = check_integer(L, 1);
  int opt = 2;
  int64_t m = n;
  if (lua_type(L, 2) == LUA_TNUMBER) {
    m = check_integer(L, 2);
    opt = 3;
  }
  if (n < 0 || m < 0) throw ArgError(1, "sizes must be non-negative");
  FactoryOptions f = check_factory_options(L, opt);
  push_tensor(L, at::eye(n, m, f.options).requires_grad_(f.requires_grad));
  return 1;
}

// ---- several tensors ---------------------------------------------------------------

// cat(tensors, dim = 1): every dimension but `dim` must match.
int torch_cat(lua_State* L) {
  auto ts = check_tensor_table(L, 1);
  int64_t ndim = ts[0].dim();
  int64_t d = lua_isnoneornil(L, 2) ? 0 : check_dim(L, 2, std::max<int64_t>(ndim, 1));
  for (size_t i = 1; i < ts.size(); ++i) {
    bool ok = ts[i].dim() == ndim;
    for (int64_t k = 0; ok && k < ndim; ++k) ok = k == d || ts[i].size(k) == ts[0].size(k);
    if (!ok)
      throw ArgError(1, "tensor " + std::to_string(i + 1) + " has shape " + shape_string(ts[i].sizes()) +
                            " and tensor 1 has " + shape_string(ts[0].sizes()) + "; all dimensions but " +
                            std::to_string(d + 1) + " must match");
  }
  push_tensor(L, at::cat(ts, d));
  return 1;
}

// stack(tensors, dim = 1): equal shapes; the new dimension goes at `dim`.
int torch_stack(lua_State* L) {
  auto ts = check_tensor_table(L, 1);
  int64_t d = lua_isnoneornil(L, 2) ? 0 : check_dim(L, 2, ts[0].dim() + 1);
  for (size_t i = 1; i < ts.size(); ++i)
    if (!ts[i].sizes().equals(ts[0].sizes()))
      throw ArgError(1, "tensor " + std::to_string(i + 1) + " has shape " + shape_string(ts[i].sizes()) +
                            ", expected " + shape_string(ts[0].sizes()) + " like tensor 1");
  push_tensor(L, at::stack(ts, d));
  return 1;
}

// einsum('ij,jk->ik', a, b) or einsum('ij,jk->ik', {a, b})
int torch_einsum(lua_State* L) {
  std::string eq = check_string(L, 1);
  std::vector<at::Tensor> ts;
  if (lua_type(L, 2) == LUA_TTABLE) {
    ts = check_tensor_table(L, 2);
  } else {
    for (int i = 2; i <= lua_gettop(L); ++i) ts.push_back(check_tensor(L, i));
  }
  if (ts.empty()) throw ArgError(2, "at least one Tensor expected");
  push_tensor(L, at::einsum(eq, ts));
  return 1;
}

// where(condition, x, y): x and y may be numbers.
int torch_where(lua_State* L) {
  at::Tensor& cond = check_tensor(L, 1);
  if (cond.scalar_type() != at::kBool)
    throw ArgError(1, std::string("condition must be a bool tensor, got ") + dtype_name(cond.scalar_type()));
  at::Tensor x = tensor_or_scalar(L, 2), y = tensor_or_scalar(L, 3);
  if (!broadcastable(cond.sizes(), x.sizes())) throw ArgError(2, "shapes " + shape_string(cond.sizes()) + " and " + shape_string(x.sizes()) + " cannot be broadcast");
  if (!broadcastable(cond.sizes(), y.sizes())) throw ArgError(3, "shapes " + shape_string(cond.sizes()) + " and " + shape_string(y.sizes()) + " cannot be broadcast");
  push_tensor(L, at::where(cond, x, y));
  return 1;
}

// allclose(a, b, {rtol = 1e-5, atol = 1e-8, equal_nan = false}) -> boolean
int torch_allclose(lua_State* L) {
  at::Tensor& a = check_tensor(L, 1);
  at::Tensor& b = check_tensor(L, 2);
  if (!broadcastable(a.sizes(), b.sizes()))
    throw ArgError(2, "shapes " + shape_string(a.sizes()) + " and " + shape_string(b.sizes()) + " cannot be broadcast");
  double rtol = 1e-5, atol = 1e-8;
  bool equal_nan = false;
  if (!lua_isnoneornil(L, 3)) {
    check_option_keys(L, 3, {"rtol", "atol", "equal_nan"});
    if (auto v = option<double>(L, 3, "rtol")) rtol = *v;
    if (auto v = option<double>(L, 3, "atol")) atol = *v;
    if (auto v = option<bool>(L, 3, "equal_nan")) equal_nan = *v;
  }
  at::Tensor other = b.scalar_type() == a.scalar_type() ? b : b.to(a.scalar_type());
  lua_pushboolean(L, at::allclose(a, other, rtol, atol, equal_nan));
  return 1;
}

int torch_equal(lua_State* L) {
  at::Tensor& a = check_tensor(L, 1);
  at::Tensor& b = check_tensor(L, 2);
  lua_pushboolean(L, a.sizes().equals(b.sizes()) && a.scalar_type() == b.scalar_type() && at::equal(a, b));
  return 1;
}

int torch_is_tensor(lua_State* L) {
  lua_pushboolean(L, to_tensor(L, 1) != nullptr);
  return 1;
}

// ---- RNG, devices, threads, printing --------------------------------------

int torch_manual_seed(lua_State* L) {
  int64_t seed = check_integer(L, 1);
  if (seed < 0) throw ArgError(1, "seed must be non-negative, got " + std::to_string(seed));
  at::manual_seed(static_cast<uint64_t>(seed));
  return 0;
}

// torch.device() -> the default device's name; torch.device('cuda') -> its canonical name.
int torch_device(lua_State* L) {
  c10::Device d = lua_isnoneornil(L, 1) ? default_device() : parse_device_arg(check_string(L, 1), 1);
  lua_pushstring(L, device_name(d).c_str());
  return 1;
}

int torch_set_default_device(lua_State* L) {
  set_default_device(parse_device_arg(check_string(L, 1), 1));
  return 0;
}

int torch_get_num_threads(lua_State* L) {
  lua_pushnumber(L, at::get_num_threads());
  return 1;
}

int torch_set_num_threads(lua_State* L) {
  int64_t n = check_integer(L, 1);
  try {
    set_num_threads(n);
  } catch (const std::invalid_argument& e) {
    throw ArgError(1, e.what());
  }
  return 0;
}

// set_printoptions{precision=, threshold=, edgeitems=, linewidth=, sci_mode=}
int torch_set_printoptions(lua_State* L) {
  check_option_keys(L, 1, {"precision", "threshold", "edgeitems", "linewidth", "sci_mode"});
  PrintOptions& o = print_options();
  if (auto v = option<int64_t>(L, 1, "precision")) o.precision = static_cast<int>(*v);
  if (auto v = option<int64_t>(L, 1, "threshold")) o.threshold = *v;
  if (auto v = option<int64_t>(L, 1, "edgeitems")) o.edgeitems = *v;
  if (auto v = option<int64_t>(L, 1, "linewidth")) o.linewidth = static_cast<int>(*v);
  if (auto v = option<bool>(L, 1, "sci_mode")) o.sci_mode = *v ? 1 : 0;
  return 0;
}

const luaL_Reg torch_functions[] = {
    {"tensor", guarded<torch_tensor>},
    {"zeros", guarded<torch_factory<make_zeros>>},
    {"ones", guarded<torch_factory<make_ones>>},
    {"empty", guarded<torch_factory<make_empty>>},
    {"rand", guarded<torch_factory<make_rand>>},
    {"randn", guarded<torch_factory<make_randn>>},
    {"full", guarded<torch_full>},
    {"zeros_like", guarded<torch_like<0>>},
    {"ones_like", guarded<torch_like<1>>},
    {"randn_like", guarded<torch_like<2>>},
    {"rand_like", guarded<torch_like<3>>},
    {"full_like", guarded<torch_like<4>>},
    {"empty_like", guarded<torch_like<5>>},
    {"randint", guarded<torch_randint>},
    {"arange", guarded<torch_arange>},
    {"linspace", guarded<torch_linspace>},
    {"eye", guarded<torch_eye>},
    {"cat", guarded<torch_cat>},
    {"stack", guarded<torch_stack>},
    {"einsum", guarded<torch_einsum>},
    {"where", guarded<torch_where>},
    {"allclose", guarded<torch_allclose>},
    {"equal", guarded<torch_equal>},
    {"is_tensor", guarded<torch_is_tensor>},
    {"_manual_seed", guarded<torch_manual_seed>},
    {"device", guarded<torch_device>},
    {"set_default_device", guarded<torch_set_default_device>},
    {"get_num_threads", guarded<torch_get_num_threads>},
    {"set_num_threads", guarded<torch_set_num_threads>},
    {"set_printoptions", guarded<torch_set_printoptions>},
    {nullptr, nullptr},
};

}  // namespace

// The native half of `torch`; lua/anatomy/init.lua completes it.
int luaopen_anatomy_core(lua_State* L) {
  lua_newtable(L);
  luaL_register(L, nullptr, torch_functions);
  luaopen_anatomy_tensor(L);
  lua_setfield(L, -2, "Tensor");
  push_size_metatable(L);
  lua_setfield(L, -2, "Size");
  int torch = lua_gettop(L);
  register_grad_mode(L, torch);
  register_random(L, torch);
  register_loss(L, torch);
  register_system(L, torch);
  register_http(L, torch);
  register_linalg(L, torch);
  register_safetensors(L, torch);
  register_npz(L, torch);
  register_yaml(L, torch);
  // the native modules that hang off torch (the underscored ones are private: the library's Lua wraps them)
  const struct {
    const char* name;
    lua_CFunction open;
  } modules[] = {{"cuda", luaopen_anatomy_cuda},       {"profiler", luaopen_anatomy_profiler},
                 {"_native", luaopen_anatomy_blocks},  {"_data", luaopen_anatomy_corpus},
                 {"_optim", luaopen_anatomy_optim},    {"_dist", luaopen_anatomy_dist},
                 {"metrics", luaopen_anatomy_metrics}, {"_exact", luaopen_anatomy_rational}};
  for (const auto& m : modules) {
    m.open(L);
    lua_setfield(L, torch, m.name);
  }
  lua_pushstring(L, torch_version().c_str());
  lua_setfield(L, -2, "libtorch_version");
  return 1;
}

void open(lua_State* L) {
  set_hook_state(L);
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, luaopen_anatomy_core);
  lua_setfield(L, -2, "anatomy.core");
  lua_pop(L, 2);
}

void close(lua_State* L) {
  close_hook_state();
  forget_tensor_metatable();  // its address may be reused by the next state
}

}  // namespace anatomy::lua
