"""TransformerLens 4.3 itself against anatomy, on a tiny GPT-2 written by
`transformers` and booted in TransformerLens's TransformerBridge (eager
attention, weights as the checkpoint has them), on the same ids.

1. Hook names: every tensor TransformerLens caches under a name anatomy maps
   (blocks.{i}.hook_resid_pre/mid/post, attn.hook_q/k/v/z/pattern/
   attn_scores, hook_attn_out, hook_mlp_out, mlp.hook_pre/post,
   ln1/ln2/ln_final.hook_scale/normalized, the submodules' hook_out,
   hook_embed, hook_pos_embed; layers from 0, as TransformerLens counts) is
   looked up in anatomy's cache by that very name and compared. The bridge's
   hook_in names and the projections' wrappers have no counterpart; they are
   listed.
2. What TransformerLens users reach for first:
   cache:accumulated_resid  (the final norm recomputed on each: the logit lens;
                             a layer's norm with the cached scale; incl_mid; mlp_input)
   cache:decompose_resid    (embed, pos_embed, each layer's attn_out and mlp_out;
                             with apply_ln; mlp_input)
   cache:stack_head_results (each head's result; with apply_ln)
   tok:to_str_tokens, probe.test_prompt (rank, logit, probability of each
   answer token, from TransformerLens's own printout).
3. probe.detect_heads against TransformerLens's detect_head (its 'mul'
   measure, a list of two texts of different lengths, each with its BOS;
   with and without exclude_bos and exclude_current_token): every head's
   score to 1e-5.
   anatomy's layers count from 1: TransformerLens's layer=1 is anatomy's
   layer = 2, its label '0_pre' anatomy's '1_pre', its rank 0 anatomy's rank 1.
Tolerance (float32): |anatomy - TL| <= 1e-5 + 1e-4 |TL| (masked scores: -inf,
or TL's large negative fill, masked on both sides; by name, check_names, the
1e-5 times the tensor's largest |TL| where that is above 1); test_prompt's numbers as
TransformerLens prints them (logit to 0.01, probability to 0.01%).
Needs transformers and transformer-lens (the PyPI build's venv); exits 77 without.
Usage: test_tl_parity.py ANATOMY_EXECUTABLE
"""
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile

import tl_side  # exits 77 without transformers and transformer-lens
from tl_side import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast, TransformerBridge, gpt2_like, torch, transformers
from transformer_lens.head_detector import detect_head
from transformer_lens.utilities import test_prompt

import safetensors_io
TEXT, ANSWER = "the quick brown", "fox"
# two texts of different lengths with repeats, for the head detectors (anatomy pads them; TransformerLens runs each alone)
DETECT_TEXTS = ["the quick brown fox jumps the quick brown fox jumps over", "a dog and a cat and a dog"]
DETECT_VARIANTS = {"plain": {}, "no_bos": {"exclude_bos": True}, "no_current": {"exclude_current_token": True},
                   "no_both": {"exclude_bos": True, "exclude_current_token": True}}


# the names every model with layers maps (the docs' table), each of which must be found
MAPPED = ["hook_resid_pre", "hook_resid_mid", "hook_resid_post", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z",
          "attn.hook_pattern", "attn.hook_attn_scores", "hook_attn_out", "hook_mlp_out", "mlp.hook_pre", "mlp.hook_post",
          "ln1.hook_scale", "ln1.hook_normalized", "ln2.hook_scale", "ln2.hook_normalized"]
# the names of the newer families' parts, each of which must be found where the bridge has it: QK-norms, gated MLPs, MoE routers
FAMILY_MAPPED = ["attn.hook_q_normed", "attn.hook_k_normed", "mlp.hook_pre_linear", "mlp.hook_expert_weights",
                 "mlp.gate.hook_expert_weights", "mlp.hook_expert_indices", "mlp.gate.hook_expert_indices"]


def bridge_view(name, w, a, cache):
    """The bridge's tensor w in anatomy's layout (that of a), where the two differ by a rule of the bridge's: its
    queries and keys after a per-head QK-norm are (B, H, T, D) and after a whole-projection one (B, T, H*D), anatomy's
    (B, T, H, D) as hook_q's; its MoE router flattens the tokens (B*T, ...) where anatomy keeps (B, T, ...); its
    hook_expert_weights scatters each token's top-k weights over all E experts, 0 elsewhere (anatomy's are the k
    slots, in the order of hook_expert_indices); its experts count from 0, anatomy's from 1."""
    if name.endswith(("attn.hook_q_normed", "attn.hook_k_normed")) and w.dim() == 4 and a.dim() == 4:
        return w.transpose(1, 2)
    if name.endswith("hook_expert_weights"):
        indices = cache[name.replace("hook_expert_weights", "hook_expert_indices")]
        w = w.gather(-1, indices.long())
    if name.endswith("hook_expert_indices"):
        w = w + 1
    if w.shape != a.shape and w.numel() == a.numel() and name.endswith(("hook_q_normed", "hook_k_normed", "mlp.gate.hook_out",
                                                                        "hook_expert_weights", "hook_expert_indices")):
        w = w.reshape(a.shape)
    return w



