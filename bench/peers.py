"""anatomy against the tools a researcher would pick today, on GPT-2 small's
shapes (124M parameters, random weights saved by `save_pretrained`, float32),
B x T ids drawn once and read by every side, the same threads:

- forward (eval, no grad): anatomy against `transformers` and TransformerLens
  (TransformerBridge.boot_transformers on the same folder);
- the activation cache: `probe.run_with_cache` (every hook point; an
  attention's per-head result only on request) against TransformerLens's
  `run_with_cache` (hook_result likewise off), each as a multiple of its own
  forward, with the memory each holds; and with the residual stream only;
- the autopsy: the whole `autopsy.run` (gradient norms, ranks, attention
  statistics, logit lens, removal of every block) against TransformerLens's
  logit lens (ln_final and unembed on every block's resid_post) and removal of
  every block (a forward whose resid_post is the block's resid_pre), which is
  the part of the autopsy it has.

The sides run in their own processes and alternate for --rounds rounds;
medians. The header says which BLAS and ATen CPU kernels each side runs.
Writes the `peers` section of bench/RESULTS.md and bench/peers.json.
Usage: peers.py ANATOMY_EXECUTABLE [--rounds N] [--threads N] [--side tl FOLDER OUT]
Needs the PyPI build's venv with the test references (scripts/setup --tests).
"""
import argparse
import datetime
import importlib.metadata
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import transformers

import sections

B, T, REPEATS = 8, 256, 3
HERE = os.path.dirname(os.path.abspath(__file__))


def read_ids(folder):
    rows = [[int(v) for v in line.split()] for line in open(os.path.join(folder, "ids.txt"))]
    return torch.tensor(rows[:B]), torch.tensor(rows[B:])


def blas(config):
    """'mkl' / 'open' ... from torch.__config__.show()'s BLAS_INFO."""
    m = re.search(r"BLAS_INFO=(\w+)", config)
    return m.group(1) if m else "?"


