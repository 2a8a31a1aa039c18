"""What a head does, read from its weights: anatomy's weights.ov, weights.qk
and weights.composition against TransformerLens 4.3 itself.

A tiny GPT-2 (3 layers, 4 heads) and a tiny Llama with grouped keys and values
(3 layers, 4 query heads over 2 key/value heads), each written by
`transformers` and booted in TransformerLens's TransformerBridge with
enable_compatibility_mode(no_processing=True) (weights as the checkpoint holds
them, as anatomy reads them), are compared on:
  - every head's OV and QK singular values (bridge.OV / bridge.QK, FactoredMatrix.S)
    and Frobenius norms (FactoredMatrix.norm());
  - the Q, K and V composition scores of every pair of heads
    (bridge.all_composition_scores(mode).scores, zero unless the first head's
    layer is earlier; anatomy's indices count from 1, the layout is the same).
Tolerance: |anatomy - TL| <= 1e-5 (anatomy computes in float64, TransformerLens
in float32). Needs transformers and transformer-lens (the PyPI build's venv);
exits 77 without.
Usage: test_weights_parity.py ANATOMY_EXECUTABLE
"""
import contextlib
import io
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from transformer_lens.model_bridge import TransformerBridge
    from test_bpe_parity import gpt2_like
except ImportError as e:
    print(f"skip: {e}; the PyPI build's venv has transformers and transformer-lens (scripts/test)")
    sys.exit(77)

import safetensors_io

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()
TOL = 1e-5


def transformer_lens_side(folder):
    eager = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        bridge = TransformerBridge.boot_transformers(folder, hf_model=eager, device="cpu")
        bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    want = {}
    with torch.no_grad():
        for kind, f in (("ov", bridge.OV), ("qk", bridge.QK)):
            want[kind + "_singular_values"] = f.S
            want[kind + "_norms"] = f.norm()
        for mode in "QKV":
            want["composition_" + mode.lower()] = bridge.all_composition_scores(mode).scores
    return want


def compare(exe, here, tmp, name, folder):
    want = transformer_lens_side(folder)
    out = os.path.join(tmp, name + "_out.safetensors")
    p = subprocess.run([exe, "--threads=1", os.path.join(here, "weights_parity.lua"), folder, out],
                       capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout + p.stderr)
        return 0, ["%s: anatomy failed" % name]
    got, _ = safetensors_io.load(out)
    passed, failed = 0, []
    for key, w in want.items():
        g = got[key].double()
        w = w.double()
        if tuple(g.shape) != tuple(w.shape):
            failed.append("%s %s: shape %s, TransformerLens %s" % (name, key, tuple(g.shape), tuple(w.shape)))
            continue
        diff = (g - w).abs().max().item()
        ok = diff <= TOL
        print("%s %-26s %-24s max |diff| %.2e  (largest value %.4f)" % ("ok  " if ok else "FAIL", name, key, diff,
                                                                        w.abs().max().item()))
        if ok:
            passed += 1
        else:
            failed.append("%s %s: max |diff| %.3g > %g" % (name, key, diff, TOL))
    return passed, failed


def main():
    exe = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    tok = gpt2_like()
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    models = {
        # initializer_range 0.3 (not 0.02): singular values of order 1, so that the tolerance means something
        "gpt2": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32, n_layer=3,
                                                   n_head=4, initializer_range=0.3, bos_token_id=0, eos_token_id=0)),
        "llama-gqa": lambda: LlamaForCausalLM(LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
                                                          num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                                          max_position_embeddings=64, initializer_range=0.3,
                                                          bos_token_id=0, eos_token_id=0)),
    }
    passed, failed = 0, []
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in models.items():
            torch.manual_seed(0)
            folder = os.path.join(tmp, name)
            make().eval().save_pretrained(folder)
            wrapped.save_pretrained(folder)
            p, f = compare(exe, here, tmp, name, folder)
            passed, failed = passed + p, failed + f
    for line in failed:
        print("FAIL " + line)
    print("%d passed, %d failed" % (passed, len(failed)))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
