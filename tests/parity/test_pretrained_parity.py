"""Pretrained checkpoints: tiny random GPT-2 models made here with
`transformers` and saved with save_pretrained (with a byte-level BPE
tokenizer trained here) load through models.from_pretrained and give the same
numbers as `transformers` on the same text: logits, every hidden state
(output_hidden_states), every attention pattern (output_attentions), the loss,
and greedy generation. Variants: tied and untied heads, gelu_new and gelu,
the Hub's base-model layout (no `transformer.` prefix, no head), sharded
weights; and the refusal of a config switch anatomy does not honour.

Tolerance (float32): |anatomy - transformers| <= 1e-4 + 1e-4 * |transformers|
for logits, hidden states and patterns; loss within 1e-5; token ids and
generated ids exact. bfloat16 (dtype = 'bfloat16' against the model cast to
bfloat16 in transformers): logits within 0.02 + 0.02 * |transformers| (8 bits
of mantissa; seen here: 0.002-0.004 on logits of size ~0.5, as large as
transformers' own bfloat16-to-float32 difference).
Needs transformers and tokenizers (the PyPI build's venv); exits 77 without.
Usage: test_pretrained_parity.py ANATOMY_EXECUTABLE
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
    from transformers import (GPT2Config, GPT2LMHeadModel, GPT2Model, GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                              MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)
    from test_bpe_parity import gpt2_like, llama3_like, sentencepiece_like
except ImportError as e:
    print(f"skip: {e}; the PyPI build's venv has transformers and tokenizers (scripts/test)")
    sys.exit(77)

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

TEXT = "The quick brown fox jumps over the lazy dog. Ünïcödé 👋🏽 1234!"
TOL = 1e-4


def run(exe, folder, tmp, saved=None, dtype=None):
    out = os.path.join(tmp, "out.json")
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([exe, "--threads=1", os.path.join(here, "pretrained_parity.lua"), folder, TEXT, out]
                          + ([saved or ""] if saved or dtype else []) + ([dtype] if dtype else []),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return None, (proc.stdout + proc.stderr).strip()
    return json.load(open(out)), None


def max_excess(a, b):
    """The largest |a - b| - TOL * (1 + |b|) (<= 0 when within tolerance), and |a - b| there."""
    a, b = torch.tensor(a, dtype=torch.float64), b.double()
    if a.shape != b.shape:
        return float("inf"), f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    d = (a - b).abs()
    return (d - TOL * (1 + b.abs())).max().item(), d.max().item()


largest = [0.0]  # the largest logit difference seen, printed at the end


def compare(name, got, hf, tok, failures):
    ids = tok.encode(TEXT).ids
    checks = 0

    def check(what, ok, detail=""):
        nonlocal checks
        checks += 1
        if not ok:
            failures.append(f"{name}: {what} {detail}")

    check("token ids", got["ids"] == ids, f"{got['ids']} vs {ids}")
    x = torch.tensor([ids])
    with torch.no_grad():
        o = hf(x, output_hidden_states=True, output_attentions=True, labels=x)
    excess, d = max_excess(got["logits"], o.logits[0])
    check("logits", excess <= 0, f"(max difference {d})")
    largest[0] = max(largest[0], d)
    check("number of hidden states", len(got["hidden"]) == len(o.hidden_states))
    for i, h in enumerate(o.hidden_states):
        excess, d = max_excess(got["hidden"][i], h[0])
        check(f"hidden state {i}", excess <= 0, f"(max difference {d})")
    for i, a in enumerate(o.attentions):
        excess, d = max_excess(got["attentions"][i], a[0])
        check(f"attention pattern of layer {i}", excess <= 0, f"(max difference {d})")
    # the hook points of probe.run_with_cache, every block on its explicit path
    excess, d = max_excess(got["cache_logits"], o.logits[0])
    check("logits with every hook point on", excess <= 0, f"(max difference {d})")
    for i, h in enumerate(o.hidden_states[:-1]):
        excess, d = max_excess(got["cache_hidden"][i], h[0])
        check(f"cache resid ({'resid_pre of layer 1' if i == 0 else f'resid_post of layer {i}'})", excess <= 0, f"(max difference {d})")
    for i, a in enumerate(o.attentions):
        excess, d = max_excess(got["cache_attentions"][i], a[0])
        check(f"cache pattern of layer {i + 1}", excess <= 0, f"(max difference {d})")
    check("per-head results + bias = attention output", got["result_gap"] <= 1e-5, f"(gap {got['result_gap']})")
    check("loss", abs(got["loss"] - o.loss.item()) <= 1e-5, f"{got['loss']} vs {o.loss.item()}")
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = hf.config.vocab_size - 1
    # an explicit mask: with none, generate treats ids equal to the pad id as padding
    gen = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False)[0].tolist()
    check("greedy generation", got["generated"] == gen, f"{got['generated']} vs {gen}")
    return checks


def make(tmp, name, tok, base=False, shard=False, **config):  # GPT-2
    torch.manual_seed(len(name))
    cfg = GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=4,
                     bos_token_id=0, eos_token_id=0, **config)
    cfg._attn_implementation = "eager"
    model = (GPT2Model if base else GPT2LMHeadModel)(cfg).eval()
    folder = os.path.join(tmp, name)
    model.save_pretrained(folder, max_shard_size="20KB" if shard else "5GB")
    tok.save(os.path.join(folder, "tokenizer.json"))
    if base:  # compare with the LM model of the same weights
        lm = GPT2LMHeadModel(cfg).eval()
        lm.transformer.load_state_dict(model.state_dict())
        lm.tie_weights()
        model = lm
    return folder, model


def make_llama(tmp, name, tok, cls=LlamaForCausalLM, config_cls=LlamaConfig, **config):
    torch.manual_seed(len(name))
    base = dict(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, bos_token_id=0,
                eos_token_id=0, tie_word_embeddings=False)
    base.update(config)
    base = {k: v for k, v in base.items() if v is not None}
    cfg = config_cls(**base)
    cfg._attn_implementation = "eager"
    model = cls(cfg).eval()
    with torch.no_grad():  # random norms and biases, so that a misplaced one shows
        for n, p in model.named_parameters():
            if n.endswith("norm.weight") or n.endswith(".bias"):
                p.copy_(1 + 0.1 * torch.randn_like(p) if n.endswith("norm.weight") else 0.1 * torch.randn_like(p))
            elif "layernorm" in n or "layer_norm" in n:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    folder = os.path.join(tmp, name)
    model.save_pretrained(folder)
    tok.save(os.path.join(folder, "tokenizer.json"))
    return folder, model


def neox(**config):
    """GPT-NeoX's names for make_llama's settings (it has no key/value heads)."""
    return dict(num_key_value_heads=None, hidden_act="gelu", layer_norm_eps=1e-5, **config)


def main():
    exe = sys.argv[1]
    passed = 0
    failures = []
    gpt2_tok, llama_tok, sp_tok = gpt2_like(), llama3_like(), sentencepiece_like("legacy")
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            ("gpt2: tied, gelu_new", lambda n: make(tmp, n, gpt2_tok), gpt2_tok),
            ("gpt2: untied head", lambda n: make(tmp, n, gpt2_tok, tie_word_embeddings=False), gpt2_tok),
            ("gpt2: gelu", lambda n: make(tmp, n, gpt2_tok, activation_function="gelu"), gpt2_tok),
            ("gpt2: the Hub's base-model layout", lambda n: make(tmp, n, gpt2_tok, base=True), gpt2_tok),
            ("gpt2: sharded", lambda n: make(tmp, n, gpt2_tok, shard=True), gpt2_tok),
            ("gpt_neox: Pythia's parallel residual, rotary_pct 0.25",
             lambda n: make_llama(tmp, n, gpt2_tok, cls=GPTNeoXForCausalLM, config_cls=GPTNeoXConfig,
                                  **neox(rotary_pct=0.25)), gpt2_tok),
            ("gpt_neox: sequential residual, rotary_pct 0.5, rotary_emb_base 500",
             lambda n: make_llama(tmp, n, gpt2_tok, cls=GPTNeoXForCausalLM, config_cls=GPTNeoXConfig,
                                  **neox(rotary_pct=0.5, use_parallel_residual=False, rotary_emb_base=500)), gpt2_tok),
            ("llama: grouped-query, untied", lambda n: make_llama(tmp, n, llama_tok), llama_tok),
            ("llama: multi-query, tied, head_dim 16, attention_bias",
             lambda n: make_llama(tmp, n, llama_tok, num_key_value_heads=1, tie_word_embeddings=True, head_dim=16,
                                  attention_bias=True), llama_tok),
            ("llama: rope_scaling llama3 (Llama 3.1), rope_theta 500000",
             lambda n: make_llama(tmp, n, llama_tok, rope_theta=500000.0, max_position_embeddings=64,
                                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8}),
             llama_tok),
            ("llama: rope_scaling linear",
             lambda n: make_llama(tmp, n, llama_tok, rope_scaling={"rope_type": "linear", "factor": 4.0}), llama_tok),
            ("mistral: sliding_window 4, SentencePiece-style tokenizer.json (byte fallback)",
             lambda n: make_llama(tmp, n, sp_tok, cls=MistralForCausalLM, config_cls=MistralConfig, sliding_window=4),
             sp_tok),
            ("qwen2: qkv bias, sliding window off",
             lambda n: make_llama(tmp, n, llama_tok, cls=Qwen2ForCausalLM, config_cls=Qwen2Config,
                                  use_sliding_window=False, sliding_window=4), llama_tok),
        ]
        for name, build, tok in cases:
            folder, hf = build("".join(c if c.isalnum() else "_" for c in name))
            saved = folder + "-saved"
            got, err = run(exe, folder, tmp, saved)
            if err:
                failures.append(f"{name}: anatomy failed: {err}")
                continue
            if "sharded" in name:
                ok = os.path.exists(os.path.join(folder, "model.safetensors.index.json"))
                passed += ok
                if not ok:
                    failures.append(f"{name}: transformers wrote no shards")
            before = len(failures)
            n = compare(name, got, hf, tok, failures)
            # save_pretrained: transformers loads the edited model anatomy wrote
            reloaded = transformers.AutoModelForCausalLM.from_pretrained(saved).eval()
            with torch.no_grad():
                logits = reloaded(torch.tensor([got["ids"]])).logits[0]
            excess, d = max_excess(got["edited_logits"], logits)
            n += 1
            if excess > 0:
                failures.append(f"{name}: save_pretrained: transformers' logits of the saved model differ by {d}")
            if name.startswith(("gpt2: tied", "gpt_neox: Pythia", "llama: grouped")):  # bfloat16 too
                got16, err = run(exe, folder, tmp, dtype="bfloat16")
                n += 1
                if err:
                    failures.append(f"{name}: bfloat16: anatomy failed: {err}")
                else:
                    with torch.no_grad():
                        ref = hf.to(torch.bfloat16)(torch.tensor([got["ids"]])).logits[0].float()
                    hf.float()
                    d = (torch.tensor(got16["logits"]) - ref).abs()
                    if got16["dtype"] != "bfloat16" or not bool((d <= 0.02 + 0.02 * ref.abs()).all()):
                        failures.append(f"{name}: bfloat16 logits ({got16['dtype']}) differ by {d.max().item()}")
            passed += n - (len(failures) - before)
            print(f"{'ok  ' if len(failures) == before else 'FAIL'}  {name}: {n} checks")
        # a switch anatomy does not honour is refused by name, and nothing is returned
        refusals = [
            (lambda: make(tmp, "inverse_layer_idx", gpt2_tok, scale_attn_by_inverse_layer_idx=True),
             "config.json has scale_attn_by_inverse_layer_idx = true, which anatomy does not support"),
            (lambda: make_llama(tmp, "yarn", llama_tok, rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                                                     "original_max_position_embeddings": 64}),
             "which anatomy does not support (supported: default, linear, llama3)"),
        ]
        for build, want in refusals:
            folder, _ = build()
            _, err = run(exe, folder, tmp)
            if err and want in err:
                passed += 1
                print(f"ok    refused: {want}")
            else:
                failures.append(f"expected an error with '{want}', got {err!r}")
    for f in failures:
        print("FAIL  " + f)
    print(f"largest logit difference: {largest[0]:.3g}")
    print(f"{passed} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
