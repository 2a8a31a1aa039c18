"""The checks every family's parity test (test_phi_parity, test_gptj_parity,
test_phi3_parity, ...) runs on each of its tiny random models, written once:
the model loaded and compared by test_pretrained_parity's compare, the folder
anatomy saves read back by transformers, a batch padded on the left
(phi_parity.lua) against each text alone and against transformers' padded
batch and generate, bfloat16 against transformers' cast, TransformerLens
4.3's bridge by test_tl_parity's check_names, the config switches refused by
name, and the summary the test ends with. Each returns the number of checks
it made (its failures appended to the caller's list); a family's own models
and checks stay in its test.
"""
import contextlib
import io
import json
import os
import subprocess
import sys

import torch
import transformers
from safetensors import safe_open
import test_pretrained_parity as P

HERE = os.path.dirname(os.path.abspath(__file__))
TEXTS = ["The quick brown fox", "jumps over the lazy dog. Ünïcödé 👋🏽", "1234!"]


def folder_name(name):
    return "".join(c if c.isalnum() else "_" for c in name)


def run(name, exe, folder, hf, tmp, tok, failures):
    """The folder through anatomy (saving it to folder-saved, its final norm edited) against transformers' hf by
    P.compare. Returns (anatomy's numbers, checks, the saved folder), or (None, 0, None) when anatomy failed."""
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = hf.config.vocab_size - 1
    saved = folder + "-saved"
    got, err = P.run(exe, folder, tmp, saved)
    if err:
        failures.append(f"{name}: anatomy failed: {err}")
        return None, 0, None
    return got, P.compare(name, got, hf, tok, failures), saved


def saved_logits(name, got, saved, failures):
    """save_pretrained: transformers reads back the edited model to anatomy's logits. Returns (1, the model read)."""
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(saved).eval()
    with torch.no_grad():
        logits = reloaded(torch.tensor([got["ids"]])).logits[0]
    excess, d = P.max_excess(got["edited_logits"], logits)
    if excess > 0:
        failures.append(f"{name}: save_pretrained: transformers' logits of the saved model differ by {d}")
    return 1, reloaded


