// The Lua state: the library is found, `torch` is global and the same table as
// require 'anatomy', options reach LibTorch, scripts get `arg`, and gradient
// hooks call back into Lua.
#include <ATen/Parallel.h>
#include <catch2/catch.hpp>

#include <lua.hpp>

#include "bindings/interrupt.h"
#include "embed/state.h"

#include <pthread.h>
#include <signal.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

using anatomy::LuaState;

namespace {
// Evaluates a Lua expression to a string.
std::string eval(LuaState& s, const std::string& expr) {
  REQUIRE(s.run_string("__result = tostring(" + expr + ")", "=eval"));
  lua_getglobal(s.get(), "__result");
  std::string v = lua_tostring(s.get(), -1);
  lua_pop(s.get(), 1);
  return v;
}
}  // namespace

TEST_CASE("torch is a global and the value of require 'anatomy'", "[state]") {
  LuaState s;
  CHECK(eval(s, "torch == require('anatomy')") == "true");
  CHECK(eval(s, "type(torch.Tensor.matmul)") == "function");
  CHECK(eval(s, "torch.matmul == torch.Tensor.matmul") == "true");
  CHECK(s.lua_dir().find("lua") != std::string::npos);
}

TEST_CASE("runtime options reach LibTorch", "[state]") {
  anatomy::RuntimeOptions o;
  o.threads = 1;
  o.seed = 7;
  LuaState s(o);
  CHECK(at::get_num_threads() == 1);
  CHECK(eval(s, "torch.get_num_threads()") == "1");
  CHECK(eval(s, "torch.device()") == "cpu");
  std::string first = eval(s, "torch.randn(3):sum():item()");
  REQUIRE(s.run_string("torch.manual_seed(7)"));
  CHECK(eval(s, "torch.randn(3):sum():item()") == first);
}

TEST_CASE("scripts receive arg and ...", "[state]") {
  std::string path = "anatomy_test_script.lua";
  {
    std::ofstream f(path);
    f << "local a, b = ...\nresult = arg[0] .. '|' .. arg[1] .. '|' .. arg[2] .. '|' .. a .. '|' .. b\n";
  }
  LuaState s;
  REQUIRE(s.run_file(path, {"--steps=3", "x"}));
  CHECK(eval(s, "result") == path + "|--steps=3|x|--steps=3|x");
  std::remove(path.c_str());
  CHECK_FALSE(s.run_file("no/such/file.lua", {}));
  CHECK(s.error().find("cannot open no/such/file.lua") != std::string::npos);
}

TEST_CASE("errors carry a traceback", "[state]") {
  LuaState s;
  REQUIRE_FALSE(s.run_string("local function inner() error('boom') end\ninner()", "=chunk"));
  CHECK(s.error().rfind("chunk:1: boom", 0) == 0);
  CHECK(s.error().find("stack traceback:") != std::string::npos);
  CHECK(s.error().find("inner") != std::string::npos);
}

TEST_CASE("gradient hooks run Lua and may replace the gradient", "[state][autograd]") {
  LuaState s;
  REQUIRE(s.run_string(R"(
    x = torch.tensor({1, 2, 3}, {requires_grad = true})
    seen = nil
    h = x:register_hook(function(g) seen = g:clone(); return g * 10 end)
    ;(x * x):sum():backward()
  )"));
  CHECK(eval(s, "seen:eq(torch.tensor({2, 4, 6})):all():item()") == "true");
  CHECK(eval(s, "x.grad:eq(torch.tensor({20, 40, 60})):all():item()") == "true");
  REQUIRE(s.run_string("h:remove(); x.grad = nil; (x * x):sum():backward()"));
  CHECK(eval(s, "x.grad:eq(torch.tensor({2, 4, 6})):all():item()") == "true");
  // An error inside a hook surfaces as an error of backward, and the state goes on.
  REQUIRE(s.run_string("x:register_hook(function(g) error('bad hook') end)"));
  REQUIRE_FALSE(s.run_string("(x * x):sum():backward()", "=test"));
  CHECK(s.error().find("bad hook") != std::string::npos);
  CHECK(eval(s, "1 + 1") == "2");
}

TEST_CASE("a Ctrl-C that lands in another thread interrupts the thread running Lua", "[state][interrupt]") {
  // A process-directed SIGINT may be handled by any thread that does not
  // block it (a LibTorch worker, the kernel's control thread). Handled there,
  // it would set the interrupt from outside, racing the Lua thread; it must be
  // passed on to the thread running Lua instead. Here that thread blocks
  // SIGINT for a moment, so the hand-over is visible: nothing is pending
  // until it unblocks.
  namespace interrupt = anatomy::lua::interrupt;
  LuaState s;
  lua_State* L = s.get();
  sigset_t sigint, saved;
  sigemptyset(&sigint);
  sigaddset(&sigint, SIGINT);
  REQUIRE(pthread_sigmask(SIG_BLOCK, &sigint, &saved) == 0);
  {
    interrupt::Running running(L);
    std::thread([&sigint] {
      pthread_sigmask(SIG_UNBLOCK, &sigint, nullptr);
      pthread_kill(pthread_self(), SIGINT);
    }).join();
    CHECK(interrupt::pending == 0);  // not taken in the other thread
    REQUIRE(pthread_sigmask(SIG_SETMASK, &saved, nullptr) == 0);  // delivered here now
    CHECK(interrupt::pending == 1);
    REQUIRE(luaL_loadstring(L, "local x = 0 for i = 1, 10 do x = x + i end return x") == 0);
    REQUIRE(lua_pcall(L, 0, 1, 0) != 0);
    CHECK(std::string(lua_tostring(L, -1)).find("interrupted") != std::string::npos);
    lua_pop(L, 1);
  }
  CHECK(interrupt::pending == 0);
  CHECK(eval(s, "1 + 1") == "2");  // the state goes on
}

TEST_CASE("an interrupt raised by a binding call leaves no hook behind", "[state][interrupt]") {
  // Ctrl-C sets the flag and a hook; a binding that sees the flag first
  // raises. The hook must go with it: left set, it would fire in the first
  // Lua code run next (the error's message handler: "error in error handling").
  namespace interrupt = anatomy::lua::interrupt;
  LuaState s;
  {
    interrupt::Running running(s.get());
    REQUIRE(std::raise(SIGINT) == 0);  // handled in this thread
    REQUIRE(interrupt::pending == 1);
    CHECK_THROWS_WITH(interrupt::raise(), "interrupted");
    CHECK(interrupt::pending == 0);
    CHECK(eval(s, "(function() local x = 0 for i = 1, 10 do x = x + i end return x end)()") == "55");
  }
}
