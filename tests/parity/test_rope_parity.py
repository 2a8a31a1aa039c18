"""nn.RoPEAttention and nn.SwiGLU against PyTorch on the same weights and
input: outputs, attention patterns, and the gradients of the input and every
parameter. The reference is written here from the published definitions
(rotary embeddings with the halves rotated as Llama's and GPT-NeoX's code
does, grouped-query attention, Llama 3.1's and linear RoPE scaling, a sliding
window, SwiGLU; Gemma's scale and soft-capping, QK-norm per head (Qwen3,
Gemma 3 with its offset) and over the whole projection (OLMo 2), GPT-J's
interleaved pairs, Phi-3's longrope on either side of
original_max_positions, Gemma's GeGLU). Cases: grouped-query, multi-query,
partial rotary, biases, head_dim apart from dim/heads, the scalings, a
window, no causal mask, each of those; and
the output again with no pattern kept, which LibTorch 2.x computes with its
fused scaled_dot_product_attention.

Tolerance: |anatomy - pytorch| <= 1e-5 + 1e-4 * |pytorch| (float32).
Usage: test_rope_parity.py ANATOMY_EXECUTABLE
"""
import json
import math
import os
import sys
import tempfile

import torch

import safetensors_io

B, T = 2, 7


def inv_freq(rot, theta, scaling=None):
    f = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    if scaling is None:
        return f
    if scaling["scaling"] == "linear":
        return f / scaling["factor"]
    factor, lo, hi, old = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["original_max_positions"]
    wavelen = 2 * math.pi / f
    out = []
    for fr, wl in zip(f.tolist(), wavelen.tolist()):
        if wl < old / hi:
            out.append(fr)
        elif wl > old / lo:
            out.append(fr / factor)
        else:
            s = (old / wl - lo) / (hi - lo)
            out.append((1 - s) * fr / factor + s * fr)
    return torch.tensor(out, dtype=torch.float64)


