"""Phi-3 (model_type "phi3": Phi-3, Phi-3.5, Phi-4-mini): tiny random
Phi3ForCausalLM models written here by `transformers` with save_pretrained
load through models.from_pretrained and give transformers' numbers, through
test_pretrained_parity's checks (its compare): token ids, logits, every
hidden state, every attention pattern, the same with every hook point on, the
loss and greedy generation with the key/value cache, token for token. Then:
the model anatomy saves (its final norm edited) is read back by transformers
to the same logits, its fused qkv_proj and gate_up_proj equal to the ones
read; a batch of three texts padded on the left gives each text's logits as
when it runs alone and transformers' of the same padded batch, and its greedy
continuation with the attention mask is transformers' generate
(family_checks' padded check); the config switches anatomy does not
honour are refused by name. Last, TransformerLens 4.3's TransformerBridge on
the first model: every tensor it caches under a name anatomy maps is found in
anatomy's cache by that name and equal (test_tl_parity's check_names).

Long RoPE: the text has 34 tokens. The first model's original_max_position_
embeddings is 64, so it runs on the short factors; the second's is 24, so
the text runs on the long ones, and the padded batch (22 tokens at most)
crosses from short to long as it generates. Across that boundary (the
second model, a prompt of 20 tokens, 8 new ones) transformers' generate
drops its cache at the step whose input passes 24 positions
(Phi3ForCausalLM.prepare_inputs_for_generation) and runs the whole sequence
again on the long factors, so that each step's logits are those of a run
without cache; anatomy's generate does the same (model:kv_refill): its
tokens and each step's logits are checked against generate's
(output_logits). A bare forward under a cache does not refill: the cached
keys keep their short rotation while the new position takes the long one,
in transformers and in anatomy alike (checked against each other, and
checked to differ from the run without cache, so that the boundary is seen).

Variants: longrope below its boundary with grouped keys and values; longrope
past it with Phi-4-mini's partial_rotary_factor 0.75 and tied head, in the
Hub's config form (rope_scaling with type 'longrope', rope_theta and
partial_rotary_factor at the top level); Phi-3-mini-4k's default RoPE
(rope_scaling null) with a sliding window of 5 and multi-head attention.

Tolerance (float32): test_pretrained_parity's, |anatomy - transformers| <=
1e-4 + 1e-4 * |transformers|; loss within 1e-5; ids exact. bfloat16 (the
first model, dtype = 'bfloat16' against transformers' cast): 0.02 + 0.02 *
|logit|, as there. Needs transformers and tokenizers (the PyPI build's venv);
exits 77 without. Usage: test_phi3_parity.py ANATOMY_EXECUTABLE
"""
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import torch
    from transformers import Phi3Config, Phi3ForCausalLM
    from test_bpe_parity import gpt2_like
    import test_pretrained_parity as P
    import family_checks as F
except ImportError as e:
    print(f"skip: {e}; the PyPI build's venv has transformers and tokenizers (scripts/test)")
    sys.exit(77)

SHORT = [1.0, 1.1, 1.3, 1.6]
LONG = [2.0, 4.0, 9.0, 20.0]


def phi3(tmp, name, tok, **config):
    base = dict(hidden_act="silu", rms_norm_eps=1e-5, pad_token_id=tok.get_vocab_size() - 1, resid_pdrop=0.1)
    base.update(config)
    return P.make_llama(tmp, name, tok, cls=Phi3ForCausalLM, config_cls=Phi3Config, **base)


def longrope(original, short=SHORT, long=LONG, **config):
    return dict(original_max_position_embeddings=original, rope_parameters=dict(
        rope_type="longrope", rope_theta=10000.0, short_factor=short, long_factor=long), **config)


def edit_config(folder, fn):
    path = os.path.join(folder, "config.json")
    cfg = json.load(open(path))
    fn(cfg)
    json.dump(cfg, open(path, "w"))


def hub_form(cfg):
    """Phi-3.5's and Phi-4-mini's config.json: rope_scaling with `type`, rope_theta and partial_rotary_factor at the top."""
    rope = cfg.pop("rope_parameters")
    cfg.update(rope_theta=rope["rope_theta"], partial_rotary_factor=rope["partial_rotary_factor"],
               rope_scaling=dict(type="longrope", short_factor=rope["short_factor"], long_factor=rope["long_factor"]))


