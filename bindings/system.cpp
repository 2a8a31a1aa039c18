// Small services of the machine for the Lua library: a monotonic clock (rates
// and ETAs), whether a file descriptor is a terminal (progress lines), the
// memory left (a model's size checked before it is made), and zlib's
// compressed size (the text measures).
#include <ATen/ATen.h>
#include <ATen/Version.h>

#include "bindings/parts.h"
#include "bindings/common.h"
#include "bindings/interrupt.h"
#include "host/io/digest.h"
#include "host/io/durable.h"
#include "host/runtime.h"

#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <utility>

namespace anatomy::lua {
namespace {

// torch._now() -> seconds on a monotonic clock (for rates and ETAs)
int torch_now(lua_State* L) {
  lua_pushnumber(L, std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count());
  return 1;
}

// torch._isatty(fd) -> whether the file descriptor is a terminal
int torch_isatty(lua_State* L) {
  lua_pushboolean(L, isatty(static_cast<int>(check_integer(L, 1))));
  return 1;
}

// torch._compressed_size(s, level = 9) -> bytes of s after zlib compression
int torch_compressed_size(lua_State* L) {
  size_t n;
  const char* s = luaL_checklstring(L, 1, &n);
  int level = lua_isnoneornil(L, 2) ? 9 : static_cast<int>(check_integer(L, 2));
  if (level < 0 || level > 9) throw ArgError(2, "zlib level must be 0..9");
  uLongf out = compressBound(n);
  std::vector<Bytef> buf(out);
  if (compress2(buf.data(), &out, reinterpret_cast<const Bytef*>(s), n, level) != Z_OK)
    throw CallError("zlib could not compress the text");
  lua_pushnumber(L, static_cast<lua_Number>(out));
  return 1;
}

// torch._cache_dir() -> anatomy's cache folder (host/runtime.h: XDG_CACHE_HOME, else ~/.cache)
int torch_cache_dir(lua_State* L) {
  std::string dir = cache_dir();
  lua_pushlstring(L, dir.data(), dir.size());
  return 1;
}

// torch._write_atomic(path, text) -> path: text written to a temporary file
// beside path, fsynced, renamed into place, the folder fsynced (io::write_atomic)
int torch_write_atomic(lua_State* L) {
  std::string path = luaL_checkstring(L, 1);
  size_t n;
  const char* text = luaL_checklstring(L, 2, &n);
  try {
    io::write_atomic(path, text, n);
  } catch (const io::WriteError& e) {
    throw CallError(e.what());
  }
  lua_pushvalue(L, 1);
  return 1;
}

// torch._sync_file(path): forces an appended file's data to disk
int torch_sync_file(lua_State* L) {
  std::string path = luaL_checkstring(L, 1);
  try {
    io::sync_file(path);
  } catch (const io::WriteError& e) {
    throw CallError(e.what());
  }
  return 0;
}

// torch._remove_stale_temporaries(path) -> n: removes the temporary files
// that writers killed before their rename left beside path
// torch._not_a_file(path) -> nil for a regular file, else why it cannot be
// read as one ("is a directory", "is not a regular file (a FIFO)", ...)
int torch_not_a_file(lua_State* L) {
  std::string why = io::not_a_file(check_string(L, 1));
  if (why.empty()) lua_pushnil(L);
  else lua_pushstring(L, why.c_str());
  return 1;
}

int torch_remove_stale_temporaries(lua_State* L) {
  lua_pushinteger(L, io::remove_stale_temporaries(luaL_checkstring(L, 1)));
  return 1;
}

// torch._show_config() -> LibTorch's build description (at::show_config:
// compiler, BLAS, LAPACK, CPU capability, ...), as torch.__config__.show()
int torch_show_config(lua_State* L) {
  lua_pushstring(L, at::show_config().c_str());
  return 1;
}

// torch._cpu_pool() -> {pooled_bytes, pooled_blocks, limit, reused, fresh}:
// the memory guard's pool of freed large CPU buffers (host/memory_guard.cpp)
int torch_cpu_pool(lua_State* L) {
  CPUPoolStats s = cpu_pool_stats();
  const std::pair<const char*, uint64_t> fields[] = {{"pooled_bytes", s.pooled_bytes}, {"pooled_blocks", s.pooled_blocks},
                                                     {"limit", s.limit}, {"reused", s.reused}, {"fresh", s.fresh}};
  lua_createtable(L, 0, 5);
  for (const auto& [name, value] : fields) {
    lua_pushnumber(L, static_cast<double>(value));
    lua_setfield(L, -2, name);
  }
  return 1;
}

// torch._available_memory() -> bytes this process can still get (RAM
// available and free swap, within its cgroup's limit, plus what the memory
// guard's pool holds and gives back first), as the guard counts them; 0 when
// it cannot be told. What a model's size is checked against before it is made.
int torch_available_memory(lua_State* L) {
  uint64_t available = available_memory();
  if (available > 0) available += cpu_pool_stats().pooled_bytes;
  lua_pushnumber(L, static_cast<double>(available));
  return 1;
}

// torch._cpu_pool_empty() -> bytes given back to the system
int torch_cpu_pool_empty(lua_State* L) {
  lua_pushnumber(L, static_cast<double>(cpu_pool_empty()));
  return 1;
}

// torch._cpu_pool_set_limit(bytes): checked in Lua (a whole, non-negative number)
int torch_cpu_pool_set_limit(lua_State* L) {
  double n = check_number(L, 1);
  luaL_argcheck(L, n >= 0 && n < 9.2e18, 1, "the limit must be a number of bytes from 0 to 2^63");
  cpu_pool_set_limit(static_cast<uint64_t>(n));
  return 0;
}

// torch._hold_interrupts(on) -> with on, Ctrl-C only marks that it came
// until torch._hold_interrupts(false), which returns whether one came (and
// clears the mark): train.fit stops between steps, never inside one.
int torch_hold_interrupts(lua_State* L) {
  bool on = lua_toboolean(L, 1) != 0;
  if (on) {
    interrupt::hold(true);
    return 0;
  }
  bool came = interrupt::take_held();
  interrupt::hold(false);
  lua_pushboolean(L, came);
  return 1;
}

const luaL_Reg functions[] = {
    {"_hold_interrupts", torch_hold_interrupts},
    {"_cpu_pool", guarded<torch_cpu_pool>},
    {"_cpu_pool_empty", guarded<torch_cpu_pool_empty>},
    {"_cpu_pool_set_limit", guarded<torch_cpu_pool_set_limit>},
    {"_available_memory", guarded<torch_available_memory>},
    {"_show_config", guarded<torch_show_config>},
    {"_remove_stale_temporaries", guarded<torch_remove_stale_temporaries>},
    {"_write_atomic", guarded<torch_write_atomic>},
    {"_sync_file", guarded<torch_sync_file>},
    {"_cache_dir", guarded<torch_cache_dir>},
    {"_now", guarded<torch_now>},
    {"_isatty", guarded<torch_isatty>},
    {"_not_a_file", guarded<torch_not_a_file>},
    {"_compressed_size", guarded<torch_compressed_size>},
    {nullptr, nullptr},
};

}  // namespace

/// Adds _hold_interrupts, _cpu_pool, _cpu_pool_empty, _cpu_pool_set_limit, _available_memory, _show_config, _now, _isatty, _not_a_file, _compressed_size, _cache_dir, _write_atomic, _sync_file and _remove_stale_temporaries to the torch table at index torch.
void register_system(lua_State* L, int torch) {
  lua_pushvalue(L, torch);
  luaL_register(L, nullptr, functions);
  lua_pop(L, 1);
}

}  // namespace anatomy::lua
