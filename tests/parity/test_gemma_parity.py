"""Gemma (model_type "gemma", "gemma2", "gemma3_text"): tiny random
GemmaForCausalLM, Gemma2ForCausalLM and Gemma3ForCausalLM models written here
by `transformers` with save_pretrained load through models.from_pretrained
and give transformers' numbers, through test_pretrained_parity's checks (its
compare): token ids, logits, every hidden state, every attention pattern, the
same with every hook point on, the loss and greedy generation with the
key/value cache, token for token (sliding windows of 4 over a text of ~30
tokens, both soft-cappings). Then: the model anatomy saves (its final norm
edited) is read back by transformers to the same logits; a batch of three
texts padded on the left gives each text's logits as when it runs alone and
transformers' logits of the same padded batch, and its greedy continuation
with the attention mask is transformers' generate of the same batch
(family_checks' padded and check_padded); each soft-capping a case sets
moves transformers' logits by more than 1e-3 when switched off (so the
parity covers it); the Hub's config.json forms (Gemma 3's rope_theta,
rope_local_base_freq, rope_scaling and sliding_window_pattern with no
layer_types; Gemma 1's legacy hidden_act "gelu") read by transformers to the
same logits as the model written; the config switches anatomy does not
honour are refused by name. Gemma 3's multimodal checkpoints (model_type
gemma3, Gemma3ForConditionalGeneration, a tiny SigLIP vision tower written
with them): the language model alone, against transformers' forward of the
whole model on token ids (no images), in both weight layouts transformers
reads (language_model.model., which its save_pretrained writes and the Hub's
files hold; model.language_model.), the head tied by the top level's
tie_word_embeddings, text_config's final_logit_softcapping left out as
there, the Hub's sparse text_config; saved as a gemma3_text checkpoint that
transformers reads as Gemma3ForCausalLM; no text_config and a tensor of
another part refused by name. Last, TransformerLens 4.3's TransformerBridge on
the Gemma 2 and Gemma 3 models: every tensor it caches under a name anatomy
maps is found in anatomy's cache by that name and equal (test_tl_parity's
check_names: 1e-5 + 1e-4 * |TL|).

Tolerance (float32): test_pretrained_parity's, |anatomy - transformers| <=
1e-4 + 1e-4 * |transformers|; loss within 1e-5; ids exact. Padded against
alone: the same bound. The first model in bfloat16 (dtype = 'bfloat16'
against transformers' cast to bfloat16): 0.02 + 0.02 * |logit|, as there.
Needs transformers and tokenizers (the PyPI build's venv); exits 77 without.
Usage: test_gemma_parity.py ANATOMY_EXECUTABLE
"""
import json
import os
import sys
import tempfile

try:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers import (GemmaConfig, GemmaForCausalLM, Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM,
                              Gemma3TextConfig, Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig)
    from test_bpe_parity import gpt2_like
    import test_pretrained_parity as P
    import family_checks as F
except ImportError as e:
    print(f"skip: {e}; the PyPI build's venv has transformers and tokenizers (scripts/test)")
    sys.exit(77)

CLASSES = {"gemma": (GemmaForCausalLM, GemmaConfig), "gemma2": (Gemma2ForCausalLM, Gemma2Config),
           "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig)}


def multimodal(tmp, name, tok, tie=True, layout="saved", **text):
    """A tiny Gemma3ForConditionalGeneration (a one-layer SigLIP vision tower) as
    transformers writes it; layout "modules": its weights under its module
    names (model.language_model., lm_head) instead."""
    torch.manual_seed(len(name))
    base = dict(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128, sliding_window=4,
                query_pre_attn_scalar=12, bos_token_id=0, eos_token_id=0, initializer_range=0.2)
    base.update(text)
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2,
                                image_size=28, patch_size=14)
    cfg = Gemma3Config(text_config=base, vision_config=vision.to_dict(), mm_tokens_per_image=4,
                       image_token_index=base["vocab_size"] - 1, tie_word_embeddings=tie)
    cfg._attn_implementation = "eager"
    model = Gemma3ForConditionalGeneration(cfg).eval()
    model.config.vocab_size = base["vocab_size"]  # for the checks that read it (the text config's)
    with torch.no_grad():  # random norms, so that a misplaced one shows
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
    folder = os.path.join(tmp, name)
    model.save_pretrained(folder)
    saved = load_file(os.path.join(folder, "model.safetensors"))
    assert "language_model.model.embed_tokens.weight" in saved and any(k.startswith("vision_tower.") for k in saved)
    if layout == "modules":
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(folder, "model.safetensors"),
                  metadata={"format": "pt"})
    tok.save(os.path.join(folder, "tokenizer.json"))
    return folder, model


