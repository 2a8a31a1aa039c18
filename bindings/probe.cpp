// torch.metrics: the autopsy's measurement kernels (host/probes/metrics.h) for Lua.
#include <ATen/ATen.h>

#include "bindings/bindings.h"
#include "bindings/common.h"
#include "host/probes/metrics.h"

namespace anatomy::lua {
namespace {

// Runs a kernel, turning its std::invalid_argument into a bad argument #1.
template <typename F>
auto checked(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    throw ArgError(1, e.what());
  }
}

int metrics_erank(lua_State* L) {
  at::Tensor& x = check_tensor(L, 1);
  lua_pushnumber(L, checked([&] { return probes::effective_rank(x); }));
  return 1;
}

// attention_entropy(pattern) -> mean (nats), per head (tensor H)
int metrics_attention_entropy(lua_State* L) {
  at::Tensor& p = check_tensor(L, 1);
  at::Tensor heads = checked([&] { return probes::attention_entropy_per_head(p); });
  lua_pushnumber(L, heads.mean().item<double>());
  push_tensor(L, heads);
  return 2;
}

int metrics_diagonal_mass(lua_State* L) {
  at::Tensor& p = check_tensor(L, 1);
  lua_pushnumber(L, checked([&] { return probes::diagonal_mass(p); }));
  return 1;
}

// activation_stats(x) -> {mean, std, max_abs, rms}
int metrics_activation_stats(lua_State* L) {
  at::Tensor& x = check_tensor(L, 1);
  auto s = checked([&] { return probes::activation_stats(x); });
  lua_createtable(L, 0, 4);
  lua_pushnumber(L, s.mean);
  lua_setfield(L, -2, "mean");
  lua_pushnumber(L, s.std);
  lua_setfield(L, -2, "std");
  lua_pushnumber(L, s.max_abs);
  lua_setfield(L, -2, "max_abs");
  lua_pushnumber(L, s.rms);
  lua_setfield(L, -2, "rms");
  return 1;
}

int metrics_block_influence(lua_State* L) {
  at::Tensor& a = check_tensor(L, 1);
  at::Tensor& b = check_tensor(L, 2);
  lua_pushnumber(L, checked([&] { return probes::block_influence(a, b); }));
  return 1;
}

int metrics_residual_ratio(lua_State* L) {
  at::Tensor& a = check_tensor(L, 1);
  at::Tensor& b = check_tensor(L, 2);
  lua_pushnumber(L, checked([&] { return probes::residual_ratio(a, b); }));
  return 1;
}

const luaL_Reg metrics_functions[] = {
    {"erank", guarded<metrics_erank>},
    {"attention_entropy", guarded<metrics_attention_entropy>},
    {"diagonal_mass", guarded<metrics_diagonal_mass>},
    {"activation_stats", guarded<metrics_activation_stats>},
    {"block_influence", guarded<metrics_block_influence>},
    {"residual_ratio", guarded<metrics_residual_ratio>},
    {nullptr, nullptr},
};

}  // namespace

int luaopen_anatomy_metrics(lua_State* L) {
  lua_newtable(L);
  luaL_register(L, nullptr, metrics_functions);
  return 1;
}

}  // namespace anatomy::lua
