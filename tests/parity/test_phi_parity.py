"""Phi (model_type "phi": Phi-1, 1.5, 2): tiny random PhiForCausalLM models
written here by `transformers` with save_pretrained load through
models.from_pretrained and give transformers' numbers, through
test_pretrained_parity's checks (its compare): token ids, logits, every
hidden state, every attention pattern, the same with every hook point on,
the loss and greedy generation with the key/value cache, token for token.
Then: the model anatomy saves (its final norm edited) is read back by
transformers to the same logits, with the head's bias; a batch of three texts
padded on the left gives each text's logits as when it runs alone, and
transformers' logits of the same padded batch; its greedy continuation with
the attention mask is transformers' generate of the same batch; and the
config switches anatomy does not honour are refused by name. Last,
TransformerLens 4.3's TransformerBridge on the first model: every tensor it
caches under a name anatomy maps is found in anatomy's cache by that name and
equal (test_tl_parity's check_names: 1e-5 + 1e-4 * |TL|).
Variants: partial_rotary_factor 0.5 (transformers' default), untied head
with a bias, multi-head; Phi-2's partial_rotary_factor 0.4 on a head of 10
with grouped keys and values, rope_theta 500; the Hub's config.json form
(microsoft/phi-2's: partial_rotary_factor and rope_theta at the top level,
rope_scaling and num_key_value_heads null).

Tolerance (float32): test_pretrained_parity's, |anatomy - transformers| <=
1e-4 + 1e-4 * |transformers|; loss within 1e-5; ids exact. Padded against
alone: the same bound. The first model in bfloat16 (dtype = 'bfloat16'
against transformers' cast to bfloat16): 0.02 + 0.02 * |logit|, as there.
Needs transformers and tokenizers (the PyPI build's venv); exits 77 without.
Usage: test_phi_parity.py ANATOMY_EXECUTABLE
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
    from transformers import PhiConfig, PhiForCausalLM
    from test_bpe_parity import gpt2_like
    import test_pretrained_parity as P
except ImportError as e:
    print(f"skip: {e}; the PyPI build's venv has transformers and tokenizers (scripts/test)")
    sys.exit(77)

TEXTS = ["The quick brown fox", "jumps over the lazy dog. Ünïcödé 👋🏽", "1234!"]


def phi(tmp, name, tok, **config):
    base = dict(num_key_value_heads=None, hidden_act="gelu_new", layer_norm_eps=1e-5, resid_pdrop=0.1)
    base.update(config)
    return P.make_llama(tmp, name, tok, cls=PhiForCausalLM, config_cls=PhiConfig, **base)


def padded(exe, folder, tmp):
    out = os.path.join(tmp, "padded.json")
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([exe, "--threads=1", os.path.join(here, "phi_parity.lua"), folder, out] + TEXTS,
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


def main():
    exe = sys.argv[1]
    passed, failures = 0, []
    tok = gpt2_like()
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            ("phi: partial_rotary_factor 0.5, untied head with a bias", dict(partial_rotary_factor=0.5)),
            ("phi: Phi-2's partial_rotary_factor 0.4, head of 10, grouped keys and values, rope_theta 500",
             dict(partial_rotary_factor=0.4, hidden_size=40, num_key_value_heads=2, rope_theta=500.0)),
            ("phi: the Hub's config.json (microsoft/phi-2's form: partial_rotary_factor 0.4 and rope_theta at the top)",
             dict(partial_rotary_factor=0.4, hidden_size=40, rope_theta=500.0, hub_form=True)),
        ]
        first = None  # the first model's folder and transformers model, for TransformerLens
        for name, config in cases:
            hub_form = config.pop("hub_form", False)
            folder, hf = phi(tmp, "".join(c if c.isalnum() else "_" for c in name), tok, **config)
            if hub_form:
                cfg = json.load(open(os.path.join(folder, "config.json")))
                rope = cfg.pop("rope_parameters")
                cfg.update(partial_rotary_factor=rope["partial_rotary_factor"], rope_theta=rope["rope_theta"],
                           rope_scaling=None, num_key_value_heads=None)
                json.dump(cfg, open(os.path.join(folder, "config.json"), "w"))
            hf.generation_config.eos_token_id = None
            hf.generation_config.pad_token_id = hf.config.vocab_size - 1
            saved = folder + "-saved"
            got, err = P.run(exe, folder, tmp, saved)
            if err:
                failures.append(f"{name}: anatomy failed: {err}")
                continue
            first = first or (folder, hf)
            before = len(failures)
            n = P.compare(name, got, hf, tok, failures)
            # save_pretrained: transformers reads back the edited model, its head's bias included
            reloaded = transformers.AutoModelForCausalLM.from_pretrained(saved).eval()
            with torch.no_grad():
                logits = reloaded(torch.tensor([got["ids"]])).logits[0]
            excess, d = P.max_excess(got["edited_logits"], logits)
            n += 2
            if excess > 0:
                failures.append(f"{name}: save_pretrained: transformers' logits of the saved model differ by {d}")
            if not torch.equal(reloaded.lm_head.bias, hf.lm_head.bias):
                failures.append(f"{name}: save_pretrained: the head's bias did not come back")
            pad, err = padded(exe, folder, tmp)
            if err:
                failures.append(f"{name}: padded batch: anatomy failed: {err}")
            else:
                n += check_padded(name, pad, hf, failures)
            if first[0] == folder:  # bfloat16, against the model cast to it in transformers (last: the cast rounds its weights)
                got16, err = P.run(exe, folder, tmp, dtype="bfloat16")
                n += 1
                if err:
                    failures.append(f"{name}: bfloat16: anatomy failed: {err}")
                else:
                    with torch.no_grad():
                        ref = hf.to(torch.bfloat16)(torch.tensor([got["ids"]])).logits[0].float()
                    hf.float()
                    d = (torch.tensor(got16["logits"]) - ref).abs()
                    print(f"      bfloat16 logits: largest difference {d.max().item():.3g}")
                    if got16["dtype"] != "bfloat16" or not bool((d <= 0.02 + 0.02 * ref.abs()).all()):
                        failures.append(f"{name}: bfloat16 logits ({got16['dtype']}) differ by {d.max().item()}")
            passed += n - (len(failures) - before)
            print(f"{'ok  ' if len(failures) == before else 'FAIL'}  {name}: {n} checks")
        # TransformerLens 4.3's bridge on the first model: its hook tensors by its names in anatomy's cache
        try:
            import test_tl_parity
            from transformer_lens.model_bridge import TransformerBridge
        except (ImportError, SystemExit):
            print("skip  TransformerLens's hook names: the venv has no transformer-lens")
        else:
            folder = first[0]
            eager = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
            bridge = TransformerBridge.boot_transformers(folder, hf_model=eager, device="cpu")
            here = os.path.dirname(os.path.abspath(__file__))
            n, failed = test_tl_parity.check_names(exe, here, tmp, folder, first[1].config, bridge)
            passed += n
            failures += failed
        refusals = [
            (dict(qk_layernorm=True), "config.json has qk_layernorm = true, which anatomy does not support"),
            (dict(tie_word_embeddings=True), "config.json has tie_word_embeddings = true, which anatomy does not support"),
            (dict(hidden_act="silu"), "config.json has hidden_act = \"silu\", which anatomy does not support"),
        ]
        for i, (config, want) in enumerate(refusals):
            folder, _ = phi(tmp, f"refused_{i}", tok, **config)
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
