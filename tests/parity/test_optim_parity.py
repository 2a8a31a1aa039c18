"""SGD and Adam parity: torch.optim.SGD (momentum 0.9 with weight decay 0.01;
Nesterov) and torch.optim.Adam (betas (0.8, 0.99), weight decay 0.1), each
driven by the cosine schedule with 2 warmup steps that train.fit uses (peak
lr, linear warmup, cosine to lr/10 over 5 steps), five steps on the same
tensors in anatomy and PyTorch: the same losses and final parameters.

Tolerance (float32): |anatomy - pytorch| <= 1e-5 + 1e-4 * |pytorch|.
Usage: test_optim_parity.py ANATOMY_EXECUTABLE
"""
import math
import os
import sys
import tempfile

import torch

import safetensors_io


def lr_at(step, peak, steps=5, warmup=2):
    if step <= warmup:
        return peak * step / warmup
    progress = (step - warmup) / max(steps - warmup, 1)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1))))


def main():
    exe = sys.argv[1]
    torch.manual_seed(5)
    X, Y = torch.randn(8, 4), torch.randn(8, 3) * 0.5
    W0, b0 = torch.randn(4, 3) * 0.5, torch.randn(3) * 0.1
    settings = {
        "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
        "nesterov": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
        "adam": lambda ps: torch.optim.Adam(ps, lr=0.05, betas=(0.8, 0.99), weight_decay=0.1),
    }
    want = {}
    for name, make in settings.items():
        W, b = W0.clone().requires_grad_(), b0.clone().requires_grad_()
        opt = make([W, b])
        peak = opt.param_groups[0]["lr"]
        for step in range(1, 6):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, peak)
            opt.zero_grad()
            loss = ((X @ W + b).tanh() - Y).pow(2).mean()
            loss.backward()
            opt.step()
            want["%s.loss.%d" % (name, step)] = loss.detach()
        want[name + ".W"], want[name + ".b"] = W.detach(), b.detach()
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in"), os.path.join(tmp, "out")
        safetensors_io.save(inp, {"X": X, "Y": Y, "W": W0, "b": b0})
        if not safetensors_io.run_lua(exe, "optim_parity.lua", inp, out):
            return 1
        got, _ = safetensors_io.load(out)
    passed = failed = 0
    worst = 0.0
    for name, w in want.items():
        g = got[name].double()
        w = w.double()
        diff = (g - w).abs()
        worst = max(worst, diff.max().item())
        if list(g.shape) == list(w.shape) and bool((diff <= 1e-5 + 1e-4 * w.abs()).all()):
            passed += 1
        else:
            failed += 1
            print("FAIL  %s maxdiff %.3g" % (name, diff.max().item()))
    print("largest difference over %d losses and parameters: %.3g" % (len(want), worst))
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
