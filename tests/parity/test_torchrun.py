#!/usr/bin/env python3
"""anatomy runs under PyTorch's own launcher unchanged.

torchrun (torch.distributed.run) starts 2 ranks of `anatomy tests/dist/fit.lua`
with its agent hosting the store; the run must be the one `anatomy --nproc 2`
gives: the same losses and final parameters, bit for bit (same ranks, same
rows, same order of sums).

Needs PyTorch >= 2 for python (Debian's torchrun 1.13 fails on Python 3.11
before starting a worker); exits 77 without.
    test_torchrun.py ANATOMY_EXE
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
    from safetensors.torch import load_file
except ImportError as e:
    print("skipped: %s" % e)
    sys.exit(77)
if int(torch.__version__.split(".")[0]) < 2:
    print("skipped: torchrun of PyTorch %s fails on Python %d.%d before it starts a worker"
          % (torch.__version__, sys.version_info[0], sys.version_info[1]))
    sys.exit(77)

exe = os.path.abspath(sys.argv[1])
fit = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dist", "fit.lua")
env = dict(os.environ, ANATOMY_THREADS="1")
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    print(("ok    " if ok else "FAIL  ") + name + ("" if ok else ": " + detail))
    passed, failed = passed + ok, failed + (not ok)


def losses(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(line)["loss"] for line in f]


with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
    ours = subprocess.run([exe, "--nproc", "2", fit, "--out=" + a, "--batch=16"], env=env,
                          capture_output=True, text=True, timeout=240)
    theirs = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--no-python",
                             "--standalone", exe, fit, "--out=" + b, "--batch=16"], env=env,
                            capture_output=True, text=True, timeout=240)
    check("anatomy --nproc 2 trains", ours.returncode == 0, ours.stdout + ours.stderr)
    check("torchrun --nproc-per-node=2 --no-python anatomy trains", theirs.returncode == 0,
          theirs.stdout[-2000:] + theirs.stderr[-4000:])
    if ours.returncode == 0 and theirs.returncode == 0:
        check("rank 0 reports a world of 2 under torchrun", "world 2" in theirs.stdout, theirs.stdout)
        la, lb = losses(a), losses(b)
        check("50 losses, equal bit for bit", len(la) == 50 and la == lb, "%s vs %s" % (la[:3], lb[:3]))
        for rank in (0, 1):
            pa = load_file(os.path.join(a, "params.%d.safetensors" % rank))
            pb = load_file(os.path.join(b, "params.%d.safetensors" % rank))
            same = sorted(pa) == sorted(pb) and all(torch.equal(pa[k], pb[k]) for k in pa)
            check("rank %d's final parameters equal" % rank, same)

print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
