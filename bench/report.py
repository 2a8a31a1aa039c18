"""Merges the benchmark's JSON (bench/bench.lua, bench/peer.py, the C++ add),
times the cold starts, and prints the side-by-side table (Markdown), also
written to OUT/RESULTS.md.  Usage: report.py OUT_DIR ANATOMY_EXECUTABLE"""
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time


def load(path):
    with open(path) as f:
        return json.load(f)


def cold(cmd, runs=10):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), max(times)


def ms(c):
    return "%.1f ms (%.1f–%.1f)" % (c["median"] * 1e3, c["min"] * 1e3, c["max"] * 1e3)


def vibenet_flops(kind, B=16, T=128, C=128, V=256, L=4):
    """Matmul FLOPs of one training step: 3× the forward's (backward computes
    two products per forward product); elementwise work and the embedding are left out."""
    per_layer = 4 * B * T * T * C                      # x·xᵀ and A·x (the full T×T, as the kernels compute it)
    if kind in ("ffn", "gate"):
        per_layer += 2 * B * T * C * C                 # ffn
    if kind == "gate":
        per_layer += 2 * B * T * C * C                 # gate
    forward = L * per_layer + 2 * B * T * C * 3 * C + 2 * B * T * 3 * C * V  # expand, head
    return 3 * forward


def main():
    out, exe = sys.argv[1], sys.argv[2]
    a = load(os.path.join(out, "anatomy.json"))["cases"]
    p = load(os.path.join(out, "pytorch.json"))["cases"]
    cpp = load(os.path.join(out, "cpp.json"))
    threads = load(os.path.join(out, "anatomy.json"))["threads"]
    rows = []
    row = lambda *cells: rows.append("| " + " | ".join(cells) + " |")

    row("case", "anatomy", "PyTorch eager", "PyTorch / anatomy", "target")
    row("---", "---", "---", "---", "---")
    for name, label, target in [("gpt", "1. gpt train step (V65 d64 h2 ffn128, B32 T64)", "≥ 1.3×"),
                                ("vibenet_plain", "2. VibeNet plain (d128 L4 V256, B16 T128)", "≥ 1.25×"),
                                ("vibenet_ffn", "2. VibeNet ffn", "≥ 1.25×"),
                                ("vibenet_gate", "2. VibeNet gate", "≥ 1.25×")]:
        x, y = a[name], p[name]
        tok = lambda c: "%.0fk tok/s" % (c["tokens"] / c["median"] / 1e3)
        row(label + (" — %d params both" % x["params"] if x["params"] == y["params"] else " — PARAMS DIFFER"),
            ms(x) + ", " + tok(x), ms(y) + ", " + tok(y), "%.2f×" % (y["median"] / x["median"]), target)
    rate = a["blas"]["flops"] / a["blas"]["median"]
    row("BLAS: 1024³ float32 matmul", "%.1f GFLOP/s" % (rate / 1e9),
        "%.1f GFLOP/s" % (p["blas"]["flops"] / p["blas"]["median"] / 1e9), "", "")
    for kind in ("plain", "ffn", "gate"):
        f = vibenet_flops(kind)
        floor = f / rate
        row("2. VibeNet %s: matmul FLOPs %.2f G, floor at that rate" % (kind, f / 1e9), "%.1f ms = %.2f× the floor"
            % (a["vibenet_" + kind]["median"] * 1e3, a["vibenet_" + kind]["median"] / floor),
            "%.2f× the floor" % (p["vibenet_" + kind]["median"] / floor), "floor %.1f ms" % (floor * 1e3), "≤ 1.1× floor")
    au = a["autopsy"]
    row("3. full autopsy from the training step (VibeNet plain)", "%s; +%.2f of a step" % (ms(au), (au["median"] - au["plain"]) / au["plain"]),
        "(no counterpart)", "", "≤ 0.25 of a step")
    ia, ip = a["idle_probes"], p["idle_probes"]
    row("4. idle probes on all %d modules vs none (VibeNet plain)" % ia["probes"],
        "%+.1f%%" % (100 * (ia["median"] / ia["plain"] - 1)), "%+.1f%% (no-op forward hooks on %d modules)" % (100 * (ip["median"] / ip["plain"] - 1), ip["probes"]),
        "", "≤ 2%")
    row("5. 1-element add, per op", "%.2f µs (Lua)" % (a["add"]["median"] * 1e6), "%.2f µs (Python)" % (p["add"]["median"] * 1e6),
        "%.2f× (C++ LibTorch: %.2f µs)" % (p["add"]["median"] / a["add"]["median"], cpp["median"] * 1e6), "≤ 0.6 µs and below PyTorch")
    ca = cold([exe, "--threads=1", "-e", "print(1)"])
    cp = cold(["/usr/bin/python3", "-c", "import torch"])
    row("6. cold start", "%.3f s (`anatomy -e 'print(1)'`)" % ca[0], "%.3f s (`python3 -c 'import torch'`)" % cp[0],
        "%.2f×" % (cp[0] / ca[0]), "≤ 0.3 s and ≤ 1/3 of PyTorch's")
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    head = ["# Benchmark results", "",
            "%s, %s, %d cores (%s), %d threads for both; LibTorch 1.13 from Debian, OpenBLAS (openmp). "
            "Medians of the timed steps after warm-up, with the range." % (
                datetime.date.today().isoformat(), platform.machine(), os.cpu_count(), cpu or "cpu", threads), ""]
    text = "\n".join(head + rows) + "\n"
    print(text)
    with open(os.path.join(out, "RESULTS.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
