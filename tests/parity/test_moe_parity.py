"""Mixtral (model_type "mixtral"): tiny random MixtralForCausalLM models
written here by `transformers` with save_pretrained load through
models.from_pretrained (nn.MoE as each layer's MLP) and give transformers'
numbers, through test_pretrained_parity's checks (its compare): token ids,
logits, every hidden state, every attention pattern, the same with every
hook point on, the loss and greedy generation with the key/value cache,
token for token. Then: the model anatomy saves (its final norm edited) is
written in the Hub's per-expert layout, as transformers' save_pretrained
writes it, and read back by transformers to the same logits; each layer's
router logits (blocks.L.mlp.router_logits, and TransformerLens's
blocks.{l}.mlp.hook_router_logits resolving to it) are transformers'
(output_router_logits=True); each expert's share (expert_out) sums to the
MLP's output, at most top_k of them non-zero for a token, and hooking it
leaves the logits as they are; a batch of three texts padded on the left
gives each text's logits as when it runs alone and transformers' logits of
the same padded batch, and its greedy continuation with the attention mask
is transformers' generate of the same batch; TransformerLens 4.3's bridge
(unprocessed) gives the same router logits (its blocks.{l}.mlp.gate.hook_out)
and MLP outputs (blocks.{l}.hook_mlp_out), where it is installed, and every
tensor it caches under a name anatomy maps is found in anatomy's cache by
that name and equal (test_tl_parity's check_names: mlp.hook_pre and
hook_post, the MoE's input and output, hook_expert_weights and
hook_expert_indices among them). A folder in transformers 5's
fused layout (mlp.experts.gate_up_proj, down_proj) loads to the same logits;
output_router_logits = true is refused by name.

Tolerance (float32): test_pretrained_parity's, |anatomy - transformers| <=
1e-4 + 1e-4 * |transformers| for logits, hidden states, patterns and router
logits; loss within 1e-5; ids and expert choices exact. The experts' shares
against the MLP's output: 1e-5.
Needs transformers and tokenizers (the PyPI build's venv); exits 77 without.
Usage: test_moe_parity.py ANATOMY_EXECUTABLE
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
    from transformers import MixtralConfig, MixtralForCausalLM
    from test_bpe_parity import llama3_like
    import test_pretrained_parity as P
    import family_checks as F
    from family_checks import TEXTS
except ImportError as e:
    print(f"skip: {e}; the PyPI build's venv has transformers and tokenizers (scripts/test)")
    sys.exit(77)


def mixtral(tmp, name, tok, **config):
    base = dict(num_local_experts=4, num_experts_per_tok=2)
    base.update(config)
    return P.make_llama(tmp, name, tok, cls=MixtralForCausalLM, config_cls=MixtralConfig, **base)


def run_moe(exe, folder, tmp):
    out = os.path.join(tmp, "moe.json")
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([exe, "--threads=1", os.path.join(here, "moe_parity.lua"), folder, out] + TEXTS,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return None, (proc.stdout + proc.stderr).strip()
    return json.load(open(out)), None


def check_moe(name, got, hf, failures):
    """Router logits, the TransformerLens name, the experts' shares (every layer an MoE), the padded batch and its
    generation."""
    layers = list(range(1, hf.config.num_hidden_layers + 1))
    return F.check_router(name, got, hf, layers, failures) + F.check_padded(name, got, hf, failures)


def check_bridge(name, got, bridge, failures):
    """TransformerLens 4.3's bridge (unprocessed, F.boot_bridge's quiet one) on the same folder: its
    blocks.{l}.mlp.gate.hook_out (the router logits, (B * T, E)) and blocks.{l}.hook_mlp_out against anatomy's
    router_logits and MLP output."""
    checks, worst = 0, 0.0
    with torch.no_grad():
        _, cache = bridge.run_with_cache(torch.tensor([got["ids"][0]]))
    for i in range(len(got["router"])):
        for what, tl_name, mine in (("router logits", f"blocks.{i}.mlp.gate.hook_out", got["router"][i]),
                                    ("MLP output", f"blocks.{i}.hook_mlp_out", got["mlp_out"][i])):
            want = cache[tl_name]
            excess, d = P.max_excess(mine, want.reshape(torch.tensor(mine).shape))
            checks += 1
            worst = max(worst, d)
            if excess > 0:
                failures.append(f"{name}: TransformerLens's {tl_name} ({what}) differs by {d}")
    print(f"      TransformerLens 4.3's bridge: {checks} router logits and MLP outputs, largest difference {worst:.3g}")
    return checks


def main():
    exe = sys.argv[1]
    passed, failures = 0, []
    tok = llama3_like()
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            ("mixtral: 4 experts, top-2, grouped-query", dict()),
            ("mixtral: 5 experts, top-3, sliding_window 4, multi-query", dict(num_local_experts=5, num_experts_per_tok=3,
                                                                             sliding_window=4, num_key_value_heads=1)),
        ]
        for name, config in cases:
            folder, hf = mixtral(tmp, F.folder_name(name), tok, **config)
            before = len(failures)
            got, n, saved = F.run(name, exe, folder, hf, tmp, tok, failures)
            if got is None:
                continue
            # save_pretrained: the layout transformers writes, read back by transformers
            n += F.same_names(name, saved, folder, failures) + F.saved_logits(name, got, saved, failures)[0]
            moe, err = run_moe(exe, folder, tmp)
            if err:
                failures.append(f"{name}: anatomy failed on the router and padded batch: {err}")
            else:
                # TransformerLens's bridge: every tensor it caches under a name anatomy maps, by that name
                # (test_tl_parity's check_names: the MoE's mlp.hook_pre and hook_post, its input and output,
                # mlp.gate.hook_out, hook_expert_weights and hook_expert_indices among them), then check_bridge's
                n += check_moe(name, moe, hf, failures) + F.bridge_names(
                    exe, tmp, folder, hf.config, failures, quiet=True, lead="      ", label=f"{name}: TransformerLens: ",
                    then=lambda bridge, failures: check_bridge(name, moe, bridge, failures))
            passed += F.tally(name, n, before, failures)
        folder, hf = mixtral(tmp, "fused", tok)
        passed += F.fused_layout("", exe, tmp, tok, folder, hf, 0, failures)
        refusals = [
            (dict(output_router_logits=True), "config.json has output_router_logits = true, which anatomy does not support"),
        ]
        passed += F.refused(exe, tmp, refusals, lambda i, config: mixtral(tmp, "refused", tok, **config)[0], failures)
    F.finish(passed, failures)


if __name__ == "__main__":
    main()
