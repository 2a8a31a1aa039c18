"""Mixtral (model_type "mixtral"): tiny random MixtralForCausalLM models
written here by `transformers` with save_pretrained load through
models.from_pretrained (nn.MoE as each layer's MLP) and give transformers'
numbers, through test_pretrained_parity's checks (its compare): token ids,
logits, every hidden state, every attention pattern, the same with every
hook point on, the loss and greedy generation with the key/value cache,
token for token. Then: the model anatomy saves (its final norm edited) is
written in the Hub's per-expert layout, as transformers' save_pretrained
writes it, and read back by transformers to the same logits; each layer's
router logits (blocks.L.mlp.router_logits, and TransformerLens's
blocks.{l}.mlp.hook_router_logits resolving to it) are transformers'
(output_router_logits=True); each expert's share (expert_out) sums to the
MLP's output, at most top_k of them non-zero for a token, and hooking it
leaves the logits as they are; a batch of three texts padded on the left
gives each text's logits as when it runs alone and transformers' logits of
the same padded batch, and its greedy continuation with the attention mask
is transformers' generate of the same batch; TransformerLens 4.3's bridge
(unprocessed) gives the same router logits (its blocks.{l}.mlp.gate.hook_out)
and MLP outputs (blocks.{l}.hook_mlp_out), where it is installed, and every
tensor it caches under a name anatomy maps is found in anatomy's cache by
that name and equal (test_tl_parity's check_names: mlp.hook_pre and
hook_post, the MoE's input and output, hook_expert_weights and
hook_expert_indices among them). A folder in transformers 5's
fused layout (mlp.experts.gate_up_proj, down_proj) loads to the same logits;
output_router_logits = true is refused by name.

Tolerance (float32): test_pretrained_parity's, |anatomy - transformers| <=
1e-4 + 1e-4 * |transformers| for logits, hidden states, patterns and router
logits; loss within 1e-5; ids and expert choices exact. The experts' shares
against the MLP's output: 1e-5.
Needs transformers and tokenizers (the PyPI build's venv); exits 77 without.
Usage: test_moe_parity.py ANATOMY_EXECUTABLE
"""
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
    from safetensors import safe_open
    from transformers import MixtralConfig, MixtralForCausalLM
    from test_bpe_parity import llama3_like
    import test_pretrained_parity as P
except ImportError as e:
    print(f"skip: {e}; the PyPI build's venv has transformers and tokenizers (scripts/test)")
    sys.exit(77)

try:  # TransformerLens's bridge, for the hook tensors by its names (skipped without it)
    from transformer_lens.model_bridge import TransformerBridge
except ImportError:
    TransformerBridge = None

TEXTS = ["The quick brown fox", "jumps over the lazy dog. Ünïcödé 👋🏽", "1234!"]


def mixtral(tmp, name, tok, **config):
    base = dict(num_local_experts=4, num_experts_per_tok=2)
    base.update(config)
    return P.make_llama(tmp, name, tok, cls=MixtralForCausalLM, config_cls=MixtralConfig, **base)


