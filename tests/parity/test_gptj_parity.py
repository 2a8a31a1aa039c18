"""GPT-J (model_type "gptj"): tiny random GPTJForCausalLM models written here
by `transformers` with save_pretrained load through models.from_pretrained
and give transformers' numbers, through test_pretrained_parity's checks (its
compare): token ids, logits, every hidden state, every attention pattern, the
same with every hook point on, the loss and greedy generation with the
key/value cache, token for token. Then, as test_phi_parity (whose padded
batch, phi_parity.lua, this reuses): the model anatomy saves (its final norm
edited) is read back by transformers to the same logits, with the head's
bias; a batch of three texts padded on the left gives each text's logits as
when it runs alone, and transformers' logits of the same padded batch; its
greedy continuation with the attention mask is transformers' generate; the
config switches anatomy does not honour are refused by name. Last,
TransformerLens 4.3's TransformerBridge (its GPT-J adapter) on the first
model: every tensor it caches under a name anatomy maps is found in
anatomy's cache by that name and equal (test_tl_parity's check_names:
1e-5 + 1e-4 * |TL|), but attn.hook_attn_scores, where the bridge's GPT-J
adapter caches the pattern (checked: equal to its hook_pattern), not the
scores before the softmax.
Variants: rotary_dim 4 of a head of 8 (interleaved pairs on part of each
head), gelu_new; the whole head rotated (rotary_dim 8), 3 layers, n_inner
48, exact gelu, layer_norm_epsilon 1e-6; one pair (rotary_dim 2) in each of
8 heads of 4; config.json without rotary_dim (transformers' default 64, of a
head of 128). rotary_dim null, which transformers 5.23 refuses (older
versions wrote it), is refused too.

Tolerance (float32): test_pretrained_parity's, |anatomy - transformers| <=
1e-4 + 1e-4 * |transformers|; loss within 1e-5; ids exact. Padded against
alone: the same bound. The first model in bfloat16 (dtype = 'bfloat16'
against transformers' cast to bfloat16): 0.02 + 0.02 * |logit|, as for the
other families, though the two compute the scores differently there:
transformers' GPT-J casts q and k to float32 for q·kᵀ and its softmax, where
anatomy's rotary attention computes them in the model's dtype (LibTorch's
fused attention; on the hooked path q·kᵀ in bfloat16, then the softmax in
float32, as transformers' Llama does); both rotate in bfloat16 with sin and
cos computed in float32 and rounded to it. The scores' bfloat16 rounding (8
bits, 0.4% of each score) is of the size of the rest of the bfloat16 path's
(seen: 0.004 on logits up to 0.6, printed below; Phi's, whose scores both
take in bfloat16, 0.002).
Needs transformers and tokenizers (the PyPI build's venv); exits 77 without.
Usage: test_gptj_parity.py ANATOMY_EXECUTABLE
"""
import json
import os
import sys
import tempfile

try:
    import torch
    import transformers
    from transformers import GPTJConfig, GPTJForCausalLM
    from test_bpe_parity import gpt2_like
    import test_pretrained_parity as P
    from test_phi_parity import TEXTS, check_padded, padded
except ImportError as e:
    print(f"skip: {e}; the PyPI build's venv has transformers and tokenizers (scripts/test)")
    sys.exit(77)


def gptj(tmp, name, tok, rotary_dim_key="keep", **config):
    """A tiny GPT-J saved in tmp/name (norms and biases moved off 1 and 0, so that a misplaced one shows); the
    config.json's rotary_dim kept, or removed ("absent")."""
    torch.manual_seed(len(name))
    base = dict(vocab_size=tok.get_vocab_size(), n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=128,
                bos_token_id=0, eos_token_id=0, resid_pdrop=0.1, tie_word_embeddings=False)
    base.update(config)
    cfg = GPTJConfig(**base)
    cfg._attn_implementation = "eager"
    model = GPTJForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".ln_" in n or n.startswith("transformer.ln_f"):
                p.copy_(1 + 0.1 * torch.randn_like(p) if n.endswith("weight") else 0.1 * torch.randn_like(p))
            elif n.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    folder = os.path.join(tmp, name)
    model.save_pretrained(folder)
    tok.save(os.path.join(folder, "tokenizer.json"))
    if rotary_dim_key == "absent":
        path = os.path.join(folder, "config.json")
        cfg = json.load(open(path))
        del cfg["rotary_dim"]
        json.dump(cfg, open(path, "w"))
    return folder, model


