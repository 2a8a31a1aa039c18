"""Causal tools against the same definitions written here in PyTorch, on the
same weights (the hook parity test's GPT, three layers) and the same clean
and corrupt ids; the metric is the mean over the batch of logit[3] - logit[5]
at the last position.

Path patching (patching.path):
  1. cache every attention's z in the clean and the corrupt run;
  2. run the corrupt ids with the senders' z from the clean run and every
     other head's z frozen at its corrupt value, recording the receivers'
     inputs (a head's q, k or v, or a layer's resid_pre);
  3. run the corrupt ids with only those inputs patched in.
  Five settings (senders in one or two layers, receivers via q, k, v and the
  residual stream), and the clean and corrupt metrics.

Attribution patching (patching.attribute), each cell corrupt + its contribution:
  atp:  (clean - corrupt activation) . d metric / d activation on the corrupt
        run, summed over the cell (a position of resid_pre, a head of attn.z,
        a neuron of mlp.post);
  atp-qk (AtP*'s QK fix): for attn.k per head and attn.q per position, the pattern recomputed
        from the corrupt q and k with the cell's clean k or q (scaled by
        1/sqrt(d), causally masked), (pattern' - pattern) . d metric / d pattern;
  ig:   per layer, resid_pre moved from corrupt to clean in 4 midpoint steps
        (that layer alone), the gradients averaged, then as atp.
Edge attribution (patching.edges), written here the split-input way
(TransformerLens's use_split_qkv_input): every head's query, key and value
and every MLP reads its own copy of the residual stream, so the gradient at
each copy is the metric's gradient along that input alone; each edge is
(clean - corrupt output of u) . that gradient, summed over batch and
positions (eap: on the corrupt run; eap-ig: averaged over 4 runs whose
embedding goes from corrupt to clean, midpoints). Every edge of the graph
is compared.
Tolerance: |anatomy - pytorch| <= 1e-4.
Usage: test_causal_parity.py ANATOMY_EXECUTABLE
"""
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

import safetensors_io
import test_hook_parity as gpt

gpt.L = 3  # the reference GPT's layer count, read when it is built
SETTINGS = [  # (senders, receivers, via); layers and heads 1-based, as anatomy counts
    ([(1, 2)], [(2, 1), (3, 3)], "q"),
    ([(1, 2)], [(2, 1), (3, 3)], "k"),
    ([(1, 2)], [(2, 1), (3, 3)], "v"),
    ([(1, 1), (2, 4)], [(3, 2)], "k"),
    ([(1, 3)], [(2,), (3,)], "resid"),
]


def metric(logits):
    return (logits[:, -1, 3] - logits[:, -1, 5]).mean()


def run(model, ids, points, grad=False, replace=None):
    """Runs ids; returns the metric and {name: activation} at points (a name ->
    HookPoint map); with grad, each activation keeps its gradient; replace:
    {name: fn(out) -> new out}."""
    acts, handles = {}, []
    for name, hp in points.items():
        def hook(m, inp, out, name=name):
            if replace and name in replace:
                out = replace[name](out)
            if grad and out.requires_grad:
                out.retain_grad()
            acts[name] = out
            return out
        handles.append(hp.register_forward_hook(hook))
    try:
        with torch.set_grad_enabled(grad):
            m = metric(model(ids))
    finally:
        for h in handles:
            h.remove()
    return m, acts


def reduce(contrib, per, head_dim=2):
    if per == "layer":
        return [contrib.sum().item()]
    d = {"head": head_dim, "position": 1, "neuron": contrib.dim() - 1}[per]
    return contrib.transpose(0, d).reshape(contrib.shape[d], -1).sum(1).tolist()


def atp(model, clean, corrupt, point, per):
    pts = {l: point(blk) for l, blk in enumerate(model.blocks)}
    _, c = run(model, clean, pts)
    m, a = run(model, corrupt, pts, grad=True)
    m.backward()
    return [[v for v in reduce((c[l] - a[l]).detach() * a[l].grad, per)] for l in pts]  # the effects


def atp_star(model, clean, corrupt, which, per):
    grid = []
    for l, blk in enumerate(model.blocks):
        pts = {"q": blk.attn.hook_q, "k": blk.attn.hook_k, "scores": blk.attn.hook_scores, "pattern": blk.attn.hook_pattern}
        _, c = run(model, clean, pts)
        model.zero_grad()
        m, a = run(model, corrupt, pts, grad=True)
        m.backward()
        q, k, p, gp = a["q"].detach(), a["k"].detach(), a["pattern"].detach(), a["pattern"].grad
        t, d_head = q.shape[1], q.shape[3]
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        delta = (c[which] - a[which]).detach()
        dim = 2 if per == "head" else 1
        row = []
        for cell in range(delta.shape[dim]):
            d = torch.zeros_like(delta)
            d.narrow(dim, cell, 1).copy_(delta.narrow(dim, cell, 1))
            qq, kk = (q + d, k) if which == "q" else (q, k + d)
            s = torch.einsum("bqhd,bkhd->bhqk", qq, kk) / math.sqrt(d_head)
            s = s.masked_fill(mask, float("-inf"))
            row.append(((s.softmax(-1) - p) * gp).sum().item())
        grid.append(row)
    return grid


