"""The PyTorch half of the GPU benchmark: bench/gpu.lua's cases (the same
models as bench/peer.py, the same batch, AdamW settings and bf16 autocast)
in eager mode, through torch.compile, and through
torch.compile(mode='reduce-overhead') (CUDA graphs), timed the same way: the
median of windows of steps, each window between two synchronisations.
Compilation falls in the warm-up. In eager mode, one more step is counted:
the operators it dispatches ("aten::" events of torch.profiler, nested ones
included, as anatomy's torch.profiler.count_ops counts them) and, on a GPU,
its host synchronisations (what torch.cuda.set_sync_debug_mode flags).
Writes one JSON object to --out.

    PYTHON bench/gpu.py --mode eager|compile|reduce-overhead --out FILE [--steps N] [--vocab N] [--smoke]
"""
import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer import GPT, VibeNet  # noqa: E402  (the models bench/bench.lua compares against)


def cases(smoke, vocab):
    s = smoke
    seed_vocab = 512 if s else vocab

    def seed(layers):  # VibeNet at the seed's scale: dim 512 (expansion 1536, untied head), B16 T512, bf16
        return ("seed_L%d" % layers, lambda: VibeNet(seed_vocab, 64 if s else 512, layers, 32 if s else 512, "ffn"), seed_vocab,
                2 if s else 16, 32 if s else 512, torch.bfloat16)
    return [
        ("gpt", lambda: GPT(65, 64, 2, 1, 64, 128), 65, 2 if s else 32, 16 if s else 64, None),
        ("vibenet_plain", lambda: VibeNet(256, 128, 4, 128, "plain"), 256, 2 if s else 16, 16 if s else 128, None),
        ("vibenet_gate", lambda: VibeNet(256, 128, 4, 128, "gate"), 256, 2 if s else 16, 16 if s else 128, None),
        seed(2),
        seed(12),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["eager", "compile", "reduce-overhead"], default="eager")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--only", default="")
    ap.add_argument("--smoke", action="store_true", help="toy sizes: a check that the script runs, not a measurement")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.smoke:
        args.steps, args.windows, args.warmup = 2, 2, 1
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    kind = "cuda" if cuda else "cpu"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def per_step(fn):
        for _ in range(args.warmup):
            fn()
        sync()
        times = []
        for _ in range(args.windows):
            t0 = time.perf_counter()
            for _ in range(args.steps):
                fn()
            sync()
            times.append((time.perf_counter() - t0) / args.steps)
        return {"median": statistics.median(times), "min": min(times), "max": max(times), "times": times}

    def count(fn):
        """Operators and host synchronisations of one call of fn."""
        from torch.profiler import ProfilerActivity, profile
        sync()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    fn()
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
        by_name = {}
        for e in prof.events():
            if e.name.startswith("aten::"):
                by_name[e.name] = by_name.get(e.name, 0) + 1
        syncs = sum(1 for w in caught if "synchronizing" in str(w.message)) if cuda else None
        return {"ops": sum(by_name.values()), "syncs": syncs, "by_name": by_name}

    results = {"side": "pytorch", "mode": args.mode, "torch": torch.__version__, "cuda": torch.version.cuda,
               "device": torch.cuda.get_device_name(0) if cuda else "cpu", "smoke": args.smoke,
               "steps": args.steps, "windows": args.windows, "cases": {}}
    for name, make, V, B, T, dtype in cases(args.smoke, args.vocab):
        if args.only and args.only not in name:
            continue
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(1)
        model = make().to(device)
        params = sum(p.numel() for p in model.parameters())
        torch.manual_seed(0)
        x = torch.randint(0, V, (B, T), device=device)
        y = torch.randint(0, V, (B, T), device=device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01,
                                capturable=args.mode == "reduce-overhead" and cuda)
        forward = model if args.mode == "eager" else torch.compile(model, mode=None if args.mode == "compile" else "reduce-overhead")

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device_type=kind, dtype=dtype, enabled=dtype is not None):
                logits = forward(x)
            loss = F.cross_entropy(logits.float().view(-1, V), y.view(-1))
            loss.backward()
            opt.step()

        s = per_step(step)
        if args.mode == "eager":
            s["count"] = count(step)
        s["peak_bytes"] = torch.cuda.max_memory_allocated() if cuda else None
        s["tokens"], s["params"], s["dtype"] = B * T, params, "bfloat16" if dtype else "float32"
        results["cases"][name + "." + args.mode] = s
        del model, opt, forward
        if cuda:
            torch.cuda.empty_cache()
    text = json.dumps(results)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
