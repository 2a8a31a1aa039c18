"""Model parity: the same weights (written here, to safetensors) and the same
batch give the same logits, loss and per-parameter gradients in anatomy
(models.vibenet plain/ffn/gate, models.gpt with and without residuals,
pre-norm) as in an independent PyTorch implementation written below.

Tolerance (float32): |anatomy - pytorch| <= 1e-5 + 1e-4 * |pytorch| elementwise.
Usage: test_model_parity.py ANATOMY_EXECUTABLE
"""
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

import safetensors_io

V, C, T, B = 17, 16, 8, 2


def causal_softmax(scores):
    t = scores.shape[-1]
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    return scores.masked_fill(mask, float("-inf")).softmax(-1)


def rmsnorm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def vibenet(P, ids, kind, layers=3):
    x = P["embed.weight"][ids] + P["embed.pos_weight"][: ids.shape[1]]
    for i in range(1, layers + 1):
        inner = "blocks.%d.inner." % i
        h = rmsnorm(x, P[inner + "norm.weight"])
        y = causal_softmax(h @ h.transpose(1, 2) / math.sqrt(C)) @ h
        if kind in ("ffn", "gate"):
            y = F.gelu(F.linear(y, P[inner + "ffn.weight"], P[inner + "ffn.bias"]))
        if kind == "gate":
            g = "blocks.%d.gate." % i
            x = F.linear(x, P[g + "weight"], P[g + "bias"]) + y
        else:
            x = x + y
    x = F.gelu(F.linear(x, P["expand.weight"], P["expand.bias"]))
    return F.linear(x, P["head.weight"], P["head.bias"])


