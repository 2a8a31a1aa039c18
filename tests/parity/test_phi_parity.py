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
import sys
import tempfile

try:
    import torch
    from transformers import PhiConfig, PhiForCausalLM
    from test_bpe_parity import gpt2_like
    import test_pretrained_parity as P
    import family_checks as F
except ImportError as e:
    print(f"skip: {e}; the PyPI build's venv has transformers and tokenizers (scripts/test)")
    sys.exit(77)


def phi(tmp, name, tok, **config):
    base = dict(num_key_value_heads=None, hidden_act="gelu_new", layer_norm_eps=1e-5, resid_pdrop=0.1)
    base.update(config)
    return P.make_llama(tmp, name, tok, cls=PhiForCausalLM, config_cls=PhiConfig, **base)


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
            folder, hf = phi(tmp, F.folder_name(name), tok, **config)
            if hub_form:
                cfg = json.load(open(os.path.join(folder, "config.json")))
                rope = cfg.pop("rope_parameters")
                cfg.update(partial_rotary_factor=rope["partial_rotary_factor"], rope_theta=rope["rope_theta"],
                           rope_scaling=None, num_key_value_heads=None)
                json.dump(cfg, open(os.path.join(folder, "config.json"), "w"))
            before = len(failures)
            got, n, reloaded = F.model_checks(name, exe, folder, hf, tmp, tok, failures)
            if got is None:
                continue
            first = first or (folder, hf)
            n += 1  # save_pretrained: transformers reads back the edited model, its head's bias included
            if not torch.equal(reloaded.lm_head.bias, hf.lm_head.bias):
                failures.append(f"{name}: save_pretrained: the head's bias did not come back")
            if first[0] == folder:  # bfloat16, against the model cast to it in transformers (last: the cast rounds its weights)
                n += F.bfloat16(name, exe, folder, tmp, got["ids"], hf, failures)
            passed += F.tally(name, n, before, failures)
        passed += F.bridge_names(exe, tmp, first[0], first[1].config, failures)
        refusals = [
            (dict(qk_layernorm=True), "config.json has qk_layernorm = true, which anatomy does not support"),
            (dict(tie_word_embeddings=True), "config.json has tie_word_embeddings = true, which anatomy does not support"),
            (dict(hidden_act="silu"), "config.json has hidden_act = \"silu\", which anatomy does not support"),
        ]
        passed += F.refused(exe, tmp, refusals, lambda i, config: phi(tmp, f"refused_{i}", tok, **config)[0], failures)
    F.finish(passed, failures)


if __name__ == "__main__":
    main()