def edited(folder, **keys):
    """The folder's config.json with keys set (a config transformers may not even build)."""
    path = os.path.join(folder, "config.json")
    cfg = json.load(open(path))
    cfg.update(keys)
    json.dump(cfg, open(path, "w"))
    return folder


def main():
    exe = sys.argv[1]
    passed, failures = 0, []
    tok = gpt2_like()
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            ("gptj: rotary_dim 4 of a head of 8 (interleaved), gelu_new, untied head with a bias", {}),
            ("gptj: the whole head rotated (rotary_dim 8), 3 layers, n_inner 48, exact gelu, eps 1e-6",
             dict(rotary_dim=8, n_layer=3, n_inner=48, activation_function="gelu", layer_norm_epsilon=1e-6)),
            ("gptj: one pair rotated (rotary_dim 2) in each of 8 heads of 4", dict(rotary_dim=2, n_head=8)),
            ("gptj: config.json without rotary_dim (transformers' 64, of a head of 128)",
             dict(rotary_dim=64, n_embd=128, n_head=1, rotary_dim_key="absent")),
        ]
        first = None  # the first model's folder and transformers model, for TransformerLens
        for name, config in cases:
            folder, hf = gptj(tmp, "".join(c if c.isalnum() else "_" for c in name), tok, **config)
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
                    print(f"      bfloat16 logits: largest difference {d.max().item():.3g} (largest logit {ref.abs().max().item():.3g})")
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
            # Its GPT-J adapter caches the pattern under attn.hook_attn_scores (GPT-J's own _attn returns only the
            # softmax; there are no scores before it to hook): shown here, and that name is left out of the
            # comparison. anatomy's scores are the masked q·kᵀ/√D before the softmax, as TransformerLens's elsewhere.
            with torch.no_grad():
                _, tl_cache = bridge.run_with_cache(torch.randint(0, first[1].config.vocab_size, (1, 5)))
            for l in range(first[1].config.n_layer):
                scores, pattern = tl_cache[f"blocks.{l}.attn.hook_attn_scores"], tl_cache[f"blocks.{l}.attn.hook_pattern"]
                passed += 1
                if not torch.equal(scores, pattern):
                    failures.append(f"blocks.{l}.attn.hook_attn_scores: TransformerLens's is no longer its pattern; compare it")
            n, failed = test_tl_parity.check_names(exe, here, tmp, folder, first[1].config, bridge, skip=["attn.hook_attn_scores"])
            passed += n
            failures += failed
        refusals = [
            (dict(tie_word_embeddings=True), "config.json has tie_word_embeddings = true, which anatomy does not support"),
            (dict(activation_function="silu"), "config.json has activation_function = \"silu\", which anatomy does not support"),
            (dict(rotary_dim=3), "config.json has rotary_dim = 3, which anatomy does not support"),
            (dict(rotary_dim=16), "config.json has rotary_dim = 16, which anatomy does not support"),
            (dict(n_embd=30), "config.json has n_embd = 30, which anatomy does not support"),
            (dict(rotary_dim=None), "config.json has rotary_dim = null, which anatomy does not support"),
        ]
        for i, (config, want) in enumerate(refusals):
            folder, _ = gptj(tmp, f"refused_{i}", tok)
            _, err = P.run(exe, edited(folder, **config), tmp)
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
