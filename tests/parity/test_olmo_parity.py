"""OLMo 2 (model_type "olmo2") and OLMoE ("olmoe"): tiny random
Olmo2ForCausalLM and OlmoeForCausalLM models written here by `transformers`
with save_pretrained load through models.from_pretrained and give
transformers' numbers, through test_pretrained_parity's checks (its compare):
token ids, logits, every hidden state, every attention pattern, the same with
every hook point on, the loss and greedy generation with the key/value cache,
token for token. Then: the model anatomy saves (its final norm edited) holds
the tensors transformers' own save_pretrained writes (OLMoE's experts one
tensor each, mlp.experts.E.gate_proj, up_proj, down_proj) and is read back by
transformers to the same logits; a batch of three texts padded on the left
gives each text's logits as when it runs alone and transformers' logits of
the same padded batch, and its greedy continuation with the attention mask is
transformers' generate of the same batch (OLMo 2: phi_parity.lua's run; OLMoE:
moe_parity.lua's, which adds each layer's router logits against
output_router_logits and its experts' shares, as test_moe_parity checks
them). The first model of each family in bfloat16. OLMoE in transformers 5's
fused layout (mlp.experts.gate_up_proj, down_proj) loads to the same logits.
clip_qkv and output_router_logits are refused by name.
TransformerLens 4.3's TransformerBridge (unprocessed, eager) on the first
model of each: every tensor it caches under a name anatomy maps is found in
anatomy's cache by that name and equal (test_tl_parity's check_names). For
OLMo 2 the post-norms are TransformerLens's ln1_post and ln2_post, and its
hook_attn_out and hook_mlp_out are their outputs (what each part adds to the
stream), its hook_resid_mid the MLP's input: each must be found. For OLMoE
its router logits (blocks.{l}.mlp.gate.hook_out) and MLP outputs
(test_moe_parity's check_bridge); by their names, the QK-norms'
attn.hook_q_normed and hook_k_normed, OLMo 2's mlp.hook_pre_linear, and the
MoE bridge's mlp.hook_pre and mlp.hook_post (the MoE's input and output, as
its bridge aliases them), hook_expert_weights and hook_expert_indices.
Variants: OLMo 2 with grouped keys and values, untied head; OLMo 2 with
attention_bias, multi-query, rope_theta 500, tied head; OLMoE with 6 experts,
top-3, norm_topk_prob false (OLMoE's), grouped-query; OLMoE with 4 experts,
top-2, norm_topk_prob true, multi-query.

Tolerance (float32): test_pretrained_parity's, |anatomy - transformers| <=
1e-4 + 1e-4 * |transformers| for logits, hidden states, patterns and router
logits; loss within 1e-5; ids and expert choices exact. TransformerLens:
1e-5 + 1e-4 * |TL|. bfloat16 (dtype = 'bfloat16' against transformers' model
cast to bfloat16): 0.02 + 0.02 * |logit|, as test_pretrained_parity.
Needs transformers and tokenizers (the PyPI build's venv); exits 77 without.
Usage: test_olmo_parity.py ANATOMY_EXECUTABLE
"""
import contextlib
import io
import json
import os
import sys
import tempfile

try:
    import torch
    import transformers
    from transformers import Olmo2Config, Olmo2ForCausalLM, OlmoeConfig, OlmoeForCausalLM
    from test_bpe_parity import llama3_like
    import test_pretrained_parity as P
    import test_moe_parity as M
    import test_phi_parity as Phi
except ImportError as e:
    print(f"skip: {e}; the PyPI build's venv has transformers and tokenizers (scripts/test)")
    sys.exit(77)

# OLMo 2's names TransformerLens's bridge must find in anatomy's cache (beyond test_tl_parity's for every model)
OLMO2_MAPPED = ["hook_resid_pre", "hook_resid_mid", "hook_resid_post", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z",
                "attn.hook_pattern", "attn.hook_attn_scores", "attn.hook_rot_q", "attn.hook_rot_k", "hook_attn_out", "hook_mlp_out",
                "mlp.hook_pre", "mlp.hook_post", "ln1_post.hook_scale", "ln1_post.hook_normalized", "ln1_post.hook_out",
                "ln2_post.hook_scale", "ln2_post.hook_normalized", "ln2_post.hook_out", "attn.hook_out", "mlp.hook_out"]