def tl_side(folder, out, threads):
    """TransformerLens and transformers in this process; writes OUT.json."""
    from transformer_lens.model_bridge import TransformerBridge
    torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    x, y = read_ids(folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    eager = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    bridge = TransformerBridge.boot_transformers(folder, hf_model=eager, device="cpu")
    L = bridge.cfg.n_layers

    def timed(fn):
        s = time.perf_counter()
        r = fn()
        return time.perf_counter() - s, r

    def ce(logits):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()

    res = {"torch": torch.__version__, "transformers": transformers.__version__,
           "transformer_lens": importlib.metadata.version("transformer-lens"),
           "cpu_capability": torch.backends.cpu.get_cpu_capability(), "config": torch.__config__.show(),
           "transformers_forward": [], "tl_forward": [], "tl_cache": [], "tl_cache_resid": []}
    with torch.no_grad():
        hf(x), bridge(x), bridge.run_with_cache(x)  # warm-up
        for _ in range(REPEATS):
            res["transformers_forward"].append(timed(lambda: hf(x))[0])
            res["tl_forward"].append(timed(lambda: bridge(x))[0])
            t, (_, cache) = timed(lambda: bridge.run_with_cache(x))
            res["tl_cache"].append(t)
            storages = {v.untyped_storage().data_ptr(): v.untyped_storage().nbytes() for v in cache.values()}
            res["tl_cache_entries"], res["tl_cache_bytes"] = len(cache), sum(storages.values())
            del cache
            res["tl_cache_resid"].append(timed(lambda: bridge.run_with_cache(
                x, names_filter=lambda n: n.endswith("hook_resid_post")))[0])

        def lens_and_removals():
            _, cache = bridge.run_with_cache(x, names_filter=lambda n: n.endswith("hook_resid_post"))
            lens = [ce(bridge.unembed(bridge.ln_final(cache[f"blocks.{i}.hook_resid_post"]))) for i in range(L)]
            removal = []
            for i in range(L):
                saved = {}
                def keep(t, hook): saved["pre"] = t
                def skip(t, hook): return saved["pre"]
                removal.append(ce(bridge.run_with_hooks(
                    x, fwd_hooks=[(f"blocks.{i}.hook_resid_pre", keep), (f"blocks.{i}.hook_resid_post", skip)])))
            return lens, removal
        res["tl_lens_removal_seconds"], (res["tl_lens_loss"], res["tl_removal_loss"]) = timed(lens_and_removals)
    json.dump(res, open(out, "w"))


def run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{cmd[0]} failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("anatomy", nargs="?")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--side", nargs=3, metavar=("SIDE", "FOLDER", "OUT"))
    a = p.parse_args()
    if a.side:
        return tl_side(a.side[1], a.side[2], a.threads)
    ours, theirs = [], []
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        folder = os.path.join(tmp, "gpt2")
        torch.manual_seed(0)
        transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval().save_pretrained(folder)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, 50257, (2 * B, T), generator=g)
        with open(os.path.join(folder, "ids.txt"), "w") as f:
            for row in ids.tolist():
                f.write(" ".join(map(str, row)) + "\n")
        for r in range(a.rounds):  # the sides alternate
            print(f"peers: round {r + 1} of {a.rounds}", file=sys.stderr)
            out = os.path.join(tmp, "anatomy.json")
            run([a.anatomy, f"--threads={a.threads}", os.path.join(HERE, "peers.lua"), folder, out, str(B), str(T), str(REPEATS)])
            ours.append(json.load(open(out)))
            out = os.path.join(tmp, "tl.json")
            run([sys.executable, os.path.abspath(__file__), "--threads", str(a.threads), "--side", "tl", folder, out])
            theirs.append(json.load(open(out)))

    def med(side, key):
        return statistics.median(v for r in side for v in (r[key] if isinstance(r[key], list) else [r[key]]))

    o, t = ours[-1], theirs[-1]
    fw, tl_fw, hf_fw = med(ours, "forward"), med(theirs, "tl_forward"), med(theirs, "transformers_forward")
    cache, tl_cache = med(ours, "cache"), med(theirs, "tl_cache")
    resid, tl_resid = med(ours, "cache_resid"), med(theirs, "tl_cache_resid")
    aut, tl_aut = med(ours, "autopsy_seconds"), med(theirs, "tl_lens_removal_seconds")
    gap = max(max(abs(p - q) / abs(q) for p, q in zip(o["lens_loss"], t["tl_lens_loss"])),
              max(abs(p - q) / abs(q) for p, q in zip(o["removal_loss"], t["tl_removal_loss"])))

    def verdict(ok):
        return "met" if ok else "not met"
    lines = [
        f"Generated by `bench/peers.py` (`scripts/bench`) on {datetime.date.today().isoformat()}, commit {sections.commit()}; "
        f"{sections.machine()}, {a.threads} threads for every side. anatomy: LibTorch {o['libtorch']}, BLAS {blas(o['config'])}, "
        f"ATen CPU kernels {o['cpu_capability']}. Peers: torch {t['torch']}, BLAS {blas(t['config'])}, "
        f"kernels {t['cpu_capability']}; transformers {t['transformers']}, TransformerLens {t['transformer_lens']} "
        f"(`TransformerBridge.boot_transformers` on the same folder, eager attention). GPT-2 small's shapes "
        f"(124M parameters, random weights, seed 0, float32), {B} x {T} random ids (seed 0) read by every side; "
        f"{a.rounds} alternating rounds, {REPEATS} repeats each, medians. The logit lens and removal losses of "
        f"the two autopsies agree within {gap:.1e} (relative).",
        "",
        "| what | anatomy | peer | ratio (anatomy / peer) | target |",
        "|---|---|---|---|---|",
        f"| forward, eval, no grad | {fw:.3f} s | transformers {hf_fw:.3f} s; TransformerLens {tl_fw:.3f} s | "
        f"{hf_fw / fw:.2f}x transformers' speed | >= 1.0x: {verdict(fw <= hf_fw)} |",
        f"| run_with_cache, every hook point (per-head result off on both) | {cache:.3f} s = {cache / fw:.2f}x its forward; "
        f"{o['cache_entries']} tensors, {o['cache_bytes'] / 2**30:.2f} GiB | {tl_cache:.3f} s = {tl_cache / tl_fw:.2f}x its forward; "
        f"{t['tl_cache_entries']} names, {t['tl_cache_bytes'] / 2**30:.2f} GiB of distinct storage | {cache / tl_cache:.2f} | "
        f"<= 1.3x forward: {verdict(cache / fw <= 1.3)} |",
        f"| run_with_cache, resid_post of every block | {resid:.3f} s = {resid / fw:.2f}x | {tl_resid:.3f} s = {tl_resid / tl_fw:.2f}x | "
        f"{resid / tl_resid:.2f} | close to a forward |",
        f"| autopsy.run (everything) against TransformerLens's logit lens + removal of each of the 12 blocks | "
        f"{aut:.1f} s | {tl_aut:.1f} s | {aut / tl_aut:.2f} | <= 0.75: {verdict(aut / tl_aut <= 0.75)} |",
    ]
    sections.write("peers", "Against transformers and TransformerLens (GPT-2 small shapes)", lines,
                   {"anatomy": [{k: v for k, v in r.items() if k != "config"} for r in ours],
                    "peers": [{k: v for k, v in r.items() if k != "config"} for r in theirs]})


if __name__ == "__main__":
    main()
