// The REPL (see repl.h). Parsing and running happen here; how values are
// shown and what completes a word is Lua (lua/anatomy/session/repl.lua), so both can
// be changed without recompiling.
#include "embed/repl.h"

#include <lua.hpp>
#include <luajit.h>

#include "bindings/interrupt.h"

#include <editline/readline.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

namespace anatomy {
namespace {

lua_State* g_completion_state = nullptr;
std::vector<std::string> g_candidates;
namespace interrupt = lua::interrupt;

std::string history_path() {
  if (const char* p = std::getenv("ANATOMY_HISTORY"); p && *p) return p;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.anatomy_history";
}

// Asks lua/anatomy/session/repl.lua for the completions of `text`.
char* next_candidate(const char* text, int state) {
  static size_t i;
  if (state == 0) i = 0;
  return i < g_candidates.size() ? strdup(g_candidates[i++].c_str()) : nullptr;
}

char** complete(const char* text, int start, int end) {
  rl_attempted_completion_over = 1;  // no file-name completion
  g_candidates.clear();
  lua_State* L = g_completion_state;
  int top = lua_gettop(L);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "anatomy.session.repl");
  if (lua_pcall(L, 1, 1, 0) == 0) {
    lua_getfield(L, -1, "complete");
    lua_pushstring(L, text);
    if (lua_pcall(L, 1, 1, 0) == 0 && lua_istable(L, -1)) {
      size_t n = lua_objlen(L, -1);
      for (size_t k = 1; k <= n; ++k) {
        lua_rawgeti(L, -1, static_cast<int>(k));
        if (const char* s = lua_tostring(L, -1)) g_candidates.emplace_back(s);
        lua_pop(L, 1);
      }
    }
  }
  lua_settop(L, top);
  if (g_candidates.empty()) return nullptr;
  return rl_completion_matches(text, next_candidate);
}

// A chunk that failed only because it ends early: keep reading lines.
bool is_incomplete(lua_State* L, int status) {
  if (status != LUA_ERRSYNTAX) return false;
  size_t n;
  const char* msg = lua_tolstring(L, -1, &n);
  const char mark[] = "'<eof>'";
  return msg && n >= sizeof(mark) - 1 && std::strcmp(msg + n - (sizeof(mark) - 1), mark) == 0;
}

std::string strip_semicolons(std::string s) {
  while (!s.empty() && (s.back() == ';' || std::isspace(static_cast<unsigned char>(s.back())))) s.pop_back();
  return s;
}

bool ends_with_semicolon(const std::string& s) {
  size_t i = s.find_last_not_of(" \t\r\n");
  return i != std::string::npos && s[i] == ';';
}

enum class Read { kLine, kEnd, kInterrupted };

Read read_line(bool tty, const char* prompt, std::string& line) {
  interrupt::take_prompt();
  if (!tty) {
    while (!std::getline(std::cin, line)) {
      if (!interrupt::take_prompt()) return Read::kEnd;
      std::cin.clear();  // Ctrl-C while waiting for input: keep reading
    }
    return Read::kLine;
  }
  char* s = readline(prompt);
  if (interrupt::take_prompt()) {
    std::free(s);
    std::fputs("\n", stdout);
    return Read::kInterrupted;
  }
  if (!s) return Read::kEnd;
  line = s;
  std::free(s);
  return Read::kLine;
}

// Shows the results left on the stack (from index base) through repl.show.
void show_results(LuaState& state, int base) {
  lua_State* L = state.get();
  int n = lua_gettop(L) - base + 1;
  if (n <= 0) return;
  lua_getglobal(L, "require");
  lua_pushliteral(L, "anatomy.session.repl");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, "show");
  lua_remove(L, -2);
  lua_insert(L, base);
  if (!state.call(n, 0)) std::fprintf(stderr, "%s\n", state.error().c_str());
}

std::string format_duration(double seconds) {
  char buf[64];
  if (seconds < 1e-3) std::snprintf(buf, sizeof buf, "%.0f us", seconds * 1e6);
  else if (seconds < 1) std::snprintf(buf, sizeof buf, "%.1f ms", seconds * 1e3);
  else std::snprintf(buf, sizeof buf, "%.2f s", seconds);
  return buf;
}

}  // namespace

int run_repl(LuaState& state) {
  lua_State* L = state.get();
  const bool tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
  const std::string history = history_path();
  if (tty) {
    rl_readline_name = "anatomy";
    rl_basic_word_break_characters = " \t\n\"\\'`@$><=;|&{(,+-*/%^#~[]";
    rl_completer_word_break_characters = const_cast<char*>(rl_basic_word_break_characters);
    rl_attempted_completion_function = complete;
    rl_completion_append_character = '\0';
    g_completion_state = L;
    read_history(history.c_str());
    lua_getglobal(L, "torch");
    lua_getfield(L, -1, "banner");
    if (lua_isfunction(L, -1) && state.call(0, 1) && lua_isstring(L, -1)) std::printf("%s\n", lua_tostring(L, -1));
    lua_settop(L, 0);
  }

  std::string chunk;
  for (;;) {
    interrupt::watch_prompt();
    std::string line;
    Read r = read_line(tty, chunk.empty() ? "> " : ">> ", line);
    if (r == Read::kEnd) break;
    if (r == Read::kInterrupted) {
      chunk.clear();
      continue;
    }
    if (chunk.empty() && line.find_first_not_of(" \t\r") == std::string::npos) continue;
    chunk += chunk.empty() ? line : "\n" + line;

    // An expression prints its values; otherwise run it as a statement. The
    // values pass through a function call so that `x:f(y)` is not a tail call,
    // which would lose its line and name in error messages.
    std::string as_expression = "local function values(...) return ... end return values(" + strip_semicolons(chunk) + "\n)";
    int status = luaL_loadbuffer(L, as_expression.data(), as_expression.size(), "=stdin");
    if (status != 0) {
      lua_pop(L, 1);
      status = luaL_loadbuffer(L, chunk.data(), chunk.size(), "=stdin");
      if (is_incomplete(L, status)) {
        lua_pop(L, 1);
        continue;
      }
    }
    if (tty) {
      add_history(chunk.c_str());
      write_history(history.c_str());
    }
    if (status != 0) {
      std::fprintf(stderr, "%s\n", lua_tostring(L, -1));
      lua_pop(L, 1);
      chunk.clear();
      continue;
    }
    // Code typed at the prompt runs in LuaJIT's interpreter: compiled traces
    // skip the hook that Ctrl-C sets, so a typed `while true do end` could not
    // be stopped. Functions from scripts and the library stay compiled.
    luaJIT_setmode(L, lua_gettop(L), LUAJIT_MODE_ALLFUNC | LUAJIT_MODE_OFF);
    bool quiet = ends_with_semicolon(chunk);
    chunk.clear();
    int base = lua_gettop(L);  // the loaded chunk sits at base
    auto t0 = std::chrono::steady_clock::now();
    bool ok = state.call(0, LUA_MULTRET);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fflush(stdout);
    if (!ok) {
      std::fprintf(stderr, "%s\n", state.error().c_str());
    } else if (!quiet) {
      show_results(state, base);
    }
    lua_settop(L, base - 1);
    std::fflush(stdout);
    if (tty) std::printf("\x1b[2m(%s)\x1b[0m\n", format_duration(seconds).c_str());
    std::fflush(stderr);
  }
  if (tty) {
    std::printf("\n");
    history_truncate_file(history.c_str(), 2000);
  }
  return 0;
}

}  // namespace anatomy