def padded(exe, folder, tmp):
    """phi_parity.lua's padded batch of TEXTS: (its json, None) or (None, anatomy's error)."""
    out = os.path.join(tmp, "padded.json")
    proc = subprocess.run([exe, "--threads=1", os.path.join(HERE, "phi_parity.lua"), folder, out] + TEXTS,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return None, (proc.stdout + proc.stderr).strip()
    return json.load(open(out)), None


def check_padded(name, got, hf, failures):
    """Each text's rows of the left-padded batch against its run alone and
    against transformers' padded batch; the batch's greedy continuation."""
    checks, worst = 0, 0.0
    mask = torch.tensor(got["mask"], dtype=torch.bool)
    B, T = mask.shape
    ids = torch.zeros(B, T, dtype=torch.long)
    for b, row in enumerate(got["ids"]):
        ids[b, T - len(row):] = torch.tensor(row)
    am = mask.long()
    with torch.no_grad():
        ref = hf(ids, attention_mask=am, position_ids=(am.cumsum(-1) - 1).clamp(min=0)).logits
    padded = torch.tensor(got["padded"])
    for b, row in enumerate(got["ids"]):
        n = len(row)
        real = padded[b, T - n:]
        excess, d = P.max_excess(got["alone"][b], real)
        checks += 1
        worst = max(worst, d)
        if excess > 0:
            failures.append(f"{name}: padded text {b + 1}: its rows differ from its run alone by {d}")
        excess, d = P.max_excess(real.tolist(), ref[b, T - n:])
        checks += 1
        if excess > 0:
            failures.append(f"{name}: padded text {b + 1}: differs from transformers' padded batch by {d}")
    gen = hf.generate(ids, attention_mask=am, max_new_tokens=6, do_sample=False)
    checks += 1
    if got["generated"] != gen.tolist():
        failures.append(f"{name}: padded greedy generation {got['generated']} vs transformers' {gen.tolist()}")
    print(f"      padded batch of {B} (left): largest difference from the texts alone {worst:.3g}")
    return checks


def check_router(name, got, hf, layers, failures, title="router logits"):
    """The MoE layers' router logits (anatomy's layer numbers, from 1, in the order of got's router, tl, ...: what
    moe_parity.lua and qwen3_parity.lua write for the first text) against transformers' (output_router_logits),
    the top_k experts they choose, the TransformerLens name hook_router_logits resolving to router_logits; the
    experts' shares summing to the MLP's output (1e-5), at most top_k of them on a token, and the logits with
    expert_out hooked. Returns its checks."""
    checks = 0

    def check(what, ok, detail=""):
        nonlocal checks
        checks += 1
        if not ok:
            failures.append(f"{name}: {what} {detail}")

    ids = torch.tensor([got["ids"][0]])
    with torch.no_grad():
        o = hf(ids, output_router_logits=True)
    check("number of router logits", len(got["router"] or []) == len(o.router_logits))
    worst, K = 0.0, hf.config.num_experts_per_tok
    for k, r in enumerate(o.router_logits[:len(layers)]):  # transformers': (B * T, E), the MoE layers in order
        l = layers[k]
        excess, d = P.max_excess(got["router"][k], r)
        worst = max(worst, d if isinstance(d, float) else float("inf"))
        check(f"router logits of layer {l}", excess <= 0, f"(max difference {d})")
        chosen = torch.tensor(got["router"][k]).topk(K).indices.sort().values
        check(f"experts chosen in layer {l}", torch.equal(chosen, r.topk(K).indices.sort().values))
        want = f"blocks.{l}.mlp.router_logits"
        check(f"blocks.{l - 1}.mlp.hook_router_logits resolves", got["tl"][k] == want, f"to {got['tl'][k]!r}, not {want!r}")
    print(f"      {title}: largest difference {worst:.3g}")
    check("the experts' shares sum to the MLP's output", got["expert_gap"] <= 1e-5, f"(gap {got['expert_gap']})")
    check("experts with a share of one token", 0 < got["experts_used"] <= K, f"{got['experts_used']}, top_k {K}")
    excess, d = P.max_excess(got["hooked_logits"], o.logits[0])
    check("logits with expert_out hooked", excess <= 0, f"(max difference {d})")
    return checks


def padded_batch(name, exe, folder, tmp, hf, failures):
    """padded and check_padded: its checks, or none (and a failure) when anatomy failed."""
    pad, err = padded(exe, folder, tmp)
    if err:
        failures.append(f"{name}: padded batch: anatomy failed: {err}")
        return 0
    return check_padded(name, pad, hf, failures)


def bfloat16(name, exe, folder, tmp, ids, hf, failures, show_logit=False):
    """The folder in bfloat16 (dtype = 'bfloat16') against hf cast to it, within 0.02 + 0.02 * |logit|; hf is cast
    back to float32 after (its weights rounded: run it last). 1 check."""
    got16, err = P.run(exe, folder, tmp, dtype="bfloat16")
    if err:
        failures.append(f"{name}: bfloat16: anatomy failed: {err}")
        return 1
    with torch.no_grad():
        ref = hf.to(torch.bfloat16)(torch.tensor([ids])).logits[0].float()
    hf.float()
    d = (torch.tensor(got16["logits"]) - ref).abs()
    largest = f" (largest logit {ref.abs().max().item():.3g})" if show_logit else ""
    print(f"      bfloat16 logits: largest difference {d.max().item():.3g}{largest}")
    if got16["dtype"] != "bfloat16" or not bool((d <= 0.02 + 0.02 * ref.abs()).all()):
        failures.append(f"{name}: bfloat16 logits ({got16['dtype']}) differ by {d.max().item()}")
    return 1


def model_checks(name, exe, folder, hf, tmp, tok, failures):
    """run (P.compare), saved_logits and padded_batch on one model. Returns (anatomy's numbers, checks, the model
    transformers read back from anatomy's save_pretrained, for the family's own checks of it), or (None, 0, None)
    when anatomy failed."""
    got, n, saved = run(name, exe, folder, hf, tmp, tok, failures)
    if got is None:
        return None, 0, None
    k, reloaded = saved_logits(name, got, saved, failures)
    return got, n + k + padded_batch(name, exe, folder, tmp, hf, failures), reloaded


def tally(name, n, before, failures, detail=""):
    """A model's n checks, those failed since `before` taken off: what it passed. Prints its line (detail after)."""
    print(f"{'ok  ' if len(failures) == before else 'FAIL'}  {name}: {n} checks{detail}")
    return n - (len(failures) - before)


def boot_bridge(folder, quiet=False):
    """TransformerLens 4.3's bridge on the folder (transformers' eager attention); quiet: its output silenced, in
    compatibility mode without weight processing. None (and a line saying so) without transformer-lens."""
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:
        print("skip  TransformerLens's hook names: the venv has no transformer-lens")
        return None
    eager = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    if not quiet:
        return TransformerBridge.boot_transformers(folder, hf_model=eager, device="cpu")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        bridge = TransformerBridge.boot_transformers(folder, hf_model=eager, device="cpu")
        bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return bridge


def bridge_names(exe, tmp, folder, cfg, failures, skip=(), quiet=False, mapped=None, lead="", label="", then=None):
    """TransformerLens 4.3's bridge (boot_bridge) on the folder (its config cfg): every tensor it caches under a
    name anatomy maps, found in anatomy's cache by that name and equal (test_tl_parity's check_names; mapped, if
    given, the names it must find instead of test_tl_parity.MAPPED). lead is printed before check_names' line,
    label before each failure; then(bridge, failures), if given, runs after and returns its own checks passed.
    Returns the checks passed; none without transformer-lens."""
    try:
        import test_tl_parity
    except (ImportError, SystemExit):
        print("skip  TransformerLens's hook names: the venv has no transformer-lens")
        return 0
    bridge = boot_bridge(folder, quiet)
    if bridge is None:
        return 0
    every = test_tl_parity.MAPPED
    test_tl_parity.MAPPED = mapped or every
    try:
        print(lead, end="")
        n, failed = test_tl_parity.check_names(exe, HERE, tmp, folder, cfg, bridge, skip=skip)
    finally:
        test_tl_parity.MAPPED = every
    failures += [label + f for f in failed]
    return n + (then(bridge, failures) if then else 0)


def saved_names(folder):
    """The tensor names of the folder's model.safetensors."""
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        return set(f.keys())


def same_names(name, saved, folder, failures):
    """save_pretrained wrote the tensors transformers' own save_pretrained writes. 1 check."""
    if saved_names(saved) != saved_names(folder):
        failures.append(f"{name}: save_pretrained wrote {sorted(saved_names(saved) ^ saved_names(folder))[:4]} "
                        "where transformers' save_pretrained does not (or the reverse)")
    return 1


def fused_layout(label, exe, tmp, tok, folder, hf, layer, failures):
    """hf saved beside its folder in transformers 5's own layout (save_original_format=False), the experts fused
    (layer's mlp.experts.gate_up_proj, down_proj), to transformers' logits. Returns the checks passed (1 or 0)."""
    fused = folder + "-fused"
    hf.save_pretrained(fused, save_original_format=False)
    tok.save(os.path.join(fused, "tokenizer.json"))
    names = saved_names(fused)
    got, err = P.run(exe, fused, tmp)
    with torch.no_grad():
        ref = hf(torch.tensor([tok.encode(P.TEXT).ids])).logits[0] if not err else None
    excess, d = P.max_excess(got["logits"], ref) if not err else (float("inf"), err)
    if f"model.layers.{layer}.mlp.experts.gate_up_proj" not in names:
        failures.append(f"fused layout: transformers wrote no gate_up_proj ({sorted(names)[:6]})")
    elif excess > 0:
        failures.append(f"{label}fused layout (mlp.experts.gate_up_proj, down_proj): logits differ by {d}")
    else:
        print(f"ok    {label}fused layout (mlp.experts.gate_up_proj, down_proj): logits within tolerance ({d:.3g})")
        return 1
    return 0


def refusal(want, err, failures):
    """1 when anatomy's error err says want (the switch refused by name), else 0 and a failure."""
    if err and want in err:
        print(f"ok    refused: {want}")
        return 1
    failures.append(f"expected an error with '{want}', got {err!r}")
    return 0


def refused(exe, tmp, cases, build, failures):
    """Each case (what, want): the folder build(i, what) makes, refused by anatomy with want in its error (a build
    that returns None has said why in failures). Returns the checks passed."""
    passed = 0
    for i, (what, want) in enumerate(cases):
        folder = build(i, what)
        if folder is not None:
            passed += refusal(want, P.run(exe, folder, tmp)[1], failures)
    return passed


def finish(passed, failures):
    for f in failures:
        print("FAIL  " + f)
    print(f"largest logit difference: {P.largest[0]:.3g}")
    print(f"{passed} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)