def run_moe(exe, folder, tmp):
    out = os.path.join(tmp, "moe.json")
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([exe, "--threads=1", os.path.join(here, "moe_parity.lua"), folder, out] + TEXTS,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return None, (proc.stdout + proc.stderr).strip()
    return json.load(open(out)), None


def saved_names(folder):
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        return set(f.keys())


def check_moe(name, got, hf, failures):
    """Router logits, the TransformerLens name, the experts' shares, the padded batch and its generation."""
    checks = 0

    def check(what, ok, detail=""):
        nonlocal checks
        checks += 1
        if not ok:
            failures.append(f"{name}: {what} {detail}")

    ids = torch.tensor([got["ids"][0]])
    with torch.no_grad():
        o = hf(ids, output_router_logits=True)
    check("number of router logits", len(got["router"]) == len(o.router_logits))
    worst = 0.0
    for i, r in enumerate(o.router_logits):  # transformers': (B * T, E)
        excess, d = P.max_excess(got["router"][i], r)
        worst = max(worst, d if isinstance(d, float) else float("inf"))
        check(f"router logits of layer {i + 1}", excess <= 0, f"(max difference {d})")
        chosen = torch.tensor(got["router"][i]).topk(hf.config.num_experts_per_tok).indices.sort().values
        check(f"experts chosen in layer {i + 1}", torch.equal(chosen, r.topk(hf.config.num_experts_per_tok).indices.sort().values))
        want = f"blocks.{i + 1}.mlp.router_logits"
        check(f"blocks.{i}.mlp.hook_router_logits resolves", got["tl"][i] == want, f"to {got['tl'][i]!r}, not {want!r}")
    print(f"      router logits: largest difference {worst:.3g}")
    check("the experts' shares sum to the MLP's output", got["expert_gap"] <= 1e-5, f"(gap {got['expert_gap']})")
    check("experts with a share of one token", 0 < got["experts_used"] <= hf.config.num_experts_per_tok,
          f"{got['experts_used']}, top_k {hf.config.num_experts_per_tok}")
    excess, d = P.max_excess(got["hooked_logits"], o.logits[0])
    check("logits with expert_out hooked", excess <= 0, f"(max difference {d})")
    # the padded batch: each text's rows against its run alone and transformers' padded batch
    mask = torch.tensor(got["mask"], dtype=torch.bool)
    B, T = mask.shape
    batch = torch.zeros(B, T, dtype=torch.long)
    for b, row in enumerate(got["ids"]):
        batch[b, T - len(row):] = torch.tensor(row)
    am = mask.long()
    with torch.no_grad():
        ref = hf(batch, attention_mask=am, position_ids=(am.cumsum(-1) - 1).clamp(min=0)).logits
    padded, alone_worst = torch.tensor(got["padded"]), 0.0
    for b, row in enumerate(got["ids"]):
        real = padded[b, T - len(row):]
        excess, d = P.max_excess(got["alone"][b], real)
        alone_worst = max(alone_worst, d)
        check(f"padded text {b + 1} against its run alone", excess <= 0, f"(max difference {d})")
        excess, d = P.max_excess(real.tolist(), ref[b, T - len(row):])
        check(f"padded text {b + 1} against transformers' padded batch", excess <= 0, f"(max difference {d})")
    gen = hf.generate(batch, attention_mask=am, max_new_tokens=6, do_sample=False)
    check("padded greedy generation", got["generated"] == gen.tolist(), f"{got['generated']} vs transformers' {gen.tolist()}")
    print(f"      padded batch of {B} (left): largest difference from the texts alone {alone_worst:.3g}")
    return checks


def check_bridge(name, got, folder, failures, exe=None):
    """TransformerLens 4.3's bridge (unprocessed) on the same folder: its blocks.{l}.mlp.gate.hook_out (the
    router logits, (B * T, E)) and blocks.{l}.hook_mlp_out against anatomy's router_logits and MLP output; given
    exe, also every tensor it caches under a name anatomy maps, by that name (test_tl_parity's check_names: the
    MoE's mlp.hook_pre and hook_post, its input and output, mlp.gate.hook_out, hook_expert_weights and
    hook_expert_indices among them)."""
    if TransformerBridge is None:
        print("      TransformerLens's bridge: skipped (transformer_lens is not installed)")
        return 0
    checks, worst = 0, 0.0
    eager = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        bridge = TransformerBridge.boot_transformers(folder, hf_model=eager, device="cpu")
        bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    if exe is not None:
        import test_tl_parity
        with tempfile.TemporaryDirectory() as tmp:
            print("      ", end="")
            n, failed = test_tl_parity.check_names(exe, os.path.dirname(os.path.abspath(__file__)), tmp, folder, eager.config, bridge)
        checks += n
        failures += [f"{name}: TransformerLens: {f}" for f in failed]
    with torch.no_grad():
        _, cache = bridge.run_with_cache(torch.tensor([got["ids"][0]]))
    for i in range(len(got["router"])):
        for what, tl_name, mine in (("router logits", f"blocks.{i}.mlp.gate.hook_out", got["router"][i]),
                                    ("MLP output", f"blocks.{i}.hook_mlp_out", got["mlp_out"][i])):
            want = cache[tl_name]
            excess, d = P.max_excess(mine, want.reshape(torch.tensor(mine).shape))
            checks += 1
            worst = max(worst, d)
            if excess > 0:
                failures.append(f"{name}: TransformerLens's {tl_name} ({what}) differs by {d}")
    print(f"      TransformerLens 4.3's bridge: {checks} hook tensors, largest difference {worst:.3g}")
    return checks


def main():
    exe = sys.argv[1]
    passed, failures = 0, []
    tok = llama3_like()
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            ("mixtral: 4 experts, top-2, grouped-query", dict()),
            ("mixtral: 5 experts, top-3, sliding_window 4, multi-query", dict(num_local_experts=5, num_experts_per_tok=3,
                                                                             sliding_window=4, num_key_value_heads=1)),
        ]
        for name, config in cases:
            folder, hf = mixtral(tmp, "".join(c if c.isalnum() else "_" for c in name), tok, **config)
            hf.generation_config.eos_token_id = None
            hf.generation_config.pad_token_id = hf.config.vocab_size - 1
            saved = folder + "-saved"
            got, err = P.run(exe, folder, tmp, saved)
            if err:
                failures.append(f"{name}: anatomy failed: {err}")
                continue
            before = len(failures)
            n = P.compare(name, got, hf, tok, failures)
            # save_pretrained: the layout transformers writes, read back by transformers
            n += 2
            if saved_names(saved) != saved_names(folder):
                failures.append(f"{name}: save_pretrained wrote {sorted(saved_names(saved) ^ saved_names(folder))[:4]} "
                                "where transformers' save_pretrained does not (or the reverse)")
            reloaded = transformers.AutoModelForCausalLM.from_pretrained(saved).eval()
            with torch.no_grad():
                logits = reloaded(torch.tensor([got["ids"]])).logits[0]
            excess, d = P.max_excess(got["edited_logits"], logits)
            if excess > 0:
                failures.append(f"{name}: save_pretrained: transformers' logits of the saved model differ by {d}")
            moe, err = run_moe(exe, folder, tmp)
            if err:
                failures.append(f"{name}: anatomy failed on the router and padded batch: {err}")
            else:
                n += check_moe(name, moe, hf, failures) + check_bridge(name, moe, folder, failures, exe)
            passed += n - (len(failures) - before)
            print(f"{'ok  ' if len(failures) == before else 'FAIL'}  {name}: {n} checks")
        # transformers 5's own layout (save_original_format=False): the experts fused
        folder, hf = mixtral(tmp, "fused", tok)
        fused = folder + "-fused"
        hf.save_pretrained(fused, save_original_format=False)
        tok.save(os.path.join(fused, "tokenizer.json"))
        names = saved_names(fused)
        got, err = P.run(exe, fused, tmp)
        with torch.no_grad():
            ref = hf(torch.tensor([tok.encode(P.TEXT).ids])).logits[0] if not err else None
        excess, d = P.max_excess(got["logits"], ref) if not err else (float("inf"), err)
        if "model.layers.0.mlp.experts.gate_up_proj" not in names:
            failures.append(f"fused layout: transformers wrote no gate_up_proj ({sorted(names)[:6]})")
        elif excess > 0:
            failures.append(f"fused layout (mlp.experts.gate_up_proj, down_proj): logits differ by {d}")
        else:
            passed += 1
            print(f"ok    fused layout (mlp.experts.gate_up_proj, down_proj): logits within tolerance ({d:.3g})")
        refusals = [
            (dict(output_router_logits=True), "config.json has output_router_logits = true, which anatomy does not support"),
        ]
        for config, want in refusals:
            folder, _ = mixtral(tmp, "refused", tok, **config)
            _, err = P.run(exe, folder, tmp)
            if err and want in err:
                passed += 1
                print(f"ok    refused: {want}")
            else:
                failures.append(f"expected an error with '{want}', got {err!r}")
    for f in failures:
        print("FAIL  " + f)
    print(f"largest logit difference: {P.largest[0]:.3g}")
    print(f"{passed} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
