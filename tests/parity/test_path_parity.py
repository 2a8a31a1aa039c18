"""Path patching: patching.path against the same definition written here in
PyTorch, on the same weights (the hook parity test's GPT, three layers) and
the same clean and corrupt ids:
  1. cache every attention's z in the clean and the corrupt run;
  2. run the corrupt ids with the senders' z from the clean run and every
     other head's z frozen at its corrupt value, recording the receivers'
     inputs (a head's q, k or v, or a layer's resid_pre);
  3. run the corrupt ids with only those inputs patched in; the metric is
     the mean over the batch of logit[3] - logit[5] at the last position.
Five settings (senders in one or two layers, receivers via q, k, v and the
residual stream), and the clean and corrupt metrics.
Tolerance: |anatomy - pytorch| <= 1e-4.
Usage: test_path_parity.py ANATOMY_EXECUTABLE
"""
import os
import subprocess
import sys
import tempfile

import torch

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
    return (logits[:, -1, 3] - logits[:, -1, 5]).mean().item()


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
        value = metric(model(corrupt))
    for h in handles:
        h.remove()
    return value


def main():
    exe = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    torch.manual_seed(1)
    model = gpt.GPT()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_((1.0 if n.endswith(("ln1.weight", "ln2.weight", "ln_f.weight")) else 0.0) + 0.3 * torch.randn(p.shape))
    clean, corrupt = torch.randint(0, gpt.V, (gpt.B, gpt.T)), torch.randint(0, gpt.V, (gpt.B, gpt.T))
    want = [path_patch(model, clean, corrupt, *s) for s in SETTINGS]
    with torch.no_grad():
        want += [metric(model(clean)), metric(model(corrupt))]
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
        tensors = gpt.state_dict(model)
        tensors["input.clean"], tensors["input.corrupt"] = clean + 1, corrupt + 1
        safetensors_io.save(inp, tensors)
        proc = subprocess.run([exe, "--threads=1", os.path.join(here, "path_parity.lua"), inp, out], capture_output=True, text=True)
        if proc.returncode != 0:
            print("FAIL  anatomy failed\n%s%s" % (proc.stdout, proc.stderr))
            print("0 passed, 1 failed")
            return 1
        got, _ = safetensors_io.load(out)
    got = got["values"].tolist()
    names = [f"{s[0]} -> {s[1]} via {s[2]}" for s in SETTINGS] + ["clean", "corrupt"]
    failed, worst = [], 0.0
    for name, g, w in zip(names, got, want):
        d = abs(g - w)
        worst = max(worst, d)
        print(f"{'ok  ' if d <= 1e-4 else 'FAIL'}  {name}: anatomy {g:.6f}, pytorch {w:.6f}")
        if d > 1e-4:
            failed.append(name)
    moved = sum(abs(w - want[-1]) > 1e-3 for w in want[:len(SETTINGS)])
    print(f"largest difference {worst:.3g}; {moved} of {len(SETTINGS)} paths move the metric off the corrupt run's")
    if moved == 0:
        failed.append("no path moves the metric: the comparison would be vacuous")
    print(f"{len(names) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
