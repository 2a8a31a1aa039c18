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
import sys
import tempfile

try:
    from transformers import Olmo2Config, Olmo2ForCausalLM, OlmoeConfig, OlmoeForCausalLM
    from test_bpe_parity import llama3_like
    import test_pretrained_parity as P
    import test_moe_parity as M
    import family_checks as F
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
            folder, hf = make(tmp, F.folder_name(name), tok, **config)
            before = len(failures)
            got, n, saved = F.run(name, exe, folder, hf, tmp, tok, failures)
            if got is None:
                continue
            # save_pretrained: the tensors transformers' own save_pretrained writes, read back by transformers
            n += F.same_names(name, saved, folder, failures) + F.saved_logits(name, got, saved, failures)[0]
            if family == "olmo2":  # the padded batch and its generation
                n += F.padded_batch(name, exe, folder, tmp, hf, failures)
            else:  # the router logits, the experts' shares, the padded batch and its generation
                moe, err = M.run_moe(exe, folder, tmp)
                if err:
                    failures.append(f"{name}: anatomy failed on the router and padded batch: {err}")
                else:
                    bridge = F.boot_bridge(folder, quiet=True)
                    n += M.check_moe(name, moe, hf, failures) + (M.check_bridge(name, moe, bridge, failures) if bridge else 0)
            if family not in firsts:
                firsts.add(family)
                n += F.bridge_names(exe, tmp, folder, hf.config, failures, quiet=True,
                                    mapped=OLMO2_MAPPED if family == "olmo2" else OLMOE_MAPPED,
                                    lead=f"      {name}: TransformerLens 4.3's bridge: ", label=f"{name}: ")
                n += F.bfloat16(name, exe, folder, tmp, got["ids"], hf, failures)
            passed += F.tally(name, n, before, failures)
        folder, hf = olmoe(tmp, "fused", tok)
        passed += F.fused_layout("olmoe, ", exe, tmp, tok, folder, hf, 0, failures)
        refusals = [
            ((olmoe, dict(clip_qkv=2.0)), "config.json has clip_qkv = 2, which anatomy does not support"),
            ((olmoe, dict(output_router_logits=True)), "config.json has output_router_logits = true, which anatomy does not support"),
            ((olmo2, dict(hidden_act="gelu")), "config.json has hidden_act = \"gelu\", which anatomy does not support"),
        ]
        passed += F.refused(exe, tmp, refusals, lambda i, what: what[0](tmp, f"refused_{i}", tok, **what[1])[0], failures)
    F.finish(passed, failures)


if __name__ == "__main__":
    main()
