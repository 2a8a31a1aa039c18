// `anatomy --nproc N`: the launcher (see launch.h).
#include "host/dist/launch.h"

#include "host/dist/dist.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace anatomy::dist {
namespace {

volatile std::sig_atomic_t g_launcher_signal = 0;

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return "was killed by signal " + std::to_string(sig) + (name ? std::string(" (SIG") + name + ")" : "");
  }
  return "stopped (status " + std::to_string(status) + ")";
}

}  // namespace

int launch(int nproc, const std::vector<char*>& child_argv) {
  using Clock = std::chrono::steady_clock;
  auto timeout = std::chrono::milliseconds(60000);
  if (const char* t = std::getenv("ANATOMY_DIST_TIMEOUT")) {
    long s = std::strtol(t, nullptr, 10);
    if (s > 0) timeout = std::chrono::seconds(s);
  }
  Rendezvous rendezvous(nproc, timeout);
  std::string port = std::to_string(rendezvous.port());
  struct sigaction sa {};
  sa.sa_handler = [](int sig) { g_launcher_signal = sig; };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::map<pid_t, int> ranks;
  for (int r = 0; r < nproc; ++r) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      std::string key = kv.substr(0, kv.find('='));
      if (key != "RANK" && key != "WORLD_SIZE" && key != "LOCAL_RANK" && key != "MASTER_ADDR" &&
          key != "MASTER_PORT" && key != "ANATOMY_STORE_HOSTED" && key != "LOCAL_WORLD_SIZE")
        env_strings.push_back(kv);
    }
    env_strings.push_back("RANK=" + std::to_string(r));
    env_strings.push_back("LOCAL_RANK=" + std::to_string(r));
    env_strings.push_back("WORLD_SIZE=" + std::to_string(nproc));
    env_strings.push_back("LOCAL_WORLD_SIZE=" + std::to_string(nproc));
    env_strings.push_back("MASTER_ADDR=127.0.0.1");
    env_strings.push_back("MASTER_PORT=" + port);
    env_strings.push_back("ANATOMY_STORE_HOSTED=1");
    // the ranks share this machine's cores (torchrun likewise sets OMP_NUM_THREADS)
    if (!std::getenv("ANATOMY_THREADS")) {
      long cores = sysconf(_SC_NPROCESSORS_ONLN);
      env_strings.push_back("ANATOMY_THREADS=" + std::to_string(std::max(1L, cores / nproc)));
    }
    std::vector<char*> envp;
    for (auto& kv : env_strings) envp.push_back(kv.data());
    envp.push_back(nullptr);
    pid_t pid = 0;
    int rc = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, child_argv.data(), envp.data());
    if (rc != 0) {
      std::fprintf(stderr, "anatomy --nproc: cannot start rank %d: %s\n", r, std::strerror(rc));
      for (auto& [p, _] : ranks) kill(p, SIGTERM);
      return 1;
    }
    ranks[pid] = r;
  }

  int code = 0;
  bool forwarded = false;
  std::optional<Clock::time_point> deadline;  // after a failure: when the rest are stopped
  bool terminated = false;
  while (!ranks.empty()) {
    if (g_launcher_signal && !forwarded) {
      forwarded = true;
      for (auto& [p, _] : ranks) kill(p, g_launcher_signal == SIGINT ? SIGINT : SIGTERM);
      if (!deadline) deadline = Clock::now() + std::chrono::seconds(10);
      if (code == 0) code = 128 + g_launcher_signal;
    }
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      auto it = ranks.find(pid);
      if (it == ranks.end()) continue;
      int r = it->second;
      ranks.erase(it);
      bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed) {
        rendezvous.report_exit(r, describe_status(status));
        if (!forwarded) std::fprintf(stderr, "anatomy --nproc: rank %d %s\n", r, describe_status(status).c_str());
        if (code == 0) code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (!deadline) deadline = Clock::now() + timeout + std::chrono::seconds(5);
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    if (deadline && Clock::now() > *deadline) {
      for (auto& [p, r] : ranks) {
        std::fprintf(stderr, "anatomy --nproc: rank %d did not stop after the failure; %s\n", r,
                     terminated ? "killing it" : "stopping it");
        kill(p, terminated ? SIGKILL : SIGTERM);
      }
      terminated = true;
      deadline = Clock::now() + std::chrono::seconds(5);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return code;
}

}  // namespace anatomy::dist
