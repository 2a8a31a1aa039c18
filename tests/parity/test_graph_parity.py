"""Attribution graphs against circuit-tracer 0.5.0 itself, before pruning.
A tiny GPT-2 and a tiny Llama with random weights (their norms' weights
random too) written by transformers; circuit-tracer's TransformerLens
replacement model on the same weights (TransformerLens's convert_*_weights,
nothing folded); transcoders with random weights written by circuit-tracer
(to_safetensors): JumpReLU and ReLU CLTs and ReLU per-layer TranscoderSets
with W_skip reading mlp.hook_in and writing mlp.hook_out, and CLTs reading
hook_resid_mid and ln2.hook_normalized (TransformerLens 2's: after a
LayerNorm's weight, before an RMSNorm's) and writing hook_mlp_out.
circuit-tracer's attribute(ids, model, max_n_logits, desired_logit_prob,
batch_size) against anatomy's sae.attribute on the folders: the nodes (active
features, the logits) the same, their activations and probabilities and
every entry of the adjacency matrix within 1e-4, also with max_feature_nodes
(the same features visited by influence); its prune_graph against
sae.prune_graph (the same kept nodes and edges, cumulative scores within
1e-4) and compute_graph_scores against sae.graph_scores.
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
from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights, convert_llama_weights  # noqa: E402
from circuit_tracer import attribute  # noqa: E402
from circuit_tracer.graph import compute_graph_scores, prune_graph  # noqa: E402
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
MAX_FEATURE_NODES = 40  # and a second graph of each with max_feature_nodes (update_interval 2)
CPU = torch.device("cpu")


def tokenizer(folder):
    """A word-level tokenizer of V tokens, saved in folder and read back (TransformerLens reloads it by its path)."""
    vocab = {"<bos>": 0}
    vocab.update({"t%d" % i: i for i in range(1, V)})
    tok = Tokenizer(tok_models.WordLevel(vocab, unk_token="<bos>"))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<bos>").save_pretrained(folder)
    return transformers.AutoTokenizer.from_pretrained(folder)


def gpt2(folder):
    """A tiny GPT-2 written by transformers (its norms' weights and biases random too), and TransformerLens's config
    and state dict of it (convert_gpt2_weights)."""
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


def llama(folder):
    """A tiny Llama (RMSNorm with random weights, rotary, 4 query heads over 2 key/value heads), as gpt2()."""
    torch.manual_seed(1)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=V, hidden_size=D, intermediate_size=2 * D, num_hidden_layers=L, num_attention_heads=HEADS,
        num_key_value_heads=2, max_position_embeddings=32, initializer_range=0.2, bos_token_id=0, eos_token_id=0,
        tie_word_embeddings=False))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + torch.randn_like(p) * 0.3)
    hf.eval().save_pretrained(folder)
    c = hf.config
    cfg = HookedTransformerConfig(n_layers=L, d_model=D, n_ctx=32, d_head=D // HEADS, n_heads=HEADS, n_key_value_heads=2,
                                  d_mlp=2 * D, d_vocab=V, act_fn="silu", normalization_type="RMS", eps=c.rms_norm_eps,
                                  positional_embedding_type="rotary", rotary_adjacent_pairs=False, rotary_dim=D // HEADS,
                                  rotary_base=c.rope_theta, final_rms=True, gated_mlp=True,
                                  original_architecture="LlamaForCausalLM", model_name="tiny-llama", default_prepend_bos=False)
    return hf, cfg, convert_llama_weights(hf, cfg)


def transcoders(folder):
    """(name, model, folder, input hook, output hook, reload): circuit-tracer's transcoders written to folder, for the
    model named; reload() reads them back as circuit-tracer does."""
    made = []

    def clt(name, model, act, seed, hooks=(IN_HOOK, OUT_HOOK)):
        c = CrossLayerTranscoder(L, F, D, activation_function=act, lazy_decoder=False, feature_input_hook=hooks[0],
                                 feature_output_hook=hooks[1], device=CPU, dtype=torch.float32)
        peer_env.randomize(c, seed, JumpReLU)
        path = os.path.join(folder, name)
        c.to_safetensors(path)
        made.append((name, model, path) + tuple(hooks) + (lambda: load_clt(
            path, feature_input_hook=hooks[0], feature_output_hook=hooks[1], lazy_decoder=False, device=CPU,
            dtype=torch.float32),))

    def tset(name, model, seed):
        layers = {layer: SingleLayerTranscoder(D, F, torch.nn.functional.relu, layer, skip_connection=True, device=CPU,
                                               dtype=torch.float32) for layer in range(L)}
        t = TranscoderSet(layers, feature_input_hook=IN_HOOK, feature_output_hook=OUT_HOOK)
        peer_env.randomize(t, seed, JumpReLU)
        path = os.path.join(folder, name)
        t.to_safetensors(path)
        made.append((name, model, path, IN_HOOK, OUT_HOOK, lambda: load_transcoder_set(
            {i: os.path.join(path, "layer_%d.safetensors" % i) for i in range(L)}, scan="tiny", feature_input_hook=IN_HOOK,
            feature_output_hook=OUT_HOOK, device=CPU, dtype=torch.float32, lazy_decoder=False)))

    clt("gpt2_clt_jump_relu", "gpt2", "jump_relu", 10)
    clt("gpt2_clt_relu", "gpt2", "relu", 11)
    tset("gpt2_set_relu_skip", "gpt2", 20)
    # circuit-tracer's default hooks for a CLT: the residual before the second norm, what the MLP adds
    clt("gpt2_clt_resid_mid", "gpt2", "relu", 12, ("hook_resid_mid", "hook_mlp_out"))
    clt("llama_clt_jump_relu", "llama", "jump_relu", 13)
    # TransformerLens 2's ln2.hook_normalized: after a LayerNorm's weight and bias, before an RMSNorm's weight
    clt("gpt2_clt_ln2_normalized", "gpt2", "relu", 15, ("ln2.hook_normalized", "hook_mlp_out"))
    clt("llama_clt_ln2_normalized", "llama", "relu", 14, ("ln2.hook_normalized", "hook_mlp_out"))
    tset("llama_set_relu_skip", "llama", 21)
    return made


def compare(report, name, got, model, prompt):
    """circuit-tracer's attribute(prompt, model), its prune_graph and compute_graph_scores, and with
    max_feature_nodes, against anatomy's tensors in got under name (graph_parity.lua's): reported."""
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
    pruned = prune_graph(g, node_threshold=0.8, edge_threshold=0.98)
    node_mask, edge_mask = got[name + ".node_mask"].bool(), got[name + ".edge_mask"].bool()
    report.expect("%s: pruned, the same %d of %d nodes" % (name, int(pruned.node_mask.sum()), B.shape[0]),
                  torch.equal(node_mask, pruned.node_mask))
    report.expect("%s: pruned, the same %d edges" % (name, int(pruned.edge_mask.sum())),
                  torch.equal(edge_mask, pruned.edge_mask))
    report.check("%s: cumulative influence scores" % name, got[name + ".cumulative_scores"], pruned.cumulative_scores)
    report.check("%s: replacement and completeness scores" % name, got[name + ".scores"],
                 torch.tensor(compute_graph_scores(g)))
    capped = attribute(prompt, model, max_feature_nodes=MAX_FEATURE_NODES, update_interval=2, **OPTS)
    report.expect("%s, max_feature_nodes %d: the same features visited" % (name, MAX_FEATURE_NODES),
                  torch.equal(got[name + ".capped.selected_features"] - 1, capped.selected_features.long()))
    report.check("%s, max_feature_nodes %d: adjacency matrix (%d nodes)" % (name, MAX_FEATURE_NODES,
                                                                             capped.adjacency_matrix.shape[0]),
                 got[name + ".capped.adjacency_matrix"], capped.adjacency_matrix)
    report.expect("%s: the graph has feature-to-feature and feature-to-logit edges" % name,
                  bool((B[:len(want_feats), :len(want_feats)] != 0).any()) and
                  bool((B[-len(logit_ids):, :len(want_feats)] != 0).any()))


def main():
    exe = sys.argv[1]
    report = peer_env.Report("circuit-tracer", TOL, width=56)
    with tempfile.TemporaryDirectory() as tmp:
        models = {name: (os.path.join(tmp, name),) + make(os.path.join(tmp, name))
                  for name, make in (("gpt2", gpt2), ("llama", llama))}
        made = transcoders(tmp)
        out = os.path.join(tmp, "anatomy.safetensors")
        ids = ",".join(str(i + 1) for i in PROMPT)  # anatomy's ids count from 1
        p = subprocess.run([exe, "--threads=1", os.path.join(HERE, "graph_parity.lua"), out, ids,
                            str(OPTS["max_n_logits"]), repr(OPTS["desired_logit_prob"]), str(OPTS["batch_size"]),
                            str(MAX_FEATURE_NODES)]
                           + ["|".join((name, models[kind][0], path, hook_in, hook_out))
                              for name, kind, path, hook_in, hook_out, _ in made], capture_output=True, text=True)
        print(p.stdout + p.stderr)
        if p.returncode != 0:
            print("FAIL anatomy failed")
            sys.exit(1)
        got = safetensors_io.load(out)[0]
        prompt = torch.tensor(PROMPT)
        tok = tokenizer(os.path.join(tmp, "tokenizer"))
        for name, kind, _, _, _, reload in made:
            _, hf, cfg, state = models[kind]
            model = TransformerLensReplacementModel(cfg, tokenizer=tok)
            model.load_and_process_state_dict({k: v.clone() for k, v in state.items()}, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                              fold_value_biases=False)
            model._configure_replacement_model(reload())
            with torch.no_grad():
                report.check("%s: TransformerLens's logits against transformers'" % name, model(prompt[None]),
                         hf(prompt[None]).logits)
            compare(report, name, got, model, prompt)
    report.finish()


if __name__ == "__main__":
    main()
