"""Graph files against circuit-tracer 0.5.0's create_graph_files: the tiny
GPT-2 and Llama and the transcoders of test_graph_parity.py (written by
transformers and circuit-tracer), with a tiny byte-level BPE tokenizer
written by transformers into each model's folder (a space, a newline, a tab,
a quote, a backslash, an e-acute and its two halves as tokens). circuit-tracer
attributes the prompt and writes create_graph_files(graph, slug, folder,
scan, node_threshold, edge_threshold); anatomy builds the graph with
sae.attribute from the same folders and writes g:json(folder, {slug, scan,
node_threshold, edge_threshold}). The two files compared: the same nodes in
the same order with every field equal (influence, activation and token_prob
within 1e-4 of max(1, |circuit-tracer's|)), the same links in the same order
with their weights within the same tolerance, the same metadata (and
graph-metadata.json) but for a list scan's name: circuit-tracer names it
'custom-' + Python's hash() of the names, salted per process (two runs of
circuit-tracer differ), so only the prefix and the transcoder_list are
compared. anatomy's files validated by circuit-tracer's pydantic Model and
served by its local server (frontend/local_server.py).
circuit-tracer lives in build/venv-ct (scripts/setup --tests); this test runs
itself there, and exits 77 (skipped) where there is none.
Usage: test_graph_json_parity.py ANATOMY_EXECUTABLE
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import urllib.request

import peer_env  # noqa: E402

peer_env.use_venv(("torch", "transformers", "transformer_lens", "circuit_tracer"), "venv-ct", "ANATOMY_CT_VENV",
                  "circuit-tracer")
HERE = os.path.dirname(os.path.abspath(__file__))

import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers  # noqa: E402
from circuit_tracer import attribute  # noqa: E402
from circuit_tracer.frontend.graph_models import Model  # noqa: E402
from circuit_tracer.frontend.local_server import serve  # noqa: E402
from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel  # noqa: E402
from circuit_tracer.utils.create_graph_files import create_graph_files  # noqa: E402

import test_graph_parity as tgp  # noqa: E402  the models and transcoders

TOL = 1e-4
# Hugging Face's ids (tokenizer() below): <|endoftext|> ' the' '"' 'th' '\' 'Ã' '©' 'é' '\n' ' a' '\t' 'e'
PROMPT = [0, 37, 32, 35, 33, 30, 31, 38, 28, 34, 29, 5]
OPTS = dict(max_n_logits=6, desired_logit_prob=0.8, batch_size=5)
# slug, transcoders (test_graph_parity's), max_feature_nodes, node_threshold, edge_threshold, scan
GRAPHS = [("gpt2-clt", "gpt2_clt_jump_relu", None, 0.8, 0.98, "tiny-gpt2-clt"),
          ("gpt2-set", "gpt2_set_relu_skip", None, 0.6, 0.9, "tiny-gpt2-set"),
          ("gpt2-clt-capped", "gpt2_clt_relu", 40, 0.8, 0.98, "tiny-gpt2-clt-relu"),
          ("llama-clt", "llama_clt_jump_relu", None, 0.8, 0.98, ["tiny-llama-l0", "tiny-llama-l1", "tiny-llama-l2"])]
FLOATS = ("influence", "activation", "token_prob")


def tokenizer(folder):
    """A byte-level BPE of tgp.V tokens (the letters, byte-level characters, five merges) saved in folder."""
    vocab = {"<|endoftext|>": 0}
    for t in list("abcdefghijklmnopqrstuvwxyz") + ["Ġ", "Ċ", "ĉ", "Ã", "©", '"', "\\", "Ġa", "th", "Ġth", "Ġthe", "Ã©", "!"]:
        vocab[t] = len(vocab)
    assert len(vocab) == tgp.V
    tok = Tokenizer(tok_models.BPE(vocab, [("Ġ", "a"), ("t", "h"), ("Ġ", "th"), ("Ġth", "e"), ("Ã", "©")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                         clean_up_tokenization_spaces=False).save_pretrained(folder)
    return transformers.AutoTokenizer.from_pretrained(folder)


def scaled(got, want):
    """got and want divided by max(1, |want|): their difference is absolute below 1, relative above"""
    want_t, got_t = torch.tensor(want, dtype=torch.float64), torch.tensor(got, dtype=torch.float64)
    scale = want_t.abs().clamp(min=1)
    return got_t / scale, want_t / scale


def compare(report, slug, got, want):
    """anatomy's graph file against circuit-tracer's"""
    gn, wn = got["nodes"], want["nodes"]
    kinds = {}
    for n in wn:
        kinds[n["feature_type"]] = kinds.get(n["feature_type"], 0) + 1
    report.expect("%s: the same %d nodes %s" % (slug, len(wn), kinds), len(gn) == len(wn))
    same = len(gn) == len(wn)
    fields = sorted(set(Model.model_fields["nodes"].annotation.__args__[0].model_fields) - set(FLOATS))
    bad = [(i, k, a.get(k), b.get(k)) for i, (a, b) in enumerate(zip(gn, wn)) for k in fields if a.get(k) != b.get(k)]
    report.expect("%s: every node's %s equal%s" % (slug, ", ".join(fields), "" if not bad else " (first: %s)" % (bad[0],)),
                  same and not bad)
    for k in FLOATS:
        pairs = [(a.get(k), b.get(k)) for a, b in zip(gn, wn)]
        nulls = [(x, y) for x, y in pairs if x is None or y is None]
        report.expect("%s: nodes' %s null in the same %d nodes" % (slug, k, len(nulls)), all(x is None and y is None
                                                                                              for x, y in nulls))
        pairs = [(x, y) for x, y in pairs if x is not None and y is not None]
        report.check("%s: nodes' %s (%d)" % (slug, k, len(pairs)), *scaled([x for x, _ in pairs], [y for _, y in pairs]))
    gl, wl = got["links"], want["links"]
    ends = [(a["source"], a["target"]) == (b["source"], b["target"]) for a, b in zip(gl, wl)]
    report.expect("%s: the same %d links, in the same order" % (slug, len(wl)), len(gl) == len(wl) and all(ends))
    report.check("%s: link weights" % slug, *scaled([a["weight"] for a in gl], [b["weight"] for b in wl]))
    report.expect("%s: the same qParams" % slug, got["qParams"] == want["qParams"])
    compare_metadata(report, slug + ": metadata", got["metadata"], want["metadata"])


def compare_metadata(report, what, got, want):
    keys = sorted(set(got) | set(want))
    if isinstance(want.get("transcoder_list"), list) and want["transcoder_list"]:  # a list scan: named by Python's hash
        ok = got["scan"].startswith("custom-") and want["scan"].startswith("custom-")
        report.expect("%s: a list scan named custom-<hash> (%s, circuit-tracer's %s)" % (what, got["scan"], want["scan"]), ok)
        keys.remove("scan")
    diff = [k for k in keys if got.get(k) != want.get(k)]
    report.expect("%s: %s equal%s" % (what, ", ".join(keys), "" if not diff else " (differ: %s: %r against %r)" % (
        diff[0], got.get(diff[0]), want.get(diff[0]))), not diff)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_served(report, folder, slugs):
    """circuit-tracer's local server on anatomy's folder: the graph files and graph-metadata.json as written"""
    port = free_port()
    server = serve(data_dir=folder, port=port)
    try:
        def get(path):
            with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=10) as r:
                return r.status, r.read()
        status, body = get("/data/graph-metadata.json")
        listed = [g["slug"] for g in json.loads(body)["graphs"]]
        report.expect("local server: graph-metadata.json lists %s" % listed, status == 200 and listed == slugs)
        for slug in slugs:
            status, body = get("/graph_data/%s.json" % slug)
            with open(os.path.join(folder, slug + ".json"), "rb") as f:
                report.expect("local server: %s.json served (%d bytes)" % (slug, len(body)), status == 200 and body == f.read())
        status, body = get("/index.html")
        report.expect("local server: its graph viewer (index.html, %d bytes)" % len(body), status == 200 and len(body) > 0)
    finally:
        server.stop()


def main():
    exe = sys.argv[1]
    report = peer_env.Report("circuit-tracer", TOL, width=60)
    with tempfile.TemporaryDirectory() as tmp:
        models = {}
        for kind, make in (("gpt2", tgp.gpt2), ("llama", tgp.llama)):
            folder = os.path.join(tmp, kind)
            models[kind] = (folder,) + make(folder) + (tokenizer(folder),)
        made = {m[0]: m for m in tgp.transcoders(tmp)}
        ours, theirs = os.path.join(tmp, "anatomy-graphs"), os.path.join(tmp, "circuit-tracer-graphs")
        args = []
        for slug, name, max_f, node_t, edge_t, scan in GRAPHS:
            _, kind, path, hook_in, hook_out, _ = made[name]
            args.append("|".join((slug, models[kind][0], path, hook_in, hook_out, str(max_f or 0), repr(node_t), repr(edge_t),
                                  scan if isinstance(scan, str) else ",".join(scan))))
        p = subprocess.run([exe, "--threads=1", os.path.join(HERE, "graph_json_parity.lua"), ours,
                            ",".join(str(i + 1) for i in PROMPT),  # anatomy's ids count from 1
                            str(OPTS["max_n_logits"]), repr(OPTS["desired_logit_prob"]), str(OPTS["batch_size"])] + args,
                           capture_output=True, text=True)
        print(p.stdout + p.stderr)
        if p.returncode != 0:
            print("FAIL anatomy failed")
            sys.exit(1)
        prompt = torch.tensor(PROMPT)
        for slug, name, max_f, node_t, edge_t, scan in GRAPHS:
            _, kind, _, _, _, reload = made[name]
            folder, _, cfg, state, tok = models[kind]
            model = TransformerLensReplacementModel(cfg, tokenizer=tok)
            model.load_and_process_state_dict({k: v.clone() for k, v in state.items()}, fold_ln=False,
                                              center_writing_weights=False, center_unembed=False, fold_value_biases=False)
            model._configure_replacement_model(reload())
            extra = dict(max_feature_nodes=max_f, update_interval=2) if max_f else {}
            g = attribute(prompt, model, **OPTS, **extra)
            g.cfg.tokenizer_name = folder  # create_graph_files reads the tokenizer from there
            create_graph_files(g, slug, theirs, scan=scan, node_threshold=node_t, edge_threshold=edge_t)
            with open(os.path.join(ours, slug + ".json")) as f:
                got = json.load(f)
            with open(os.path.join(theirs, slug + ".json")) as f:
                want = json.load(f)
            compare(report, slug, got, want)
            try:
                Model.model_validate(got)
                report.expect("%s: anatomy's file validates as circuit-tracer's Model" % slug, True)
            except Exception as e:  # pydantic's ValidationError, printed
                report.expect("%s: anatomy's file validates as circuit-tracer's Model (%s)" % (slug, e), False)
        metas = []
        for folder in (ours, theirs):
            with open(os.path.join(folder, "graph-metadata.json")) as f:
                metas.append(json.load(f)["graphs"])
        report.expect("graph-metadata.json: the same %d slugs in order" % len(metas[1]),
                      [m["slug"] for m in metas[0]] == [m["slug"] for m in metas[1]])
        for a, b in zip(*metas):
            compare_metadata(report, "graph-metadata.json: " + a["slug"], a, b)
        check_served(report, ours, [g[0] for g in GRAPHS])
    report.finish()


if __name__ == "__main__":
    main()
