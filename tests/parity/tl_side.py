"""What the parity tests against TransformerLens 4.3 share: its imports
(a test exits 77, skipped, where the venv lacks them), tiny checkpoints
written by `transformers`, the bridge booted on one, and the report of each
comparison (the largest difference beside the tolerance)."""
import contextlib
import io
import os
import subprocess
import sys

try:
    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from transformer_lens.model_bridge import TransformerBridge
    from test_bpe_parity import gpt2_like
except ImportError as e:
    print(f"skip: {e}; the PyPI build's venv has transformers and transformer-lens (scripts/test)")
    sys.exit(77)

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


def tokenizer():
    """A GPT-2-like byte-level BPE of 400 tokens, and its transformers wrapper."""
    tok = gpt2_like()
    return tok, PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")


def tiny(kind, vocab, layers, init):
    """A fresh tiny model: 'gpt2' (4 heads, width 32), 'llama' (4 query heads over 2 key/value heads) or 'qwen2'
    (the same, with query, key and value biases and no output bias)."""
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, initializer_range=init, bos_token_id=0, eos_token_id=0,
            tie_word_embeddings=False))
    if kind == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=64, n_embd=32, n_layer=layers, n_head=4,
                                          initializer_range=init, bos_token_id=0, eos_token_id=0))
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        initializer_range=init, bos_token_id=0, eos_token_id=0))


def save(model, wrapped, folder):
    model.eval().save_pretrained(folder)
    wrapped.save_pretrained(folder)


def hf(folder):
    """The folder's model in transformers, eager attention, in eval mode."""
    return transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()


def boot(folder, **compatibility):
    """TransformerBridge on the folder's model in compatibility mode with these options (processing, by
    default, edits the transformers model it wraps: take plain outputs from another one, hf(folder))."""
    eager = hf(folder)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        bridge = TransformerBridge.boot_transformers(folder, hf_model=eager, device="cpu")
        bridge.enable_compatibility_mode(disable_warnings=True, **compatibility)
    return bridge


def run_anatomy(exe, script, args, out, report, label):
    """Runs a Lua script beside this file with args; its tensors from the safetensors file out, or None (and a
    failure reported) when it fails."""
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run([exe, "--threads=1", os.path.join(here, script)] + list(args), capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout + p.stderr)
        report.fail("%s: anatomy failed" % label)
        return None
    import safetensors_io
    return safetensors_io.load(out)[0]


class Report:
    """Comparisons, one line each; finish() prints the failures and the count, and exits 1 on any."""

    def __init__(self):
        self.passed, self.failed = 0, []

    def fail(self, line):
        self.failed.append(line)

    def check(self, label, what, got, want, tol):
        got, want = got.double(), want.double()
        if tuple(got.shape) != tuple(want.shape):
            self.fail("%s %s: shape %s, TransformerLens %s" % (label, what, tuple(got.shape), tuple(want.shape)))
            return
        diff = (got - want).abs().max().item()
        ok = diff <= tol
        print("%s %-10s %-44s max |diff| %.2e  (largest value %.4f)" % ("ok  " if ok else "FAIL", label, what, diff,
                                                                        want.abs().max().item()))
        if ok:
            self.passed += 1
        else:
            self.fail("%s %s: max |diff| %.3g > %g" % (label, what, diff, tol))

    def finish(self):
        for line in self.failed:
            print("FAIL " + line)
        print("%d passed, %d failed" % (self.passed, len(self.failed)))
        sys.exit(1 if self.failed else 0)
