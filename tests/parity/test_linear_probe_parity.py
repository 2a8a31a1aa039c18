"""Linear probes: probe.linear's fitted loss against the same probe trained
here with torch.optim.Adam, on the same GPT (the hook parity test's, three
layers), ids, labels (each position's previous token, a few classes) and
split. Per row (embed: block 1's resid_pre; then each block's resid_post),
on the labelled positions of the training examples:
  features (float32 activations, fitted in float64) standardised with the
  training rows' mean and population std
  (+ 1e-5), W (K, C) and b (K) from zero, full-batch Adam (lr 0.05, 150
  steps), loss = cross-entropy + 1e-3 / 2 * |W|^2;
the fitted loss and the accuracies on the training and held-out examples
are compared, for the labels and for anatomy's control labels (a label per
token type).
Tolerance: |anatomy - pytorch| <= 1e-4 on losses (the activations agree to
float32 rounding; the fits are float64); accuracies equal.
Usage: test_linear_probe_parity.py ANATOMY_EXECUTABLE
"""
import os
import sys
import tempfile

import torch
import torch.nn.functional as F

import safetensors_io
import test_hook_parity as gpt

gpt.L = 3
B, T = 24, gpt.T
STEPS, LR, WD = 150, 0.05, 1e-3


def fit(x, y, train, test, K):
    xt, yt = x[train], y[train]
    mean = xt.mean(0)
    std = ((xt - mean) ** 2).mean(0).sqrt() + 1e-5
    z = lambda t: (t - mean) / std
    W = torch.zeros(K, x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(K, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([W, b], lr=LR)
    zt = z(xt)
    objective = lambda: F.cross_entropy(zt @ W.T + b, yt) + (W * W).sum() * (WD / 2)
    for _ in range(STEPS):
        opt.zero_grad()
        loss = objective()
        loss.backward()
        opt.step()
    with torch.no_grad():
        acc = lambda idx: ((z(x[idx]) @ W.T + b).argmax(-1) == y[idx]).double().mean().item()
        return objective().item(), acc(train), acc(test)


def main():
    exe = sys.argv[1]
    model = gpt.random_gpt(13)
    ids = torch.randint(0, 5, (B, T))  # five token types: classes repeat often enough to learn
    labels = torch.ones(B, T, dtype=torch.int64)
    labels[:, 1:] = ids[:, :-1] + 1
    mask = torch.ones(B, T, dtype=torch.uint8)
    mask[:, 0] = 0
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
        tensors = gpt.state_dict(model)
        tensors["input.ids"], tensors["input.labels"], tensors["input.mask"] = ids + 1, labels, mask
        safetensors_io.save(inp, tensors)
        if not safetensors_io.run_lua(exe, "linear_probe_parity.lua", inp, out):
            return 1
        got, _ = safetensors_io.load(out)
    positions = got["positions"] - 1                      # 0-based into B * T
    want_positions = torch.nonzero(mask.reshape(-1)).squeeze(1)
    failed, worst = [], 0.0
    if not torch.equal(positions, want_positions):
        failed.append("labelled positions")
        print("FAIL  the labelled positions differ from the mask's")
    y = got["labels"] - 1
    values = sorted(set(labels.reshape(-1)[want_positions].tolist()))
    want_y = torch.tensor([values.index(v) for v in labels.reshape(-1)[want_positions].tolist()])
    if not torch.equal(y, want_y):
        failed.append("classes")
        print("FAIL  the classes are not the labels renumbered in sorted order")
    train_examples = set((got["train_examples"] - 1).tolist())
    example = positions // T
    train = torch.tensor([int(e) in train_examples for e in example.tolist()])
    test = ~train
    K = len(values)
    for i, x in enumerate(gpt.residual_rows(model, ids)[0]):
        x = x.reshape(B * T, -1)[positions].double()  # probes fit in float64, from the float32 activations
        for task, labels_i, key in (("probe", y, "train_loss"), ("control", got["control_labels"] - 1, "control_train_loss")):
            loss, train_acc, test_acc = fit(x, labels_i, train, test, K)
            d = abs(got[key][i].item() - loss)
            worst = max(worst, d)
            accs = (got["train_acc"][i].item(), got["test_acc"][i].item()) if task == "probe" else (None, got["control_acc"][i].item())
            acc_ok = (accs[0] is None or abs(accs[0] - train_acc) < 1e-9) and abs(accs[1] - test_acc) < 1e-9
            ok = d <= 1e-4 and acc_ok
            print(f"{'ok  ' if ok else 'FAIL'}  row {i} {task}: fitted loss anatomy {got[key][i].item():.6f}, pytorch {loss:.6f} "
                  f"(difference {d:.3g}); held-out accuracy anatomy {accs[1]:.4f}, pytorch {test_acc:.4f}")
            if not ok:
                failed.append(f"row {i} {task}")
    print(f"linear probes against torch.optim.Adam: largest loss difference {worst:.3g} (tolerance 1e-4), "
          f"{int(train.sum())} train and {int(test.sum())} held-out positions, {K} classes")
    total = 2 * (gpt.L + 1) + 2
    print(f"{total - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
