"""GPT-J (model_type "gptj"): tiny random GPTJForCausalLM models written here
by `transformers` with save_pretrained load through models.from_pretrained
and give transformers' numbers, through test_pretrained_parity's checks (its
compare): token ids, logits, every hidden state, every attention pattern, the
same with every hook point on, the loss and greedy generation with the
key/value cache, token for token. Then, as every family (family_checks, whose padded
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
    from transformers import GPTJConfig, GPTJForCausalLM
    from test_bpe_parity import gpt2_like
    import family_checks as F
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
            folder, hf = gptj(tmp, F.folder_name(name), tok, **config)
            before = len(failures)
            got, n, reloaded = F.model_checks(name, exe, folder, hf, tmp, tok, failures)
            if got is None:
                continue
            first = first or (folder, hf)
            n += 1  # save_pretrained: transformers reads back the edited model, its head's bias included
            if not torch.equal(reloaded.lm_head.bias, hf.lm_head.bias):
                failures.append(f"{name}: save_pretrained: the head's bias did not come back")
            if first[0] == folder:  # bfloat16, against the model cast to it in transformers (last: the cast rounds its weights)
                n += F.bfloat16(name, exe, folder, tmp, got["ids"], hf, failures, show_logit=True)
            passed += F.tally(name, n, before, failures)

        def scores_are_pattern(bridge, failures):
            # The bridge's GPT-J adapter caches the pattern under attn.hook_attn_scores (GPT-J's own _attn returns only
            # the softmax; there are no scores before it to hook): shown here, and that name is left out of the
            # comparison. anatomy's scores are the masked q·kᵀ/√D before the softmax, as TransformerLens's elsewhere.
            before = len(failures)
            with torch.no_grad():
                _, tl_cache = bridge.run_with_cache(torch.randint(0, first[1].config.vocab_size, (1, 5)))
            for l in range(first[1].config.n_layer):
                scores, pattern = tl_cache[f"blocks.{l}.attn.hook_attn_scores"], tl_cache[f"blocks.{l}.attn.hook_pattern"]
                if not torch.equal(scores, pattern):
                    failures.append(f"blocks.{l}.attn.hook_attn_scores: TransformerLens's is no longer its pattern; compare it")
            return first[1].config.n_layer - (len(failures) - before)

        # TransformerLens 4.3's bridge on the first model: its hook tensors by its names in anatomy's cache
        passed += F.bridge_names(exe, tmp, first[0], first[1].config, failures, skip=["attn.hook_attn_scores"],
                                 then=scores_are_pattern)
        refusals = [
            (dict(tie_word_embeddings=True), "config.json has tie_word_embeddings = true, which anatomy does not support"),
            (dict(activation_function="silu"), "config.json has activation_function = \"silu\", which anatomy does not support"),
            (dict(rotary_dim=3), "config.json has rotary_dim = 3, which anatomy does not support"),
            (dict(rotary_dim=16), "config.json has rotary_dim = 16, which anatomy does not support"),
            (dict(n_embd=30), "config.json has n_embd = 30, which anatomy does not support"),
            (dict(rotary_dim=None), "config.json has rotary_dim = null, which anatomy does not support"),
        ]
        passed += F.refused(exe, tmp, refusals, lambda i, config: edited(gptj(tmp, f"refused_{i}", tok)[0], **config),
                            failures)
    F.finish(passed, failures)


if __name__ == "__main__":
    main()
