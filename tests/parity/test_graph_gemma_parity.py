"""Attribution graphs of a Gemma 3 against circuit-tracer 0.5.0's nnsight
backend (TransformerLens 2.16.1, circuit-tracer's other backend, has no
Gemma 3). A tiny Gemma3ForCausalLM written by transformers (every norm's
weight random, QK-norm, one full-attention layer between two sliding ones
whose window is shorter than the prompt, the embeddings scaled by
sqrt(hidden_size) and tied to the head, no final soft-capping); circuit-
tracer's NNSightReplacementModel.from_pretrained_and_transcoders on the
folder (utils/tl_nnsight_mapping.py's Gemma3ForCausalLM: ln2.hook_normalized
the pre-feedforward norm's normalized vectors before its weight, mlp.hook_in
its output, hook_resid_mid its input, hook_mlp_out the post-feedforward
norm's output; attention patterns and every norm's rsqrt, the QK-norms'
too, frozen); transcoders with random weights written by circuit-tracer
(a JumpReLU CLT on ln2.hook_normalized as Gemma Scope's, ReLU CLTs on
mlp.hook_in and hook_resid_mid, a ReLU TranscoderSet with W_skip on
ln2.hook_normalized, each writing hook_mlp_out). anatomy's side is
graph_parity.lua, unchanged; the comparisons test_graph_parity's compare:
the same active features, logits and selected features, activations,
probabilities and the adjacency matrix within 1e-4, the same pruned nodes
and edges, cumulative and graph scores, and the same with max_feature_nodes.

circuit-tracer's nnsight backend takes its token nodes' vectors from the
unscaled embedding matrix (setup_attribution: embed_weight[tokens]) while
the gradient it contracts them with is read at the embedding module's
output, after Gemma's sqrt(hidden_size): its token edges are the direct
effects divided by sqrt(hidden_size) (its TransformerLens backend's and
anatomy's are the direct effects: the embedding as the residual stream
receives it). The test checks that this is the only difference: the token
columns of circuit-tracer's matrix times sqrt(hidden_size) equal anatomy's,
every other entry equal as it stands; pruning and scores, which weigh the
token columns, are compared against circuit-tracer's prune_graph and
compute_graph_scores on its graph with the token columns so scaled.
circuit-tracer and nnsight live in build/venv-ct (scripts/setup --tests);
this test runs itself there, and exits 77 (skipped) where there is none.
Usage: test_graph_gemma_parity.py ANATOMY_EXECUTABLE
"""
import os
import subprocess
import sys
import tempfile

import peer_env  # noqa: E402

peer_env.use_venv(("torch", "transformers", "nnsight", "circuit_tracer"), "venv-ct", "ANATOMY_CT_VENV",
                  "circuit-tracer with nnsight")
HERE = os.path.dirname(os.path.abspath(__file__))

import torch  # noqa: E402
import transformers  # noqa: E402
try:
    from nnsight import save
    from circuit_tracer.replacement_model.replacement_model_nnsight import NNSightReplacementModel
except ImportError as e:  # nnsight 0.8 moved what circuit-tracer 0.5.0's nnsight backend imports
    import importlib.metadata
    print("skip: circuit-tracer's nnsight backend does not import with nnsight %s (%s); scripts/setup --tests pins 0.7.0"
          % (importlib.metadata.version("nnsight"), e))
    sys.exit(77)
from circuit_tracer import attribute  # noqa: E402
from circuit_tracer.transcoder.activation_functions import JumpReLU  # noqa: E402
from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder, load_clt  # noqa: E402
from circuit_tracer.transcoder.single_layer_transcoder import (SingleLayerTranscoder, TranscoderSet,  # noqa: E402
                                                               load_transcoder_set)

import safetensors_io  # noqa: E402
from test_graph_parity import L, D, F, V, HEADS, PROMPT, OPTS, MAX_FEATURE_NODES, TOL, tokenizer, compare  # noqa: E402

transformers.logging.set_verbosity_error()
CPU = torch.device("cpu")
WINDOW = 4  # the sliding layers see 4 of the prompt's 7 positions
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]


def gemma3(folder, with_tokenizer):
    """A tiny Gemma3ForCausalLM written by transformers to folder, and to with_tokenizer with a word-level tokenizer
    beside it (nnsight loads both from its folder; anatomy reads BPE tokenizers only, and the model alone); its norms'
    weights (the QK-norms' too) random."""
    torch.manual_seed(2)
    cfg = transformers.Gemma3TextConfig(
        vocab_size=V, hidden_size=D, intermediate_size=2 * D, num_hidden_layers=L, num_attention_heads=HEADS,
        num_key_value_heads=2, head_dim=D // HEADS, max_position_embeddings=32, sliding_window=WINDOW,
        layer_types=LAYER_TYPES, query_pre_attn_scalar=D // HEADS, final_logit_softcapping=None,
        attn_logit_softcapping=None, initializer_range=0.2, bos_token_id=0, eos_token_id=0, pad_token_id=0,
        tie_word_embeddings=True)
    cfg._attn_implementation = "eager"
    hf = transformers.Gemma3ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.5)  # Gemma's norms scale by 1 + weight
    hf.eval().save_pretrained(folder)
    hf.save_pretrained(with_tokenizer)
    tokenizer(with_tokenizer)
    return hf


