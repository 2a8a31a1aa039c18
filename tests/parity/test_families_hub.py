"""Every family anatomy loads (each model_type of pretrained.families: one
missing here is a failure), by name from a Hub on loopback
(tests/hub/fake_hub.py) as from its folder: a tiny random checkpoint of each
that transformers 5.23 writes here (save_pretrained, safetensors), its logits
against transformers' on the same ids, and the autopsy run on it (a row per
layer, each with a removal loss; on a mixture of experts, its router's
entropy on each MoE layer).

The ids are 12 positions, past the 4-position sliding windows of the
families that have them. Tolerance on the logits: 1e-4 absolute (float32).
Needs transformers (the PyPI build's venv); exits 77 without.
Usage: test_families_hub.py ANATOMY_EXECUTABLE
"""
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # tiny vocabularies: the configs' default token ids are out of range
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
try:
    import torch
    import transformers
except ImportError as e:  # Debian's venv: no transformers
    print(f"skip: {e}")
    sys.exit(77)

import safetensors_io

HERE = os.path.dirname(os.path.abspath(__file__))
V = 64
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64, tie_word_embeddings=False)
MOE = dict(num_experts_per_tok=2)
# model_type -> (config keywords, whether its layers hold a mixture of experts)
FAMILIES = {
    "gpt2": (dict(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64), False),
    "llama": (dict(SMALL, num_key_value_heads=2), False),
    "mistral": (dict(SMALL, num_key_value_heads=2, sliding_window=4), False),
    "qwen2": (dict(SMALL, num_key_value_heads=2), False),
    "gpt_neox": (dict(SMALL, rotary_pct=0.5), False),
    "phi": (dict(SMALL), False),
    "mixtral": (dict(SMALL, num_key_value_heads=2, num_local_experts=4, **MOE), True),
    "gemma": (dict(SMALL, num_key_value_heads=1, head_dim=8, tie_word_embeddings=True), False),
    "gemma2": (dict(SMALL, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, sliding_window=4,
                    attn_logit_softcapping=5.0, final_logit_softcapping=3.0, tie_word_embeddings=True), False),
    "gemma3_text": (dict(SMALL, num_hidden_layers=3, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
                         sliding_window=4, tie_word_embeddings=True), False),
    "qwen3": (dict(SMALL, num_key_value_heads=2, head_dim=8), False),
    "qwen3_moe": (dict(SMALL, num_key_value_heads=2, head_dim=8, num_experts=4, moe_intermediate_size=16,
                       norm_topk_prob=True, **MOE), True),
    "olmo2": (dict(SMALL, num_key_value_heads=2), False),
    "olmoe": (dict(SMALL, num_key_value_heads=2, num_experts=4, **MOE), True),
    "phi3": (dict(SMALL, num_key_value_heads=2, pad_token_id=0), False),
    "gptj": (dict(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, rotary_dim=4), False),
    # Gemma3ForConditionalGeneration: its language model, the SigLIP tower passed over
    "gemma3": (dict(text_config=dict(SMALL, num_hidden_layers=3, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
                                     sliding_window=4), tie_word_embeddings=False, mm_tokens_per_image=4, image_token_index=V - 1,
                    vision_config=dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=24,
                                       num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14)), False),
}


def write(model_type, kw, folder):
    config = transformers.AutoConfig.for_model(model_type, **kw)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms away from their initial values, so that a misplaced one shows
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.2)
    model.save_pretrained(folder)
    return model


def main():
    exe = os.path.abspath(sys.argv[1])
    sys.path.insert(0, os.path.join(HERE, "..", "hub"))
    from fake_hub import FakeHub
    torch.manual_seed(1)
    ids = torch.randint(0, V, (2, 12))
    passed = failed = 0
    worst = 0.0
    hub = FakeHub()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cases, expected = [], {}
            for model_type, (kw, moe) in FAMILIES.items():
                folder = os.path.join(tmp, model_type)
                model = write(model_type, kw, folder)
                with torch.no_grad():
                    expected[model_type] = model(ids).logits
                files = {f: open(os.path.join(folder, f), "rb").read() for f in os.listdir(folder)}
                hub.repo(f"families/{model_type}").commit(files, branches=["main"])
                cases.append({"family": model_type, "folder": folder, "name": f"families/{model_type}", "moe": moe})
            with open(os.path.join(tmp, "cases.json"), "w") as f:
                json.dump(cases, f)
            safetensors_io.save(os.path.join(tmp, "ids.safetensors"), {"ids": ids})
            env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
            env.update({"HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": os.path.join(tmp, "hub-cache"),
                        "HF_HOME": os.path.join(tmp, "hf-home")})
            out = os.path.join(tmp, "out.safetensors")
            proc = subprocess.run([exe, "--threads=1", os.path.join(HERE, "families_hub.lua"), os.path.join(tmp, "cases.json"),
                                   os.path.join(tmp, "ids.safetensors"), out], capture_output=True, text=True, env=env)
            print(proc.stdout, end="")
            if proc.returncode != 0:
                print(proc.stderr)
                print(f"{passed} passed, {failed + 1} failed")
                sys.exit(1)
            got, _ = safetensors_io.load(out)
            for model_type, want in expected.items():
                for how in ("folder", "name"):
                    have = got.get(f"{model_type}.{how}")
                    if have is None or have.shape != want.shape:
                        failed += 1
                        print(f"FAIL  {model_type} by {how}: {'missing' if have is None else tuple(have.shape)} vs {tuple(want.shape)}")
                        continue
                    d = (have.double() - want.double()).abs().max().item()
                    worst = max(worst, d)
                    ok = d <= 1e-4
                    passed, failed = passed + ok, failed + (not ok)
                    print(f"{'ok  ' if ok else 'FAIL'}  {model_type} by {how}: logits within {d:.2g} of transformers'")
            # what the Lua side checked of the autopsy (its lines start with ok or FAIL)
            for line in proc.stdout.splitlines():
                passed += line.startswith("ok ")
                failed += line.startswith("FAIL")
    finally:
        hub.stop()
    print(f"largest logit difference: {worst:.3g} over {len(FAMILIES)} families")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
