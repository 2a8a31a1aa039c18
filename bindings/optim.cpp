// The Lua-visible Optimizer: LibTorch's AdamW over the parameters Lua hands
// it, with its state readable and writable for checkpoints.
// lua/anatomy/optim.lua wraps it as optim.AdamW(params, opts).
#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include "bindings/bindings.h"
#include "bindings/common.h"

namespace anatomy::lua {
namespace {

constexpr const char* kOptimizerMeta = "anatomy.Optimizer";
using OptimizerPtr = std::unique_ptr<torch::optim::AdamW>;

torch::optim::AdamW& check_optimizer(lua_State* L, int idx) {
  return *check_userdata<OptimizerPtr>(L, idx, kOptimizerMeta, "Optimizer");
}

std::vector<at::Tensor> param_list(lua_State* L, int idx) {
  if (lua_type(L, idx) != LUA_TTABLE) throw ArgError(idx, "table of parameters expected, got " + type_name(L, idx));
  std::vector<at::Tensor> ps;
  for (size_t i = 1; i <= lua_objlen(L, idx); ++i) {
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

// AdamW(decayed, not_decayed, lr, beta1, beta2, eps, weight_decay): two groups,
// weight decay applying to the first only.
int optim_adamw(lua_State* L) {
  std::vector<at::Tensor> decayed = param_list(L, 1), plain = param_list(L, 2);
  double lr = check_number(L, 3), b1 = check_number(L, 4), b2 = check_number(L, 5), eps = check_number(L, 6),
         wd = check_number(L, 7);
  if (!(lr >= 0)) throw ArgError(3, "learning rate must be non-negative");
  if (!(b1 >= 0 && b1 < 1)) throw ArgError(4, "beta1 must be in [0, 1)");
  if (!(b2 >= 0 && b2 < 1)) throw ArgError(5, "beta2 must be in [0, 1)");
  if (decayed.empty() && plain.empty()) throw ArgError(1, "no parameters to optimize");
  auto options = torch::optim::AdamWOptions(lr).betas({b1, b2}).eps(eps).weight_decay(wd);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decayed.empty()) groups.emplace_back(decayed, std::make_unique<torch::optim::AdamWOptions>(options));
  if (!plain.empty())
    groups.emplace_back(plain, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(options).weight_decay(0)));
  push_userdata<OptimizerPtr>(L, kOptimizerMeta, std::make_unique<torch::optim::AdamW>(std::move(groups), options));
  return 1;
}

int optimizer_step(lua_State* L) {
  check_optimizer(L, 1).step();
  return 0;
}

int optimizer_zero_grad(lua_State* L) {
  for (auto& group : check_optimizer(L, 1).param_groups())
    for (auto& p : group.params()) p.mutable_grad() = at::Tensor();
  return 0;
}

int optimizer_set_lr(lua_State* L) {
  double lr = check_number(L, 2);
  if (!(lr >= 0)) throw ArgError(2, "learning rate must be non-negative");
  for (auto& group : check_optimizer(L, 1).param_groups()) group.options().set_lr(lr);
  return 0;
}

int optimizer_lr(lua_State* L) {
  lua_pushnumber(L, check_optimizer(L, 1).param_groups().at(0).options().get_lr());
  return 1;
}

std::string key_of(const at::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

// opt:state() -> {{step = n, exp_avg = t, exp_avg_sq = t} or false, ...} in parameter order
int optimizer_state(lua_State* L) {
  auto& opt = check_optimizer(L, 1);
  lua_newtable(L);
  int i = 0;
  for (auto& group : opt.param_groups()) {
    for (auto& p : group.params()) {
      auto it = opt.state().find(key_of(p));
      if (it == opt.state().end()) {
        lua_pushboolean(L, false);
      } else {
        auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
        lua_createtable(L, 0, 3);
        lua_pushnumber(L, static_cast<lua_Number>(s.step()));
        lua_setfield(L, -2, "step");
        push_tensor(L, s.exp_avg());
        lua_setfield(L, -2, "exp_avg");
        push_tensor(L, s.exp_avg_sq());
        lua_setfield(L, -2, "exp_avg_sq");
      }
      lua_rawseti(L, -2, ++i);
    }
  }
  return 1;
}

// opt:load_state(list): the inverse of state(); tensors are copied.
int optimizer_load_state(lua_State* L) {
  auto& opt = check_optimizer(L, 1);
  if (lua_type(L, 2) != LUA_TTABLE) throw ArgError(2, "state table expected, got " + type_name(L, 2));
  int i = 0;
  for (auto& group : opt.param_groups()) {
    for (auto& p : group.params()) {
      lua_rawgeti(L, 2, ++i);
      if (lua_istable(L, -1)) {
        auto s = std::make_unique<torch::optim::AdamWParamState>();
        lua_getfield(L, -1, "step");
        s->step(check_integer(L, -1));
        lua_getfield(L, -2, "exp_avg");
        at::Tensor* m = to_tensor(L, -1);
        lua_getfield(L, -3, "exp_avg_sq");
        at::Tensor* v = to_tensor(L, -1);
        if (!m || !v || !m->sizes().equals(p.sizes()) || !v->sizes().equals(p.sizes()))
          throw ArgError(2, "state of parameter " + std::to_string(i) + " does not match its shape");
        s->exp_avg(m->detach().to(p.options()).clone());
        s->exp_avg_sq(v->detach().to(p.options()).clone());
        lua_pop(L, 3);
        opt.state()[key_of(p)] = std::move(s);
      } else {
        opt.state().erase(key_of(p));
      }
      lua_pop(L, 1);
    }
  }
  return 0;
}

const luaL_Reg optimizer_methods[] = {
    {"step", guarded<optimizer_step>},
    {"zero_grad", guarded<optimizer_zero_grad>},
    {"set_lr", guarded<optimizer_set_lr>},
    {"lr", guarded<optimizer_lr>},
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
