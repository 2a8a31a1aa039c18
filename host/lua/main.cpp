// The `anatomy` executable: runs a script, a string of code or the REPL in a
// LuaJIT state with `torch` loaded. Options mirror the standalone `lua`.
#include <lua.hpp>

#include "host/lua/state.h"
#include "host/lua/repl.h"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

const char* kUsage =
    "usage: anatomy [options] [script [args...]]\n"
    "\n"
    "Runs Lua scripts over LibTorch; with no script, opens the REPL.\n"
    "\n"
    "  -e CODE          run CODE (may be repeated)\n"
    "  -i               enter the REPL after the script or -e\n"
    "  -l NAME          require library NAME before the script\n"
    "  -                run the script read from standard input\n"
    "  --device=NAME    default device: cpu, cuda or cuda:N\n"
    "                   (default: $ANATOMY_DEVICE, else cuda if a GPU is present, else cpu)\n"
    "  --threads=N      CPU threads (default: $ANATOMY_THREADS, else the number of cores)\n"
    "  --seed=N         seed torch's generators and math.random\n"
    "  -v, --version    print versions and exit\n"
    "  -h, --help       print this help and exit\n"
    "\n"
    "Arguments after the script go to it as the global table `arg` and as `...`.\n";

struct Action {
  char kind;  // 'e' code, 'l' library
  std::string value;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "anatomy: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

// "--name=value" or "--name value"
bool take_value(int argc, char** argv, int& i, const char* name, std::string& value) {
  size_t n = std::strlen(name);
  if (std::strncmp(argv[i], name, n) != 0) return false;
  if (argv[i][n] == '=') {
    value = argv[i] + n + 1;
    return true;
  }
  if (argv[i][n] == '\0') {
    if (i + 1 >= argc) usage_error(std::string(name) + " needs a value");
    value = argv[++i];
    return true;
  }
  return false;
}

long parse_positive(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < 0) usage_error(flag + " expects a non-negative integer, got '" + v + "'");
  if (errno == ERANGE) usage_error(flag + "=" + v + " is out of range (at most " + std::to_string(LONG_MAX) + ")");
  return n;
}

// Runs the command line's actions in a fresh Lua state; the state (and every
// tensor it holds) is closed before this returns.
int run(const anatomy::RuntimeOptions& options, const std::vector<Action>& actions, bool interactive, bool version,
        int script, int argc, char** argv) {
  anatomy::LuaState state(options);
  lua_State* L = state.get();
  if (version) {
    lua_getglobal(L, "torch");
    lua_getfield(L, -1, "banner");
    if (state.call(0, 1)) std::printf("%s\n", lua_tostring(L, -1));
    return 0;
  }
  for (const Action& act : actions) {
    bool ok = act.kind == 'e' ? state.run_string(act.value)
                              : state.run_string("require('" + act.value + "')", "=(command line)");
    if (!ok) {
      std::fprintf(stderr, "anatomy: %s\n", state.error().c_str());
      return 1;
    }
  }
  if (script) {
    std::vector<std::string> args(argv + script + 1, argv + argc);
    if (!state.run_file(argv[script], args)) {
      std::fprintf(stderr, "anatomy: %s\n", state.error().c_str());
      return 1;
    }
  }
  if (interactive || (!script && actions.empty())) return anatomy::run_repl(state);
  return 0;
}

// Leaves without running the static destructors of the loaded libraries:
// LibTorch's unregister every operator one by one (~0.1 s of instructions at
// every exit), and nothing of ours is left to release once the Lua state is
// closed. C stdio is flushed first; the C++ streams write through it
// (sync_with_stdio). Naming std::cout here would give the executable a copy
// relocation of it, which the RTLD_DEEPBIND SentencePiece plugin would not see
// initialised. Sanitizer builds exit normally so that the leak checker runs.
[[noreturn]] void leave(int code) {
  std::fflush(nullptr);
#if defined(__SANITIZE_ADDRESS__) || defined(ANATOMY_SANITIZE)  // gcc defines the first, clang neither
  std::exit(code);
#else
  std::_Exit(code);
#endif
}

}  // namespace

int main(int argc, char** argv) {
#ifdef __GLIBC__
  // Tensor buffers are freed in batches by Lua's collector rather than one at
  // a time. glibc would serve buffers above 128 KiB with mmap and trim freed
  // heap back to the system, so every new buffer would start as fresh pages
  // (one fault per 4 KiB). Keep buffers up to 32 MiB on the heap and keep
  // freed memory for reuse: the steady state of a training loop then faults
  // no more than PyTorch does.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
  std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);  // progress lines show up promptly in logs and pipes
  anatomy::RuntimeOptions options;
  std::vector<Action> actions;
  bool interactive = false, version = false;
  int script = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], v;
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "-v" || a == "--version") {
      version = true;
    } else if (a == "-i") {
      interactive = true;
    } else if (a == "-e" || a == "-l") {
      if (i + 1 >= argc) usage_error("'" + a + "' needs an argument");
      actions.push_back({a[1], argv[++i]});
    } else if (take_value(argc, argv, i, "--device", v)) {
      options.device = v;
    } else if (take_value(argc, argv, i, "--threads", v)) {
      options.threads = static_cast<int64_t>(parse_positive("--threads", v));
    } else if (take_value(argc, argv, i, "--seed", v)) {
      options.seed = static_cast<uint64_t>(parse_positive("--seed", v));
    } else if (a == "--") {
      if (i + 1 < argc) script = i + 1;
      break;
    } else if (a.size() > 1 && a[0] == '-') {
      usage_error("unknown option '" + a + "'");
    } else {
      script = i;
      break;
    }
  }

  int code = 1;
  try {
    code = run(options, actions, interactive, version, script, argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "anatomy: %s\n", e.what());
  }
  leave(code);
}
