// Errors as Lua reports them (see common.h): the failing function's name as
// the script wrote it, the user's file and line, and Lua's "bad argument"
// grammar for what guarded() caught.
#include "bindings/common.h"

#include <ATen/ATen.h>

#include <cstring>
#include <string>

namespace anatomy::lua {

namespace {
// The running C function's name, as init.lua recorded it for that function
// (registry "anatomy.names"), else as Lua's debug info gives it. Debug info
// names the call site, which a tail call (`return x:f()`) replaces with the
// caller's; so it decides only whether the call was written obj:name(...).
std::string current_function_name(lua_State* L, bool* method) {
  lua_Debug ar;
  *method = false;
  if (!lua_getstack(L, 0, &ar)) return "?";
  lua_getinfo(L, "nf", &ar);  // pushes the function
  std::string name;
  lua_getfield(L, LUA_REGISTRYINDEX, "anatomy.names");
  if (lua_istable(L, -1)) {
    lua_pushvalue(L, -2);
    lua_rawget(L, -2);
    if (lua_isstring(L, -1)) name = lua_tostring(L, -1);
    lua_pop(L, 1);
  }
  lua_pop(L, 2);
  if (ar.name && (name.empty() || name == ar.name)) {
    *method = std::strcmp(ar.namewhat, "method") == 0;
    name = ar.name;
  } else if (!ar.name && !name.empty() && name.find('.') == std::string::npos && to_tensor(L, 1)) {
    // No call site (a tail call, `return h:matmul(W)`, leaves none): a tensor
    // function called on a tensor was almost surely written as a method, so
    // the arguments are numbered as the script wrote them.
    *method = true;
  }
  return name.empty() ? "?" : name;
}

// ATen's messages can run to several lines (notes, hints); keep the first.
std::string first_line(const std::string& message) {
  std::string s = message.substr(0, message.find('\n'));
  while (!s.empty() && (s.back() == ' ' || s.back() == '.')) s.pop_back();
  return s;
}
}  // namespace

// "file:line: " of the code that made the failing call: the first Lua frame
// outside anatomy's own Lua library (registry "anatomy.lua_dir"), so that an
// error inside nn.Linear's forward points at the user's line, not the library's.
void push_where(lua_State* L) {
  lua_getfield(L, LUA_REGISTRYINDEX, "anatomy.lua_dir");
  std::string library = lua_isstring(L, -1) ? "@" + std::string(lua_tostring(L, -1)) : "";
  lua_pop(L, 1);
  lua_Debug ar;
  for (int level = 1; !library.empty() && lua_getstack(L, level, &ar); ++level) {
    lua_getinfo(L, "Sl", &ar);
    if (ar.currentline <= 0) continue;
    if (std::strncmp(ar.source, library.c_str(), library.size()) == 0) continue;
    lua_pushfstring(L, "%s:%d: ", ar.short_src, ar.currentline);
    return;
  }
  luaL_where(L, 1);
}

int raise_error(lua_State* L, int kind, int arg) {
  std::string text;
  {
    bool method = false;
    std::string name = current_function_name(L, &method);
    std::string msg = lua_tostring(L, -1) ? lua_tostring(L, -1) : "?";
    if (kind == 1) {
      // Lua's own convention (luaL_argerror): in obj:f(x), x is argument #1.
      if (method && --arg == 0) text = "calling '" + name + "' on bad self (" + msg + ")";
      else text = "bad argument #" + std::to_string(arg) + " to '" + name + "' (" + msg + ")";
    } else if (kind == 2) {
      text = msg;
    } else {
      text = "error in '" + name + "' (" + first_line(msg) + ")";
    }
  }
  lua_pop(L, 1);
  push_where(L);
  lua_pushlstring(L, text.data(), text.size());
  text = std::string();  // nothing of ours may be left to free: lua_error unwinds
  lua_concat(L, 2);
  return lua_error(L);
}

}  // namespace anatomy::lua
