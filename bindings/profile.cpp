// torch.profiler: what a piece of work asks of LibTorch, counted
// (host/profile/op_count.h). PyTorch's torch.profiler records the same
// operator events; count_ops gives their number and the host
// synchronisations among them, for the benchmark's per-step comparison.
#include "bindings/common.h"
#include "bindings/parts.h"
#include "host/profile/op_count.h"

#include <optional>

namespace anatomy::lua {
namespace {

void push_counts_by_name(lua_State* L, const std::map<std::string, int64_t>& m) {
  lua_createtable(L, 0, static_cast<int>(m.size()));
  for (const auto& [name, n] : m) set_number_field(L, name.c_str(), static_cast<double>(n));
}

// torch.profiler.count_ops(fn, ...) -> counts, fn(...): runs fn and counts the
// operators LibTorch dispatched meanwhile, on every thread: counts.ops,
// counts.syncs (reads of a device tensor back to the host: item, copies to
// the CPU; blocking copies from the CPU; nonzero, masked_select, unique),
// counts.by_name and
// counts.syncs_by_name ({['aten::mm'] = 3, ...}). An error in fn propagates
// after the count stops.
int profiler_count_ops(lua_State* L) {
  if (lua_type(L, 1) != LUA_TFUNCTION) throw ArgError(1, "function expected, got " + type_name(L, 1));
  int status;
  profile::OpCounts counts;
  {
    profile::OpCounter counter;
    status = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
    counts = counter.counts();
  }
  if (status != 0) return lua_error(L);
  int results = lua_gettop(L);
  lua_createtable(L, 0, 4);
  set_number_field(L, "ops", static_cast<double>(counts.ops));
  set_number_field(L, "syncs", static_cast<double>(counts.syncs));
  push_counts_by_name(L, counts.by_name);
  lua_setfield(L, -2, "by_name");
  push_counts_by_name(L, counts.syncs_by_name);
  lua_setfield(L, -2, "syncs_by_name");
  lua_insert(L, 1);
  return results + 1;
}

const luaL_Reg profiler_functions[] = {
    {"count_ops", guarded<profiler_count_ops>},
    {nullptr, nullptr},
};

}  // namespace

/// Pushes torch.profiler.
int luaopen_anatomy_profiler(lua_State* L) {
  lua_newtable(L);
  luaL_register(L, nullptr, profiler_functions);
  return 1;
}

}  // namespace anatomy::lua
