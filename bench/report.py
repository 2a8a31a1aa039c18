"""Merges the benchmark's JSON (bench/bench.lua, bench/peer.py, the C++ add;
one file of each per round: anatomy.1.json, pytorch.1.json, cpp.1.json, ...),
times the cold starts, and prints the side-by-side table (Markdown), also
written to OUT/RESULTS.md and, with the commit and machine, into the
`training-BUILD` section of bench/RESULTS.md (one section a build: pypi, cuda
or debian).
Usage: report.py OUT_DIR ANATOMY_EXECUTABLE LOAD_FLOOR_EXECUTABLE PYTHON BUILD"""
import datetime
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import sections


def load(path):
    with open(path) as f:
        return json.load(f)


def summarize(times):
    s = sorted(times)
    return {"median": statistics.median(s), "min": s[0], "max": s[-1], "n": len(s), "times": times}


def merge(runs):
    """One result per case from several rounds: the step times pooled (median
    and range recomputed), per-op figures the best round's."""
    out = {}
    for name in runs[0]:
        cases = [r[name] for r in runs]
        c = dict(cases[0])
        if "times" in c:
            c.update(summarize([t for x in cases for t in x["times"]]))
        else:
            c["median"] = min(x["median"] for x in cases)
        if isinstance(c.get("plain"), dict):
            c["plain"] = summarize([t for x in cases for t in x["plain"]["times"]])
        out[name] = c
    return out


