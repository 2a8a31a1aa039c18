#!/usr/bin/env python3
"""Writes tests/fuzz/RESULTS.md (to stdout) from a `scripts/fuzz --record` run:
its provenance, one row a target as the run printed it, the totals against
the goal (10^7 parser inputs and 10^6 Lua API calls with no crash), and the
findings of development (tests/fuzz/findings.md).

    record.py ROOT BUILD LINES SECONDS CALLS FAILED
"""
import datetime
import hashlib
import os
import platform
import re
import subprocess
import sys


def sh(*cmd, cwd=None):
    try:
        return subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout.strip()
    except OSError:
        return ""


def seeds_digest(folder):
    h = hashlib.sha256()
    for base, _, files in sorted(os.walk(folder)):
        for name in sorted(files):
            path = os.path.join(base, name)
            h.update(os.path.relpath(path, folder).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


def machine():
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) / 2 ** 20
    osname = ""
    if os.path.exists("/etc/os-release"):
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    osname = line.split("=", 1)[1].strip().strip('"')
    return "%s, %d cores, %.0f GiB, %s" % (model, os.cpu_count(), mem, osname or platform.platform())


def main():
    root, build, lines_path, seconds, calls, failed = sys.argv[1:7]
    lines = open(lines_path).read().splitlines()
    with open(os.path.join(build, "fuzz", "commit")) as f:  # written by scripts/fuzz when the run began
        commit = " ".join(f.read().split())
    version = sh(os.path.join(build, "anatomy"), "-v").splitlines()
    out = []
    w = out.append
    w("# Fuzzing record")
    w("")
    w("Written by `scripts/fuzz --record` (`tests/fuzz/record.py`, from the one-line results of the run it describes); "
      "not edited by hand.")
    w("")
    ended = datetime.datetime.fromtimestamp(os.path.getmtime(lines_path), datetime.timezone.utc)  # when the run's last line came
    w("- date: %s (the run's end)" % ended.strftime("%Y-%m-%d %H:%M UTC"))
    w("- commit: %s" % commit)
    w("- machine: %s" % machine())
    w("- compiler: %s, `-fsanitize=fuzzer-no-link,address,undefined` (build `%s`)" % (
        sh("clang", "--version").splitlines()[0] if sh("clang", "--version") else "clang", os.path.basename(build)))
    w("- anatomy: %s" % ("; ".join(v.strip() for v in version[:2]) or "?"))
    w("- run: each libFuzzer target %s s from its seed corpus (two targets at a time), `-timeout=1 -rss_limit_mb=2048 "
      "-malloc_limit_mb=2048`, dictionary `tests/fuzz/json.dict`; the Lua API fuzzer %s calls" % (seconds, calls))
    w("- seed corpora (`tests/fuzz/make_seeds.lua`): sha256 %s" % seeds_digest(os.path.join(build, "fuzz", "seeds")))
    w("")
    w("| target | executions | per second | coverage (edges) | corpus | crashes |")
    w("|---|---:|---:|---:|---:|---:|")
    inputs = crashes = 0
    api_calls = None
    api_ok = False
    problems = []
    for line in lines:
        m = re.match(r"fuzz (\S+) +(\d+) executions in (\d+)s, coverage +(\d+) edges, corpus +(\d+), crashes (\d+)(.*)", line)
        if m:
            name, runs, secs, cov, corpus, crash, rest = m.groups()
            inputs += int(runs)
            crashes += int(crash)
            w("| `%s` | %s | %s | %s | %s | %s%s |" % (name, f"{int(runs):,}", f"{int(runs) / max(int(secs), 1):,.0f}", cov,
                                                       corpus, crash, rest.strip() and " " + rest.strip()))
            continue
        m = re.match(r"fuzz lua_api +(\d+) functions and (\d+) tensor methods; (\d+) calls \(seed (\d+)\), (\d+) Lua errors, "
                     r"(\d+) without a message, ([\d.]+) s(?:, resident memory ([\d.]+)\.\.([\d.]+) MiB)?; the process survived", line)
        if m:
            fns, methods, n, s, errs, bad, secs, mem0, mem1 = m.groups()
            api_calls, api_ok = int(n), int(bad) == 0
            memory = (", resident memory %s to %s MiB" % (mem0, mem1)) if mem0 else ""
            w("| `lua_api` (seed %s; %s functions, %s tensor methods) | %s calls | %s | — | — | 0 (%s Lua errors, %s without a message%s) |" % (
                s, fns, methods, f"{int(n):,}", f"{int(n) / max(float(secs), 1e-9):,.0f}", f"{int(errs):,}", bad, memory))
            continue
        if line.startswith("fuzz "):
            problems.append(line)
    w("")
    goal_inputs = inputs >= 10 ** 7 and crashes == 0
    goal_api = api_calls is not None and api_calls >= 10 ** 6 and api_ok
    w("Parser inputs in all: %s, crashes %d: the goal of 10^7 inputs with no crash is %s. "
      "Lua API calls: %s: the goal of 10^6 calls with no crash is %s." % (
          f"{inputs:,}", crashes, "met" if goal_inputs else "**not met**",
          f"{api_calls:,}" if api_calls is not None else "none", "met" if goal_api else "**not met**"))
    if problems or failed != "0":
        w("")
        w("The run reported failures:")
        w("")
        for p in problems:
            w("    " + p)
    w("")
    w("Not fuzzed here: SentencePiece model files through the plugin (Debian's libsentencepiece; the plugin needs "
      "`RTLD_DEEPBIND`, which AddressSanitizer refuses, so it is not loaded in this build; the normal suite loads "
      "2000 mutations of a trained model through it instead, `tests/lua/test_fuzz_findings.lua`); the GPU paths "
      "(no GPU in this build).")
    w("")
    with open(os.path.join(root, "tests", "fuzz", "findings.md")) as f:
        w(f.read().rstrip())
    print("\n".join(out))


if __name__ == "__main__":
    main()