# OLMoE's: a Llama's, its MoE bridge's mlp.hook_pre and hook_post the MoE's input and output, and its router's
OLMOE_MAPPED = ["hook_resid_pre", "hook_resid_mid", "hook_resid_post", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z",
                "attn.hook_pattern", "attn.hook_attn_scores", "attn.hook_rot_q", "attn.hook_rot_k", "hook_attn_out", "hook_mlp_out",
                "ln1.hook_scale", "ln1.hook_normalized", "ln2.hook_scale", "ln2.hook_normalized", "mlp.hook_pre", "mlp.hook_post",
                "mlp.hook_out", "mlp.gate.hook_out"]


def olmo2(tmp, name, tok, **config):
    return P.make_llama(tmp, name, tok, cls=Olmo2ForCausalLM, config_cls=Olmo2Config, **config)


def olmoe(tmp, name, tok, **config):
    base = dict(num_experts=6, num_experts_per_tok=3)
    base.update(config)
    return P.make_llama(tmp, name, tok, cls=OlmoeForCausalLM, config_cls=OlmoeConfig, **base)


def bfloat16(name, exe, folder, tmp, hf, ids, failures):
    """The model in bfloat16 against transformers' cast to it (last: the cast rounds its weights)."""
    got16, err = P.run(exe, folder, tmp, dtype="bfloat16")
    if err:
        failures.append(f"{name}: bfloat16: anatomy failed: {err}")
        return
    with torch.no_grad():
        ref = hf.to(torch.bfloat16)(torch.tensor([ids])).logits[0].float()
    hf.float()
    d = (torch.tensor(got16["logits"]) - ref).abs()
    print(f"      bfloat16 logits: largest difference {d.max().item():.3g}")
    if got16["dtype"] != "bfloat16" or not bool((d <= 0.02 + 0.02 * ref.abs()).all()):
        failures.append(f"{name}: bfloat16 logits ({got16['dtype']}) differ by {d.max().item()}")


def bridge_names(name, exe, tmp, folder, hf, mapped, failures):
    """TransformerLens 4.3's bridge on the folder: its hook tensors by its names in anatomy's cache."""
    try:
        import test_tl_parity
        from transformer_lens.model_bridge import TransformerBridge
    except (ImportError, SystemExit):
        print("skip  TransformerLens's hook names: the venv has no transformer-lens")
        return 0
    eager = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        bridge = TransformerBridge.boot_transformers(folder, hf_model=eager, device="cpu")
        bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    every = test_tl_parity.MAPPED
    test_tl_parity.MAPPED = mapped  # each of these, cached by the bridge, must be found
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        print(f"      {name}: TransformerLens 4.3's bridge: ", end="")
        n, failed = test_tl_parity.check_names(exe, here, tmp, folder, hf.config, bridge)
    finally:
        test_tl_parity.MAPPED = every
    failures += [f"{name}: {f}" for f in failed]
    return n


