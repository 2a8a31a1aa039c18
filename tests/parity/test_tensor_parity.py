"""Tensor parity: runs tensor_ops.lua in anatomy and the same operations in
PyTorch (Debian's python3-torch, the same LibTorch), and compares every result.

Tolerance: |anatomy - pytorch| <= 1e-5 + 1e-5 * |pytorch| elementwise (float32
results); indices and booleans must be equal; printed forms must be identical.
Usage: test_tensor_parity.py ANATOMY_EXECUTABLE
"""
import json
import os
import subprocess
import sys

import torch


def reference():
    torch.manual_seed(1234)
    A = torch.randn(4, 5)
    B = torch.randn(5, 3)
    C = torch.randn(4, 5)
    v = torch.randn(5)
    P = torch.rand(4, 5) + 0.1
    X3 = torch.randn(2, 3, 4)
    Y3 = torch.randn(2, 4, 5)
    idx = torch.randint(1, 6, (4, 2)) - 1  # the same draws, 0-based
    W1 = torch.randn(5, 8, requires_grad=True)
    b1 = torch.randn(8, requires_grad=True)
    W2 = torch.randn(8, 3, requires_grad=True)
    x = torch.randn(4, 5, requires_grad=True)
    targets = torch.randint(1, 4, (4, 1)) - 1

    r = {}
    r["add_broadcast"] = A + v
    r["arith"] = A * C - A / P + 2 * A - 1
    r["pow"] = P ** 2.5
    r["pow_tensor"] = P.pow(P)
    r["matmul"] = A @ B
    r["bmm"] = X3.bmm(Y3)
    r["matmul_batched"] = X3 @ Y3[0]
    r["einsum"] = torch.einsum("bij,bjk->bik", X3, Y3)
    for f in ["exp", "abs", "sin", "cos", "tanh", "sigmoid", "relu", "neg", "square"]:
        r["unary_" + f] = getattr(A, f)()
    r["unary_gelu"] = torch.nn.functional.gelu(A)
    for f in ["log", "sqrt", "rsqrt", "reciprocal"]:
        r["positive_" + f] = getattr(P, f)()
    r["gelu_tanh"] = torch.nn.functional.gelu(A, approximate="tanh")
    r["softmax"] = A.softmax(1)
    r["log_softmax"] = A.log_softmax(0)
    r["clamp"] = A.clamp(-0.5, 0.5)
    r["sum_keepdim"] = A.sum(1, keepdim=True)
    r["mean"] = A.mean(0)
    r["std"] = A.std(1)
    r["var_biased"] = A.var(0, unbiased=False)
    r["norm3"] = A.norm(3, 1)
    r["logsumexp"] = A.logsumexp(1)
    r["cumsum"] = A.cumsum(0)
    mx, mi = A.max(1)
    r["max_values"], r["max_indices"] = mx, mi + 1
    r["argmin"] = A.argmin(0) + 1
    r["argmax_flat"] = A.argmax() + 1
    tv, ti = A.topk(2, 1)
    r["topk_values"], r["topk_indices"] = tv, ti + 1
    r["gt"] = A.gt(0)
    r["index_select"] = A.index_select(1, idx[:, 0])
    r["gather"] = A.gather(1, idx)
    r["scatter"] = torch.zeros(4, 5).scatter(1, idx, C[:, 0:2])
    r["masked_fill"] = A.masked_fill(A.lt(0), -1)
    r["where"] = torch.where(A.gt(0), A, C)
    r["tril"] = A.tril(-1)
    r["triu"] = A.triu(1)
    r["svdvals"] = torch.linalg.svdvals(A)
    r["linalg_norm"] = torch.linalg.norm(A)
    r["linalg_nuc"] = torch.linalg.norm(A, "nuc")
    r["permute"] = X3.permute(2, 0, 1).contiguous()
    r["transpose_reshape"] = X3.transpose(1, 2).reshape(2, -1)
    r["cat"] = torch.cat([A, C], 1)
    r["stack"] = torch.stack([A, C], 1)
    r["indexing"] = A[1:4, -1]

    h = x @ W1 + b1
    logits = torch.nn.functional.gelu(h) @ W2
    loss = -(logits.log_softmax(1).gather(1, targets)).mean()
    loss.backward()
    r["mlp_loss"] = loss
    r["mlp_grad_W1"] = W1.grad
    r["mlp_grad_b1"] = b1.grad
    r["mlp_grad_W2"] = W2.grad
    r["mlp_grad_x"] = x.grad.clone()
    y = (x.softmax(1) * x).sum() + x.tanh().norm() + (x * x).mean(0).sum()
    x.grad = None
    y.backward()
    r["misc_grad_x"] = x.grad

    F = torch.nn.functional
    r["flip"] = X3.flip(0, 2)
    r["median_all"] = A.median()
    mv, mi = A.median(1)
    r["median_values"], r["median_indices"] = mv, mi + 1
    r["clamp_int"] = (idx + 1).clamp(2, 4)
    r["clamp_min"] = A.clamp_min(0)
    r["clamp_max"] = A.clamp_max(0.5)
    r["softplus"] = F.softplus(A, 2, 1)
    r["silu"] = F.silu(A)
    r["layer_norm"] = F.layer_norm(X3, (4,), v[:4], P[0][:4])
    r["layer_norm_2d"] = F.layer_norm(X3, (3, 4))
    r["rms_norm"] = X3 / (X3.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * v[:4]  # 1.13 has no F.rms_norm
    r["mse_loss"] = F.mse_loss(A, C)
    r["mse_loss_sum"] = F.mse_loss(A, C, reduction="sum")
    r["linear"] = F.linear(A, B.t(), v[:3])
    r["embedding"] = F.embedding(idx, A.t())

    def sdpa(q, k, v, mask=None, causal=False, scale=None):  # 1.13 has no F.scaled_dot_product_attention
        s = q @ k.transpose(-2, -1) * (scale if scale is not None else q.shape[-1] ** -0.5)
        if causal:
            s = s.masked_fill(torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1), float("-inf"))
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        return s.softmax(-1) @ v
    classes = torch.tensor([0, 2, 4, 1])
    r["ce_mean"] = F.cross_entropy(A, classes)
    r["ce_none"] = F.cross_entropy(A, classes, reduction="none")
    r["ce_sum"] = F.cross_entropy(A, classes, reduction="sum")
    r["ce_ignore"] = F.cross_entropy(A, torch.tensor([0, -100, 4, -100]))
    r["ce_ignore_none"] = F.cross_entropy(A, torch.tensor([0, -100, 4, -100]), reduction="none")
    r["ce_smooth_weight"] = F.cross_entropy(A, classes, label_smoothing=0.1, weight=P[0])
    r["ce_3d_none"] = F.cross_entropy(X3.reshape(-1, 4), torch.tensor([0, 3, 1, 2, 2, 0]), reduction="none").reshape(2, 3)
    r["sdpa"] = sdpa(X3, X3, X3)
    r["sdpa_causal"] = sdpa(X3, X3, X3, causal=True)
    r["sdpa_mask"] = sdpa(X3, X3, X3, mask=torch.ones(3, 3, dtype=torch.bool).tril(), scale=0.5)

    r["repr_A"] = str(A)
    r["repr_big"] = str(A @ B * 1000)
    r["repr_small"] = str(P * 1e-5)
    r["repr_int"] = str(idx + 1)
    r["repr_large"] = str(torch.arange(1500).reshape(30, 50).float() / 7)
    r["repr_bool"] = str(A.gt(0))
    return r


