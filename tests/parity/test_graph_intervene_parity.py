"""Interventions on transcoder features against circuit-tracer 0.5.0's
ReplacementModel.feature_intervention, on test_graph_parity.py's tiny GPT-2
and Llama (written by transformers, circuit-tracer's TransformerLens
replacement model on the same weights) and its eight transcoder sets
(written by circuit-tracer): per set, four lists of interventions (one
active feature ablated to 0, one steered to 3 times its activation, four
features at four positions and three layers, one feature at two positions
with a tensor of values), each run with circuit-tracer's defaults, with
freeze_attention False, with every layer constrained, with one layer
constrained and attention free, and with apply_activation_function False
(free, and every layer constrained): anatomy's sae.intervene gives the same
logits and activations within 1e-4.
circuit-tracer lives in build/venv-ct (scripts/setup --tests); this test runs
itself there, and exits 77 (skipped) where there is none.
Usage: test_graph_intervene_parity.py ANATOMY_EXECUTABLE
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
from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel  # noqa: E402

import safetensors_io  # noqa: E402
import test_graph_parity as gp  # noqa: E402  the models, tokenizer and transcoders of the graph parity test

TOL = 1e-4
OPTIONS = [  # (name, circuit-tracer's keyword arguments); anatomy's constrained_layers count from 1
    ("defaults", {}),
    ("attention free", dict(freeze_attention=False)),
    ("all layers constrained", dict(constrained_layers=range(gp.L))),
    ("layer 2 constrained, attention free", dict(constrained_layers=range(1, 2), freeze_attention=False)),
    ("pre-activations", dict(apply_activation_function=False)),
    ("pre-activations, all constrained", dict(apply_activation_function=False, constrained_layers=range(gp.L))),
]


def interventions(acts):
    """Four lists of (layer, pos, feature, value) from the clean activations (L, T, F), 0-based: the most active
    feature at a position ablated, steered to 3 times its activation, several at once, one over two positions."""
    def top(layer, pos):
        f = int(acts[layer, pos].argmax())
        return f, float(acts[layer, pos, f])

    f0, a0 = top(0, 3)
    f1, a1 = top(1, 4)
    f2, _ = top(2, 5)
    f3, a3 = top(0, 6)
    return [
        ("ablate", [(0, 3, f0, 0.0)]),
        ("steer up", [(1, 4, f1, 3.0 * a1)]),
        ("several", [(0, 3, f0, 0.0), (1, 4, f1, 2.0 * a1), (2, 5, f2, 0.0), (0, 6, f3, -a3)]),
        ("over positions", [(1, torch.tensor([2, 5]), f1, torch.tensor([1.5, -0.5]))]),
    ]


def lua_case(key, name, model_dir, path, hook_in, hook_out, ivs, kwargs):
    """One case as a Lua table literal, every index from 1."""
    items = []
    for layer, pos, feature, value in ivs:
        if torch.is_tensor(pos):
            p = "{%s}" % ", ".join(str(int(x) + 1) for x in pos)
            v = "torch.tensor({%s})" % ", ".join(repr(float(x)) for x in value)
        else:
            p, v = str(pos + 1), repr(float(value))
        items.append("{%d, %s, %d, %s}" % (layer + 1, p, feature + 1, v))
    opts = []
    if "freeze_attention" in kwargs:
        opts.append("freeze_attention = %s" % str(kwargs["freeze_attention"]).lower())
    if "apply_activation_function" in kwargs:
        opts.append("apply_activation_function = %s" % str(kwargs["apply_activation_function"]).lower())
    if "constrained_layers" in kwargs:
        opts.append("constrained_layers = {%s}" % ", ".join(str(i + 1) for i in kwargs["constrained_layers"]))
    return ("{key = %r, model = %r, clt = %r, input_hook = %r, output_hook = %r, interventions = {%s}, opts = {%s}}"
            % (key, model_dir, path, hook_in, hook_out, ", ".join(items), ", ".join(opts)))


def main():
    exe = sys.argv[1]
    report = peer_env.Report("circuit-tracer", TOL, width=84)
    prompt = torch.tensor(gp.PROMPT)
    with tempfile.TemporaryDirectory() as tmp:
        models = {name: (os.path.join(tmp, name),) + make(os.path.join(tmp, name))
                  for name, make in (("gpt2", gp.gpt2), ("llama", gp.llama))}
        made = gp.transcoders(tmp)
        tok = gp.tokenizer(os.path.join(tmp, "tokenizer"))
        want, cases = {}, []
        for name, kind, path, hook_in, hook_out, reload in made:
            _, hf, cfg, state = models[kind]
            model = TransformerLensReplacementModel(cfg, tokenizer=tok)
            model.load_and_process_state_dict({k: v.clone() for k, v in state.items()}, fold_ln=False,
                                              center_writing_weights=False, center_unembed=False, fold_value_biases=False)
            model._configure_replacement_model(reload())
            clean_logits, acts = model.get_activations(prompt)
            want[name + ": no intervention"] = (clean_logits[0], acts)
            cases.append(lua_case(name + ": no intervention", name, models[kind][0], path, hook_in, hook_out, [], {}))
            for iv_name, ivs in interventions(acts):
                for opt_name, kwargs in OPTIONS:
                    key = "%s: %s, %s" % (name, iv_name, opt_name)
                    logits, activations = model.feature_intervention(prompt, ivs, **kwargs)
                    want[key] = (logits[0], activations)
                    cases.append(lua_case(key, name, models[kind][0], path, hook_in, hook_out, ivs, kwargs))
            model.reset_hooks(including_permanent=True)
        case_file = os.path.join(tmp, "cases.lua")
        with open(case_file, "w") as f:
            f.write("return {\n%s,\n}\n" % ",\n".join(cases))
        out = os.path.join(tmp, "anatomy.safetensors")
        ids = ",".join(str(i + 1) for i in gp.PROMPT)  # anatomy's ids count from 1
        p = subprocess.run([exe, "--threads=1", os.path.join(HERE, "graph_intervene_parity.lua"), out, ids, case_file],
                           capture_output=True, text=True)
        print(p.stdout + p.stderr)
        if p.returncode != 0:
            print("FAIL anatomy failed")
            sys.exit(1)
        got = safetensors_io.load(out)[0]
        for key, (logits, activations) in want.items():
            report.check(key + ": logits", got.get(key + ".logits"), logits)
            report.check(key + ": activations", got.get(key + ".activations"), activations)
        # the interventions did something: each changes the logits, but where the layers it writes to are not
        # constrained (a per-layer set's layer-1 feature with layer 2 constrained writes nowhere)
        still = [k for k, w in want.items() if not k.endswith("no intervention") and
                 float((w[0] - want[k.split(":")[0] + ": no intervention"][0]).abs().max()) < 1e-3]
        print("interventions that leave circuit-tracer's logits as they were: %s" % (still or "none"))
        report.expect("every intervention moves the logits but a per-layer set's constrained to a layer it does not "
                      "write to (%d of %d)" % (len(still), len(want) - len(made)),
                      all("_set_" in k and "layer 2 constrained" in k and ("ablate" in k or "several" in k) for k in still))
    report.finish()


if __name__ == "__main__":
    main()
