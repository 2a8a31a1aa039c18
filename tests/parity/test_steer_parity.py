"""Steering vectors: steer.vector's mean-difference and principal-direction
vectors against the same computation in PyTorch (float64) on the very
activations anatomy cached, example by example (ten examples of different
lengths, three layers, each position reduction).
  mean: mean over the positive examples minus mean over the negative ones
  pca:  the first right singular vector of the centred paired differences,
        signed along their mean, scaled to the mean's length along it
Tolerance: |anatomy - pytorch| <= 1e-5 elementwise (the vectors are float32).
Usage: test_steer_parity.py ANATOMY_EXECUTABLE
"""
import os
import subprocess
import sys
import tempfile

import torch

import safetensors_io


def reduce(t, how):
    return t.mean(0) if how == "mean" else t[-1]


def main():
    exe = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "steer.safetensors")
        p = subprocess.run([exe, "--threads=1", os.path.join(here, "steer_parity.lua"), out], capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stdout + p.stderr)
            print("0 passed, 1 failed")
            return 1
        got, _ = safetensors_io.load(out)
    layers = sorted({k.split(".", 2)[2] for k in got if k.startswith("pos.")})
    n = len({k.split(".")[1] for k in got if k.startswith("pos.")})
    failed, passed, worst = [], 0, 0.0
    for method in ("mean", "pca"):
        for how in ("mean", "last"):
            for layer in layers:
                pos = torch.stack([reduce(got[f"pos.{i}.{layer}"].double(), how) for i in range(1, n + 1)])
                neg = torch.stack([reduce(got[f"neg.{i}.{layer}"].double(), how) for i in range(1, n + 1)])
                if method == "mean":
                    want = pos.mean(0) - neg.mean(0)
                else:
                    d = pos - neg
                    mean = d.mean(0)
                    direction = torch.linalg.svd(d - mean, full_matrices=False).Vh[0]
                    along = float(mean @ direction)
                    if along < 0:
                        direction, along = -direction, -along
                    want = direction * along
                v = got[f"{method}.{how}.{layer}"].double()
                diff = (v - want).abs().max().item()
                worst = max(worst, diff)
                if diff <= 1e-5:
                    passed += 1
                else:
                    failed.append(f"{method}/{how}/{layer}: largest difference {diff:.3g}")
    for f in failed:
        print("FAIL", f)
    print(f"steer.vector against PyTorch on the cached activations: {passed} of {passed + len(failed)} vectors within 1e-5, "
          f"largest difference {worst:.3g}")
    print(f"{passed} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
