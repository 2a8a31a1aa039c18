"""TransformerLens's weight processing: anatomy's models.from_pretrained(...,
{fold_ln, center_writing_weights, center_unembed, fold_value_biases}) against
TransformerLens 4.3 itself.

A tiny GPT-2 (LayerNorm, every step), a tiny Llama with grouped keys and
values (RMSNorm: fold_ln and center_unembed; TransformerLens does not centre
writing weights under RMSNorm, and anatomy refuses to; it has no value
biases to fold), a tiny Qwen2 (the same, with value biases and no output
bias, which both give it for the fold: fold_ln, center_unembed,
fold_value_biases), a tiny Phi (one LayerNorm read by attention and
MLP, a head with a bias: all four) and a tiny GPT-J (Phi's block with no
biases on q, k, v and the output, which gain them as TransformerLens's b_Q,
b_K, b_V and b_O: all four), written by `transformers`, booted in
TransformerLens's TransformerBridge and processed with
enable_compatibility_mode() (its defaults: all four), are compared on:
  - every processed weight in TransformerLens's layout: W_E, W_pos, W_Q, W_K,
    W_V, W_O, b_Q, b_K, b_V, b_O, W_in, b_in, (W_gate), W_out, b_out, W_U, b_U
    (grouped keys and values repeated to every query head, as
    weights.attention gives them);
  - the logits on the same ids (both processed), and anatomy's processed
    logits against its unprocessed ones: the same up to one constant per
    position (center_unembed moves every logit by the same amount);
  - direct logit attribution of a token at the last position, averaged over
    the batch: each head's share (TransformerLens: cache.stack_head_results
    with apply_ln, times W_U's column; anatomy: probe.logit_attribution),
    except through Gemma 2/3's post-norms, where anatomy refuses it;
  - every norm that folds left at weight 1, bias 0 (Gemma's: weight 0, a
    scale of 1 + 0), and the norms TransformerLens keeps (Gemma 2/3's
    post-norms ln1_post, ln2_post, Gemma 3's q_norm, k_norm) unchanged.
A tiny Gemma 2 (four norms, both soft-cappings: fold_ln alone, as
TransformerLens's bridge skips center_unembed under final soft-capping and
anatomy refuses it) and a tiny Gemma 3 (QK-norms, no final soft-capping:
fold_ln, center_unembed; RMSNorm, and no value biases, so neither centres
writing weights nor folds value biases).
A tiny Mixtral, OLMoE (QK-norms over the whole projections) and Qwen3-MoE
(per-head QK-norms, a dense layer between two sparse ones): fold_ln,
center_unembed; their MoE weights compared in transformers' names and
layout against the bridge's (it folds ln2 into the router,
mlp.gate.weight, and each expert's gate and up, mlp.experts.gate_up_proj;
down_proj and the dense layers' as they come), and the direct logit
attribution through the MoE's output.
Tolerance: 1e-5 on weights, 1e-4 on logits and attributions (float32).
Needs transformers and transformer-lens (the PyPI build's venv); exits 77 without.
Usage: test_process_parity.py ANATOMY_EXECUTABLE
"""
import os
import sys
import tempfile

import tl_side  # exits 77 without transformers and transformer-lens
import torch

import safetensors_io

WEIGHT_TOL, OUTPUT_TOL = 1e-5, 1e-4
TARGET = 7  # a token id, from 0