def gemma(tmp, name, tok, kind, **config):
    if kind == "gemma3mm":
        return multimodal(tmp, name, tok, **config)
    cls, config_cls = CLASSES[kind]
    base = dict(head_dim=8, tie_word_embeddings=True, initializer_range=0.2)
    if kind != "gemma":
        base.update(sliding_window=4, query_pre_attn_scalar=12)
    base.update(config)
    return P.make_llama(tmp, name, tok, cls=cls, config_cls=config_cls, **base)


def logits_without(hf, ids, key):
    """transformers' logits with the config's `key` (a soft-capping) switched off
    (the attention's copy of it too)."""
    holders = [hf.config] + [m for m in hf.modules() if hasattr(m, key)]
    old = getattr(hf.config, key)
    for h in holders:
        setattr(h, key, None)
    try:
        with torch.no_grad():
            return hf(ids).logits[0]
    finally:
        for h in holders:
            setattr(h, key, old)


def hub_form(folder, kind):
    """config.json rewritten in the form the Hub's checkpoints have it."""
    path = os.path.join(folder, "config.json")
    cfg = json.load(open(path))
    if kind == "gemma3mm":  # google/gemma-3-4b-pt's: text_config holds what differs from Gemma3TextConfig's defaults
        text, default = cfg["text_config"], Gemma3TextConfig().to_dict()
        rope = text.pop("rope_parameters")
        text.pop("layer_types")
        text.update(rope_scaling={"rope_type": "linear", "factor": rope["full_attention"]["factor"]},
                    rope_local_base_freq=rope["sliding_attention"]["rope_theta"], sliding_window_pattern=2)
        for k in list(text):
            if k in default and text[k] == default[k] and k not in ("model_type",):
                del text[k]
        assert "num_attention_heads" in default and "num_attention_heads" not in text, text
    elif kind == "gemma3":  # google/gemma-3-1b-pt's: no layer_types, the RoPE settings at the top
        rope = cfg.pop("rope_parameters")
        full = dict(rope["full_attention"])
        cfg.pop("layer_types")
        cfg.update(rope_theta=full.pop("rope_theta"), rope_local_base_freq=rope["sliding_attention"]["rope_theta"],
                   sliding_window_pattern=2)
        cfg["rope_scaling"] = full if full.get("rope_type", "default") != "default" else None
    else:  # google/gemma-7b's legacy activation name
        cfg["hidden_act"] = "gelu"
    json.dump(cfg, open(path, "w"))


