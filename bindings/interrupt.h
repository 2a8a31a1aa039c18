// Ctrl-C, in one place. While Lua code runs, Ctrl-C makes the next Lua
// instruction (a count hook) or the next binding call (the pending flag, for
// loops LuaJIT has compiled, which skip hooks) raise "interrupted"; a second
// Ctrl-C before that ends the process as usual. At the REPL's prompt, Ctrl-C
// only marks the line to be discarded.
#pragma once
#include <pthread.h>

#include <csignal>

struct lua_State;

namespace anatomy::lua::interrupt {

/// Set by Ctrl-C while Lua runs; guarded() checks it before every binding call.
extern volatile std::sig_atomic_t pending;

/// Clears the flag and the hook and throws CallError("interrupted") (inside a
/// binding call).
[[noreturn]] void raise();

/// The same as a Lua error, for a C function outside the bindings' wrapper
/// (the kernel's input): `return interrupt::raise_in(L);`.
int raise_in(lua_State* L);

/// hold(true): until hold(false), Ctrl-C only marks that it came (a second
/// one still ends the process), so that the code running stops where it
/// chooses by asking take_held(); hold(false) with a mark nobody took
/// interrupts at once.
void hold(bool on);
/// Whether Ctrl-C came while held; clears the mark.
bool take_held();

/// While a Running lives, Ctrl-C interrupts the Lua code running in L (the
/// previous handler and state come back when it ends; Runnings nest).
class Running {
 public:
  explicit Running(lua_State* L);
  ~Running();
  Running(const Running&) = delete;
  Running& operator=(const Running&) = delete;

 private:
  lua_State* L_;
  lua_State* saved_state_;
  pthread_t saved_thread_;
  void (*saved_handler_)(int);
};

/// Installs the prompt's handler (no SA_RESTART, so a blocked read returns).
void watch_prompt();
/// Whether Ctrl-C came since the last call; clears the mark.
bool take_prompt();

}  // namespace anatomy::lua::interrupt