def rounds(out, side, optional=False):
    files = sorted(glob.glob(os.path.join(out, side + ".*.json")))
    if not files and not optional:
        sys.exit("report.py: no %s.N.json in %s" % (side, out))
    return [load(f) for f in files]


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
    out, exe, load_floor, python, build = sys.argv[1:6]
    ar, pr = rounds(out, "anatomy"), rounds(out, "pytorch")
    a = merge([r["cases"] for r in ar])
    p = merge([r["cases"] for r in pr])
    cpp = {"median": min(r["median"] for r in rounds(out, "cpp"))}
    threads = ar[0]["threads"]
    n_rounds = len(ar)
    cr = rounds(out, "compiled", optional=True)  # torch.compile's steps (PyTorch 2.x only)
    c = merge([r["cases"] for r in cr]) if cr else None
    rows = []
    header = ["case", "anatomy", "PyTorch eager", "PyTorch / anatomy", "target"]
    if c:
        header[4:4] = ["torch.compile", "compile / anatomy"]
    # every row as wide as the header (the compile columns stay empty beyond the steps)
    row = lambda *cells: rows.append("| " + " | ".join(list(cells[:-1]) + [""] * (len(header) - len(cells)) + [cells[-1]]) + " |")

    row(*header)
    row(*["---"] * len(header))
    target = "≥ 1.3× eager" + (", ≥ 1.2× compile" if c else "")
    for name, label in [("gpt", "1. gpt train step (V65 d64 h2 ffn128, B32 T64)"),
                        ("vibenet_plain", "2. VibeNet plain (d128 L4 V256, B16 T128)"),
                        ("vibenet_ffn", "2. VibeNet ffn"),
                        ("vibenet_gate", "2. VibeNet gate")]:
        x, y = a[name], p[name]
        tok = lambda c: "%.0fk tok/s" % (c["tokens"] / c["median"] / 1e3)
        cells = [label + (" — %d params both" % x["params"] if x["params"] == y["params"] else " — PARAMS DIFFER"),
                 ms(x) + ", " + tok(x), ms(y) + ", " + tok(y),
                 "%.2f× (fastest steps: %.2f×)" % (y["median"] / x["median"], y["min"] / x["min"])]
        if c:
            z = c[name]
            cells += [ms(z) + ", " + tok(z), "%.2f× (fastest steps: %.2f×)" % (z["median"] / x["median"], z["min"] / x["min"])]
        row(*cells, target)
    rate = a["blas"]["flops"] / a["blas"]["median"]
    row("BLAS: 1024³ float32 matmul", "%.1f GFLOP/s" % (rate / 1e9),
        "%.1f GFLOP/s" % (p["blas"]["flops"] / p["blas"]["median"] / 1e9), "", "")
    for kind in ("plain", "ffn", "gate"):
        f = vibenet_flops(kind)
        floor = f / rate
        row("2. VibeNet %s: matmul FLOPs %.2f G, floor at that rate" % (kind, f / 1e9), "%.1f ms = %.2f× the floor"
            % (a["vibenet_" + kind]["median"] * 1e3, a["vibenet_" + kind]["median"] / floor),
            "%.2f× the floor" % (p["vibenet_" + kind]["median"] / floor), "floor %.1f ms" % (floor * 1e3), "≤ 1.5× floor")
    au = a["autopsy"]
    row("3. full autopsy from the training step (VibeNet plain), alternating with plain steps",
        "%s; +%.2f of a step (%.1f ms)" % (ms(au), (au["median"] - au["plain"]["median"]) / au["plain"]["median"], au["plain"]["median"] * 1e3),
        "(no counterpart)", "", "≤ 0.25 of a step")
    ia, ip = a["idle_probes"], p["idle_probes"]
    row("4. idle probes on all %d modules vs none (VibeNet plain, alternating steps)" % ia["probes"],
        "%+.1f%%" % (100 * (ia["median"] / ia["plain"]["median"] - 1)),
        "%+.1f%% (no-op forward hooks on %d modules)" % (100 * (ip["median"] / ip["plain"]["median"] - 1), ip["probes"]),
        "", "≤ 2%")
    row("5. 1-element add, per op", "%.2f µs (Lua; %.2f µs where it goes through at::add)" % (a["add"]["median"] * 1e6, a["add_aten"]["median"] * 1e6),
        "%.2f µs (Python)" % (p["add"]["median"] * 1e6),
        "%.2f× (C++ `at::add`: %.2f µs)" % (p["add"]["median"] / a["add"]["median"], cpp["median"] * 1e6), "≤ 0.6 µs and below PyTorch")
    ca = cold([exe, "--threads=1", "-e", "print(1)"])
    cp = cold([python, "-c", "import torch"])
    cf = cold([load_floor])
    row("6. cold start", "%.3f s (`anatomy -e 'print(1)'`)" % ca[0], "%.3f s (`python3 -c 'import torch'`)" % cp[0],
        "%.2f× (a C++ program that only loads LibTorch: %.3f s)" % (cp[0] / ca[0], cf[0]), "≤ 0.3 s and ≤ 1/3 of PyTorch's")
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    a0, p0 = ar[0], pr[0]
    head = ["%s, %s, %d cores (%s), %d threads for both; commit %s. anatomy: LibTorch %s (build `%s`), BLAS %s, "
            "ATen CPU kernels %s; PyTorch eager: torch %s, BLAS %s, kernels %s. "
            "%d rounds, each running anatomy then PyTorch; medians of the timed steps of all rounds "
            "after warm-up, with the range; per-op figures are the best round's. The ratio of the fastest "
            "steps is the one least disturbed by other work on a shared machine." % (
                datetime.date.today().isoformat(), platform.machine(), os.cpu_count(), cpu or "cpu", threads,
                sections.commit(), a0.get("libtorch", "?"), build, a0.get("blas", "?"), a0.get("cpu_capability", "?"),
                p0.get("torch", "?"), p0.get("blas", "?"), p0.get("cpu_capability", "?"), n_rounds), ""]
    text = "\n".join(head + rows) + "\n"
    with open(os.path.join(out, "RESULTS.md"), "w") as f:
        f.write(text)
    sections.write("training-" + build, "Training steps, probes, per-op cost and cold start: the %s build" % build,
                   head + rows, {"anatomy": ar, "pytorch": pr}, script="report.py (scripts/bench)")


if __name__ == "__main__":
    main()
