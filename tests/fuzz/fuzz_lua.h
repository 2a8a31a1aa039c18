// What the libFuzzer targets of readers written in Lua share: anatomy's own
// Lua state, made once, and a harness function (Lua source returning
// function(text, path, folder)) called on every input with the input's bytes,
// the input written to a file, and a scratch folder. The harness returns or
// raises; a raised error is a finding (the harness catches the errors its
// readers are allowed to raise and checks that each has a message).
#pragma once
#include "embed/state.h"
#include "tests/fuzz/fuzz_common.h"

#include <lua.hpp>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace anatomy::fuzz {

/// The harness's Lua helper, defined before its code: check(ok, err) makes an
/// error without a message (or not a string) a finding.
inline const char* kLuaCheck = R"LUA(
function __fuzz_check(ok, err)
  if not ok and (type(err) ~= 'string' or err == '') then error('FINDING: an error without a message: ' .. tostring(err)) end
end
)LUA";

class LuaHarness {
 public:
  explicit LuaHarness(const char* code, const char* suffix) : suffix_(suffix) {
    RuntimeOptions options;
    options.threads = 1;
    state_ = std::make_unique<LuaState>(options);
    lua_State* L = state_->get();
    if (luaL_dostring(L, kLuaCheck) != 0) std::abort();
    if (luaL_loadstring(L, code) != 0 || lua_pcall(L, 0, 1, 0) != 0) {
      std::fprintf(stderr, "%s\n", lua_tostring(L, -1));
      std::abort();
    }
    lua_setglobal(L, "__fuzz_harness");
    folder_ = as_file(nullptr, 0, ".folder");
    std::remove(folder_.c_str());
    std::string mk = "mkdir -p '" + folder_ + "'";
    if (std::system(mk.c_str()) != 0) std::abort();
  }

  /// Runs the harness on one input; aborts (a finding) when it raises.
  void run(const uint8_t* data, size_t size) {
    std::string path = as_file(data, size, suffix_);
    lua_State* L = state_->get();
    lua_getglobal(L, "__fuzz_harness");
    lua_pushlstring(L, reinterpret_cast<const char*>(data), size);
    lua_pushstring(L, path.c_str());
    lua_pushstring(L, folder_.c_str());
    if (!state_->call(3, 0)) {
      std::fprintf(stderr, "%s\n", state_->error().c_str());
      std::abort();
    }
    lua_settop(L, 0);
  }
  void run(const std::string& text) { run(reinterpret_cast<const uint8_t*>(text.data()), text.size()); }
  lua_State* lua() { return state_->get(); }

 private:
  std::unique_ptr<LuaState> state_;
  std::string folder_;
  const char* suffix_;
};

}  // namespace anatomy::fuzz
