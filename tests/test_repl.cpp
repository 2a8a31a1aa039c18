// The executable and its REPL, driven as a user would: through pipes, with
// options, and with Ctrl-C (SIGINT) during a running loop.
#include <catch2/catch.hpp>

#include "host/runtime.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

namespace {

struct Result {
  std::string out;
  int status;
};

// Runs `anatomy ARGS` with `input` on stdin; stdout and stderr together.
Result run(const std::string& args, const std::string& input = "") {
  std::string in = "/tmp/anatomy_test_input_" + std::to_string(getpid());
  FILE* f = std::fopen(in.c_str(), "w");
  std::fputs(input.c_str(), f);
  std::fclose(f);
  std::string cmd = std::string(ANATOMY_EXE) + " " + args + " < " + in + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  Result r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::remove(in.c_str());
  return r;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("the piped REPL survives an error and keeps its variables", "[repl]") {
  Result r = run("", "x = 41\nlocal t = torch.ones(2, 3) + torch.ones(4)\nx + 1\n");
  CHECK(r.status == 0);
  CHECK(contains(r.out, "stdin:1: bad operands to '+' (shapes 2x3 and 4 cannot be broadcast)"));
  CHECK(contains(r.out, "\n42\n"));
}

TEST_CASE("an error in a one-line chunk is at stdin:1, whatever came before and however the line ends", "[repl]") {
  // (the expression form wraps a chunk as `values(CHUNK\n)`: its line numbers must stay the chunk's own)
  Result r = run("", "x = torch.ones(2, 3)\nx:sum({dim = 3})\nx:sum({dim = 3}) -- a comment\r\nerror('boom')\r\n"
                     "y = x:sum({dim = 3})\nlocal a =\n  x:sum({dim = 3})\n");
  CHECK(contains(r.out, "stdin:1: bad argument #1 to 'sum' (option 'dim': dimension 3 out of range"));
  CHECK(contains(r.out, "stdin:1: boom"));
  CHECK(contains(r.out, "stdin:2: bad argument #1 to 'sum'"));  // the two-line chunk: its second line
  size_t errors = 0, at_one = 0;
  for (size_t p = r.out.find("stdin:"); p != std::string::npos; p = r.out.find("stdin:", p + 1)) {
    if (r.out.compare(p, 8, "stdin:1:") == 0 && r.out.compare(p > 0 ? p - 1 : p, 1, "\t") != 0) ++at_one;
    if (r.out.compare(p > 0 ? p - 1 : p, 1, "\t") != 0) ++errors;
  }
  CHECK(errors == 5);
  CHECK(at_one == 4);
}

TEST_CASE("the REPL prints expressions but not statements and a semicolon silences", "[repl]") {
  Result r = run("", "y = 5\ny * 2\ny * 3;\n'text'\n");
  CHECK(r.out == "10\n\"text\"\n");
}

TEST_CASE("multi-line input continues until the chunk is complete", "[repl]") {
  Result r = run("", "function f(a)\n  return a * 2\nend\nf(21)\nfor i = 1, 2 do\nprint(i)\nend\n");
  CHECK(r.out == "42\n1\n2\n");
}

TEST_CASE("tensors print with their header in the REPL", "[repl]") {
  Result r = run("", "torch.tensor({1, 2})\n");
  CHECK(r.out == "[Tensor 2 float32 cpu]\ntensor([1., 2.])\n");
}

TEST_CASE("the -e option and scripts with arg and exit codes", "[repl]") {
  CHECK(run("-e 'print(1 + 1)'").out == "2\n");
  Result bad = run("-e 'error(\"nope\")'");
  CHECK(bad.status == 1);
  CHECK(contains(bad.out, "anatomy: (command line):1: nope"));
  Result script = run("- a b", "print(arg[1], arg[2], select('#', ...))\n");
  CHECK(script.out == "a\tb\t2\n");
  Result i = run("-e 'z = 3' -i", "z * z\n");
  CHECK(i.out == "9\n");
}

TEST_CASE("the options help and version and threads and device and seed", "[repl]") {
  CHECK(contains(run("--help").out, "usage: anatomy [options] [script [args...]]"));
  CHECK(contains(run("--version").out, "LibTorch " + anatomy::torch_version()));  // the LibTorch it was built with
  CHECK(run("--threads=1 -e 'print(torch.get_num_threads())'").out == "1\n");
  CHECK(run("--device=cpu -e 'print(torch.device())'").out == "cpu\n");
  Result bad = run("--device=tpu -e 'print(1)'");
  CHECK(bad.status == 1);
  CHECK(contains(bad.out, "unknown device 'tpu'"));
  CHECK(run("--seed=3 -e 'print(torch.randn(1):item())'").out == run("--seed=3 -e 'print(torch.randn(1):item())'").out);
  CHECK(run("--bogus").status == 2);
}

// Starts the REPL on pipes, feeds `loop`, sends SIGINT once it runs (200 ms
// after the REPL printed `ready`), then feeds `after`; returns everything the
// REPL printed.
std::string interrupt_repl(const std::string& loop, const std::string& after, const std::string& ready = "started") {
  int in[2], out[2];
  REQUIRE(pipe(in) == 0);
  REQUIRE(pipe(out) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(out[1], 2);
    close(in[1]);
    close(out[0]);
    execl(ANATOMY_EXE, ANATOMY_EXE, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  // The loop's own line announces that it runs; SIGINT goes only then.
  std::string start = "kept = 'yes'\nn = 0\nprint('started') io.stdout:flush() " + loop + "\n";
  REQUIRE(write(in[1], start.data(), start.size()) == static_cast<ssize_t>(start.size()));
  std::string output;
  char buf[4096];
  ssize_t n;
  while (output.find(ready) == std::string::npos && (n = read(out[0], buf, sizeof buf)) > 0) output.append(buf, n);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  kill(pid, SIGINT);
  REQUIRE(write(in[1], after.data(), after.size()) == static_cast<ssize_t>(after.size()));
  close(in[1]);
  while ((n = read(out[0], buf, sizeof buf)) > 0) output.append(buf, n);
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  return output;
}

TEST_CASE("Ctrl-C interrupts a running loop, not the REPL", "[repl]") {
  SECTION("a loop calling tensor functions") {
    std::string out = interrupt_repl("while true do n = n + torch.ones(1):item() end",
                                     "print(kept, n > 0)\n");
    CHECK(contains(out, "interrupted"));
    CHECK(contains(out, "yes\ttrue"));
  }
  SECTION("train.fit stops at a step boundary and returns its run") {
    std::string out = interrupt_repl(
        "c = data.from_string(('abcdefgh '):rep(100)) m = models.gpt{vocab = c.vocab_size, dim = 16, heads = 2, "
        "layers = 1, seq = 8, ffn = 32} run = train.fit(m, c, {steps = 1000000, batch = 4, quiet = true, "
        "on_step = function(s) if s == 2 then print('training') io.stdout:flush() end end})",
        "print(kept, run.interrupted, run.steps > 0, #run.train == run.steps)\n",
        "training");  // a loaded machine may take longer than 200 ms to reach the first step
    CHECK(contains(out, "the model keeps what it learned"));
    CHECK(contains(out, "yes\ttrue\ttrue\ttrue"));
  }
  SECTION("a pure Lua loop (which LuaJIT would otherwise compile)") {
    std::string out = interrupt_repl("while true do n = n + 1 end", "print(kept, n > 1000)\n");
    CHECK(contains(out, "interrupted"));
    CHECK(contains(out, "yes\ttrue"));
  }
}
