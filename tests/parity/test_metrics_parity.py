"""Autopsy metric parity: autopsy.run on models.gpt (pre-norm) gives the same
per-parameter gradient norms, per-layer effective rank, attention entropy and
diagonal mass, activation std, residual ratio, block influence, logit-lens
loss and agreement, removal losses, and weight effective ranks as independent
computations here in PyTorch on the same weights and batch.

Tolerance: |anatomy - pytorch| <= 1e-5 + 1e-4 * |pytorch| (float32 activations,
float64 metrics).
Usage: test_metrics_parity.py ANATOMY_EXECUTABLE
"""
import json
import math
import os
import sys
import tempfile

import torch
import torch.nn.functional as F

import safetensors_io
from test_model_parity import B, C, T, V, causal_softmax, gpt_shapes, random_params, save_inputs


def erank(m):
    s = torch.linalg.svdvals(m.double())
    p = s / s.sum()
    p = p[p > 0]
    return math.exp(-(p * p.log()).sum().item())


def entropy(att):
    a = att.double()
    return (-(a * torch.where(a > 0, a.log(), torch.zeros_like(a))).sum(-1)).mean().item()


def forward(P, ids, layers=2, heads=2, skip=()):
    """Pre-norm GPT that also returns each block's (input, output) and attention pattern."""
    x = P["embed.weight"][ids] + P["embed.pos_weight"][: ids.shape[1]]
    records = []
    for i in range(1, layers + 1):
        p = "blocks.%d." % i
        if i in skip:
            records.append(None)
            continue
        inp = x
        h = F.layer_norm(x, (C,), P[p + "ln1.weight"], P[p + "ln1.bias"], 1e-5)
        b, t, c = h.shape
        q, k, v = F.linear(h, P[p + "attn.qkv.weight"], P[p + "attn.qkv.bias"]).split(c, -1)
        split = lambda z: z.view(b, t, heads, c // heads).transpose(1, 2)
        q, k, v = split(q), split(k), split(v)
        att = causal_softmax(q @ k.transpose(-2, -1) / math.sqrt(c // heads))
        y = F.linear((att @ v).transpose(1, 2).reshape(b, t, c), P[p + "attn.proj.weight"], P[p + "attn.proj.bias"])
        x = x + y
        h = F.layer_norm(x, (C,), P[p + "ln2.weight"], P[p + "ln2.bias"], 1e-5)
        x = x + F.linear(F.gelu(F.linear(h, P[p + "mlp.fc.weight"], P[p + "mlp.fc.bias"])),
                         P[p + "mlp.proj.weight"], P[p + "mlp.proj.bias"])
        records.append((inp, x, att))
    return readout(P, x), records


def readout(P, h):
    h = F.layer_norm(h, (C,), P["ln_f.weight"], P["ln_f.bias"], 1e-5)
    return F.linear(h, P["head.weight"], P["head.bias"])


def main():
    exe = sys.argv[1]
    torch.manual_seed(2)
    P = random_params(gpt_shapes(pre=True))
    ids, targets = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in"), os.path.join(tmp, "out.json")
        save_inputs(inp, P, ids, targets)
        if not safetensors_io.run_lua(exe, "metrics_parity.lua", inp, out):
            return 1
        got = json.load(open(out))

    logits, records = forward(P, ids)
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    loss.backward()
    top = logits.argmax(-1)
    want = {"loss": loss.item()}
    for name, p in P.items():
        want["grad " + name] = p.grad.norm().item()
        if p.dim() == 2:
            want["weight erank " + name] = erank(p.detach())
    with torch.no_grad():
        for i, (x_in, x_out, att) in enumerate(records, start=1):
            L = "blocks.%d " % i
            flat_in, flat_out = x_in.reshape(-1, C).double(), x_out.reshape(-1, C).double()
            want[L + "erank"] = erank(flat_out)
            want[L + "entropy"] = entropy(att)
            want[L + "diag"] = att.double().diagonal(0, -2, -1).mean().item()
            want[L + "act_std"] = x_out.double().std(unbiased=False).item()
            want[L + "amplification"] = x_out.double().std(unbiased=False).item() / x_in.double().std(unbiased=False).item()
            want[L + "residual"] = ((flat_out - flat_in).norm(dim=-1) / flat_in.norm(dim=-1)).mean().item()
            want[L + "influence"] = 1 - F.cosine_similarity(flat_in, flat_out, dim=-1).mean().item()
            lens = readout(P, x_out)
            want[L + "lens_loss"] = F.cross_entropy(lens.reshape(-1, V), targets.reshape(-1)).item()
            want[L + "lens_agree"] = (lens.argmax(-1) == top).double().mean().item()
            skipped, _ = forward(P, ids, skip=(i,))
            want[L + "removal_loss"] = F.cross_entropy(skipped.reshape(-1, V), targets.reshape(-1)).item()

    have = {"loss": got["loss"]}
    for p in got["params"]:
        have["grad " + p["name"]] = p["grad_norm"]
    for w in got["weights"]:
        have["weight erank " + w["name"]] = w["erank"]
    for r in got["rows"]:
        if r["kind"] == "block":
            for key in ("erank", "entropy", "diag", "act_std", "amplification", "residual", "influence",
                        "lens_loss", "lens_agree", "removal_loss"):
                have[r["name"] + " " + key] = r.get(key)

    passed = failed = 0
    worst = 0.0
    for key, w in want.items():
        g = have.get(key)
        ok = g is not None and abs(g - w) <= 1e-5 + 1e-4 * abs(w)
        if g is not None:
            worst = max(worst, abs(g - w) / max(abs(w), 1e-12))
        if ok:
            passed += 1
        else:
            failed += 1
            print("FAIL  %-40s anatomy %s  pytorch %.8g" % (key, g, w))
    print("%d metrics compared; largest relative difference %.3g" % (len(want), worst))
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