def transcoders(folder):
    """(name, folder, input hook, output hook, reload): circuit-tracer's transcoders for the Gemma 3, written to folder."""
    made = []

    def clt(name, act, seed, hooks):
        c = CrossLayerTranscoder(L, F, D, activation_function=act, lazy_decoder=False, feature_input_hook=hooks[0],
                                 feature_output_hook=hooks[1], device=CPU, dtype=torch.float32)
        peer_env.randomize(c, seed, JumpReLU)
        path = os.path.join(folder, name)
        c.to_safetensors(path)
        made.append((name, path) + tuple(hooks) + (lambda: load_clt(
            path, feature_input_hook=hooks[0], feature_output_hook=hooks[1], lazy_decoder=False, device=CPU,
            dtype=torch.float32),))

    def tset(name, seed, hooks):
        layers = {layer: SingleLayerTranscoder(D, F, torch.nn.functional.relu, layer, skip_connection=True, device=CPU,
                                               dtype=torch.float32) for layer in range(L)}
        t = TranscoderSet(layers, feature_input_hook=hooks[0], feature_output_hook=hooks[1])
        peer_env.randomize(t, seed, JumpReLU)
        path = os.path.join(folder, name)
        t.to_safetensors(path)
        made.append((name, path) + tuple(hooks) + (lambda: load_transcoder_set(
            {i: os.path.join(path, "layer_%d.safetensors" % i) for i in range(L)}, scan="tiny",
            feature_input_hook=hooks[0], feature_output_hook=hooks[1], device=CPU, dtype=torch.float32,
            lazy_decoder=False),))

    clt("gemma3_clt_jump_relu", "jump_relu", 30, ("ln2.hook_normalized", "hook_mlp_out"))
    clt("gemma3_clt_mlp_in", "relu", 31, ("mlp.hook_in", "hook_mlp_out"))
    clt("gemma3_clt_resid_mid", "relu", 32, ("hook_resid_mid", "hook_mlp_out"))
    tset("gemma3_set_relu_skip", 33, ("ln2.hook_normalized", "hook_mlp_out"))
    return made


class TokensScaled:
    """circuit-tracer's nnsight replacement model whose attribute() gives the token columns times sqrt(hidden_size)
    (see the docstring): its token vectors read from the embedding matrix times the embedding's scale."""

    def __init__(self, model, scale):
        self.model, self.scale = model, scale

    def __getattr__(self, k):
        return getattr(self.model, k)

    def setup_attribution(self, inputs):
        ctx = self.model.setup_attribution(inputs)
        ctx.token_vectors = ctx.token_vectors * self.scale
        return ctx


def main():
    exe = sys.argv[1]
    report = peer_env.Report("circuit-tracer", TOL, width=60)
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "tiny-gemma3")
        nn_folder = os.path.join(tmp, "tiny-gemma3-tokenizer")
        hf = gemma3(folder, nn_folder)
        made = transcoders(tmp)
        out = os.path.join(tmp, "anatomy.safetensors")
        ids = ",".join(str(i + 1) for i in PROMPT)  # anatomy's ids count from 1
        p = subprocess.run([exe, "--threads=1", os.path.join(HERE, "graph_parity.lua"), out, ids,
                            str(OPTS["max_n_logits"]), repr(OPTS["desired_logit_prob"]), str(OPTS["batch_size"]),
                            str(MAX_FEATURE_NODES)]
                           + ["|".join((name, folder, path, hook_in, hook_out)) for name, path, hook_in, hook_out, _ in made],
                           capture_output=True, text=True)
        print(p.stdout + p.stderr)
        if p.returncode != 0:
            print("FAIL anatomy failed")
            sys.exit(1)
        got = safetensors_io.load(out)[0]
        prompt = torch.tensor(PROMPT)
        with torch.no_grad():
            want = hf(prompt[None]).logits
            # the sliding window is in force: a model whose every layer is global gives other logits
            full = transformers.Gemma3ForCausalLM.from_pretrained(folder, layer_types=["full_attention"] * L,
                                                                  attn_implementation="eager").eval()
            report.expect("the sliding window moves transformers' logits (by %.3g)" % (full(prompt[None]).logits - want)
                          .abs().max().item(), bool(((full(prompt[None]).logits - want).abs() > 1e-3).any()))
        scale = hf.model.embed_tokens.embed_scale.item()
        for name, _, _, _, reload in made:
            model = NNSightReplacementModel.from_pretrained_and_transcoders(nn_folder, reload(), device=CPU,
                                                                            dtype=torch.float32)
            with torch.no_grad(), model.trace(prompt[None]):
                logits = save(model.output.logits)
            report.check("%s: nnsight's logits against transformers'" % name, logits, want)
            n_feats = got[name + ".active_features"].shape[0]
            T = len(PROMPT)
            tokens = slice(n_feats + L * T, n_feats + (L + 1) * T)  # the token columns of the full graph
            g = attribute(prompt, model, **OPTS)
            A, B = got[name + ".adjacency_matrix"], g.adjacency_matrix
            if A.shape == B.shape:
                rest = torch.ones(B.shape[1], dtype=torch.bool)
                rest[tokens] = False
                report.check("%s: adjacency, all but the token columns, as it stands" % name, A[:, rest], B[:, rest])
                report.check("%s: token columns, circuit-tracer's times sqrt(d) = %g" % (name, scale), A[:, tokens],
                             B[:, tokens] * scale)
                report.expect("%s: circuit-tracer's token columns are not the direct effects (by %.3g)" % (
                    name, (A[:, tokens] - B[:, tokens]).abs().max().item()),
                    bool(((A[:, tokens] - B[:, tokens]).abs() > 1e-3).any()))
            compare(report, name, got, TokensScaled(model, scale), prompt)
    report.finish()


if __name__ == "__main__":
    main()
