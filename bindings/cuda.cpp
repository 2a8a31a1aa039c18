// torch.cuda: availability, synchronize, the caching allocator's counters and
// CUDA graphs (torch.cuda.CUDAGraph), with PyTorch's names. The work is in
// host/cuda/cuda.h; without CUDA every call but is_available, device_count and
// version raises an error saying why.
#include <ATen/ATen.h>

#include "bindings/parts.h"
#include "bindings/common.h"
#include "host/cuda/cuda.h"

namespace anatomy::lua {
namespace {

constexpr const char* kGraphMeta = "anatomy.CUDAGraph";
using GraphPtr = std::unique_ptr<cuda::Graph>;

// The optional device argument at idx: nil (the current one), an index from 0
// as PyTorch counts GPUs, or a device string "cuda:N".
int device_arg(lua_State* L, int idx) {
  if (lua_isnoneornil(L, idx)) return -1;
  if (lua_type(L, idx) == LUA_TSTRING) {
    std::string s = lua_tostring(L, idx);
    if (s == "cuda") return -1;
    if (s.rfind("cuda:", 0) == 0 && s.size() > 5 && s.find_first_not_of("0123456789", 5) == std::string::npos)
      return std::stoi(s.substr(5));
    throw ArgError(idx, "expected a CUDA device ('cuda' or 'cuda:N') or its index, got '" + s + "'");
  }
  int64_t d = check_integer(L, idx);
  if (d < 0) throw ArgError(idx, "device index must be >= 0, got " + std::to_string(d));
  return static_cast<int>(d);
}

int cuda_is_available(lua_State* L) {
  lua_pushboolean(L, cuda::is_available());
  return 1;
}
int cuda_device_count(lua_State* L) {
  lua_pushinteger(L, cuda::device_count());
  return 1;
}
int cuda_version(lua_State* L) {
  std::string v = cuda::version();
  if (v.empty()) lua_pushnil(L); else lua_pushstring(L, v.c_str());
  return 1;
}
int cuda_synchronize(lua_State* L) {
  cuda::synchronize(device_arg(L, 1));
  return 0;
}
int cuda_memory_allocated(lua_State* L) {
  lua_pushnumber(L, static_cast<lua_Number>(cuda::memory_allocated(device_arg(L, 1))));
  return 1;
}
int cuda_max_memory_allocated(lua_State* L) {
  lua_pushnumber(L, static_cast<lua_Number>(cuda::max_memory_allocated(device_arg(L, 1))));
  return 1;
}
int cuda_memory_reserved(lua_State* L) {
  lua_pushnumber(L, static_cast<lua_Number>(cuda::memory_reserved(device_arg(L, 1))));
  return 1;
}
int cuda_reset_peak_memory_stats(lua_State* L) {
  cuda::reset_peak_memory_stats(device_arg(L, 1));
  return 0;
}

// torch.cuda.side_stream(fn, ...) -> fn(...): runs fn with a side stream from
// LibTorch's pool as the current stream (it first waits for the work queued
// before; the previous stream waits for its work afterwards, also when fn
// raises). What PyTorch writes `with torch.cuda.stream(torch.cuda.Stream()):`;
// the steps before a CUDA graph's capture run there (host/cuda/cuda.h).
int cuda_side_stream(lua_State* L) {
  if (lua_type(L, 1) != LUA_TFUNCTION) throw ArgError(1, "function expected, got " + type_name(L, 1));
  int status;
  {
    cuda::SideStream side;
    status = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
  }
  if (status != 0) return lua_error(L);
  return lua_gettop(L);
}

int graph_new(lua_State* L) {
  push_userdata<GraphPtr>(L, kGraphMeta, std::make_unique<cuda::Graph>());
  return 1;
}
cuda::Graph& check_graph(lua_State* L) { return *check_userdata<GraphPtr>(L, 1, kGraphMeta, "CUDAGraph"); }
int graph_capture_begin(lua_State* L) { check_graph(L).capture_begin(); return 0; }
int graph_capture_end(lua_State* L) { check_graph(L).capture_end(); return 0; }
int graph_replay(lua_State* L) { check_graph(L).replay(); return 0; }
int graph_reset(lua_State* L) { check_graph(L).reset(); return 0; }
int graph_capturing(lua_State* L) {
  lua_pushboolean(L, check_graph(L).capturing());
  return 1;
}

const luaL_Reg graph_methods[] = {
    {"capture_begin", guarded<graph_capture_begin>},
    {"capture_end", guarded<graph_capture_end>},
    {"replay", guarded<graph_replay>},
    {"reset", guarded<graph_reset>},
    {"capturing", guarded<graph_capturing>},
    {nullptr, nullptr},
};

const luaL_Reg cuda_functions[] = {
    {"is_available", guarded<cuda_is_available>},
    {"device_count", guarded<cuda_device_count>},
    {"_version", guarded<cuda_version>},
    {"synchronize", guarded<cuda_synchronize>},
    {"memory_allocated", guarded<cuda_memory_allocated>},
    {"max_memory_allocated", guarded<cuda_max_memory_allocated>},
    {"memory_reserved", guarded<cuda_memory_reserved>},
    {"reset_peak_memory_stats", guarded<cuda_reset_peak_memory_stats>},
    {"side_stream", guarded<cuda_side_stream>},
    {"CUDAGraph", guarded<graph_new>},
    {nullptr, nullptr},
};

}  // namespace

/// Pushes torch.cuda.
int luaopen_anatomy_cuda(lua_State* L) {
  define_userdata<GraphPtr>(L, kGraphMeta, "CUDAGraph", graph_methods);
  lua_newtable(L);
  luaL_register(L, nullptr, cuda_functions);
  return 1;
}

}  // namespace anatomy::lua
