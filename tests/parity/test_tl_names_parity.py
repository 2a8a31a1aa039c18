"""TransformerLens's hook names in anatomy: a tiny GPT-2 written by
`transformers`, run through TransformerLens 4.3's TransformerBridge
(boot_transformers on the folder, eager attention) and through
models.from_pretrained; every tensor TransformerLens caches under a name
anatomy maps (blocks.{i}.hook_resid_pre/mid/post, attn.hook_q/k/v/z/
pattern/attn_scores, hook_attn_out, hook_mlp_out, mlp.hook_pre/post,
ln1/ln2/ln_final.hook_scale/normalized, hook_embed; layers from 0, as
TransformerLens counts) is looked up in anatomy's cache by that very name
and compared. Names that are the bridge's own wrappers (hook_in, hook_out of
each submodule) have no anatomy counterpart and are listed.
Tolerance (float32): |anatomy - TL| <= 1e-5 + 1e-4 |TL| (masked scores: -inf,
or TL's large negative fill, compared as masked on both sides).
Needs transformers and transformer-lens (the PyPI build's venv); exits 77 without.
Usage: test_tl_names_parity.py ANATOMY_EXECUTABLE
"""
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
    from transformer_lens.model_bridge import TransformerBridge
    from test_bpe_parity import gpt2_like
except ImportError as e:
    print(f"skip: {e}; the PyPI build's venv has transformers and transformer-lens (scripts/test)")
    sys.exit(77)

import safetensors_io

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()
# the names every model with layers maps (the docs' table), each of which must be found
MAPPED = ["hook_resid_pre", "hook_resid_mid", "hook_resid_post", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z",
          "attn.hook_pattern", "attn.hook_attn_scores", "hook_attn_out", "hook_mlp_out", "mlp.hook_pre", "mlp.hook_post",
          "ln1.hook_scale", "ln1.hook_normalized", "ln2.hook_scale", "ln2.hook_normalized"]


def main():
    exe = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        tok = gpt2_like()
        torch.manual_seed(0)
        cfg = GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
        folder = os.path.join(tmp, "gpt2")
        GPT2LMHeadModel(cfg).eval().save_pretrained(folder)
        PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(folder)
        eager = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
        bridge = TransformerBridge.boot_transformers(folder, hf_model=eager, device="cpu")
        ids = torch.randint(0, cfg.vocab_size, (2, 7))
        with torch.no_grad():
            _, cache = bridge.run_with_cache(ids)
        names = sorted(cache.keys())
        ids_path, names_path, out = (os.path.join(tmp, f) for f in ("ids.safetensors", "names.txt", "out.safetensors"))
        safetensors_io.save(ids_path, {"ids": ids + 1})
        open(names_path, "w").write("\n".join(names) + "\n")
        p = subprocess.run([exe, "--threads=1", os.path.join(here, "tl_names_parity.lua"), folder, ids_path, names_path, out],
                           capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stdout + p.stderr)
            print("0 passed, 1 failed")
            return 1
        got, meta = safetensors_io.load(out)
    missing = meta.get("missing", "").split()
    failed, passed, worst = [], 0, 0.0
    for name in names:
        if name not in got:
            continue
        a, w = got[name].double(), cache[name].detach().double()
        if a.shape != w.shape:
            failed.append(f"{name}: shape {tuple(a.shape)} in anatomy, {tuple(w.shape)} in TransformerLens")
            continue
        masked = (w < -1e4) | torch.isinf(w)
        if not torch.equal(masked, (a < -1e4) | torch.isinf(a)):
            failed.append(f"{name}: masked in one and not the other")
            continue
        d = (a - w).abs().masked_fill(masked, 0)
        excess = (d - 1e-5 - 1e-4 * w.abs().masked_fill(masked, 0)).max().item()
        worst = max(worst, d.max().item())
        if excess > 0:
            failed.append(f"{name}: largest difference {d.max().item():.3g}")
        else:
            passed += 1
    L = 2
    for i in range(L):
        for suffix in MAPPED:
            name = f"blocks.{i}.{suffix}"
            if name in cache and name not in got:
                failed.append(f"{name}: TransformerLens caches it and anatomy does not map it")
    for name in ("ln_final.hook_scale", "ln_final.hook_normalized", "hook_embed"):
        if name in cache and name not in got:
            failed.append(f"{name}: TransformerLens caches it and anatomy does not map it")
    for f in failed:
        print("FAIL", f)
    print(f"{passed} TransformerLens names found in anatomy's cache and equal (largest difference {worst:.3g}); "
          f"not mapped ({len(missing)}): {' '.join(missing)}")
    print(f"{passed} passed, {len(failed)} failed")
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