def rope_attention(P, x, c):
    o = c["options"]
    C, H = c["dim"], c["heads"]
    KV = o.get("kv_heads", H)
    D = o.get("head_dim", C // H)
    R = o.get("rotary_dim", D)
    q = (x @ P["q.weight"].t() + P.get("q.bias", 0)).view(B, T, H, D).transpose(1, 2)
    k = (x @ P["k.weight"].t() + P.get("k.bias", 0)).view(B, T, KV, D).transpose(1, 2)
    v = (x @ P["v.weight"].t() + P.get("v.bias", 0)).view(B, T, KV, D).transpose(1, 2)
    norm = o.get("qk_norm", "none")
    if norm != "none":  # an RMSNorm over each head's dims (Qwen3), or over the whole projection (OLMo 2)
        def rms(t, w):
            return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + o.get("qk_norm_eps", 1e-6)) * (w + o.get("qk_norm_offset", 0))

        if norm == "head":
            q, k = rms(q, P["q_norm.weight"]), rms(k, P["k_norm.weight"])
        else:
            def whole(t, w):
                n, h = t.shape[1], t.shape[3]
                return rms(t.transpose(1, 2).reshape(B, T, n * h), w).view(B, T, n, h).transpose(1, 2)

            q, k = whole(q, P["q_norm.weight"]), whole(k, P["k_norm.weight"])
    kind = o.get("scaling", "default")
    if kind == "longrope":  # Phi-3: the long factors once the last position is past original_max_positions
        f = inv_freq(R, o.get("theta", 10000.0))
        factors = o["long_factor"] if T > o["original_max_positions"] else o["short_factor"]
        f = f / torch.tensor(factors, dtype=torch.float64)
    else:
        f = inv_freq(R, o.get("theta", 10000.0), o if kind != "default" else None)
    freqs = torch.arange(T, dtype=torch.float32)[:, None] * f.float()[None, :]
    interleaved = o.get("interleaved", False)
    emb = freqs.repeat_interleave(2, -1) if interleaved else torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos() * o.get("attention_factor", 1.0), emb.sin() * o.get("attention_factor", 1.0)

    def rot(t):
        r, rest = t[..., :R], t[..., R:]
        if interleaved:  # GPT-J's rotate_every_two
            turned = torch.stack([-r[..., 1::2], r[..., ::2]], -1).flatten(-2)
        else:
            turned = torch.cat([-r[..., R // 2:], r[..., : R // 2]], -1)
        return torch.cat([r * cos + turned * sin, rest], -1)

    q, k = rot(q), rot(k)
    k = k.repeat_interleave(H // KV, 1)
    v = v.repeat_interleave(H // KV, 1)
    att = q @ k.transpose(-2, -1) * o.get("scale", 1 / math.sqrt(D))
    if o.get("softcap"):  # Gemma 2, before the mask
        att = torch.tanh(att / o["softcap"]) * o["softcap"]
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    masked = torch.zeros(T, T, dtype=torch.bool)
    if o.get("causal", True):
        masked |= j > i
    if o.get("sliding_window", 0):
        masked |= (i - j) >= o["sliding_window"]
    att = att.masked_fill(masked, float("-inf")).softmax(-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, H * D)
    return y @ P["o.weight"].t() + P.get("o.bias", 0), att


def swiglu(P, x, activation="silu"):
    lin = lambda n, t: t @ P[n + ".weight"].t() + P.get(n + ".bias", 0)
    F = torch.nn.functional
    act = {"silu": F.silu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "gelu": F.gelu}[activation]
    return lin("down", act(lin("gate", x)) * lin("up", x))


CASES = [
    {"name": "gqa", "dim": 16, "heads": 4, "options": {"kv_heads": 2}},
    {"name": "mqa_bias", "dim": 16, "heads": 4, "options": {"kv_heads": 1, "qkv_bias": True, "out_bias": True}},
    {"name": "partial_rotary", "dim": 16, "heads": 2, "options": {"rotary_dim": 4, "qkv_bias": True, "out_bias": True}},
    {"name": "head_dim", "dim": 12, "heads": 3, "options": {"head_dim": 8, "kv_heads": 3}},
    {"name": "llama3", "dim": 16, "heads": 2, "options": {"theta": 500000.0, "scaling": "llama3", "factor": 8.0,
                                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                          "original_max_positions": 16}},
    {"name": "linear", "dim": 16, "heads": 2, "options": {"scaling": "linear", "factor": 4.0}},
    {"name": "window", "dim": 16, "heads": 4, "options": {"kv_heads": 2, "sliding_window": 3}},
    {"name": "not_causal", "dim": 8, "heads": 2, "options": {"causal": False}},
    {"name": "scale_softcap", "dim": 16, "heads": 4, "options": {"kv_heads": 2, "scale": 0.2, "softcap": 1.5,
                                                                  "sliding_window": 4}},
    {"name": "qk_norm_head", "dim": 16, "heads": 4, "options": {"kv_heads": 2, "head_dim": 8, "qk_norm": "head",
                                                                 "qk_norm_eps": 1e-5, "qk_norm_offset": 1.0}},
    {"name": "qk_norm_proj", "dim": 16, "heads": 4, "options": {"kv_heads": 2, "qk_norm": "proj"}},
    {"name": "interleaved", "dim": 16, "heads": 2, "options": {"rotary_dim": 4, "interleaved": True}},
    {"name": "longrope_short", "dim": 16, "heads": 2, "options": {"rotary_dim": 4, "scaling": "longrope",
                                                                   "short_factor": [1.0, 1.5], "long_factor": [2.0, 7.0],
                                                                   "original_max_positions": 7, "attention_factor": 1.2}},
    {"name": "longrope_long", "dim": 16, "heads": 2, "options": {"scaling": "longrope", "short_factor": [1.0, 1.5, 1.1, 1.3],
                                                                  "long_factor": [2.0, 7.0, 3.0, 5.0],
                                                                  "original_max_positions": 6, "attention_factor": 1.2}},
    {"name": "swiglu", "kind": "swiglu", "dim": 8, "hidden": 20, "bias": False},
    {"name": "geglu", "kind": "swiglu", "dim": 8, "hidden": 12, "bias": False, "activation": "gelu_tanh"},
    {"name": "swiglu_bias", "kind": "swiglu", "dim": 8, "hidden": 12, "bias": True},
]


def params(c):
    if c.get("kind") == "swiglu":
        shapes = {"gate.weight": (c["hidden"], c["dim"]), "up.weight": (c["hidden"], c["dim"]), "down.weight": (c["dim"], c["hidden"])}
        if c["bias"]:
            shapes.update({"gate.bias": (c["hidden"],), "up.bias": (c["hidden"],), "down.bias": (c["dim"],)})
        return shapes
    o = c["options"]
    C, H = c["dim"], c["heads"]
    KV, D = o.get("kv_heads", H), o.get("head_dim", C // H)
    shapes = {"q.weight": (H * D, C), "k.weight": (KV * D, C), "v.weight": (KV * D, C), "o.weight": (C, H * D)}
    if o.get("qkv_bias"):
        shapes.update({"q.bias": (H * D,), "k.bias": (KV * D,), "v.bias": (KV * D,)})
    if o.get("out_bias"):
        shapes["o.bias"] = (C,)
    if o.get("qk_norm", "none") != "none":
        head = o["qk_norm"] == "head"
        shapes.update({"q_norm.weight": (D if head else H * D,), "k_norm.weight": (D if head else KV * D,)})
    return shapes


def main():
    exe = sys.argv[1]
    torch.manual_seed(0)
    tensors, expected = {}, {}
    for c in CASES:
        P = {n: (torch.randn(*s) * 0.3).requires_grad_(True) for n, s in params(c).items()}
        x = torch.randn(B, T, c["dim"], requires_grad=True)
        g = torch.randn(B, T, c["dim"])
        if c.get("kind") == "swiglu":
            y, att = swiglu(P, x, c.get("activation", "silu")), None
        else:
            y, att = rope_attention(P, x, c)
        (y * g).sum().backward()
        for n, p in P.items():
            tensors[f"{c['name']}.{n}"] = p.detach()
            expected[f"{c['name']}.grad.{n}"] = p.grad
        tensors[f"{c['name']}.x"], tensors[f"{c['name']}.g"] = x.detach(), g
        expected[f"{c['name']}.y"], expected[f"{c['name']}.dx"] = y.detach(), x.grad
        if att is not None:
            expected[f"{c['name']}.pattern"] = att.detach()
            expected[f"{c['name']}.y_fused"] = y.detach()  # the output without a pattern kept (fused where LibTorch has it)
    with tempfile.TemporaryDirectory() as tmp:
        cases, inp, outp = (os.path.join(tmp, n) for n in ("cases.json", "in.safetensors", "out.safetensors"))
        with open(cases, "w") as f:
            json.dump(CASES, f)
        safetensors_io.save(inp, tensors)
        if not safetensors_io.run_lua(exe, "rope_parity.lua", cases, inp, outp):
            sys.exit(1)
        got, _ = safetensors_io.load(outp)
    passed = failed = 0
    worst = 0.0
    for name, want in sorted(expected.items()):
        have = got.get(name)
        if have is None or have.shape != want.shape:
            failed += 1
            print(f"FAIL  {name}: {'missing' if have is None else tuple(have.shape)} vs {tuple(want.shape)}")
            continue
        d = (have.double() - want.double()).abs()
        ok = bool((d <= 1e-5 + 1e-4 * want.double().abs()).all())
        worst = max(worst, d.max().item())
        passed += ok
        failed += not ok
        if not ok:
            print(f"FAIL  {name}: max difference {d.max().item():.3g}")
    print(f"largest difference: {worst:.3g} over {len(expected)} tensors")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