def attention(P, p, x, heads):
    b, t, c = x.shape
    q, k, v = F.linear(x, P[p + "qkv.weight"], P[p + "qkv.bias"]).split(c, -1)
    split = lambda z: z.view(b, t, heads, c // heads).transpose(1, 2)
    q, k, v = split(q), split(k), split(v)
    att = causal_softmax(q @ k.transpose(-2, -1) / math.sqrt(c // heads))
    y = (att @ v).transpose(1, 2).reshape(b, t, c)
    return F.linear(y, P[p + "proj.weight"], P[p + "proj.bias"])


def gpt(P, ids, residual=True, pre=False, act=F.relu, layers=2, heads=2):
    x = P["embed.weight"][ids] + P["embed.pos_weight"][: ids.shape[1]]
    for i in range(1, layers + 1):
        p = "blocks.%d." % i
        ln1 = lambda z: F.layer_norm(z, (C,), P[p + "ln1.weight"], P[p + "ln1.bias"], 1e-5)
        ln2 = lambda z: F.layer_norm(z, (C,), P[p + "ln2.weight"], P[p + "ln2.bias"], 1e-5)
        attn = lambda z: attention(P, p + "attn.", z, heads)
        mlp = lambda z: F.linear(act(F.linear(z, P[p + "mlp.fc.weight"], P[p + "mlp.fc.bias"])),
                                 P[p + "mlp.proj.weight"], P[p + "mlp.proj.bias"])
        if pre:
            x = x + attn(ln1(x))
            x = x + mlp(ln2(x))
        elif residual:
            x = ln1(x + attn(x))
            x = ln2(x + mlp(x))
        else:
            x = ln2(mlp(ln1(attn(x))))
    if pre:
        x = F.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], 1e-5)
    return F.linear(x, P["head.weight"], P["head.bias"])


def vibenet_shapes(kind, layers=3):
    s = {"embed.weight": (V, C), "embed.pos_weight": (T, C), "expand.weight": (3 * C, C), "expand.bias": (3 * C,),
         "head.weight": (V, 3 * C), "head.bias": (V,)}
    for i in range(1, layers + 1):
        s["blocks.%d.inner.norm.weight" % i] = (C,)
        if kind in ("ffn", "gate"):
            s["blocks.%d.inner.ffn.weight" % i] = (C, C)
            s["blocks.%d.inner.ffn.bias" % i] = (C,)
        if kind == "gate":
            s["blocks.%d.gate.weight" % i] = (C, C)
            s["blocks.%d.gate.bias" % i] = (C,)
    return s


def gpt_shapes(pre=False, layers=2, ffn=32):
    s = {"embed.weight": (V, C), "embed.pos_weight": (T, C), "head.weight": (V, C), "head.bias": (V,)}
    for i in range(1, layers + 1):
        p = "blocks.%d." % i
        s.update({p + "attn.qkv.weight": (3 * C, C), p + "attn.qkv.bias": (3 * C,), p + "attn.proj.weight": (C, C),
                  p + "attn.proj.bias": (C,), p + "ln1.weight": (C,), p + "ln1.bias": (C,), p + "ln2.weight": (C,),
                  p + "ln2.bias": (C,), p + "mlp.fc.weight": (ffn, C), p + "mlp.fc.bias": (ffn,),
                  p + "mlp.proj.weight": (C, ffn), p + "mlp.proj.bias": (C,)})
    if pre:
        s["ln_f.weight"] = (C,)
        s["ln_f.bias"] = (C,)
    return s


def random_params(shapes):
    """Parameters of the given shapes, requiring grad: 0.3 * N(0, 1), plus 1
    for the norms' gains (names ending in norm.weight, ln1.weight, ln2.weight, ln_f.weight)."""
    P = {}
    for name, shape in shapes.items():
        base = torch.ones(shape) if name.endswith(("norm.weight", "ln1.weight", "ln2.weight", "ln_f.weight")) else 0
        P[name] = (base + 0.3 * torch.randn(shape)).requires_grad_()
    return P


def save_inputs(path, P, ids, targets):
    """Writes the parameters P and a batch for a parity script: ids and
    targets as input.ids and input.targets, 1-based as anatomy reads them."""
    tensors = dict(P)
    tensors["input.ids"], tensors["input.targets"] = ids + 1, targets + 1
    safetensors_io.save(path, tensors)


CASES = {
    "vibenet_plain": (vibenet_shapes("plain"), lambda P, ids: vibenet(P, ids, "plain")),
    "vibenet_ffn": (vibenet_shapes("ffn"), lambda P, ids: vibenet(P, ids, "ffn")),
    "vibenet_gate": (vibenet_shapes("gate"), lambda P, ids: vibenet(P, ids, "gate")),
    "gpt": (gpt_shapes(), lambda P, ids: gpt(P, ids)),
    "gpt_no_residual": (gpt_shapes(), lambda P, ids: gpt(P, ids, residual=False)),
    "gpt_pre": (gpt_shapes(pre=True), lambda P, ids: gpt(P, ids, pre=True, act=F.gelu)),
}


def compare(name, got, want):
    got, want = got.double(), want.detach().double()
    if list(got.shape) != list(want.shape):
        return False, "shape %s, expected %s" % (list(got.shape), list(want.shape))
    diff = (got - want).abs()
    ok = bool((diff <= 1e-5 + 1e-4 * want.abs()).all())
    return ok, "maxdiff %.3g" % (diff.max().item() if diff.numel() else 0.0)


def main():
    exe = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    torch.manual_seed(0)
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case, (shapes, forward) in CASES.items():
            P = random_params(shapes)
            ids = torch.randint(0, V, (B, T))
            targets = torch.randint(0, V, (B, T))
            inp, out = os.path.join(tmp, case + ".in"), os.path.join(tmp, case + ".out")
            save_inputs(inp, P, ids, targets)
            logits = forward(P, ids)
            loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
            loss.backward()
            proc = subprocess.run([exe, "--threads=1", os.path.join(here, "model_parity.lua"), case, inp, out],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                print("FAIL  %s: anatomy failed\n%s%s" % (case, proc.stdout, proc.stderr))
                failed += 1
                continue
            got, _ = safetensors_io.load(out)
            checks = [("logits", logits), ("loss", loss)] + [("grad." + n, p.grad) for n, p in P.items()]
            worst, bad = 0.0, []
            for name, want in checks:
                if name not in got:
                    bad.append("%s missing" % name)
                    continue
                ok, detail = compare(name, got[name], want)
                worst = max(worst, float(detail.split()[-1]) if detail.startswith("maxdiff") else float("inf"))
                if not ok:
                    bad.append("%s %s" % (name, detail))
            if bad:
                failed += 1
                print("FAIL  %-16s %s" % (case, "; ".join(bad)))
            else:
                passed += 1
                print("ok    %-16s logits, loss and %d gradients; maxdiff %.3g (loss %.6f)" % (case, len(P), worst, loss.item()))
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
