// torch._dist: the native half of `dist` (lua/anatomy/torch/dist.lua): joining the
// world, the collectives, and the gradient reducer train.fit uses. The work
// is in host/dist/dist.h.
#include <ATen/ATen.h>

#include "bindings/common.h"
#include "bindings/parts.h"
#include "host/dist/dist.h"

namespace anatomy::lua {
namespace {

constexpr const char* kReducerMeta = "anatomy.dist.Reducer";
using ReducerPtr = std::unique_ptr<dist::Reducer>;

// dist::Error already names the function and the rank: raised as it is.
template <lua_CFunction F>
int plain(lua_State* L) {
  try {
    return F(L);
  } catch (const dist::Error& e) {
    throw CallError(e.what());
  }
}

// _init{rank=, world_size=, master_addr=, master_port=, local_rank=, timeout=, hosted=}
int dist_init(lua_State* L) {
  check_option_keys(L, 1, {"rank", "world_size", "master_addr", "master_port", "local_rank", "timeout", "hosted"});
  dist::Options o;
  if (auto v = option<int64_t>(L, 1, "world_size")) o.world_size = static_cast<int>(*v);
  if (auto v = option<int64_t>(L, 1, "rank")) o.rank = static_cast<int>(*v);
  o.local_rank = o.rank;
  if (auto v = option<int64_t>(L, 1, "local_rank")) o.local_rank = static_cast<int>(*v);
  if (auto v = option<std::string>(L, 1, "master_addr")) o.master_addr = *v;
  if (auto port = option<int64_t>(L, 1, "master_port")) {
    if (*port < 1 || *port > 65535) throw ArgError(1, "master_port must be in 1..65535, got " + std::to_string(*port));
    o.port = static_cast<int>(*port);
  }
  if (auto s = option<double>(L, 1, "timeout")) {
    if (!(*s > 0 && *s <= 86400)) throw ArgError(1, "timeout must be in (0, 86400] seconds, got " + std::to_string(*s));
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(*s * 1000));
  }
  if (auto v = option<bool>(L, 1, "hosted")) o.store_hosted_elsewhere = *v;
  dist::init(o);
  return 0;
}

// _init_from_environment() -> true when WORLD_SIZE was set (and the world joined)
int dist_init_from_environment(lua_State* L) {
  auto o = dist::options_from_environment();
  if (o) dist::init(*o);
  lua_pushboolean(L, o.has_value());
  return 1;
}

int dist_is_initialized(lua_State* L) {
  lua_pushboolean(L, dist::is_initialized());
  return 1;
}
int dist_rank(lua_State* L) {
  lua_pushinteger(L, dist::rank());
  return 1;
}
int dist_world_size(lua_State* L) {
  lua_pushinteger(L, dist::world_size());
  return 1;
}
int dist_local_rank(lua_State* L) {
  lua_pushinteger(L, dist::local_rank());
  return 1;
}
int dist_timeout(lua_State* L) {
  lua_pushnumber(L, static_cast<double>(dist::timeout().count()) / 1000.0);
  return 1;
}
int dist_destroy(lua_State* L) {
  dist::destroy();
  return 0;
}

// all_reduce(t, op, compare = true) -> t (in place). compare = false skips the
// ranks' comparison of the call (for train.fit's own calls, alike by construction).
int dist_all_reduce(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  dist::Op op = dist::Op::Sum;
  if (!lua_isnoneornil(L, 2)) {
    try {
      op = dist::parse_op(check_string(L, 2));
    } catch (const std::invalid_argument& e) {
      throw ArgError(2, e.what());
    }
  }
  dist::all_reduce(t, op, lua_isnoneornil(L, 3) || lua_toboolean(L, 3));
  lua_settop(L, 1);
  return 1;
}

// broadcast(t, src) -> t (in place)
int dist_broadcast(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  int64_t src = lua_isnoneornil(L, 2) ? 0 : check_integer(L, 2);
  if (src < 0 || src >= dist::world_size())
    throw ArgError(2, "src must be a rank in 0.." + std::to_string(dist::world_size() - 1) + ", got " + std::to_string(src));
  dist::broadcast(t, static_cast<int>(src));
  lua_settop(L, 1);
  return 1;
}

// all_gather(t) -> {t of rank 0, t of rank 1, ...}
int dist_all_gather(lua_State* L) {
  push_tensor_table(L, dist::all_gather(check_tensor(L, 1)));
  return 1;
}

int dist_barrier(lua_State* L) {
  dist::barrier();
  return 0;
}

int dist_report_failure(lua_State* L) {
  dist::report_failure(check_string(L, 1));
  return 0;
}

// _reducer(params, bucket_megabytes) -> Reducer
int dist_reducer(lua_State* L) {
  std::vector<at::Tensor> params = check_tensor_table(L, 1);
  double mb = lua_isnoneornil(L, 2) ? 25.0 : check_number(L, 2);
  if (!(mb > 0 && mb <= 4096)) throw ArgError(2, "bucket size must be in (0, 4096] MiB, got " + std::to_string(mb));
  push_userdata<ReducerPtr>(L, kReducerMeta,
                            std::make_unique<dist::Reducer>(std::move(params), static_cast<int64_t>(mb * (1 << 20))));
  return 1;
}

dist::Reducer& check_reducer(lua_State* L) {
  auto& r = check_userdata<ReducerPtr>(L, 1, kReducerMeta, "Reducer");
  if (!r) throw ArgError(1, "the reducer was released");
  return *r;
}

int reducer_prepare(lua_State* L) {
  check_reducer(L).prepare();
  return 0;
}
int reducer_finish(lua_State* L) {
  check_reducer(L).finish();
  return 0;
}
int reducer_buckets(lua_State* L) {
  lua_pushinteger(L, check_reducer(L).buckets());
  return 1;
}
// stats() -> seconds waiting for communication after backward, seconds of communication
int reducer_stats(lua_State* L) {
  dist::Reducer& r = check_reducer(L);
  lua_pushnumber(L, r.wait_seconds());
  lua_pushnumber(L, r.communication_seconds());
  return 2;
}
// release(): removes the hooks now rather than at collection
int reducer_release(lua_State* L) {
  check_userdata<ReducerPtr>(L, 1, kReducerMeta, "Reducer").reset();
  return 0;
}

const luaL_Reg reducer_methods[] = {
    {"prepare", guarded<plain<reducer_prepare>>},
    {"finish", guarded<plain<reducer_finish>>},
    {"buckets", guarded<plain<reducer_buckets>>},
    {"stats", guarded<plain<reducer_stats>>},
    {"release", guarded<plain<reducer_release>>},
    {nullptr, nullptr},
};

const luaL_Reg dist_functions[] = {
    {"_init", guarded<plain<dist_init>>},
    {"_init_from_environment", guarded<plain<dist_init_from_environment>>},
    {"is_initialized", guarded<plain<dist_is_initialized>>},
    {"rank", guarded<plain<dist_rank>>},
    {"world_size", guarded<plain<dist_world_size>>},
    {"local_rank", guarded<plain<dist_local_rank>>},
    {"timeout", guarded<plain<dist_timeout>>},
    {"destroy_process_group", guarded<plain<dist_destroy>>},
    {"all_reduce", guarded<plain<dist_all_reduce>>},
    {"broadcast", guarded<plain<dist_broadcast>>},
    {"all_gather", guarded<plain<dist_all_gather>>},
    {"barrier", guarded<plain<dist_barrier>>},
    {"_report_failure", guarded<plain<dist_report_failure>>},
    {"_reducer", guarded<plain<dist_reducer>>},
    {nullptr, nullptr},
};

}  // namespace

int luaopen_anatomy_dist(lua_State* L) {
  define_userdata<ReducerPtr>(L, kReducerMeta, "Reducer", reducer_methods);
  lua_newtable(L);
  luaL_register(L, nullptr, dist_functions);
  return 1;
}

}  // namespace anatomy::lua
