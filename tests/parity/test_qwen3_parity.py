"""Qwen3 and Qwen3-MoE (model_type "qwen3", "qwen3_moe"): tiny random
Qwen3ForCausalLM and Qwen3MoeForCausalLM models written here by
`transformers` with save_pretrained load through models.from_pretrained
(models/qwen3.lua: Llama's block with an RMSNorm over each head's queries and
keys, nn.MoE on the sparse layers) and give transformers' numbers, through
test_pretrained_parity's checks (its compare): token ids, logits, every
hidden state, every attention pattern, the same with every hook point on, the
loss and greedy generation with the key/value cache, token for token. Then:
the model anatomy saves (its final norm edited) holds the tensors
transformers' save_pretrained writes (Qwen3-MoE's experts one tensor each,
mlp.experts.E.gate_proj/up_proj/down_proj) and transformers reads it back to
the same logits; a batch of three texts padded on the left gives each text's
logits as when it runs alone and transformers' logits of the same padded
batch, and its greedy continuation with the attention mask is transformers'
generate of the same batch. Qwen3-MoE's sparse layers (mlp_only_layers and
decoder_sparse_step leave others dense): each one's router logits
(blocks.L.mlp.router_logits, and TransformerLens's
blocks.{l}.mlp.hook_router_logits resolving to it) are transformers'
(output_router_logits=True), the same experts chosen; each expert's share
(expert_out) sums to the MLP's output, at most top_k of them non-zero for a
token, and hooking it leaves the logits as they are. The first Qwen3 and the
first Qwen3-MoE in bfloat16 against transformers' cast to bfloat16; a folder
in transformers 5's fused layout (mlp.experts.gate_up_proj, down_proj) loads
to the same logits; the config switches anatomy does not honour are refused
by name. Last, TransformerLens 4.3's TransformerBridge (unprocessed) on the
first of each: every tensor it caches under a name anatomy maps is found in
anatomy's cache by that name and equal (test_tl_parity's check_names: among
them attn.hook_q_normed and hook_k_normed, the dense layers'
mlp.hook_pre_linear, and on the sparse layers the MoE bridge's mlp.hook_pre
and hook_post, the MoE's input and output, mlp.gate.hook_out,
hook_expert_weights and hook_expert_indices), and for Qwen3-MoE its router
logits (blocks.{l}.mlp.gate.hook_out) and MLP inputs and outputs
(blocks.{l}.hook_mlp_out, mlp.hook_pre, mlp.hook_post) are also compared
with the tensors anatomy's own run gives.
Variants: Qwen3 with head_dim 16 over hidden_size 32 and 4 heads (head_dim
is its own setting), grouped keys and values, untied; Qwen3 with
attention_bias (q, k, v and o), multi-query, a tied head, and the sliding
window 4 from max_window_layers 1 on (use_sliding_window), rope_theta 500;
Qwen3 with layer_types naming the sliding layers (1 and 3 of 3); Qwen3-MoE
with 4 experts, top-2 not renormalised (norm_topk_prob false, transformers'
default), moe_intermediate_size 24 and the middle layer dense
(mlp_only_layers [1], intermediate_size 48); Qwen3-MoE with 5 experts, top-3
renormalised, decoder_sparse_step 2 (layers 2 and 4 of 4 sparse), the
sliding window 4 on every layer; the Hub's config.json form (Qwen/Qwen3-30B-A3B's:
num_experts, max_window_layers and rope_theta at the top level).

Tolerance (float32): test_pretrained_parity's, |anatomy - transformers| <=
1e-4 + 1e-4 * |transformers| for logits, hidden states, patterns and router
logits; loss within 1e-5; ids and expert choices exact. The experts' shares
against the MLP's output: 1e-5. Padded against alone: the same bound as
logits. bfloat16: 0.02 + 0.02 * |logit|. TransformerLens: 1e-5 + 1e-4 * |TL|.
Needs transformers and tokenizers (the PyPI build's venv); exits 77 without.
Usage: test_qwen3_parity.py ANATOMY_EXECUTABLE
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
    from test_bpe_parity import llama3_like
    import test_pretrained_parity as P
    import family_checks as F
    from family_checks import TEXTS
except ImportError as e:
    print(f"skip: {e}; the PyPI build's venv has transformers and tokenizers (scripts/test)")
    sys.exit(77)


def qwen3(tmp, name, tok, **config):
    return P.make_llama(tmp, name, tok, cls=Qwen3ForCausalLM, config_cls=Qwen3Config, **config)


def qwen3_moe(tmp, name, tok, **config):
    base = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, num_hidden_layers=3)
    base.update(config)
    return P.make_llama(tmp, name, tok, cls=Qwen3MoeForCausalLM, config_cls=Qwen3MoeConfig, **base)


def run_side(exe, folder, tmp):
    out = os.path.join(tmp, "qwen3.json")
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([exe, "--threads=1", os.path.join(here, "qwen3_parity.lua"), folder, out] + TEXTS,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return None, (proc.stdout + proc.stderr).strip()
    return json.load(open(out)), None


def check_router(name, got, hf, failures):
    """The sparse layers transformers' config makes (mlp_only_layers, decoder_sparse_step), then
    family_checks.check_router on them."""
    cfg = hf.config
    want_sparse = [i + 1 for i in range(cfg.num_hidden_layers)
                   if i not in cfg.mlp_only_layers and (i + 1) % cfg.decoder_sparse_step == 0]
    sparse = list(got["sparse"] or [])
    if sparse != want_sparse:
        failures.append(f"{name}: sparse layers {sparse} vs transformers' {want_sparse}")
    return 1 + F.check_router(name, got, hf, sparse, failures, f"router logits of layers {sparse}")


def check_bridge(name, got, bridge, failures):
    """For Qwen3-MoE, TransformerLens 4.3's bridge (unprocessed, F.boot_bridge's quiet one): its router logits and
    MLP outputs of the sparse layers, and the MLP's input and output its MoE bridge names mlp.hook_pre and
    hook_post there (aliases of its hook_in, hook_out)."""
    sparse = list(got["sparse"] or [])
    if not sparse:
        return 0
    checks, worst = 0, 0.0
    with torch.no_grad():
        _, cache = bridge.run_with_cache(torch.tensor([got["ids"][0]]))
    for k, l in enumerate(sparse):
        for what, tl_name, mine in (("router logits", f"blocks.{l - 1}.mlp.gate.hook_out", got["router"][k]),
                                    ("MLP output", f"blocks.{l - 1}.hook_mlp_out", got["mlp_out"][k]),
                                    ("MLP output", f"blocks.{l - 1}.mlp.hook_post", got["mlp_out"][k]),
                                    ("MLP input", f"blocks.{l - 1}.mlp.hook_pre", got["mlp_in"][k])):
            want = cache[tl_name]
            excess, d = P.max_excess(mine, want.reshape(torch.tensor(mine).shape))
            checks += 1
            worst = max(worst, d)
            if excess > 0:
                failures.append(f"{name}: TransformerLens's {tl_name} ({what}) differs by {d}")
    print(f"      TransformerLens 4.3's bridge: {checks} router logits, MLP inputs and outputs, largest difference {worst:.3g}")
    return checks


def hub_form(folder):
    """Qwen/Qwen3-30B-A3B's config.json form: num_experts, rope_theta and max_window_layers at the top level."""
    path = os.path.join(folder, "config.json")
    cfg = json.load(open(path))
    rope = cfg.pop("rope_parameters")
    cfg["num_experts"] = cfg.pop("num_local_experts")
    cfg.update(rope_theta=rope["rope_theta"], rope_scaling=None, max_window_layers=48, sliding_window=None,
               use_sliding_window=False)
    json.dump(cfg, open(path, "w"))