def crossing(exe, folder, hf, tok, tmp, failures):
    """Cached greedy generation from 20 tokens to 28 across original_max_position_embeddings = 24."""
    checks = 0
    prompt = tok.encode(P.TEXT).ids[:20]
    out = os.path.join(tmp, "crossing.json")
    here = os.path.dirname(os.path.abspath(__file__))
    n = 24  # the bare cached forward: 24 positions, then the 25th alone
    proc = subprocess.run([exe, "--threads=1", os.path.join(here, "phi3_parity.lua"), folder, out,
                           ",".join(map(str, prompt)), "8", str(n)], capture_output=True, text=True)
    if proc.returncode != 0:
        failures.append(f"crossing: anatomy failed: {(proc.stdout + proc.stderr).strip()}")
        return 1
    got = json.load(open(out))
    x = torch.tensor([prompt])
    g = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False,
                    output_logits=True, return_dict_in_generate=True)
    seq = g.sequences
    checks += 2
    if got["generated"] != seq[0].tolist():
        failures.append(f"crossing: cached greedy generation {got['generated']} vs transformers' {seq[0].tolist()}")
    if got["uncached"] != seq[0].tolist():
        failures.append(f"crossing: greedy generation without cache {got['uncached']} vs transformers' {seq[0].tolist()}")
    worst = 0.0
    for i, logits in enumerate(g.logits):
        excess, d = P.max_excess(got["step_logits"][i], logits[0])
        worst = max(worst, d)
        checks += 1
        if excess > 0:
            failures.append(f"crossing: step {i + 1} ({len(prompt) + i} tokens): logits differ by {d}")
    # the refill: the step whose input first passes 24 positions reads them all (25), the others one
    want = [len(prompt)] + [1] * 4 + [n + 1] + [1] * 2
    checks += 1
    if got["step_positions"] != want:
        failures.append(f"crossing: positions read per step {got['step_positions']}, expected {want}")
    with torch.no_grad():
        o = hf(seq[:, :n], use_cache=True)
        bare = hf(seq[:, n:n + 1], past_key_values=o.past_key_values, use_cache=True).logits[0, -1]
        full = hf(seq[:, :n + 1]).logits[0, -1]
    excess, d = P.max_excess(got["bare"], bare)
    checks += 2
    if excess > 0:
        failures.append(f"crossing: a bare forward under the cache differs from transformers' by {d}")
    excess, mixed = P.max_excess(bare.tolist(), full)
    if excess <= 0:
        failures.append(f"crossing: the bare cached forward should mix short and long rotations (off by only {mixed})")
    print(f"      across the boundary: each step's logits within {worst:.3g} of generate's; a bare cached forward "
          f"{P.max_excess(got['bare'], bare)[1]:.3g} from transformers' and {mixed:.3g} from the run without cache")
    return checks


def main():
    exe = sys.argv[1]
    passed, failures = 0, []
    tok = gpt2_like()
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            ("phi3: longrope below original_max_position_embeddings (64), grouped keys and values",
             longrope(64), None),
            ("phi3: longrope past original_max_position_embeddings (24), partial_rotary_factor 0.75, tied head, the Hub's form",
             longrope(24, short=SHORT[:3], long=LONG[:3], partial_rotary_factor=0.75, tie_word_embeddings=True), hub_form),
            ("phi3: default RoPE (rope_scaling null), sliding_window 5, multi-head",
             dict(sliding_window=5, num_key_value_heads=4, rope_parameters=dict(rope_type="default", rope_theta=500.0)),
             lambda cfg: cfg.update(rope_scaling=None)),
        ]
        first = None  # the first model's folder and transformers model, for TransformerLens
        for name, config, edit in cases:
            if "partial_rotary_factor" in config:  # transformers reads it in rope_parameters
                config["rope_parameters"]["partial_rotary_factor"] = config.pop("partial_rotary_factor")
            folder, hf = phi3(tmp, F.folder_name(name), tok, **config)
            if edit:
                edit_config(folder, edit)
            before = len(failures)
            got, n, reloaded = F.model_checks(name, exe, folder, hf, tmp, tok, failures)
            if got is None:
                continue
            first = first or (folder, hf)
            n += 1  # save_pretrained: the fused projections read back as read
            fused = [k for k in hf.state_dict() if "qkv_proj" in k or "gate_up_proj" in k]
            sd = reloaded.state_dict()
            if len(fused) != 4 or not all(torch.equal(sd[k], hf.state_dict()[k]) for k in fused):
                failures.append(f"{name}: save_pretrained: qkv_proj and gate_up_proj did not come back as read ({fused})")
            r = hf.config.rope_parameters
            if r["rope_type"] == "longrope":
                # transformers' default attention factor, which anatomy computes from the config
                f = hf.config.max_position_embeddings / r["original_max_position_embeddings"]
                n += 1
                if abs(hf.model.rotary_emb.attention_scaling - math.sqrt(1 + math.log(f) / math.log(r["original_max_position_embeddings"]))) > 1e-12:
                    failures.append(f"{name}: transformers' attention factor is not the one anatomy computes")
            if r.get("original_max_position_embeddings") == 24:
                n += crossing(exe, folder, hf, tok, tmp, failures)
            if first[0] == folder:  # bfloat16, against the model cast to it in transformers (last: the cast rounds its weights)
                n += F.bfloat16(name, exe, folder, tmp, got["ids"], hf, failures)
            passed += F.tally(name, n, before, failures)
        passed += F.bridge_names(exe, tmp, first[0], first[1].config, failures)
        refusals = [
            (lambda cfg: cfg.update(hidden_act="gelu_new"), "config.json has hidden_act = \"gelu_new\", which anatomy does not support"),
            (lambda cfg: cfg.update(rope_scaling=dict(type="linear", factor=2.0)),
             "config.json has rope_scaling.rope_type = \"linear\", which anatomy does not support"),
            (lambda cfg: cfg["rope_parameters"].update(short_factor=[1.0, 2.0]),
             "config.json has rope_parameters.short_factor = [1,2], which anatomy does not support (longrope needs 4 numbers"),
        ]

        def refused_folder(i, edit):
            folder, _ = phi3(tmp, f"refused_{i}", tok, **longrope(64))
            edit_config(folder, edit)
            return folder
        passed += F.refused(exe, tmp, refusals, refused_folder, failures)
    F.finish(passed, failures)


if __name__ == "__main__":
    main()
