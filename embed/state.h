// The Lua state that scripts and the REPL run in: LuaJIT with the standard
// libraries, the `torch` global, the Lua library path, error tracebacks and
// Ctrl-C handling. One of the few host files that include Lua's headers.
#pragma once
#include "host/runtime.h"

#include <string>
#include <vector>

struct lua_State;

namespace anatomy {

class LuaState {
 public:
  /// Opens LuaJIT, applies the runtime options and loads `torch` as a global.
  /// Throws std::runtime_error if the Lua library cannot be found or loaded.
  explicit LuaState(const RuntimeOptions& options = {});
  ~LuaState();
  LuaState(const LuaState&) = delete;
  LuaState& operator=(const LuaState&) = delete;

  lua_State* get() { return L_; }

  /// Runs a script file with `arg` set as the standalone lua does
  /// (arg[0] the script, arg[1..] its arguments); the arguments are also
  /// passed as `...`. Returns false on error, with error() set.
  bool run_file(const std::string& path, const std::vector<std::string>& args);
  /// Runs a string of code; chunkname names it in error messages.
  bool run_string(const std::string& code, const std::string& chunkname = "=(command line)");
  /// Calls the function on the stack top with nargs arguments below it,
  /// with a traceback on error and Ctrl-C interrupting it. Leaves nresults.
  bool call(int nargs, int nresults);
  /// The last error: message and traceback.
  const std::string& error() const { return error_; }
  /// The folder the Lua library (anatomy/init.lua) was loaded from.
  const std::string& lua_dir() const { return lua_dir_; }

 private:
  lua_State* L_ = nullptr;
  std::string error_;
  std::string lua_dir_;
};

/// Where the Lua library is: $ANATOMY_LUA_PATH, the install prefix next to the
/// executable, or the source tree this binary was built from.
std::string find_lua_dir();

}  // namespace anatomy
