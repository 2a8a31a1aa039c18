"""Attribution graphs against circuit-tracer 0.5.0 itself, before pruning.
A tiny GPT-2 with random weights (its norms' weights and biases random too)
written by transformers; circuit-tracer's TransformerLens replacement model
on the same weights (TransformerLens's convert_gpt2_weights, nothing folded);
transcoders with random weights written by circuit-tracer (to_safetensors):
a cross-layer transcoder with a JumpReLU, one with a ReLU, and a per-layer
TranscoderSet with W_skip, all reading mlp.hook_in and writing mlp.hook_out.
circuit-tracer's attribute(ids, model, max_n_logits, desired_logit_prob,
batch_size) against anatomy's sae.attribute on the folders: the nodes (active
features, their activations, the logits and their probabilities) equal, and
every entry of the adjacency matrix within 1e-4.
circuit-tracer lives in build/venv-ct (scripts/setup --tests); this test runs
itself there, and exits 77 (skipped) where there is none.
Usage: test_graph_parity.py ANATOMY_EXECUTABLE
"""
import os
import subprocess
import sys
import tempfile

import peer_env  # noqa: E402

peer_env.use_venv(("torch", "transformers", "transformer_lens", "circuit_tracer"), "venv-ct", "ANATOMY_CT_VENV",
                  "circuit-tracer")
HERE = os.path.dirname(os.path.abspath(__file__))

import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer, models as tok_models  # noqa: E402
from transformer_lens import HookedTransformerConfig  # noqa: E402
from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights  # noqa: E402
from circuit_tracer import attribute  # noqa: E402
from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel  # noqa: E402
from circuit_tracer.transcoder.activation_functions import JumpReLU  # noqa: E402
from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder, load_clt  # noqa: E402
from circuit_tracer.transcoder.single_layer_transcoder import (SingleLayerTranscoder, TranscoderSet,  # noqa: E402
                                                               load_transcoder_set)

import safetensors_io  # noqa: E402

transformers.logging.set_verbosity_error()
TOL = 1e-4
L, D, F, V, HEADS = 3, 16, 12, 40, 4
IN_HOOK, OUT_HOOK = "mlp.hook_in", "mlp.hook_out"
PROMPT = [0, 7, 3, 19, 25, 3, 11]  # Hugging Face's ids; 0 the BOS, as circuit-tracer wants first
OPTS = dict(max_n_logits=6, desired_logit_prob=0.8, batch_size=5)
CPU = torch.device("cpu")


def tokenizer(folder):
    """A word-level tokenizer of V tokens, saved in folder and read back (TransformerLens reloads it by its path)."""
    vocab = {"<bos>": 0}
    vocab.update({"t%d" % i: i for i in range(1, V)})
    tok = Tokenizer(tok_models.WordLevel(vocab, unk_token="<bos>"))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<bos>").save_pretrained(folder)
    return transformers.AutoTokenizer.from_pretrained(folder)


def gpt2(folder):
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=V, n_positions=32, n_embd=D, n_layer=L, n_head=HEADS,
                                                              initializer_range=0.2, bos_token_id=0, eos_token_id=0))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "ln" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + torch.randn_like(p) * 0.3)
    hf.eval().save_pretrained(folder)
    cfg = HookedTransformerConfig(n_layers=L, d_model=D, n_ctx=32, d_head=D // HEADS, n_heads=HEADS, d_mlp=4 * D, d_vocab=V,
                                  act_fn="gelu_new", normalization_type="LN", eps=1e-5, positional_embedding_type="standard",
                                  original_architecture="GPT2LMHeadModel", model_name="tiny-gpt2", default_prepend_bos=False)
    return hf, cfg, convert_gpt2_weights(hf, cfg)


