"""The PyTorch half of the side-by-side benchmark: the same models, batch
sizes, optimizer settings and measurements as bench/bench.lua, written as
idiomatic PyTorch eager code (the PyTorch of the build's LibTorch: the venv's for
the PyPI builds, Debian's python3-torch for Debian's).
Writes one JSON object to --out.

    PYTHON bench/peer.py --threads N --steps 20 --warmup 5 [--compile] --out FILE
"""
import argparse
import json
import math
import re
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalAttention(nn.Module):
    def __init__(self, dim, heads, seq):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, -1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        att = att.masked_fill(self.mask[:t, :t], float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))


class GPTBlock(nn.Module):  # post-norm: x = ln1(x + attn(x)); x = ln2(x + mlp(x))
    def __init__(self, dim, heads, ffn, seq):
        super().__init__()
        self.attn = CausalAttention(dim, heads, seq)
        self.ln1 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, ffn), nn.ReLU(), nn.Linear(ffn, dim))
        self.ln2 = nn.LayerNorm(dim)

    def forward(self, x):
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class GPT(nn.Module):
    def __init__(self, vocab, dim, heads, layers, seq, ffn):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = nn.Sequential(*[GPTBlock(dim, heads, ffn, seq) for _ in range(layers)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.head(self.blocks(self.embed(ids) + self.pos[: ids.shape[1]]))


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class VibeAttention(nn.Module):  # softmax(mask(x xᵀ / √d)) x, no parameters
    def __init__(self, seq):
        super().__init__()
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1))

    def forward(self, x):
        t, c = x.shape[1], x.shape[2]
        att = (x @ x.transpose(1, 2)) * (1.0 / math.sqrt(c))
        return att.masked_fill(self.mask[:t, :t], float("-inf")).softmax(-1) @ x


class VibeBlock(nn.Module):
    def __init__(self, dim, seq, kind):
        super().__init__()
        self.kind = kind
        self.norm = RMSNorm(dim)
        self.attn = VibeAttention(seq)
        if kind in ("ffn", "gate"):
            self.ffn = nn.Linear(dim, dim)
        if kind == "gate":
            self.gate = nn.Linear(dim, dim)

    def forward(self, x):
        y = self.attn(self.norm(x))
        if self.kind in ("ffn", "gate"):
            y = F.gelu(self.ffn(y))
        return (self.gate(x) if self.kind == "gate" else x) + y


class VibeNet(nn.Module):
    def __init__(self, vocab, dim, layers, seq, kind):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = nn.Sequential(*[VibeBlock(dim, seq, kind) for _ in range(layers)])
        self.expand = nn.Linear(dim, 3 * dim)
        self.head = nn.Linear(3 * dim, vocab)

    def forward(self, ids):
        x = self.blocks(self.embed(ids) + self.pos[: ids.shape[1]])
        return self.head(F.gelu(self.expand(x)))


def summary(times):
    s = sorted(times)
    n = len(s)
    median = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    return {"median": median, "min": s[0], "max": s[-1], "n": n, "times": list(times)}


def time_steps(fn, steps, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return summary(times)


def time_pair(fa, fb, steps, warmup):
    """fa and fb alternately (fa first on odd steps), so a slow spell falls on both."""
    for _ in range(warmup):
        fa()
        fb()
    ta, tb = [], []
    for i in range(1, steps + 1):
        for k in (0, 1):
            first = (i + k) % 2 == 1
            t0 = time.perf_counter()
            (fa if first else fb)()
            (ta if first else tb).append(time.perf_counter() - t0)
    return summary(ta), summary(tb)


def trainer(model, x, y, vocab):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).view(-1, vocab), y.view(-1))
        loss.backward()
        opt.step()

    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--ops", type=int, default=200000)
    ap.add_argument("--out", default="")
    ap.add_argument("--compile", action="store_true",
                    help="the four training steps only, each model through torch.compile (its compilation in the warm-up)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    results = {"threads": torch.get_num_threads(), "torch": torch.__version__, "cases": {},
               "blas": blas.group(1) if blas else "?", "cpu_capability": torch.backends.cpu.get_cpu_capability()}

    cases = [
        ("gpt", lambda: GPT(65, 64, 2, 1, 64, 128), 65, 32, 64),
        ("vibenet_plain", lambda: VibeNet(256, 128, 4, 128, "plain"), 256, 16, 128),
        ("vibenet_ffn", lambda: VibeNet(256, 128, 4, 128, "ffn"), 256, 16, 128),
        ("vibenet_gate", lambda: VibeNet(256, 128, 4, 128, "gate"), 256, 16, 128),
    ]
    steps = {}
    for name, make, vocab, B, T in cases:
        torch.manual_seed(1)
        model = make()
        torch.manual_seed(0)
        x, y = torch.randint(0, vocab, (B, T)), torch.randint(0, vocab, (B, T))
        step = trainer(torch.compile(model) if args.compile else model, x, y, vocab)
        s = time_steps(step, args.steps, args.warmup)
        s["tokens"] = B * T
        s["params"] = sum(p.numel() for p in model.parameters())
        results["cases"][name] = s
        steps[name] = (model, step, s["median"])

    if args.compile:
        results["compiled"] = True
        write(results, args.out)
        return

    # every module carries a forward hook that does nothing; the same model
    # without them alternates with it
    _, plain_step, _ = steps["vibenet_plain"]
    torch.manual_seed(1)
    hooked = VibeNet(256, 128, 4, 128, "plain")
    torch.manual_seed(0)
    x, y = torch.randint(0, 256, (16, 128)), torch.randint(0, 256, (16, 128))
    handles = [m.register_forward_hook(lambda *a: None) for n, m in hooked.named_modules() if n]
    s, plain = time_pair(trainer(hooked, x, y, 256), plain_step, args.steps, args.warmup)
    s["plain"] = plain
    s["probes"] = len(handles)
    results["cases"]["idle_probes"] = s

    a, b = torch.tensor([1.0]), torch.tensor([2.0])
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(args.ops):
            a + b
        best = min(best, (time.perf_counter() - t0) / args.ops)
    results["cases"]["add"] = {"median": best, "n": args.ops}

    m = 1024
    a, b = torch.randn(m, m), torch.randn(m, m)
    s = time_steps(lambda: a @ b, args.steps, args.warmup)
    s["flops"] = 2 * m * m * m
    results["cases"]["blas"] = s

    write(results, args.out)


def write(results, out):
    text = json.dumps(results)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
