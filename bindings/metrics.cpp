// torch.metrics: the autopsy's measurement kernels (host/metrics/metrics.h) for Lua.
#include <ATen/ATen.h>

#include "bindings/parts.h"
#include "bindings/common.h"
#include "host/metrics/metrics.h"

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
  lua_pushnumber(L, checked([&] { return metrics::effective_rank(x); }));
  return 1;
}

// attention_entropy(pattern) -> mean (nats), per head (tensor H)
int metrics_attention_entropy(lua_State* L) {
  at::Tensor& p = check_tensor(L, 1);
  at::Tensor heads = checked([&] { return metrics::attention_entropy_per_head(p); });
  lua_pushnumber(L, heads.mean().item<double>());
  push_tensor(L, heads);
  return 2;
}

int metrics_diagonal_mass(lua_State* L) {
  at::Tensor& p = check_tensor(L, 1);
  lua_pushnumber(L, checked([&] { return metrics::diagonal_mass(p); }));
  return 1;
}

// {mean, std, max_abs, rms}
void push_stats(lua_State* L, const metrics::ActivationStats& s) {
  lua_createtable(L, 0, 4);
  set_number_field(L, "mean", s.mean);
  set_number_field(L, "std", s.std);
  set_number_field(L, "max_abs", s.max_abs);
  set_number_field(L, "rms", s.rms);
}

// activation_stats(x) -> {mean, std, max_abs, rms}
int metrics_activation_stats(lua_State* L) {
  at::Tensor& x = check_tensor(L, 1);
  push_stats(L, checked([&] { return metrics::activation_stats(x); }));
  return 1;
}

int metrics_block_influence(lua_State* L) {
  at::Tensor& a = check_tensor(L, 1);
  at::Tensor& b = check_tensor(L, 2);
  lua_pushnumber(L, checked([&] { return metrics::block_influence(a, b); }));
  return 1;
}

int metrics_residual_ratio(lua_State* L) {
  at::Tensor& a = check_tensor(L, 1);
  at::Tensor& b = check_tensor(L, 2);
  lua_pushnumber(L, checked([&] { return metrics::residual_ratio(a, b); }));
  return 1;
}

// A Lua list of tensors, where nil or false entries stand for undefined tensors.
std::vector<at::Tensor> tensor_list_with_holes(lua_State* L, int idx) {
  luaL_checktype(L, idx, LUA_TTABLE);
  std::vector<at::Tensor> out;
  size_t n = lua_objlen(L, idx);
  for (size_t i = 1; i <= n; ++i) {
    lua_rawgeti(L, idx, static_cast<int>(i));
    at::Tensor* t = to_tensor(L, -1);
    if (!t && lua_toboolean(L, -1)) throw ArgError(idx, "entry " + std::to_string(i) + " is not a tensor");
    out.push_back(t ? *t : at::Tensor());
    lua_pop(L, 1);
  }
  return out;
}