def ig(model, clean, corrupt, steps):
    grid = []
    for l, blk in enumerate(model.blocks):
        pts = {"x": blk.hook_resid_pre}
        _, c = run(model, clean, pts)
        _, a = run(model, corrupt, pts)
        delta, base = (c["x"] - a["x"]).detach(), a["x"].detach()
        total = torch.zeros_like(base)
        for k in range(steps):
            alpha = (k + 0.5) / steps
            leaf = (base + alpha * delta).requires_grad_(True)
            m, _ = run(model, corrupt, pts, grad=True, replace={"x": lambda out: leaf})
            m.backward()
            total += leaf.grad
        grid.append([(delta * total / steps).sum().item()])
    return grid


def split_forward(model, ids, embed=None):
    """The GPT's forward with split inputs. Returns the metric, the upstream
    outputs {name: (B, T, C)} and the downstream input copies {(to, via): tensor}
    (each kept with retain_grad)."""
    x = model.embed_weight[ids] + model.embed_pos[: ids.shape[1]] if embed is None else embed
    ups, downs = {"embed": x}, {}
    d = gpt.C // gpt.H
    for l, blk in enumerate(model.blocks, start=1):
        copies = x.unsqueeze(2).repeat(1, 1, 3 * gpt.H, 1)
        if copies.requires_grad:
            copies.retain_grad()
        a = blk.attn
        w, bias = a.qkv.weight.view(3, gpt.H, d, gpt.C), a.qkv.bias.view(3, gpt.H, d)
        heads = []
        for r, role in enumerate("qkv"):
            for h in range(gpt.H):
                downs[(f"blocks.{l} head {h + 1}", role)] = (copies, r * gpt.H + h)
                heads.append(F.linear(blk.ln1(copies[:, :, r * gpt.H + h]), w[r, h], bias[r, h]))
        q, k, v = (torch.stack(heads[r * gpt.H:(r + 1) * gpt.H], 2) for r in range(3))
        t = ids.shape[1]
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        z = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)
        result = torch.einsum("bqhd,chd->bqhc", z, a.proj.weight.view(gpt.C, gpt.H, d))
        for h in range(gpt.H):
            ups[f"blocks.{l} head {h + 1}"] = result[:, :, h]
        x = x + result.sum(2) + a.proj.bias
        mlp_in = x.clone()
        if mlp_in.requires_grad:
            mlp_in.retain_grad()
        downs[(f"blocks.{l} mlp", None)] = (mlp_in, None)
        out = blk.mlp(blk.ln2(mlp_in))
        ups[f"blocks.{l} mlp"] = out
        x = x + out
    final = x.clone()
    if final.requires_grad:
        final.retain_grad()
    downs[("logits", None)] = (final, None)
    return metric(model.head(model.ln_f(final))), ups, downs


def eap(model, clean, corrupt, steps=None):
    """{(from, to, via): score} for every edge, in anatomy's order of nodes."""
    with torch.no_grad():
        _, up_clean, _ = split_forward(model, clean)
        _, up_corrupt, _ = split_forward(model, corrupt)
    alphas = [0.0] if steps is None else [(k + 0.5) / steps for k in range(steps)]
    grads = {}
    for alpha in alphas:
        embed = None if alpha == 0 else (up_corrupt["embed"] + alpha * (up_clean["embed"] - up_corrupt["embed"])).requires_grad_(True)
        model.zero_grad()
        m, _, downs = split_forward(model, corrupt, embed)
        m.backward()
        for key, (t, slot) in downs.items():
            g = t.grad if slot is None else t.grad[:, :, slot]
            grads[key] = grads.get(key, 0) + g / len(alphas)
    order = list(up_clean)  # embed, then each layer's heads and MLP
    stage = {name: i for i, name in enumerate(order)}
    scores = {}
    for (to, via), g in grads.items():
        if to == "logits":
            last = len(order)
        else:
            layer = int(to.split()[0].split(".")[1])
            last = stage[f"blocks.{layer} head 1"] if via else stage[f"blocks.{layer} mlp"]
        for name in order[:last]:
            scores[(name, to, via)] = ((up_clean[name] - up_corrupt[name]) * g).sum().item()
    return scores


