// The `anatomy` executable: runs a script, a string of code or the REPL in a
// LuaJIT state with `torch` loaded. Options mirror the standalone `lua`.
#include <lua.hpp>

#include "host/dist/dist.h"
#include "host/dist/launch.h"
#include "embed/kernel.h"
#include "embed/state.h"
#include "embed/repl.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <thread>

#include <cerrno>
#include <csignal>
#include <climits>
#include <cstdio>
#ifdef __GLIBC__
#include <malloc.h>
#include <execinfo.h>
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
    "  --kernel FILE    serve as a Jupyter kernel on the connection FILE\n"
    "  --install-kernel [--user | --prefix P]\n"
    "                   write the kernelspec that makes Jupyter find this anatomy\n"
    "  --nproc=N        run N ranks of the script on this machine, data-parallel\n"
    "                   (c10d over loopback; each with cores/N threads unless\n"
    "                   --threads or $ANATOMY_THREADS says otherwise)\n"
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
      // the other ranks, waiting in a collective, name this one and its error
      anatomy::dist::report_failure(state.error());
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

// Memory settings that must precede the first allocation.
// A crash (a native fault: a library's bug, a corrupt file a plugin reads)
// ends the process as the signal would, after printing the native stack to
// stderr, so that a log from a machine that is gone (a GPU run) says where.
// The sanitizer build leaves the signals to its own, fuller report.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ANATOMY_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define ANATOMY_ASAN 1
#endif
#ifndef ANATOMY_ASAN
extern "C" void on_fatal_signal(int sig) {
  const char* name = sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGILL ? "SIGILL" : sig == SIGFPE ? "SIGFPE" : "SIGABRT";
  const char head[] = "anatomy: fatal signal ";
  const char tail[] = "; the native stack (addresses: addr2line -f -C -e the binary, or gdb):\n";
  (void)!write(STDERR_FILENO, head, sizeof head - 1);
  (void)!write(STDERR_FILENO, name, std::strlen(name));
  (void)!write(STDERR_FILENO, tail, sizeof tail - 1);
  void* frames[64];
  int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  signal(sig, SIG_DFL);  // then the signal's own end: the same exit status and core dump
  raise(sig);
}

void install_crash_report() {
  static char alt_stack[64 * 1024];  // a stack overflow's fault still gets a stack to run on
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof alt_stack;
  sigaltstack(&ss, nullptr);
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  struct sigaction sa{};
  sa.sa_handler = on_fatal_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_ONSTACK | SA_RESETHAND;
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) sigaction(sig, &sa, nullptr);
}
#else
void install_crash_report() {}
#endif

void configure_process() {
  install_crash_report();
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
  // Buffers of 2 MiB and more on transparent huge pages (LibTorch 2.x's own
  // switch, read once at its first allocation; 1.13 has none): a full
  // activation cache (GPT-2 small, 8x256: 3 GiB held at once) is memory no
  // earlier forward freed, and first touching it 4 KiB at a time cost as
  // much as the forward's matmuls (perf: 41% of run_with_cache in the
  // kernel's clear_page). THP_MEM_ALLOC_ENABLE=0 turns it off.
  setenv("THP_MEM_ALLOC_ENABLE", "1", /*overwrite=*/0);
  std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);  // progress lines show up promptly in logs and pipes
}

// What the command line asks for.
struct CommandLine {
  anatomy::RuntimeOptions options;
  std::vector<Action> actions;
  bool interactive = false, version = false;
  int script = 0;  // argv index of the script, 0 for none
  long nproc = 0;
  std::string kernel_file, kernel_prefix;
  bool install_kernel = false, kernel_user = false;
  std::vector<int> nproc_at;  // where --nproc's words are: the ranks get the command line without them
};

CommandLine parse_command_line(int argc, char** argv) {
  CommandLine c;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], v;
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "-v" || a == "--version") {
      c.version = true;
    } else if (a == "-i") {
      c.interactive = true;
    } else if (a == "-e" || a == "-l") {
      if (i + 1 >= argc) usage_error("'" + a + "' needs an argument");
      c.actions.push_back({a[1], argv[++i]});
    } else if (take_value(argc, argv, i, "--device", v)) {
      c.options.device = v;
    } else if (take_value(argc, argv, i, "--threads", v)) {
      c.options.threads = static_cast<int64_t>(parse_positive("--threads", v));
    } else if (take_value(argc, argv, i, "--seed", v)) {
      c.options.seed = static_cast<uint64_t>(parse_positive("--seed", v));
    } else if (take_value(argc, argv, i, "--kernel", v)) {
      c.kernel_file = v;
    } else if (a == "--install-kernel") {
      c.install_kernel = true;
    } else if (a == "--user") {
      c.kernel_user = true;
    } else if (take_value(argc, argv, i, "--prefix", v)) {
      c.kernel_prefix = v;
    } else if (take_value(argc, argv, i, "--nproc", v)) {
      c.nproc = parse_positive("--nproc", v);
      if (c.nproc < 1 || c.nproc > 1024) usage_error("--nproc expects 1..1024 ranks, got " + v);
      if (std::strcmp(argv[i - 1], "--nproc") == 0) c.nproc_at.push_back(i - 1);  // "--nproc N"
      c.nproc_at.push_back(i);
    } else if (a == "--") {
      if (i + 1 < argc) c.script = i + 1;
      break;
    } else if (a.size() > 1 && a[0] == '-') {
      usage_error("unknown option '" + a + "'");
    } else {
      c.script = i;
      break;
    }
  }
  if (c.install_kernel && c.kernel_user && !c.kernel_prefix.empty()) usage_error("--install-kernel takes --user or --prefix, not both");
  if ((c.kernel_user || !c.kernel_prefix.empty()) && !c.install_kernel) usage_error("--user and --prefix go with --install-kernel");
  if (c.nproc > 0 && !c.script && c.actions.empty()) usage_error("--nproc runs a script (or -e code), not the REPL");
  if (c.nproc > 0 && c.interactive) usage_error("--nproc cannot enter the REPL (-i): each rank would read the terminal");
  return c;
}

// --install-kernel: the kernelspec that makes Jupyter find this executable.
[[noreturn]] void install_kernel(const CommandLine& c) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) usage_error("--install-kernel: cannot find this executable's path");
  self[n] = '\0';
  try {
    std::string dir = anatomy::install_kernelspec(self, c.kernel_user, c.kernel_prefix);
    std::printf("installed the kernelspec 'anatomy' in %s\n", dir.c_str());
    leave(0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "anatomy: %s\n", e.what());
    leave(1);
  }
}

// The exit code of f(), or 1 with its exception's message.
template <class F>
int reported(F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "anatomy: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  configure_process();
  CommandLine c = parse_command_line(argc, argv);
  if (c.install_kernel) install_kernel(c);
  if (!c.kernel_file.empty()) {
    leave(reported([&] {
      anatomy::LuaState state(c.options);
      return anatomy::run_kernel(state, c.kernel_file);
    }));
  }
  if (c.nproc > 0) {
    std::vector<char*> child_argv;  // this command line without --nproc
    for (int i = 0; i < argc; ++i) {
      if (std::find(c.nproc_at.begin(), c.nproc_at.end(), i) == c.nproc_at.end()) child_argv.push_back(argv[i]);
    }
    child_argv.push_back(nullptr);
    leave(reported([&] { return anatomy::dist::launch(static_cast<int>(c.nproc), child_argv); }));
  }
  leave(reported([&] { return run(c.options, c.actions, c.interactive, c.version, c.script, argc, argv); }));
}
