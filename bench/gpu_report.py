"""Merges the GPU benchmark's rounds (OUT/anatomy.N.json from bench/gpu.lua,
OUT/pytorch-MODE.N.json from bench/gpu.py) and prints the side-by-side table;
on a GPU, with a full-size run, it also writes the `gpu` section of
bench/RESULTS.md (and bench/gpu.json) with the GPU, its driver, the commit and
the machine. A smoke run, or one on the CPU, prints and writes nothing else:
its numbers mean nothing.

    PYTHON bench/gpu_report.py OUT_DIR [--data-note TEXT]
"""
import argparse
import glob
import json
import os
import statistics
import subprocess

import sections

MODES = ["eager", "compile", "reduce-overhead"]
# dense bfloat16 tensor-core peaks (FLOP/s) from the vendors' data sheets, by
# the device name torch reports; MFU is left out for a GPU not listed
PEAKS = [("H100 PCIe", 756e12), ("H100", 989.4e12), ("H200", 989.4e12), ("GH200", 989.4e12),
         ("A100", 312e12), ("L40S", 362e12), ("L4", 121e12), ("A10", 125e12)]


def load_rounds(out, pattern):
    return [json.load(open(f)) for f in sorted(glob.glob(os.path.join(out, pattern)))]


FAILED = {}  # "anatomy seed_L2.graph" -> why that case has no time (a capture that failed)


def merge(runs, side="anatomy"):
    """One entry per case: every round's window times pooled, their median and range.
    A case that failed in a round (no times, an error) is left out and noted in FAILED."""
    cases = {}
    for r in runs:
        for name, c in r["cases"].items():
            if "times" not in c:
                FAILED["%s %s" % (side, name)] = c.get("error", "no times")
                continue
            m = cases.setdefault(name, dict(c, times=[]))
            m["times"] = m["times"] + c["times"]
            if isinstance(c.get("plain"), dict):
                m.setdefault("plain_times", [])
                m["plain_times"] = m["plain_times"] + c["plain"]["times"]
    for m in cases.values():
        m["median"], m["min"], m["max"] = statistics.median(m["times"]), min(m["times"]), max(m["times"])
        if "plain_times" in m:
            m["plain_median"] = statistics.median(m["plain_times"])
    return cases


def train_flops(c):
    """Model FLOPs of one training step (3x the forward's matmuls; attention's
    T x T products counted in full, not halved for the causal mask)."""
    cfg, tokens = c["config"], c["tokens"]
    V, C, L, T = cfg["vocab"], cfg["dim"], cfg["layers"], cfg["seq"]
    if cfg.get("block"):  # VibeNet: [ffn or gate+ffn per layer], expand C -> 3C, head 3C -> V
        per_layer = {"plain": 0, "ffn": 1, "gate": 2}.get(cfg["block"], 0) * C * C
        matmul = L * per_layer + C * 3 * C + 3 * C * V
        attn = L * 2 * T * C  # x x^T and A x
    else:  # GPT: qkv + proj, two ffn matmuls, head
        matmul = L * (4 * C * C + 2 * C * cfg["ffn"]) + C * V
        attn = L * 2 * T * C
    return 3 * 2 * tokens * (matmul + attn)


