// The Lua-visible Optimizer: userdata holding host/optim/adamw.h's AdamW.
// The Lua options table maps onto AdamWOptions here, in one place; the
// host checks the values. lua/anatomy/optim.lua wraps it as optim.AdamW.
#include <ATen/ATen.h>

#include "bindings/parts.h"
#include "bindings/common.h"
#include "host/optim/adamw.h"

namespace anatomy::lua {
namespace {

constexpr const char* kOptimizerMeta = "anatomy.Optimizer";
using OptimizerPtr = std::unique_ptr<optim::AdamW>;

optim::AdamW& check_optimizer(lua_State* L, int idx) {
  return *check_userdata<OptimizerPtr>(L, idx, kOptimizerMeta, "Optimizer");
}

std::vector<at::Tensor> param_list(lua_State* L, int idx) {
  if (lua_type(L, idx) != LUA_TTABLE) throw ArgError(idx, "table of parameters expected, got " + type_name(L, idx));
  std::vector<at::Tensor> ps;
  size_t n = check_list_length(L, idx, idx, "the table of parameters");
  for (size_t i = 1; i <= n; ++i) {
    lua_rawgeti(L, idx, static_cast<int>(i));
    at::Tensor* t = to_tensor(L, -1);
    lua_pop(L, 1);
    if (!t) throw ArgError(idx, "parameter " + std::to_string(i) + " is not a Tensor");
    if (!t->is_leaf() || !t->requires_grad())
      throw ArgError(idx, "parameter " + std::to_string(i) + " is not a leaf tensor that requires grad");
    ps.push_back(*t);
  }
  return ps;
}

// The options table at idx ({lr, betas = {b1, b2}, eps, weight_decay}) as AdamWOptions.
optim::AdamWOptions adamw_options(lua_State* L, int idx) {
  optim::AdamWOptions o;
  if (lua_isnoneornil(L, idx)) return o;
  check_option_keys(L, idx, {"lr", "betas", "eps", "weight_decay"});
  if (auto v = option<double>(L, idx, "lr")) o.lr(*v);
  if (auto v = option<double>(L, idx, "eps")) o.eps(*v);
  if (auto v = option<double>(L, idx, "weight_decay")) o.weight_decay(*v);
  if (get_option(L, idx, "betas") != LUA_TNIL) {
    std::vector<double> b;
    if (lua_istable(L, -1)) {
      for (int k = 1; k <= 2; ++k) {
        lua_rawgeti(L, -1, k);
        if (lua_type(L, -1) == LUA_TNUMBER) b.push_back(lua_tonumber(L, -1));
        lua_pop(L, 1);
      }
    }
    if (b.size() != 2) throw ArgError(idx, "betas must be a table of two numbers");
    o.betas(b[0], b[1]);
  }
  lua_pop(L, 1);
  return o;
}

// AdamW(decayed, not_decayed, {lr, betas, eps, weight_decay}): two groups,
// weight decay applying to the first only.
int optim_adamw(lua_State* L) {
  std::vector<at::Tensor> decayed = param_list(L, 1), plain = param_list(L, 2);
  optim::AdamWOptions options = adamw_options(L, 3);
  try {
    push_userdata<OptimizerPtr>(L, kOptimizerMeta, std::make_unique<optim::AdamW>(std::move(decayed), std::move(plain), options));
  } catch (const optim::OptionError& e) {
    throw ArgError(e.field == "params" ? 1 : 3, e.what());
  }
  return 1;
}

int optimizer_step(lua_State* L) {
  check_optimizer(L, 1).step();
  return 0;
}

int optimizer_zero_grad(lua_State* L) {
  check_optimizer(L, 1).zero_grad();
  return 0;
}

int optimizer_set_lr(lua_State* L) {
  optim::AdamW& opt = check_optimizer(L, 1);
  try {
    opt.set_lr(check_number(L, 2));
  } catch (const optim::OptionError& e) {
    throw ArgError(2, e.what());
  }
  return 0;
}

// opt:set_capturable(on): see host/optim/adamw.h (for CUDA graphs)
int optimizer_set_capturable(lua_State* L) {
  optim::AdamW& opt = check_optimizer(L, 1);
  if (lua_type(L, 2) != LUA_TBOOLEAN) throw ArgError(2, "boolean expected, got " + type_name(L, 2));
  try {
    opt.set_capturable(lua_toboolean(L, 2));
  } catch (const optim::OptionError& e) {
    throw CallError(e.what());
  }
  return 0;
}

int optimizer_lr(lua_State* L) {
  lua_pushnumber(L, check_optimizer(L, 1).lr());
  return 1;
}

// opt:state() -> {{step = n, exp_avg = t, exp_avg_sq = t} or false, ...} in parameter order
int optimizer_state(lua_State* L) {
  auto states = check_optimizer(L, 1).state();
  lua_createtable(L, static_cast<int>(states.size()), 0);
  int i = 0;
  for (const auto& s : states) {
    if (!s) {
      lua_pushboolean(L, false);
    } else {
      lua_createtable(L, 0, 3);
      lua_pushnumber(L, static_cast<lua_Number>(s->step));
      lua_setfield(L, -2, "step");
      push_tensor(L, s->exp_avg);
      lua_setfield(L, -2, "exp_avg");
      push_tensor(L, s->exp_avg_sq);
      lua_setfield(L, -2, "exp_avg_sq");
    }
    lua_rawseti(L, -2, ++i);
  }
  return 1;
}

// opt:load_state(list): the inverse of state(); tensors are copied.
int optimizer_load_state(lua_State* L) {
  auto& opt = check_optimizer(L, 1);
  if (lua_type(L, 2) != LUA_TTABLE) throw ArgError(2, "state table expected, got " + type_name(L, 2));
  std::vector<std::optional<optim::ParamState>> states(opt.size());
  for (size_t i = 0; i < states.size(); ++i) {
    lua_rawgeti(L, 2, static_cast<int>(i + 1));
    if (lua_istable(L, -1)) {
      optim::ParamState s;
      lua_getfield(L, -1, "step");
      s.step = check_integer(L, -1);
      lua_getfield(L, -2, "exp_avg");
      if (at::Tensor* m = to_tensor(L, -1)) s.exp_avg = *m;
      lua_getfield(L, -3, "exp_avg_sq");
      if (at::Tensor* v = to_tensor(L, -1)) s.exp_avg_sq = *v;
      lua_pop(L, 3);
      states[i] = s;
    }
    lua_pop(L, 1);
  }
  try {
    opt.load_state(states);
  } catch (const optim::OptionError& e) {
    throw ArgError(2, e.what());
  }
  return 0;
}

const luaL_Reg optimizer_methods[] = {
    {"step", guarded<optimizer_step>},
    {"zero_grad", guarded<optimizer_zero_grad>},
    {"set_lr", guarded<optimizer_set_lr>},
    {"lr", guarded<optimizer_lr>},
    {"set_capturable", guarded<optimizer_set_capturable>},
    {"state", guarded<optimizer_state>},
    {"load_state", guarded<optimizer_load_state>},
    {nullptr, nullptr},
};

const luaL_Reg optim_functions[] = {
    {"AdamW", guarded<optim_adamw>},
    {nullptr, nullptr},
};

}  // namespace

// Pushes the table of optimizer constructors (torch._optim).
int luaopen_anatomy_optim(lua_State* L) {
  define_userdata<OptimizerPtr>(L, kOptimizerMeta, "Optimizer", optimizer_methods);
  lua_newtable(L);
  luaL_register(L, nullptr, optim_functions);
  return 1;
}

}  // namespace anatomy::lua
