"""The tuned lens against the same definition written here in PyTorch, on the
same weights (the hook parity test's GPT, three layers), the same fixed
translators and the same ids. For each row i (0: the first block's input,
then each block's output) the residual stream h_i is translated,
h_i + h_i W_i^T + b_i (the last block's output untranslated), read through
the final LayerNorm and the unembedding, and compared with the model's own
output distribution:
  kl:   KL(final || lens) = sum_v p_final (log p_final - log p_lens), the mean
        over batch and positions (what lens.tuned minimises);
  loss: the cross-entropy of the lens's prediction of the next token, the
        mean over the positions that have one.
The logit lens (no translators) is compared the same way.
Tolerance: |anatomy - pytorch| <= 1e-5.
Usage: test_lens_parity.py ANATOMY_EXECUTABLE
"""
import os
import sys
import tempfile

import torch

import safetensors_io
import test_hook_parity as gpt

gpt.L = 3


def lens_numbers(model, ids, translators):
    h, logits = gpt.residual_rows(model, ids)
    final = logits.double().log_softmax(-1)
    kl, loss = [], []
    with torch.no_grad():
        for i, x in enumerate(h):
            if translators is not None and i < len(h) - 1:
                w, b = translators[i]
                x = x + x @ w.T + b
            read = model.head(model.ln_f(x)).double().log_softmax(-1)
            kl.append((final.exp() * (final - read)).sum(-1).mean().item())
            nll = -read[:, :-1].gather(2, ids[:, 1:].unsqueeze(2)).squeeze(2)
            loss.append(nll.mean().item())
    return kl, loss


def main():
    exe = sys.argv[1]
    model = gpt.random_gpt(11)
    ids = torch.randint(0, gpt.V, (gpt.B, gpt.T))
    translators = [(0.2 * torch.randn(gpt.C, gpt.C), 0.2 * torch.randn(gpt.C)) for _ in range(gpt.L)]
    want = {}
    want["tuned_kl"], want["tuned_loss"] = lens_numbers(model, ids, translators)
    want["logit_kl"], want["logit_loss"] = lens_numbers(model, ids, None)
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
        tensors = gpt.state_dict(model)
        tensors["input.ids"] = ids + 1
        for i, (w, b) in enumerate(translators):
            tensors[f"input.translator.{i}.weight"], tensors[f"input.translator.{i}.bias"] = w, b
        safetensors_io.save(inp, tensors)
        if not safetensors_io.run_lua(exe, "lens_parity.lua", inp, out):
            return 1
        got, _ = safetensors_io.load(out)
    failed, worst = [], 0.0
    for name, w in want.items():
        g = got[name].double().tolist()
        d = max(abs(a - b) for a, b in zip(g, w)) if len(g) == len(w) else float("inf")
        worst = max(worst, d)
        ok = d <= 1e-5
        print(f"{'ok  ' if ok else 'FAIL'}  {name}: anatomy {[round(v, 6) for v in g]}, pytorch {[round(v, 6) for v in w]}, "
              f"largest difference {d:.3g}")
        if not ok:
            failed.append(name)
    # the comparison means something only where the translators change what is read
    if max(abs(a - b) for a, b in zip(want["tuned_kl"][:-1], want["logit_kl"][:-1])) < 1e-3:
        failed.append("the translators do not change the KL: the comparison would be vacuous")
        print("FAIL  the translators do not change the KL")
    print(f"tuned and logit lens against PyTorch: largest difference {worst:.3g} (tolerance 1e-5)")
    print(f"{4 - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
