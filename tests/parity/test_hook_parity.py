"""Hook parity: anatomy's hook points inside blocks (probe.run_with_cache)
against the same activations captured in PyTorch the way TransformerLens
does it, with identity HookPoint modules and forward hooks, in a GPT written
here as torch.nn modules, on the same weights and ids: every block's
resid_pre, resid_mid, resid_post; attention q, k, v, scores, pattern, z,
result; MLP pre and post; each LayerNorm's scale and normalized; every
module output. Then interventions on both sides: head 2's z zeroed in layer
1 (the logits), and the residual stream of layer 2 patched at position 3
from another batch (the logits).

Tolerance (float32): |anatomy - pytorch| <= 1e-5 + 1e-4 * |pytorch| elementwise
(masked scores: -inf on both sides, compared as equal).
Usage: test_hook_parity.py ANATOMY_EXECUTABLE
"""
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as tnn
import torch.nn.functional as F

import safetensors_io

V, C, T, B, H, L, FFN = 17, 16, 8, 2, 4, 2, 32


class HookPoint(tnn.Module):
    """An identity a forward hook can read or replace (TransformerLens's HookPoint)."""

    def forward(self, x):
        return x


class LayerNorm(tnn.Module):
    def __init__(self):
        super().__init__()
        self.weight, self.bias = tnn.Parameter(torch.ones(C)), tnn.Parameter(torch.zeros(C))
        self.scale, self.normalized = HookPoint(), HookPoint()

    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)
        scale = self.scale((x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt())
        return self.normalized(x / scale) * self.weight + self.bias


class Linear(tnn.Module):  # anatomy's parameter names: weight [out, in], bias
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight, self.bias = tnn.Parameter(torch.zeros(n_out, n_in)), tnn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class Attention(tnn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.proj = Linear(C, 3 * C), Linear(C, C)
        for n in ("q", "k", "v", "scores", "pattern", "z", "result"):
            setattr(self, "hook_" + n, HookPoint())

    def forward(self, x):
        b, t, _ = x.shape
        d = C // H
        q, k, v = (z.reshape(b, t, H, d) for z in self.qkv(x).split(C, -1))
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        pattern = self.hook_pattern(self.hook_scores(scores).softmax(-1))
        z = self.hook_z(torch.einsum("bhqk,bkhd->bqhd", pattern, v))
        result = self.hook_result(torch.einsum("bqhd,chd->bqhc", z, self.proj.weight.view(C, H, d)))
        return result.sum(2) + self.proj.bias


class MLP(tnn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.proj = Linear(C, FFN), Linear(FFN, C)
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()

    def forward(self, x):
        return self.proj(self.hook_post(F.gelu(self.hook_pre(self.fc(x)))))


class Block(tnn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.ln1, self.mlp, self.ln2 = Attention(), LayerNorm(), MLP(), LayerNorm()
        self.hook_resid_pre, self.hook_resid_mid, self.hook_resid_post = HookPoint(), HookPoint(), HookPoint()

    def forward(self, x):
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(x + self.attn(self.ln1(x)))
        return self.hook_resid_post(x + self.mlp(self.ln2(x)))


class GPT(tnn.Module):
    def __init__(self):
        super().__init__()
        self.embed_weight, self.embed_pos = tnn.Parameter(torch.zeros(V, C)), tnn.Parameter(torch.zeros(T, C))
        self.blocks = tnn.ModuleList([Block() for _ in range(L)])
        self.ln_f, self.head = LayerNorm(), Linear(C, V)

    def forward(self, ids):
        x = self.embed_weight[ids] + self.embed_pos[: ids.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def anatomy_name(torch_name):
    """blocks.0.attn.hook_q -> blocks.1.attn.q; blocks.0.attn -> blocks.1.attn."""
    parts = torch_name.split(".")
    if len(parts) > 1 and parts[0] == "blocks":
        parts[1] = str(int(parts[1]) + 1)
    if parts[-1].startswith("hook_"):
        parts[-1] = parts[-1][5:]
    return ".".join(parts)


def state_dict(model):
    out = {}
    for n, p in model.named_parameters():
        n = anatomy_name(n).replace("embed_weight", "embed.weight").replace("embed_pos", "embed.pos_weight")
        out[n] = p.detach().clone()
    return out


def capture(model, ids):
    """Every hook point and every submodule's output, by anatomy's names."""
    cache, handles = {}, []
    for name, mod in model.named_modules():
        if name == "" or isinstance(mod, tnn.ModuleList) or (isinstance(mod, Linear) and name != "head"):
            continue  # anatomy's attention and MLP hold their projections as parameters, not modules
        def hook(m, inp, out, name=name):
            cache[anatomy_name(name)] = out.detach().clone()
        handles.append(mod.register_forward_hook(hook))
    with torch.no_grad():
        logits = model(ids)
    for h in handles:
        h.remove()
    return logits, cache


def close(got, want):
    got, want = got.double(), want.double()
    if list(got.shape) != list(want.shape):
        return False, "shape %s, expected %s" % (list(got.shape), list(want.shape))
    inf = torch.isinf(want)
    if not torch.equal(torch.isinf(got), inf):
        return False, "-inf in other places"
    got, want = got.masked_fill(inf, 0), want.masked_fill(inf, 0)
    diff = (got - want).abs()
    return bool((diff <= 1e-5 + 1e-4 * want.abs()).all()), "maxdiff %.3g" % diff.max().item()


def residual_rows(model, ids):
    """The residual stream before the first block and after each block, and the logits."""
    h = []
    handles = [model.blocks[0].hook_resid_pre.register_forward_hook(lambda m, i, o: h.append(o))]
    for blk in model.blocks:
        handles.append(blk.hook_resid_post.register_forward_hook(lambda m, i, o: h.append(o)))
    with torch.no_grad():
        logits = model(ids)
    for hd in handles:
        hd.remove()
    return h, logits


def random_gpt(seed):
    """The GPT with every weight drawn at seed: norms' gains about 1, the rest N(0, 0.3^2)."""
    torch.manual_seed(seed)
    model = GPT()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_((1.0 if n.endswith(("ln1.weight", "ln2.weight", "ln_f.weight")) else 0.0) + 0.3 * torch.randn(p.shape))
    return model


def main():
    exe = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    model = random_gpt(0)
    ids, other = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    logits, want = capture(model, ids)
    _, want_other = capture(model, other)
    # interventions: head 2 of layer 1's z zeroed; layer 2's resid_pre at position 3 from the other batch
    def zero_head(m, inp, out):
        out = out.clone()
        out[:, :, 1] = 0
        return out
    h = model.blocks[0].attn.hook_z.register_forward_hook(zero_head)
    with torch.no_grad():
        ablated = model(ids)
    h.remove()
    def patch(m, inp, out):
        out = out.clone()
        out[:, 2] = want_other["blocks.2.resid_pre"][:, 2]
        return out
    h = model.blocks[1].hook_resid_pre.register_forward_hook(patch)
    with torch.no_grad():
        patched = model(ids)
    h.remove()

    failed, passed = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
        tensors = state_dict(model)
        tensors["input.ids"], tensors["input.other"] = ids + 1, other + 1
        safetensors_io.save(inp, tensors)
        proc = subprocess.run([exe, "--threads=1", os.path.join(here, "hook_parity.lua"), inp, out], capture_output=True, text=True)
        if proc.returncode != 0:
            print("FAIL  anatomy failed\n%s%s" % (proc.stdout, proc.stderr))
            return 1
        got, _ = safetensors_io.load(out)
    checks = [("logits", logits), ("ablated logits (layer 1 head 2 z = 0)", ablated),
              ("patched logits (layer 2 resid_pre, position 3)", patched)]
    checks += [("cache " + n, t) for n, t in sorted(want.items())]
    worst = 0.0
    for name, w in checks:
        key = name.split(" ")[0] if not name.startswith("cache ") else name
        key = {"ablated": "ablated", "patched": "patched"}.get(key, key)
        if key not in got:
            failed.append("%s: missing from anatomy's output" % name)
            continue
        ok, detail = close(got[key], w)
        worst = max(worst, float(detail.split()[-1])) if detail.startswith("maxdiff") else worst
        if ok:
            passed += 1
        else:
            failed.append("%s: %s" % (name, detail))
    for f in failed:
        print("FAIL  " + f)
    print("%s  %d of %d checks: every hook point and module output (%d names), and two interventions; maxdiff %.3g"
          % ("ok  " if not failed else "FAIL", passed, len(checks), len(want), worst))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
