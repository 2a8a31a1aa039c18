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
import os
import sys
import tempfile

import tl_side  # exits 77 without transformers and transformer-lens
import torch


TOL = 1e-5


def transformer_lens_side(folder):
    bridge = tl_side.boot(folder, no_processing=True)
    want = {}
    with torch.no_grad():
        for kind, f in (("ov", bridge.OV), ("qk", bridge.QK)):
            want[kind + "_singular_values"] = f.S
            want[kind + "_norms"] = f.norm()
        for mode in "QKV":
            want["composition_" + mode.lower()] = bridge.all_composition_scores(mode).scores
    return want


def compare(exe, tmp, name, folder, report):
    want = transformer_lens_side(folder)
    out = os.path.join(tmp, name + "_out.safetensors")
    got = tl_side.run_anatomy(exe, "weights_parity.lua", [folder, out], out, report, name)
    if got is None:
        return
    for key, w in want.items():
        report.check(name, key, got[key], w, TOL)


def main():
    exe = sys.argv[1]
    tok, wrapped = tl_side.tokenizer()
    report = tl_side.Report()
    with tempfile.TemporaryDirectory() as tmp:
        # initializer_range 0.3 (not 0.02): singular values of order 1, so that the tolerance means something
        for name, kind in (("gpt2", "gpt2"), ("llama-gqa", "llama")):
            torch.manual_seed(0)
            folder = os.path.join(tmp, name)
            tl_side.save(tl_side.tiny(kind, tok.get_vocab_size(), 3, 0.3), wrapped, folder)
            compare(exe, tmp, name, folder, report)
    report.finish()


if __name__ == "__main__":
    main()