def randomize(module, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        for m in module.modules():
            if isinstance(m, JumpReLU):
                m.threshold.copy_(torch.rand_like(m.threshold) * 0.3)


def transcoders(folder):
    """(name, folder, reload): circuit-tracer's transcoders written to folder; reload() reads them back as circuit-tracer does."""
    made = []
    for i, act in enumerate(("jump_relu", "relu")):
        clt = CrossLayerTranscoder(L, F, D, activation_function=act, lazy_decoder=False, feature_input_hook=IN_HOOK,
                                   feature_output_hook=OUT_HOOK, device=CPU, dtype=torch.float32)
        randomize(clt, 10 + i)
        path = os.path.join(folder, "clt_" + act)
        clt.to_safetensors(path)
        made.append(("clt_" + act, path, lambda path=path: load_clt(path, feature_input_hook=IN_HOOK,
                                                                     feature_output_hook=OUT_HOOK, lazy_decoder=False,
                                                                     device=CPU, dtype=torch.float32)))
    layers = {layer: SingleLayerTranscoder(D, F, torch.nn.functional.relu, layer, skip_connection=True, device=CPU,
                                           dtype=torch.float32) for layer in range(L)}
    tset = TranscoderSet(layers, feature_input_hook=IN_HOOK, feature_output_hook=OUT_HOOK)
    randomize(tset, 20)
    path = os.path.join(folder, "set_relu_skip")
    tset.to_safetensors(path)
    made.append(("set_relu_skip", path, lambda path=path: load_transcoder_set(
        {i: os.path.join(path, "layer_%d.safetensors" % i) for i in range(L)}, scan="tiny", feature_input_hook=IN_HOOK,
        feature_output_hook=OUT_HOOK, device=CPU, dtype=torch.float32, lazy_decoder=False)))
    return made


def main():
    exe = sys.argv[1]
    report = peer_env.Report("circuit-tracer", TOL, width=56)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")
        hf, cfg, state = gpt2(model_dir)
        made = transcoders(tmp)
        out = os.path.join(tmp, "anatomy.safetensors")
        ids = ",".join(str(i + 1) for i in PROMPT)  # anatomy's ids count from 1
        p = subprocess.run([exe, "--threads=1", os.path.join(HERE, "graph_parity.lua"), model_dir, out, ids,
                            str(OPTS["max_n_logits"]), repr(OPTS["desired_logit_prob"]), str(OPTS["batch_size"])]
                           + ["%s=%s" % (name, path) for name, path, _ in made], capture_output=True, text=True)
        print(p.stdout + p.stderr)
        if p.returncode != 0:
            print("FAIL anatomy failed")
            sys.exit(1)
        got = safetensors_io.load(out)[0]
        prompt = torch.tensor(PROMPT)
        tok = tokenizer(os.path.join(tmp, "tokenizer"))
        for name, _, reload in made:
            model = TransformerLensReplacementModel(cfg, tokenizer=tok)
            model.load_and_process_state_dict({k: v.clone() for k, v in state.items()}, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                              fold_value_biases=False)
            model._configure_replacement_model(reload())
            with torch.no_grad():
                report.check("%s: TransformerLens's logits against transformers'" % name, model(prompt[None]),
                         hf(prompt[None]).logits)
            g = attribute(prompt, model, **OPTS)
            want_feats = g.active_features.long()
            report.expect("%s: the same %d active features (layer, position, feature)" % (name, len(want_feats)),
                          torch.equal(got[name + ".active_features"] - 1, want_feats))
            report.check("%s: activations" % name, got[name + ".activation_values"], g.activation_values)
            report.expect("%s: the same selected features" % name,
                          torch.equal(got[name + ".selected_features"] - 1, g.selected_features.long()))
            logit_ids = torch.tensor([t.vocab_idx for t in g.logit_targets])
            report.expect("%s: the same %d logits %s" % (name, len(logit_ids), logit_ids.tolist()),
                          torch.equal(got[name + ".logit_tokens"] - 1, logit_ids))
            report.check("%s: logit probabilities" % name, got[name + ".logit_probabilities"], g.logit_probabilities)
            A, B = got[name + ".adjacency_matrix"], g.adjacency_matrix
            report.check("%s: adjacency matrix (%d nodes)" % (name, B.shape[0]), A, B)
            report.expect("%s: the graph has feature-to-feature and feature-to-logit edges" % name,
                          bool((B[:len(want_feats), :len(want_feats)] != 0).any()) and
                          bool((B[-len(logit_ids):, :len(want_feats)] != 0).any()))
    report.finish()


if __name__ == "__main__":
    main()