def check_names(exe, here, tmp, folder, cfg, bridge, skip=()):
    """Part 1: every TransformerLens hook name anatomy maps, looked up in its cache by that name (but those ending
    in one of skip: what the caller has shown the bridge does not hold for its family)."""
    # the same ids whatever ran before (the global generator's state differs between callers)
    ids = torch.randint(0, cfg.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, cache = bridge.run_with_cache(ids)
    names = sorted(cache.keys())
    ids_path, names_path, out = (os.path.join(tmp, f) for f in ("names_ids.safetensors", "names.txt", "names_out.safetensors"))
    safetensors_io.save(ids_path, {"ids": ids + 1})
    open(names_path, "w").write("\n".join(names) + "\n")
    p = subprocess.run([exe, "--threads=1", os.path.join(here, "tl_names_parity.lua"), folder, ids_path, names_path, out],
                       capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout + p.stderr)
        return 0, ["hook names: anatomy failed"]
    got, meta = safetensors_io.load(out)
    missing = meta.get("missing", "").split()
    failed, passed, worst = [], 0, 0.0
    for name in names:
        if name not in got or name.endswith(tuple(skip)):
            continue
        a, w = got[name].double(), bridge_view(name, cache[name].detach(), got[name], cache).double()
        if a.shape != w.shape:
            failed.append(f"{name}: shape {tuple(a.shape)} in anatomy, {tuple(w.shape)} in TransformerLens")
            continue
        masked = (w < -1e4) | torch.isinf(w)
        if not torch.equal(masked, (a < -1e4) | torch.isinf(a)):
            failed.append(f"{name}: masked in one and not the other")
            continue
        d = (a - w).abs().masked_fill(masked, 0)
        # float32 rounding grows with the tensor's scale: the absolute part is 1e-5 of its largest value (at least 1)
        scale = max(1.0, w.abs().masked_fill(masked, 0).max().item()) if w.numel() else 1.0
        excess = (d - 1e-5 * scale - 1e-4 * w.abs().masked_fill(masked, 0)).max().item()
        worst = max(worst, d.max().item())
        if excess > 0:
            failed.append(f"{name}: largest difference {d.max().item():.3g} (values up to {w.abs().max().item():.3g})")
        else:
            passed += 1
    L = 2
    for i in range(L):
        for suffix in MAPPED + FAMILY_MAPPED:
            name = f"blocks.{i}.{suffix}"
            if name in cache and name not in got:
                failed.append(f"{name}: TransformerLens caches it and anatomy does not map it")
    for name in ("ln_final.hook_scale", "ln_final.hook_normalized", "hook_embed"):
        if name in cache and name not in got:
            failed.append(f"{name}: TransformerLens caches it and anatomy does not map it")
    print(f"{passed} TransformerLens names found in anatomy's cache and equal (largest difference {worst:.3g}); "
          f"not mapped ({len(missing)}): {' '.join(missing)}")
    return passed, failed + ([] if passed else ["hook names: nothing compared"])



def anatomy_label(label):
    """TransformerLens's '0_pre', 'L0H1' -> anatomy's '1_pre', 'L1H2'."""
    m = re.match(r"^L(\d+)H(\d+)$", label)
    if m:
        return f"L{int(m.group(1)) + 1}H{int(m.group(2)) + 1}"
    m = re.match(r"^(\d+)_(.*)$", label)
    return f"{int(m.group(1)) + 1}_{m.group(2)}" if m else label


def main():
    exe = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        tok = gpt2_like()
        torch.manual_seed(0)
        cfg = GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
        folder = os.path.join(tmp, "gpt2")
        GPT2LMHeadModel(cfg).eval().save_pretrained(folder)
        PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>").save_pretrained(folder)
        eager = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
        bridge = TransformerBridge.boot_transformers(folder, hf_model=eager, device="cpu")
        names_passed, names_failed = check_names(exe, here, tmp, folder, cfg, bridge)
        ids = torch.randint(0, cfg.vocab_size, (2, 7))
        with torch.no_grad():
            _, cache = bridge.run_with_cache(ids)
            want = {
                "accumulated_final_ln": cache.accumulated_resid(apply_ln=True, return_labels=True),
                "accumulated_2_mid_ln": cache.accumulated_resid(layer=1, incl_mid=True, apply_ln=True, return_labels=True),
                "accumulated_2_mlp_input": cache.accumulated_resid(layer=1, mlp_input=True, return_labels=True),
                "decompose": cache.decompose_resid(return_labels=True),
                "decompose_ln": cache.decompose_resid(apply_ln=True, return_labels=True),
                "decompose_2_mlp_ln": cache.decompose_resid(layer=1, mlp_input=True, apply_ln=True, return_labels=True),
                "heads": cache.stack_head_results(return_labels=True),
                "heads_ln": cache.stack_head_results(apply_ln=True, return_labels=True),
            }
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                test_prompt(TEXT, ANSWER, bridge, prepend_bos=False, top_k=3)
            str_tokens = bridge.to_str_tokens(TEXT, prepend_bos=False)
            # head detectors: TransformerLens's detect_head on a list of texts (each with its BOS), per kind and options
            detect_ids = [bridge.to_tokens(t)[0] for t in DETECT_TEXTS]
            detected = {}
            for kind in ("previous_token", "duplicate_token", "induction"):
                for variant, opts in DETECT_VARIANTS.items():
                    detected[f"detect_{kind}_{variant}"] = detect_head(bridge, DETECT_TEXTS, kind + "_head", **opts)
        ids_path, out = os.path.join(tmp, "ids.safetensors"), os.path.join(tmp, "out.safetensors")
        detect_tensors = {f"detect_ids_{i + 1}": t + 1 for i, t in enumerate(detect_ids)}
        safetensors_io.save(ids_path, {"ids": ids + 1, **detect_tensors})
        p = subprocess.run([exe, "--threads=1", os.path.join(here, "tl_cache_parity.lua"), folder, ids_path, TEXT, ANSWER, out],
                           capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stdout + p.stderr)
            print("0 passed, 1 failed")
            return 1
        got, meta = safetensors_io.load(out)
    labels = json.loads(meta["labels"])
    failed, passed, worst = list(names_failed), names_passed, 0.0
    for name, (w, w_labels) in want.items():
        a, w = got[name].double(), w.detach().double()
        expected_labels = [anatomy_label(l) for l in w_labels]
        if labels[name] != expected_labels:
            failed.append(f"{name}: labels {labels[name]}, TransformerLens's {w_labels}")
            continue
        if a.shape != w.shape:
            failed.append(f"{name}: shape {tuple(a.shape)}, TransformerLens's {tuple(w.shape)}")
            continue
        d = (a - w).abs()
        worst = max(worst, d.max().item())
        if (d - 1e-5 - 1e-4 * w.abs()).max().item() > 0:
            failed.append(f"{name}: largest difference {d.max().item():.3g}")
        else:
            passed += 1
            print(f"ok    {name} {tuple(a.shape)} {' '.join(expected_labels)}")
    for name, w in detected.items():
        a, w = got[name].double(), w.double()
        d = (a - w).abs().max().item()
        if a.shape != w.shape or d > 1e-5:
            failed.append(f"{name}: largest difference {d:.3g} (anatomy {a.tolist()}, TransformerLens {w.tolist()})")
        else:
            passed += 1
            print(f"ok    {name}: largest difference {d:.3g} over {tuple(a.shape)} heads (scores {w.min().item():.4f} to {w.max().item():.4f})")
    if json.loads(meta["str_tokens"]) == str_tokens:
        passed += 1
        print(f"ok    to_str_tokens: {str_tokens}")
    else:
        failed.append(f"to_str_tokens: {json.loads(meta['str_tokens'])} vs {str_tokens}")
    tl = re.findall(r"Rank: (\d+)\s+Logit:\s*(-?[\d.]+) Prob:\s*([\d.]+)% Token: \|([^|]*)\|", printed.getvalue())
    ours = json.loads(meta["ranks"])
    if len(tl) != len(ours) or not tl:
        failed.append(f"test_prompt: {len(ours)} answer tokens, TransformerLens printed {len(tl)}:\n{printed.getvalue()}")
    else:
        for (rank, logit, prob, token), (o_token, o_rank, o_logit, o_prob) in zip(tl, ours):
            ok = (o_token == token and o_rank == int(rank) + 1 and abs(o_logit - float(logit)) <= 0.0051
                  and abs(100 * o_prob - float(prob)) <= 0.0051)
            print(f"{'ok  ' if ok else 'FAIL'}  test_prompt |{token}|: rank {o_rank} (TL {rank}), logit {o_logit:.4f} (TL {logit}), "
                  f"prob {100 * o_prob:.4f}% (TL {prob}%)")
            if ok:
                passed += 1
            else:
                failed.append(f"test_prompt |{token}|")
    for f in failed:
        print("FAIL", f)
    print(f"largest difference of the stacks: {worst:.3g}")
    print(f"{passed} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
