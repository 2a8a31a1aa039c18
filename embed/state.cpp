// The Lua state (see state.h).
#include "embed/state.h"

#include <lua.hpp>
#include <luajit.h>

#include "bindings/bindings.h"
#include "bindings/interrupt.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>

namespace anatomy {
namespace fs = std::filesystem;

namespace {
// Error handler: message plus traceback (non-string errors via __tostring).
int traceback(lua_State* L) {
  if (!lua_isstring(L, 1)) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_isstring(L, -1)) return 1;
    lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    lua_replace(L, 1);
  }
  lua_getglobal(L, "debug");
  lua_getfield(L, -1, "traceback");
  lua_pushvalue(L, 1);
  lua_pushinteger(L, 2);
  lua_call(L, 2, 1);
  return 1;
}

bool has_library(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir / "anatomy" / "init.lua", ec);
}
}  // namespace

std::string find_lua_dir() {
  if (const char* env = std::getenv("ANATOMY_LUA_PATH"); env && *env) return env;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path installed = exe.parent_path().parent_path() / ANATOMY_LUA_INSTALL_DIR;
    if (has_library(installed)) return installed.string();
  }
  return ANATOMY_SOURCE_LUA_DIR;
}

LuaState::LuaState(const RuntimeOptions& options) {
  configure_runtime(options);
  L_ = luaL_newstate();
  if (!L_) throw std::runtime_error("cannot create a Lua state (out of memory)");
  luaL_openlibs(L_);
  lua::open(L_);

  lua_dir_ = find_lua_dir();
  // a constructor that throws runs no destructor: close the state first
  auto fail = [this](const std::string& message) {
    lua::close(L_);
    lua_close(L_);
    L_ = nullptr;
    throw std::runtime_error(message);
  };
  if (!has_library(lua_dir_))
    fail("the Lua library was not found in '" + lua_dir_ +
         "'\n---> HINT: set ANATOMY_LUA_PATH to the folder that holds anatomy/init.lua");
  lua_pushstring(L_, lua_dir_.c_str());
  lua_setfield(L_, LUA_REGISTRYINDEX, "anatomy.lua_dir");
  lua_getglobal(L_, "package");
  std::string path = lua_dir_ + "/?.lua;" + lua_dir_ + "/?/init.lua;";
  lua_getfield(L_, -1, "path");
  path += lua_tostring(L_, -1);
  lua_pop(L_, 1);
  lua_pushstring(L_, path.c_str());
  lua_setfield(L_, -2, "path");
  lua_pop(L_, 1);

  lua_getglobal(L_, "require");
  lua_pushliteral(L_, "anatomy");
  if (!call(1, 1)) fail("loading the Lua library failed: " + error_);
  lua_setglobal(L_, "torch");
  if (options.seed) {
    lua_getglobal(L_, "torch");
    lua_getfield(L_, -1, "manual_seed");
    lua_pushnumber(L_, static_cast<lua_Number>(*options.seed));
    if (!call(1, 0)) throw std::runtime_error(error_);
    lua_pop(L_, 1);
  }
}

LuaState::~LuaState() {
  if (!L_) return;
  lua::close(L_);
  lua_close(L_);
}

bool LuaState::call(int nargs, int nresults) {
  int base = lua_gettop(L_) - nargs;
  lua_pushcfunction(L_, traceback);
  lua_insert(L_, base);
  int status;
  {
    lua::interrupt::Running running(L_);  // Ctrl-C stops this call
    status = lua_pcall(L_, nargs, nresults, base);
  }
  lua_remove(L_, base);
  if (status != 0) {
    const char* msg = lua_tostring(L_, -1);
    error_ = msg ? msg : "(error object is not a string)";
    lua_pop(L_, 1);
    return false;
  }
  return true;
}

bool LuaState::run_file(const std::string& path, const std::vector<std::string>& args) {
  lua_createtable(L_, static_cast<int>(args.size()), 1);
  lua_pushstring(L_, path.c_str());
  lua_rawseti(L_, -2, 0);
  for (size_t i = 0; i < args.size(); ++i) {
    lua_pushstring(L_, args[i].c_str());
    lua_rawseti(L_, -2, static_cast<int>(i + 1));
  }
  lua_setglobal(L_, "arg");
  int status = path == "-" ? luaL_loadfile(L_, nullptr) : luaL_loadfile(L_, path.c_str());
  if (status != 0) {
    error_ = lua_tostring(L_, -1);
    lua_pop(L_, 1);
    return false;
  }
  for (const auto& a : args) lua_pushstring(L_, a.c_str());
  return call(static_cast<int>(args.size()), 0);
}

bool LuaState::run_string(const std::string& code, const std::string& chunkname) {
  if (luaL_loadbuffer(L_, code.data(), code.size(), chunkname.c_str()) != 0) {
    error_ = lua_tostring(L_, -1);
    lua_pop(L_, 1);
    return false;
  }
  return call(0, 0);
}

}  // namespace anatomy