def transformer_lens_side(folder, ids):
    with torch.no_grad():
        plain = tl_side.hf(folder)(ids).logits
    bridge = tl_side.boot(folder)  # its defaults: every step
    want = {}
    with torch.no_grad():
        for name in ["W_E", "W_pos", "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "W_in", "b_in", "W_gate",
                     "W_out", "b_out", "W_U", "b_U"]:
            try:
                t = getattr(bridge, name)
            except (AttributeError, KeyError, ValueError):
                continue
            if t is None:
                continue
            if name in ("W_K", "W_V", "b_K", "b_V") and t.shape[1] != bridge.cfg.n_heads:
                # grouped keys and values: each query head's, as anatomy's weights.attention gives them
                t = t.repeat_interleave(bridge.cfg.n_heads // t.shape[1], dim=1)
            want[name] = t
        layers = getattr(getattr(bridge.original_model, "model", None), "layers", [])
        if any(hasattr(getattr(layer, "mlp", None), "experts") for layer in layers):
            # a mixture of experts: each layer's MLP in transformers' names, the router and the experts' (E, out, in)
            for k in ("W_in", "b_in", "W_gate", "W_out", "b_out"):
                want.pop(k, None)
            for l, layer in enumerate(layers):
                mlp, at = layer.mlp, "blocks.%d.mlp." % l
                if hasattr(mlp, "experts"):
                    gate_up = mlp.experts.gate_up_proj  # (E, 2 * hidden, C): gate rows, then up rows
                    half = gate_up.shape[1] // 2
                    want[at + "gate.weight"] = mlp.gate.weight
                    want[at + "experts.gate"], want[at + "experts.up"] = gate_up[:, :half], gate_up[:, half:]
                    want[at + "experts.down"] = mlp.experts.down_proj
                else:
                    for n in ("gate", "up", "down"):
                        want[at + n + "_proj.weight"] = getattr(mlp, n + "_proj").weight
        logits, cache = bridge.run_with_cache(ids)
        want["logits"] = logits
        heads = cache.stack_head_results(layer=-1, pos_slice=-1, apply_ln=True)  # (layers*heads, batch, d_model)
        want["dla_heads"] = (heads @ bridge.W_U[:, TARGET]).mean(-1)
    return want, plain


def compare(exe, tmp, name, folder, steps, report):
    ids = torch.randint(0, 400, (3, 9))
    want, hf_plain = transformer_lens_side(folder, ids)
    ids_path, out = os.path.join(tmp, name + "_ids.safetensors"), os.path.join(tmp, name + "_out.safetensors")
    safetensors_io.save(ids_path, {"ids": ids + 1})
    got = tl_side.run_anatomy(exe, "process_parity.lua", [folder, ",".join(steps), ids_path, str(TARGET + 1), out], out,
                              report, name)
    if got is None:
        return
    for key, w in want.items():
        if key in ("logits", "dla_heads"):
            continue
        if key not in got:
            if w.abs().max().item() != 0:  # a zero bias TransformerLens keeps where anatomy's block has none is fine
                report.fail("%s %s: anatomy has none, TransformerLens's is not zero" % (name, key))
            continue
        report.check(name, key, got[key], w, WEIGHT_TOL)
    report.check(name, "logits (processed, against TransformerLens's)", got["logits"], want["logits"], OUTPUT_TOL)
    centre = lambda t: t.double() - t.double().mean(-1, keepdim=True)
    report.check(name, "logits less their mean: processed vs not", centre(got["logits"]), centre(got["logits_unprocessed"]),
                 OUTPUT_TOL)
    report.check(name, "unprocessed logits against transformers'", got["logits_unprocessed"], hf_plain, OUTPUT_TOL)
    if name.startswith("gemma"):  # a head's share of the logit does not pass a post-norm alone: attribution refuses them
        report.check(name, "no direct logit attribution through post-norms", torch.tensor(float("dla_heads" in got)),
                     torch.zeros(()), 0)
    else:
        report.check(name, "direct logit attribution per head", got["dla_heads"], want["dla_heads"], OUTPUT_TOL)
    report.check(name, "layer norms left at weight 1, bias 0", got["norm_identity_error"], torch.zeros(1), 0)
    report.check(name, "post-norms and QK-norms unchanged", got["kept_norm_change"], torch.zeros(1), 0)


def perturbed(model, which):
    """The norms (and, by `which`, the biases) moved away from their initial 1 and 0, so that folding them shows."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if which(n):
                p.add_(torch.randn_like(p) * 0.2)
    return model


def main():
    exe = sys.argv[1]
    tok, wrapped = tl_side.tokenizer()
    V = tok.get_vocab_size()
    cases = [("gpt2", lambda: perturbed(tl_side.tiny("gpt2", V, 2, 0.3), lambda n: "ln" in n or n.endswith("bias")),
              ["fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases"]),
             ("llama-gqa", lambda: perturbed(tl_side.tiny("llama", V, 2, 0.3), lambda n: "norm" in n),
              ["fold_ln", "center_unembed"]),  # no value biases: anatomy refuses a fold of nothing
             ("qwen2-gqa", lambda: perturbed(tl_side.tiny("qwen2", V, 2, 0.3), lambda n: "norm" in n or n.endswith("bias")),
              ["fold_ln", "center_unembed", "fold_value_biases"]),  # value biases into an output bias it gains
             ("phi", lambda: perturbed(tl_side.transformers.PhiForCausalLM(tl_side.transformers.PhiConfig(
                 vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=64, initializer_range=0.3, bos_token_id=0, eos_token_id=0)),
                 lambda n: "layernorm" in n or n.endswith("bias")),  # one norm read by attention and MLP, a head bias
              ["fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases"]),
             ("gptj", lambda: perturbed(tl_side.transformers.GPTJForCausalLM(tl_side.transformers.GPTJConfig(
                 vocab_size=V, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64, initializer_range=0.3,
                 bos_token_id=0, eos_token_id=0)), lambda n: "ln_" in n or n.endswith("bias")),
              # q, k, v without biases: ln_1's shift folds into the b_Q, b_K, b_V they gain, b_V then into b_O
              ["fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases"]),
             # Gemma 2: four norms; the pre-norms fold with their (1 + w), the post-norms stay; with the final
             # soft-capping TransformerLens skips center_unembed (anatomy refuses it): fold_ln alone
             ("gemma2", lambda: perturbed(tl_side.transformers.Gemma2ForCausalLM(tl_side.transformers.Gemma2Config(
                 vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, sliding_window=4,
                 max_position_embeddings=64, initializer_range=0.3, final_logit_softcapping=3.0,
                 attn_logit_softcapping=5.0, bos_token_id=0, eos_token_id=0, pad_token_id=0)),
                 lambda n: "norm" in n),
              ["fold_ln"]),
             # Gemma 3 (text): as Gemma 2 with QK-norms (kept) and no final soft-capping: fold_ln, center_unembed
             ("gemma3", lambda: perturbed(tl_side.transformers.Gemma3ForCausalLM(tl_side.transformers.Gemma3TextConfig(
                 vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, sliding_window=4,
                 layer_types=["sliding_attention", "full_attention"], max_position_embeddings=64,
                 initializer_range=0.3, bos_token_id=0, eos_token_id=0, pad_token_id=0)),
                 lambda n: "norm" in n),
              ["fold_ln", "center_unembed"]),
             # Mixtral: ln2 folds into the router and every expert's gate and up (TransformerLens's bridge folds the
             # batched experts in place), RMSNorm: fold_ln, center_unembed
             ("mixtral", lambda: perturbed(tl_side.transformers.MixtralForCausalLM(tl_side.transformers.MixtralConfig(
                 vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                 initializer_range=0.3, bos_token_id=0, eos_token_id=0)), lambda n: "norm" in n),
              ["fold_ln", "center_unembed"]),
             # OLMoE: the same, with QK-norms over the whole projections (kept)
             ("olmoe", lambda: perturbed(tl_side.transformers.OlmoeForCausalLM(tl_side.transformers.OlmoeConfig(
                 vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                 initializer_range=0.3, bos_token_id=0, eos_token_id=0, pad_token_id=1)), lambda n: "norm" in n),
              ["fold_ln", "center_unembed"]),
             # Qwen3-MoE: per-head QK-norms (kept), a dense layer (mlp_only_layers) between two sparse ones
             ("qwen3-moe", lambda: perturbed(tl_side.transformers.Qwen3MoeForCausalLM(tl_side.transformers.Qwen3MoeConfig(
                 vocab_size=V, hidden_size=32, intermediate_size=64, moe_intermediate_size=48, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
                 mlp_only_layers=[1], max_position_embeddings=64, initializer_range=0.3, bos_token_id=0,
                 eos_token_id=0)), lambda n: "norm" in n),
              ["fold_ln", "center_unembed"])]
    report = tl_side.Report()
    with tempfile.TemporaryDirectory() as tmp:
        for name, make, steps in cases:
            torch.manual_seed(0)
            folder = os.path.join(tmp, name)
            tl_side.save(make(), wrapped, folder)
            compare(exe, tmp, name, folder, steps, report)
    report.finish()


if __name__ == "__main__":
    main()