def main():
    exe = sys.argv[1]
    passed, failures = 0, []
    tok = llama3_like()
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            ("olmo2: grouped keys and values, untied head", "olmo2", dict()),
            ("olmo2: attention_bias, multi-query, rope_theta 500, tied head", "olmo2",
             dict(attention_bias=True, num_key_value_heads=1, rope_theta=500.0, tie_word_embeddings=True)),
            ("olmoe: 6 experts, top-3, norm_topk_prob false, grouped-query", "olmoe", dict()),
            ("olmoe: 4 experts, top-2, norm_topk_prob true, multi-query", "olmoe",
             dict(num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, num_key_value_heads=1)),
        ]
        firsts = set()
        for name, family, config in cases:
            make = olmo2 if family == "olmo2" else olmoe
            folder, hf = make(tmp, "".join(c if c.isalnum() else "_" for c in name), tok, **config)
            hf.generation_config.eos_token_id = None
            hf.generation_config.pad_token_id = hf.config.vocab_size - 1
            saved = folder + "-saved"
            got, err = P.run(exe, folder, tmp, saved)
            if err:
                failures.append(f"{name}: anatomy failed: {err}")
                continue
            before = len(failures)
            n = P.compare(name, got, hf, tok, failures)
            # save_pretrained: the tensors transformers' own save_pretrained writes, read back by transformers
            n += 2
            if M.saved_names(saved) != M.saved_names(folder):
                failures.append(f"{name}: save_pretrained wrote {sorted(M.saved_names(saved) ^ M.saved_names(folder))[:4]} "
                                "where transformers' save_pretrained does not (or the reverse)")
            reloaded = transformers.AutoModelForCausalLM.from_pretrained(saved).eval()
            with torch.no_grad():
                logits = reloaded(torch.tensor([got["ids"]])).logits[0]
            excess, d = P.max_excess(got["edited_logits"], logits)
            if excess > 0:
                failures.append(f"{name}: save_pretrained: transformers' logits of the saved model differ by {d}")
            if family == "olmo2":  # the padded batch and its generation
                pad, err = Phi.padded(exe, folder, tmp)
                if err:
                    failures.append(f"{name}: padded batch: anatomy failed: {err}")
                else:
                    n += Phi.check_padded(name, pad, hf, failures)
            else:  # the router logits, the experts' shares, the padded batch and its generation
                moe, err = M.run_moe(exe, folder, tmp)
                if err:
                    failures.append(f"{name}: anatomy failed on the router and padded batch: {err}")
                else:
                    n += M.check_moe(name, moe, hf, failures) + M.check_bridge(name, moe, folder, failures)
            if family not in firsts:
                firsts.add(family)
                n += bridge_names(name, exe, tmp, folder, hf, OLMO2_MAPPED if family == "olmo2" else OLMOE_MAPPED, failures)
                n += 1
                bfloat16(name, exe, folder, tmp, hf, got["ids"], failures)
            passed += n - (len(failures) - before)
            print(f"{'ok  ' if len(failures) == before else 'FAIL'}  {name}: {n} checks")
        # transformers 5's own layout (save_original_format=False): OLMoE's experts fused
        folder, hf = olmoe(tmp, "fused", tok)
        fused = folder + "-fused"
        hf.save_pretrained(fused, save_original_format=False)
        tok.save(os.path.join(fused, "tokenizer.json"))
        names = M.saved_names(fused)
        got, err = P.run(exe, fused, tmp)
        with torch.no_grad():
            ref = hf(torch.tensor([tok.encode(P.TEXT).ids])).logits[0] if not err else None
        excess, d = P.max_excess(got["logits"], ref) if not err else (float("inf"), err)
        if "model.layers.0.mlp.experts.gate_up_proj" not in names:
            failures.append(f"fused layout: transformers wrote no gate_up_proj ({sorted(names)[:6]})")
        elif excess > 0:
            failures.append(f"olmoe, fused layout (mlp.experts.gate_up_proj, down_proj): logits differ by {d}")
        else:
            passed += 1
            print(f"ok    olmoe, fused layout (mlp.experts.gate_up_proj, down_proj): logits within tolerance ({d:.3g})")
        refusals = [
            (olmoe, dict(clip_qkv=2.0), "config.json has clip_qkv = 2, which anatomy does not support"),
            (olmoe, dict(output_router_logits=True), "config.json has output_router_logits = true, which anatomy does not support"),
            (olmo2, dict(hidden_act="gelu"), "config.json has hidden_act = \"gelu\", which anatomy does not support"),
        ]
        for i, (make, config, want) in enumerate(refusals):
            folder, _ = make(tmp, f"refused_{i}", tok, **config)
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