def nvidia_driver():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
        return out[0] if out else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--data-note", default="", help="where the seed-scale vocabulary came from (its data, hash, settings)")
    args = ap.parse_args()
    ours = load_rounds(args.out, "anatomy.*.json")
    if not ours:
        raise SystemExit("gpu_report.py: no anatomy.N.json in " + args.out)
    theirs = {m: load_rounds(args.out, "pytorch-%s.*.json" % m) for m in MODES}
    a = merge(ours)
    p = {m: merge(r, "PyTorch " + m) for m, r in theirs.items() if r}
    py = next((r[0] for r in theirs.values() if r), {})
    gpu = py.get("device", "?")
    smoke = ours[0].get("smoke") or not ours[0]["device"].startswith("cuda")
    peak = next((v for k, v in PEAKS if k in gpu), None)

    def ms(c):
        return "%.2f ms" % (c["median"] * 1e3) if c else "—"

    def tok_s(c):
        return "%.0fk" % (c["tokens"] / c["median"] / 1e3) if c else "—"

    def mib(c):
        return "%.0f" % (c["peak_bytes"] / 2**20) if c and c.get("peak_bytes") else "—"

    lines = []
    if smoke:
        lines += ["**Smoke run (%s, toy sizes): these numbers mean nothing and are not written to bench/RESULTS.md.**" %
                  ours[0]["device"], ""]
    lines += ["| case | dtype | tokens/step | anatomy eager | anatomy CUDA graph | PyTorch eager | torch.compile | "
              "reduce-overhead | anatomy best / PyTorch best (time; below 1: anatomy faster) | peak MiB anatomy / PyTorch eager |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    names = [n for n in ["gpt", "vibenet_plain", "vibenet_gate", "seed_L2", "seed_L12"] if n + ".eager" in a]
    data = {"cases": {}, "gpu": gpu}
    for n in names:
        ae, ag = a.get(n + ".eager"), a.get(n + ".graph")
        pm = {m: p.get(m, {}).get(n + "." + m) for m in MODES}
        best_a = min((c["median"] for c in (ae, ag) if c), default=None)
        best_p = min((c["median"] for c in pm.values() if c), default=None)
        ratio = "%.2f" % (best_a / best_p) if best_a and best_p else "—"
        lines.append("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s / %s |" % (
            n, ae["dtype"], ae["tokens"], ms(ae), ms(ag), ms(pm["eager"]), ms(pm["compile"]), ms(pm["reduce-overhead"]),
            ratio, mib(ae), mib(pm["eager"])))
        data["cases"][n] = {"anatomy": {"eager": ae, "graph": ag}, "pytorch": pm, "flops": train_flops(ae)}
    lines += ["", "Tokens per second (thousands) and model-FLOP utilisation of the bf16 seed-scale models "
              "(MFU: model FLOPs per step, 3x the forward's matmuls with attention's T x T products in full, over the "
              "step time and the GPU's dense bf16 peak%s):" % (", %.0f TFLOP/s for %s" % (peak / 1e12, gpu) if peak else
                                                               ", not listed for this GPU: no MFU"), "",
              "| case | anatomy eager | anatomy CUDA graph | PyTorch eager | torch.compile | reduce-overhead |",
              "|---|---|---|---|---|---|"]
    for n in names:
        ae = a[n + ".eager"]
        row = [a.get(n + ".eager"), a.get(n + ".graph")] + [p.get(m, {}).get(n + "." + m) for m in MODES]
        flops = train_flops(ae)

        def cell(c):
            if not c:
                return "—"
            mfu = " (%.0f%% MFU)" % (100 * flops / c["median"] / peak) if peak and ae["dtype"] == "bfloat16" else ""
            return tok_s(c) + mfu
        lines.append("| %s | %s |" % (n, " | ".join(cell(c) for c in row)))
    # what one step asks of LibTorch: operators dispatched and host synchronisations
    on_device = not ours[0]["device"].startswith("cpu")
    lines += ["", "One training step, counted: the operators dispatched (\"aten::\" events, nested ones included: anatomy's "
              "torch.profiler.count_ops, PyTorch's torch.profiler) and the host synchronisations among them (anatomy: reads "
              "of a device tensor to the host, blocking copies from it, operators sized by a device tensor's values; PyTorch: what "
              "torch.cuda.set_sync_debug_mode flags)%s:" % ("" if on_device else "; on the CPU there is no device to wait for"),
              "", "| step | anatomy ops | PyTorch eager ops | anatomy / PyTorch | anatomy syncs | PyTorch eager syncs | "
              "anatomy: time to queue the step / the step (after a sync) |",
              "|---|---|---|---|---|---|---|"]

    def count_cells(ours_count, theirs_count):
        def n(c, k):
            return "—" if not c or c.get(k) is None or (k == "syncs" and not on_device) else "%d" % c[k]
        ratio = "%.2f" % (ours_count["ops"] / theirs_count["ops"]) if ours_count and theirs_count and theirs_count["ops"] else "—"
        return "%s | %s | %s | %s | %s" % (n(ours_count, "ops"), n(theirs_count, "ops"), ratio, n(ours_count, "syncs"),
                                          n(theirs_count, "syncs"))
    def enqueue_cell(c):
        e = c.get("enqueue")
        return "%.2f / %.2f ms" % (e["queued"] * 1e3, e["whole"] * 1e3) if e else "—"
    for n in names:
        theirs_eager = p.get("eager", {}).get(n + ".eager") or {}
        lines.append("| %s | %s | %s |" % (n, count_cells(a[n + ".eager"].get("count"), theirs_eager.get("count")),
                                          enqueue_cell(a[n + ".eager"])))
        data["cases"][n]["count"] = {"anatomy": a[n + ".eager"].get("count"), "pytorch": theirs_eager.get("count")}
    if a.get("autopsy", {}).get("count"):
        of = a["autopsy"].get("of", "?")
        lines.append("| %s with the autopsy's probes | %s | — |" % (of, count_cells(a["autopsy"]["count"], None)))
    for key, what in [("autopsy", "the autopsy's measurements taken from the step's own forward and backward"),
                      ("idle_probes", "a probe that does nothing on every module")]:
        c = a.get(key)
        if c and c.get("plain_median"):
            lines.append("")
            lines.append("%s (%s): %.2f ms against %.2f ms for the plain step: %.3f of a step%s." % (
                key, what + (", %d probes" % c["probes"] if c.get("probes") else ""), c["median"] * 1e3,
                c["plain_median"] * 1e3, c["median"] / c["plain_median"] - 1, ", on " + c.get("of", "?")))
            data[key] = c
    for key, why in sorted(FAILED.items()):
        lines += ["", "%s: no time (%s)." % (key, why.splitlines()[0] if why else "?")]
    for n in names:
        for mode in ("eager", "graph"):
            c = a.get(n + "." + mode)
            if c and c.get("peak_error"):
                lines += ["", "%s.%s: no peak memory (%s)." % (n, mode, c["peak_error"].splitlines()[0])]
    # rounds: how many runs timed each case (scripts/gpu-run runs the cases in
    # separate files, one round each)
    rounds = max((sum(1 for r in ours if name in r["cases"]) for name in a), default=len(ours))
    lines += ["", "%d round%s of %d windows of %d steps per case, the windows' median; anatomy %s (LibTorch %s, CUDA %s), "
              "PyTorch %s; %s, driver %s; commit %s; %s%s." % (
                  rounds, "" if rounds == 1 else "s", ours[0]["windows"], ours[0]["steps"], ours[0]["device"],
                  ours[0]["libtorch"], ours[0].get("cuda"), py.get("torch", "?"), gpu, nvidia_driver(), sections.commit(),
                  sections.machine(), ("; " + args.data_note) if args.data_note else "")]
    if smoke:
        print("\n".join(lines))
        return
    sections.write("gpu", "On the GPU: anatomy against PyTorch eager, torch.compile and CUDA graphs", lines, data,
                   script="gpu_report.py (scripts/bench-gpu)")


if __name__ == "__main__":
    main()
