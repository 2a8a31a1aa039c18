// Ctrl-C (see interrupt.h): the flag the bindings check, the Lua state the
// handler stops, and the prompt's mark.
#include "bindings/interrupt.h"

#include <lua.hpp>
#include <pthread.h>
#include <signal.h>

#include "bindings/common.h"

namespace anatomy::lua::interrupt {

volatile std::sig_atomic_t pending = 0;

namespace {
lua_State* g_running = nullptr;                     // the state a Ctrl-C stops
pthread_t g_thread;                                 // the thread that runs it
volatile std::sig_atomic_t g_prompt_interrupted = 0;
volatile std::sig_atomic_t g_holding = 0;  // hold(true): Ctrl-C only marks g_held
volatile std::sig_atomic_t g_held = 0;

void stop_hook(lua_State* L, lua_Debug*) { raise_in(L); }

void on_sigint(int) {
  // A process-directed SIGINT may land in any thread that does not block it
  // (a worker of LibTorch's, the kernel's control thread that sent it). Set
  // from there, the hook could arrive after the thread running Lua had
  // already seen `pending` and raised: it would then fire inside the error's
  // message handler. The signal goes on to the thread running Lua instead.
  if (g_running && !pthread_equal(pthread_self(), g_thread)) {
    pthread_kill(g_thread, SIGINT);
    return;
  }
  std::signal(SIGINT, SIG_DFL);
  if (g_holding) {  // the code running said when it may stop: it asks take_held()
    g_held = 1;
    return;
  }
  pending = 1;
  if (g_running) lua_sethook(g_running, stop_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

void on_prompt_sigint(int) { g_prompt_interrupted = 1; }
}  // namespace

int raise_in(lua_State* L) {
  lua_sethook(L, nullptr, 0, 0);  // one hook for the whole VM, coroutines included
  pending = 0;
  return luaL_error(L, "interrupted");
}

void raise() {
  // the handler also set the hook: left in place, it would fire again in the
  // first Lua code that runs next, which is the error's own message handler
  // (xpcall's, a notebook cell's), and turn "interrupted" into "error in error handling"
  if (g_running) lua_sethook(g_running, nullptr, 0, 0);
  pending = 0;
  throw CallError("interrupted");
}

Running::Running(lua_State* L) : L_(L), saved_state_(g_running), saved_thread_(g_thread) {
  g_thread = pthread_self();
  g_running = L;
  saved_handler_ = std::signal(SIGINT, on_sigint);
}

void hold(bool on) {
  g_holding = on ? 1 : 0;
  if (!on && g_held) {  // one came while held and nobody took it: it interrupts now
    g_held = 0;
    pending = 1;
    if (g_running) lua_sethook(g_running, stop_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
  }
}

bool take_held() {
  bool was = g_held != 0;
  g_held = 0;
  if (was && g_running) std::signal(SIGINT, on_sigint);  // the next Ctrl-C interrupts again rather than ending the process
  return was;
}

Running::~Running() {
  g_holding = 0;
  g_held = 0;
  std::signal(SIGINT, saved_handler_);
  g_running = saved_state_;
  g_thread = saved_thread_;
  lua_sethook(L_, nullptr, 0, 0);
  pending = 0;
}

void watch_prompt() {
  struct sigaction sa {};
  sa.sa_handler = on_prompt_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
}

bool take_prompt() {
  bool was = g_prompt_interrupted != 0;
  g_prompt_interrupted = 0;
  return was;
}

}  // namespace anatomy::lua::interrupt