def path_patch(model, clean, corrupt, senders, receivers, via):
    _, c_clean = gpt.capture(model, clean)
    _, c_corrupt = gpt.capture(model, corrupt)
    handles = []
    for layer, blk in enumerate(model.blocks, start=1):
        name = f"blocks.{layer}.attn.z"

        def freeze(m, inp, out, name=name, layer=layer):
            z = c_corrupt[name].clone()
            for sl, sh in senders:
                if sl == layer:
                    z[:, :, sh - 1] = c_clean[name][:, :, sh - 1]
            return z
        handles.append(blk.attn.hook_z.register_forward_hook(freeze))
    recorded = {}

    def point(r):
        blk = model.blocks[r[0] - 1]
        return blk.hook_resid_pre if via == "resid" else getattr(blk.attn, "hook_" + via)
    for r in receivers:
        def record(m, inp, out, r=r):
            recorded[r] = out.detach().clone()
        handles.append(point(r).register_forward_hook(record))
    with torch.no_grad():
        model(corrupt)
    for h in handles:
        h.remove()
    handles = []
    for r in receivers:
        def patch(m, inp, out, r=r):
            out = out.clone()
            if via == "resid":
                out[:] = recorded[r]
            else:
                out[:, :, r[1] - 1] = recorded[r][:, :, r[1] - 1]
            return out
        handles.append(point(r).register_forward_hook(patch))
    with torch.no_grad():
        value = metric(model(corrupt)).item()
    for h in handles:
        h.remove()
    return value



def main():
    exe = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    model = gpt.random_gpt(3)
    clean, corrupt = torch.randint(0, gpt.V, (gpt.B, gpt.T)), torch.randint(0, gpt.V, (gpt.B, gpt.T))
    with torch.no_grad():
        paths = [path_patch(model, clean, corrupt, *s) for s in SETTINGS]
        paths += [metric(model(clean)).item(), metric(model(corrupt)).item()]
    want = {
        "path": [paths],
        "atp_resid_pre_position": atp(model, clean, corrupt, lambda b: b.hook_resid_pre, "position"),
        "atp_z_head": atp(model, clean, corrupt, lambda b: b.attn.hook_z, "head"),
        "atp_mlp_post_neuron": atp(model, clean, corrupt, lambda b: b.mlp.hook_post, "neuron"),
        "atpstar_k_head": atp_star(model, clean, corrupt, "k", "head"),
        "atpstar_q_position": atp_star(model, clean, corrupt, "q", "position"),
        "ig_resid_pre_layer": ig(model, clean, corrupt, 4),
    }
    edge_keys = None
    for name, steps in (("eap", None), ("eap_ig", 4)):
        scores = eap(model, clean, corrupt, steps)
        edge_keys = edge_keys or sorted(scores, key=lambda k: (k[0], k[1], k[2] or ""))
        want[name] = [[scores[k] for k in edge_keys]]
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
        tensors = gpt.state_dict(model)
        tensors["input.clean"], tensors["input.corrupt"] = clean + 1, corrupt + 1
        safetensors_io.save(inp, tensors)
        with open(os.path.join(tmp, "edges.txt"), "w") as f:
            f.writelines(f"{a}\t{b}\t{c or ''}\n" for a, b, c in edge_keys)
        proc = subprocess.run([exe, "--threads=1", os.path.join(here, "causal_parity.lua"), inp, out], capture_output=True, text=True)
        if proc.returncode != 0:
            print("FAIL  anatomy failed\n%s%s" % (proc.stdout, proc.stderr))
            print("0 passed, 1 failed")
            return 1
        got, _ = safetensors_io.load(out)
    got["path"] = got["path"].reshape(1, -1)
    for name in ("eap", "eap_ig"):
        got[name] = got[name].reshape(1, -1)
    failed, worst = [], 0.0
    for name, w in want.items():
        w = torch.tensor(w, dtype=torch.float64)
        g = got[name]
        if g.shape != w.shape:
            failed.append(name)
            print(f"FAIL  {name}: shape {tuple(g.shape)} vs {tuple(w.shape)}")
            continue
        d = (g - w).abs().max().item()
        worst = max(worst, d)
        spread = (w - w.mean()).abs().max().item()
        print(f"{'ok  ' if d <= 1e-4 else 'FAIL'}  {name} {tuple(w.shape)}: largest difference {d:.3g} (cells spread over {spread:.3g})")
        if d > 1e-4:
            failed.append(name)
    moved = sum(abs(v - paths[-1]) > 1e-3 for v in paths[:len(SETTINGS)])
    print(f"largest difference {worst:.3g}; {moved} of {len(SETTINGS)} paths move the metric off the corrupt run's")
    if moved == 0:
        failed.append("no path moves the metric: the path comparison would be vacuous")
    print(f"{len(want) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