def main():
    exe = sys.argv[1]
    passed, failures = 0, []
    tok = gpt2_like()
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            # weights at transformers' default scale (0.02), as the bfloat16 check's tolerance assumes
            ("gemma2: alternating sliding and global layers, both soft-cappings, tied head", "gemma2",
             dict(num_hidden_layers=3, initializer_range=0.02, attn_logit_softcapping=0.05, final_logit_softcapping=0.2)),
            ("gemma2: layer_types given, untied head, head_dim 16, multi-query, attention_bias, rope_theta 500, no soft-capping",
             "gemma2",
             dict(num_hidden_layers=3, layer_types=["full_attention", "sliding_attention", "sliding_attention"],
                  tie_word_embeddings=False, head_dim=16, num_key_value_heads=1, attention_bias=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                  null=["final_logit_softcapping", "attn_logit_softcapping"])),
            ("gemma3_text: QK-norm, local and global RoPE (linear scaling 8 on the global), final soft-capping", "gemma3",
             dict(num_hidden_layers=3, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                  rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}},
                  final_logit_softcapping=0.5, attn_logit_softcapping=0.5)),
            ("gemma3_text: the Hub's config.json (rope_theta, rope_local_base_freq, sliding_window_pattern 2)", "gemma3",
             dict(num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2,
                  rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}},
                  initializer_range=0.02, hub_form=True)),  # TransformerLens's model: its tolerance is 1e-5
            ("gemma: Gemma 1 (pre-norm, GeGLU, scaled embeddings), the legacy hidden_act gelu", "gemma",
             dict(hub_form=True)),
            ("gemma3: Gemma3ForConditionalGeneration's language model (language_model.model. names), tied head, "
             "text_config's final_logit_softcapping left out as transformers does", "gemma3mm",
             dict(num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                  final_logit_softcapping=0.5)),
            ("gemma3: model.language_model. names, untied head (top-level tie_word_embeddings false, text_config's true)",
             "gemma3mm", dict(tie=False, tie_word_embeddings=True, layout="modules")),
            ("gemma3: the Hub's config.json (sparse text_config, rope_scaling, rope_local_base_freq, sliding_window_pattern)",
             "gemma3mm", dict(num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, layer_types=[
                 "sliding_attention", "full_attention"] * 2, rope_parameters={
                     "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}, hub_form=True)),
        ]
        tl_models = []  # the Gemma 2 and 3 models' folders and configs, for TransformerLens
        for name, kind, config in cases:
            rewrite, nulls = config.pop("hub_form", False), config.pop("null", [])
            folder, hf = gemma(tmp, F.folder_name(name), tok, kind, **config)
            if nulls:  # switched off: null in config.json (make_llama leaves a None out, so the default would stand)
                path = os.path.join(folder, "config.json")
                cfg = json.load(open(path))
                for key in nulls:
                    cfg[key] = None
                    for h in [hf.config] + [m for m in hf.modules() if hasattr(m, key)]:
                        setattr(h, key, None)
                json.dump(cfg, open(path, "w"))
            before = len(failures)
            n = 0
            ids = torch.tensor([tok.encode(P.TEXT).ids])
            for key in ("final_logit_softcapping", "attn_logit_softcapping"):
                if kind == "gemma3mm" and getattr(hf.config.text_config, key, None) is not None:
                    with torch.no_grad():  # what the soft-capping would have made of transformers' logits
                        logits = hf(ids).logits[0]
                    cap = hf.config.text_config.final_logit_softcapping
                    d = (logits - cap * torch.tanh(logits / cap)).abs().max().item()
                    n += 1
                    if d <= 1e-3:
                        failures.append(f"{name}: {key} would move the logits by only {d:.3g}: the test does not show it left out")
                if kind == "gemma2" and getattr(hf.config, key, None) is not None:
                    with torch.no_grad():
                        d = (hf(ids).logits[0] - logits_without(hf, ids, key)).abs().max().item()
                    n += 1
                    if d <= 1e-3:
                        failures.append(f"{name}: {key} moves transformers' logits by only {d:.3g}: the test does not exercise it")
            if rewrite:
                hub_form(folder, kind)
                with torch.no_grad():
                    again = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
                    d = (again(ids).logits - hf(ids).logits).abs().max().item()
                n += 1
                if d > 1e-6:
                    failures.append(f"{name}: transformers reads the rewritten config.json as another model ({d:.3g})")
            overall, P.largest[0] = P.largest[0], 0.0
            got, k, reloaded = F.model_checks(name, exe, folder, hf, tmp, tok, failures)
            case_largest, P.largest[0] = P.largest[0], max(overall, P.largest[0])
            if got is None:
                continue
            n += k
            # the first of each; TransformerLens 4.3's bridge applies Gemma 3's attn_logit_softcapping,
            # which transformers 5.23 (and anatomy) leave out, so a Gemma 3 without it
            if kind not in ("gemma", "gemma3mm") and kind not in [k for k, _, _ in tl_models] and (
                    kind == "gemma2" or hf.config.attn_logit_softcapping is None):
                tl_models.append((kind, folder, hf.config))
            if kind == "gemma3mm":  # its language model written alone, as Gemma3ForCausalLM
                n += 1
                written = json.load(open(os.path.join(folder + "-saved", "config.json")))
                if type(reloaded).__name__ != "Gemma3ForCausalLM" or written["model_type"] != "gemma3_text":
                    failures.append(f"{name}: save_pretrained wrote {written['model_type']}, read as {type(reloaded).__name__}")
            if name == cases[0][0]:  # bfloat16, against the model cast to it in transformers (last: the cast rounds its weights)
                n += F.bfloat16(name, exe, folder, tmp, got["ids"], hf, failures)
            passed += F.tally(name, n, before, failures, f", largest logit difference {case_largest:.3g}")
        # TransformerLens 4.3's bridge: its hook tensors by its names in anatomy's cache
        for kind, folder, cfg in tl_models:
            passed += F.bridge_names(exe, tmp, folder, cfg, failures, lead=f"      TransformerLens on {kind}: ", label=f"{kind}: ")
        refusals = [
            (("gemma3", dict(use_bidirectional_attention=True)),
             "config.json has use_bidirectional_attention = true, which anatomy does not support"),
            (("gemma2", dict(hidden_activation="relu")), "config.json has hidden_activation = \"relu\", which anatomy does not support"),
        ]
        passed += F.refused(exe, tmp, refusals, lambda i, what: gemma(tmp, f"refused_{i}", tok, what[0], **what[1])[0],
                            failures)
        # Gemma 3's multimodal folder without its text_config, or with a tensor of a part anatomy does not know
        folder, _ = multimodal(tmp, "refused_multimodal", tok)
        tensors = load_file(os.path.join(folder, "model.safetensors"))
        save_file(dict(tensors, **{"audio_tower.weight": torch.zeros(2)}), os.path.join(folder, "model.safetensors"),
                  metadata={"format": "pt"})
        _, err = P.run(exe, folder, tmp)
        cfg = json.load(open(os.path.join(folder, "config.json")))
        del cfg["text_config"]
        json.dump(cfg, open(os.path.join(folder, "config.json"), "w"))
        _, err2 = P.run(exe, folder, tmp)
        passed += F.refusal("the checkpoint has a tensor anatomy does not place: audio_tower.weight", err, failures)
        passed += F.refusal("config.json has text_config = null, which anatomy does not support", err2, failures)
    F.finish(passed, failures)


if __name__ == "__main__":
    main()