def main():
    exe = sys.argv[1]
    passed, failures = 0, []
    tok = llama3_like()
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            ("qwen3: head_dim 16 of its own, grouped-query, untied", qwen3, dict(head_dim=16)),
            ("qwen3: attention_bias, multi-query, tied head, sliding window 4 from max_window_layers 1, rope_theta 500",
             qwen3, dict(attention_bias=True, num_key_value_heads=1, tie_word_embeddings=True, use_sliding_window=True,
                         sliding_window=4, max_window_layers=1, rope_theta=500.0, num_hidden_layers=3)),
            ("qwen3: layer_types naming the sliding layers (1 and 3 of 3)", qwen3,
             dict(use_sliding_window=True, sliding_window=4, num_hidden_layers=3,
                  layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
            ("qwen3_moe: 4 experts, top-2 not renormalised, moe_intermediate_size 24, mlp_only_layers [1]", qwen3_moe,
             dict(mlp_only_layers=[1], head_dim=16)),
            ("qwen3_moe: 5 experts, top-3 renormalised, decoder_sparse_step 2, sliding window 4", qwen3_moe,
             dict(num_experts=5, num_experts_per_tok=3, norm_topk_prob=True, decoder_sparse_step=2, num_hidden_layers=4,
                  use_sliding_window=True, sliding_window=4)),
            ("qwen3_moe: the Hub's config.json (Qwen/Qwen3-30B-A3B's form)", qwen3_moe,
             dict(head_dim=16, rope_theta=500.0, hub=True)),
        ]
        firsts = set()
        for name, make, config in cases:
            hub = config.pop("hub", False)
            folder, hf = make(tmp, F.folder_name(name), tok, **config)
            if hub:
                hub_form(folder)
                hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
            before = len(failures)
            got, n, saved = F.run(name, exe, folder, hf, tmp, tok, failures)
            if got is None:
                continue
            # save_pretrained: the tensors transformers writes, read back by transformers
            n += F.same_names(name, saved, folder, failures) + F.saved_logits(name, got, saved, failures)[0]
            side, err = run_side(exe, folder, tmp)
            if err:
                failures.append(f"{name}: anatomy failed on the padded batch and the router: {err}")
            else:
                n += F.check_padded(name, side, hf, failures)
                if make is qwen3_moe:
                    n += check_router(name, side, hf, failures)
                if make not in firsts:  # the first of each family: TransformerLens's bridge, and bfloat16 (last: the cast rounds)
                    # every tensor the bridge caches under a name anatomy maps (test_tl_parity.check_names), then
                    # check_bridge's
                    n += F.bridge_names(exe, tmp, folder, hf.config, failures, quiet=True, label=f"{name}: TransformerLens: ",
                                        then=lambda bridge, failures: check_bridge(name, side, bridge, failures))
                    n += F.bfloat16(name, exe, folder, tmp, got["ids"], hf, failures)
                    firsts.add(make)
            passed += F.tally(name, n, before, failures)
        folder, hf = qwen3_moe(tmp, "fused", tok, mlp_only_layers=[0])
        passed += F.fused_layout("qwen3_moe: ", exe, tmp, tok, folder, hf, 1, failures)
        refusals = [
            ((qwen3_moe, dict(output_router_logits=True)), "config.json has output_router_logits = true, which anatomy does not support"),
            ((qwen3_moe, dict(num_experts_per_tok=5)), "config.json has num_experts_per_tok = 5, which anatomy does not support"),
            ((qwen3, dict(hidden_act="gelu")), "config.json has hidden_act = \"gelu\", which anatomy does not support"),
            ((qwen3, dict(rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=32))),
             "config.json has rope_parameters.rope_type = \"yarn\", which anatomy does not support"),
        ]

        def refused_folder(i, what):
            make, config = what
            try:
                return make(tmp, f"refused_{i}", tok, **config)[0]
            except Exception as e:  # transformers refuses it too: write the config by hand
                failures.append(f"refusal {config}: transformers would not make the model: {e}")
                return None
        passed += F.refused(exe, tmp, refusals, refused_folder, failures)
    F.finish(passed, failures)


if __name__ == "__main__":
    main()