void push_numbers(lua_State* L, const std::vector<double>& v) {
  lua_createtable(L, static_cast<int>(v.size()), 0);
  for (size_t i = 0; i < v.size(); ++i) {
    lua_pushnumber(L, v[i]);
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
}

// eranks({W1, W2, ...}) -> {r1, r2, ...}: Gram matrices where the W are, one copy, eigenvalues on the host
int metrics_eranks(lua_State* L) {
  auto list = tensor_list_with_holes(L, 1);
  for (size_t i = 0; i < list.size(); ++i)
    if (!list[i].defined()) throw ArgError(1, "entry " + std::to_string(i + 1) + " is not a tensor");
  push_numbers(L, checked([&] { return metrics::effective_ranks(list); }));
  return 1;
}

// norms({t1, false, t3, ...}) -> {‖t1‖, nan, ‖t3‖, ...}
int metrics_norms(lua_State* L) {
  push_numbers(L, metrics::norms(tensor_list_with_holes(L, 1)));
  return 1;
}

void push_step_values(lua_State* L, const metrics::StepValues& v) {
  lua_createtable(L, 0, 5);
  push_numbers(L, v.eranks);
  lua_setfield(L, -2, "eranks");
  push_numbers(L, v.norms);
  lua_setfield(L, -2, "norms");
  lua_createtable(L, static_cast<int>(v.stats.size()), 0);
  for (size_t i = 0; i < v.stats.size(); ++i) {
    push_stats(L, v.stats[i]);
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
  lua_setfield(L, -2, "stats");
  push_numbers(L, v.entropy);
  lua_setfield(L, -2, "entropy");
  push_numbers(L, v.diag);
  lua_setfield(L, -2, "diag");
}

// The reader step_values(..., false) returns: its upvalue is the table
// {values, {gram, ...}, grads, outputs, patterns}.
int step_values_read(lua_State* L) {
  metrics::UnreadStepValues u;
  lua_rawgeti(L, lua_upvalueindex(1), 1);
  u.values = *to_tensor(L, -1);
  lua_rawgeti(L, lua_upvalueindex(1), 2);
  for (size_t i = 1, n = lua_objlen(L, -1); i <= n; ++i) {
    lua_rawgeti(L, -1, static_cast<int>(i));
    u.grams.push_back(*to_tensor(L, -1));
    lua_pop(L, 1);
  }
  size_t* counts[] = {&u.grads, &u.outputs, &u.patterns};
  for (int i = 0; i < 3; ++i) {
    lua_rawgeti(L, lua_upvalueindex(1), 3 + i);
    *counts[i] = static_cast<size_t>(lua_tointeger(L, -1));
  }
  push_step_values(L, metrics::read_step_values(u));
  return 1;
}

// step_values(weights, grads, outputs, patterns [, read = true]) -> {eranks,
// norms, stats, entropy, diag}: the autopsy's numbers of a step, read back in
// one copy (host/metrics/metrics.h); false in grads, outputs or patterns for
// a missing one (NaN, or a stats entry of NaNs). With read = false: a function
// that reads them (that one copy, and the ranks' eigenproblems on the host),
// everything else left queued on the device until it is called.
int metrics_step_values(lua_State* L) {
  auto weights = tensor_list_with_holes(L, 1);
  for (size_t i = 0; i < weights.size(); ++i)
    if (!weights[i].defined()) throw ArgError(1, "entry " + std::to_string(i + 1) + " is not a tensor");
  auto grads = tensor_list_with_holes(L, 2), outputs = tensor_list_with_holes(L, 3), patterns = tensor_list_with_holes(L, 4);
  if (!lua_isnoneornil(L, 5) && !lua_toboolean(L, 5)) {
    auto u = checked([&] { return metrics::step_values_unread(weights, grads, outputs, patterns); });
    lua_createtable(L, 5, 0);
    push_tensor(L, u.values);
    lua_rawseti(L, -2, 1);
    lua_createtable(L, static_cast<int>(u.grams.size()), 0);
    for (size_t i = 0; i < u.grams.size(); ++i) {
      push_tensor(L, u.grams[i]);
      lua_rawseti(L, -2, static_cast<int>(i + 1));
    }
    lua_rawseti(L, -2, 2);
    size_t counts[] = {u.grads, u.outputs, u.patterns};
    for (int i = 0; i < 3; ++i) {
      lua_pushinteger(L, static_cast<lua_Integer>(counts[i]));
      lua_rawseti(L, -2, 3 + i);
    }
    lua_pushcclosure(L, guarded<step_values_read>, 1);
    return 1;
  }
  push_step_values(L, checked([&] { return metrics::step_values(weights, grads, outputs, patterns); }));
  return 1;
}

const luaL_Reg metrics_functions[] = {
    {"eranks", guarded<metrics_eranks>},
    {"norms", guarded<metrics_norms>},
    {"step_values", guarded<metrics_step_values>},
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