def main():
    exe = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([exe, "--threads=1", os.path.join(here, "tensor_ops.lua")],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout, proc.stderr)
        print("0 passed, 1 failed")
        return 1
    got = {}
    for line in proc.stdout.splitlines():
        d = json.loads(line)
        got[d["name"]] = d

    torch.set_num_threads(1)
    passed = failed = 0
    for name, want in reference().items():
        g = got.get(name)
        ok, detail = False, "missing from anatomy's output"
        if g is not None and isinstance(want, str):
            ok = g.get("repr") == want
            detail = "printed form differs:\n--- anatomy\n%s\n--- pytorch\n%s" % (g.get("repr"), want)
        elif g is not None:
            w = want.detach().double()
            t = torch.tensor(g["values"], dtype=torch.float64).reshape(g["shape"])
            if list(t.shape) != list(w.shape):
                detail = "shape %s, expected %s" % (list(t.shape), list(w.shape))
            else:
                maxdiff = (t - w).abs().max().item() if w.numel() else 0.0
                ok = bool(((t - w).abs() <= 1e-5 + 1e-5 * w.abs()).all())
                detail = "maxdiff %.3g" % maxdiff
        print("%-5s %-20s %s" % ("ok" if ok else "FAIL", name, detail if not ok or g is None or "maxdiff" in detail else ""))
        passed, failed = passed + ok, failed + (not ok)
    extra = set(got) - set(reference().keys())
    for name in sorted(extra):
        print("FAIL  %-20s not in the reference" % name)
        failed += 1
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
