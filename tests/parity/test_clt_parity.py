"""Transcoders in circuit-tracer's format, both ways, against circuit-tracer
0.5.0 itself:
  - written by circuit-tracer (to_safetensors, random weights): a
    cross-layer transcoder with a JumpReLU and one with a ReLU, a per-layer
    TranscoderSet with W_skip (ReLU) and one without (JumpReLU); read by
    anatomy's sae.load_clt: the features and every layer's reconstruction
    of the same MLP inputs as circuit-tracer's encode and decode;
  - trained by anatomy's sae.train_clt for a few steps on a tiny model (a
    JumpReLU CLT and a ReLU set with skip), written by c:save, read by
    circuit-tracer's load_clt and load_transcoder_set (its lazy decoders
    reading the files as they are): circuit-tracer's features and
    reconstructions against anatomy's, and config.yaml's keys as its Hub
    loader reads them;
  - through a Hub on loopback (tests/hub/fake_hub.py): circuit-tracer's
    folders with a config.yaml, one in a subfolder, read by sae.load_clt
    from their references ('ct/clt', 'ct/sets/tiny@main'), and anatomy's
    folders read by circuit-tracer's load_transcoder_from_hub.
Tolerance: |anatomy - circuit-tracer| <= 1e-5, both in float32.
circuit-tracer pins transformers <= 4.57.3 and huggingface-hub < 1, so it
lives in its own venv (build/venv-ct, made by scripts/setup --tests beside
build/venv); this test runs itself there, and exits 77 (skipped) where there
is none.
Usage: test_clt_parity.py ANATOMY_EXECUTABLE
"""
import os
import subprocess
import sys
import tempfile

import peer_env  # noqa: E402

peer_env.use_venv(("torch", "yaml", "circuit_tracer"), "venv-ct", "ANATOMY_CT_VENV", "circuit-tracer")
TMP = tempfile.TemporaryDirectory()
# circuit-tracer's downloads, and anatomy's, go to the loopback Hub
HUB = peer_env.loopback_hub(TMP.name)

import torch  # noqa: E402
import yaml  # noqa: E402
from circuit_tracer.transcoder.activation_functions import JumpReLU  # noqa: E402
from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder, load_clt  # noqa: E402
from circuit_tracer.transcoder.single_layer_transcoder import (SingleLayerTranscoder, TranscoderSet,  # noqa: E402
                                                               load_transcoder_set)
from circuit_tracer.utils.hf_utils import load_transcoder_from_hub  # noqa: E402

import safetensors_io  # noqa: E402

TOL = 1e-5
L, D, F = 3, 12, 20
N = 40
CPU = torch.device("cpu")


def circuit_tracer_written(folder):
    """circuit-tracer's transcoders, random weights, saved with to_safetensors: (name, module, path)."""
    made = []
    for i, act in enumerate(("jump_relu", "relu")):
        clt = CrossLayerTranscoder(L, F, D, activation_function=act, lazy_decoder=False, device=CPU, dtype=torch.float32)
        peer_env.randomize(clt, 10 + i, JumpReLU)
        path = os.path.join(folder, "clt_" + act)
        clt.to_safetensors(path)
        made.append(("CLT " + act, clt, path))
    for i, (act, skip) in enumerate((("relu", True), ("jump_relu", False))):
        layers = {}
        for layer in range(L):
            fn = JumpReLU(torch.zeros(F), 0.1) if act == "jump_relu" else torch.nn.functional.relu
            layers[layer] = SingleLayerTranscoder(D, F, fn, layer, skip_connection=skip, device=CPU, dtype=torch.float32)
        tset = TranscoderSet(layers, feature_input_hook="ln2.hook_normalized", feature_output_hook="hook_mlp_out")
        peer_env.randomize(tset, 20 + i, JumpReLU)
        path = os.path.join(folder, "set_%s%s" % (act, "_skip" if skip else ""))
        tset.to_safetensors(path)
        made.append(("set %s%s" % (act, " W_skip" if skip else ""), tset, path))
    return made


def publish(repo, folder, subfolder=None, config=None):
    """A folder's files (and a config.yaml) as the main branch of a repository on the loopback Hub."""
    prefix = subfolder + "/" if subfolder else ""
    files = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as fh:
            files[prefix + name] = fh.read()
    if config is not None:
        files[prefix + "config.yaml"] = yaml.safe_dump(config).encode()
    HUB.repo(repo).commit(files, branches=["main"])


def run(module, x):
    """circuit-tracer's features (L, N, F) and reconstructions (L, N, D) of MLP inputs x (L, N, D)."""
    f = module.encode(x)
    if isinstance(module, CrossLayerTranscoder):
        recon = module.decode(f.to_sparse(), x)
    else:
        recon = module.decode(f, x)
    return f, recon


def main():
    exe = sys.argv[1]
    report = peer_env.Report("circuit-tracer", TOL, width=44)
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(1)
        x = torch.randn(L, N, D)
        acts = os.path.join(tmp, "acts.safetensors")
        safetensors_io.save(acts, {"x": x.transpose(0, 1).contiguous()})  # anatomy's (N, L, D)
        made = circuit_tracer_written(tmp)
        # two of them on the loopback Hub, as circuit-tracer's Hub folders are: config.yaml beside the files
        publish("ct/clt", made[0][2], config={"model_kind": "cross_layer_transcoder", "feature_input_hook": "hook_resid_mid",
                                              "feature_output_hook": "hook_mlp_out"})
        publish("ct/sets", made[2][2], subfolder="tiny", config={"model_kind": "transcoder_set",
                                                                 "feature_input_hook": "mlp.hook_in",
                                                                 "feature_output_hook": "hook_mlp_out"})
        made += [(made[0][0] + " (test Hub)", made[0][1], "ct/clt"), (made[2][0] + " (test Hub)", made[2][1], "ct/sets/tiny@main")]
        out_dir = os.path.join(tmp, "anatomy")
        os.makedirs(out_dir)
        here = os.path.dirname(os.path.abspath(__file__))
        p = subprocess.run([exe, "--threads=1", os.path.join(here, "clt_parity.lua"), acts, out_dir] + [m[2] for m in made],
                           capture_output=True, text=True)
        print(p.stdout, end="")
        if p.returncode != 0:
            print(p.stderr)
            print("FAIL anatomy failed")
            sys.exit(1)
        got = safetensors_io.load(os.path.join(out_dir, "anatomy.safetensors"))[0]
        with torch.no_grad():
            for i, (name, module, _) in enumerate(made, 1):
                f, recon = run(module, x)
                report.check("%s read: features" % name, got["read_%d_acts" % i].transpose(0, 1), f)
                report.check("%s read: every layer's reconstruction" % name, got["read_%d_recons" % i].transpose(0, 1), recon)
            xt = got["trained_x"].transpose(0, 1).contiguous()  # (L, N, 16)
            clt_dir = os.path.join(out_dir, "clt")
            clt = load_clt(clt_dir, device=CPU, dtype=torch.float32)  # lazy decoders: W_dec_i read from the files
            f, recon = run(clt, xt)
            report.check("anatomy CLT written: features", got["trained_clt_acts"].transpose(0, 1), f)
            report.check("anatomy CLT written: every layer's reconstruction", got["trained_clt_recons"].transpose(0, 1), recon)
            set_dir = os.path.join(out_dir, "set")
            with open(os.path.join(set_dir, "config.yaml")) as fh:
                config = yaml.safe_load(fh)
            tset = load_transcoder_set({i: os.path.join(set_dir, "layer_%d.safetensors" % i) for i in range(L)}, scan="anatomy",
                                       feature_input_hook=config["feature_input_hook"],
                                       feature_output_hook=config["feature_output_hook"], device=CPU, dtype=torch.float32)
            f, recon = run(tset, xt)
            report.check("anatomy set (W_skip) written: features", got["trained_set_acts"].transpose(0, 1), f)
            report.check("anatomy set (W_skip) written: reconstruction", got["trained_set_recons"].transpose(0, 1), recon)
            report.expect("anatomy set written: a ReLU with W_skip as circuit-tracer reads it",
                          tset.skip_connection and tset[0].activation_function is torch.nn.functional.relu)
            report.expect("anatomy CLT written: a JumpReLU as circuit-tracer reads it", isinstance(clt.activation_function, JumpReLU))
            report.expect("the Hub's config.yaml hooks read by anatomy",
                          "read ct/clt: " in p.stdout and "hook_resid_mid -> hook_mlp_out" in p.stdout.split("read ct/clt: ")[1].split("\n")[0]
                          and "mlp.hook_in -> hook_mlp_out" in p.stdout.split("read ct/sets/tiny@main: ")[1].split("\n")[0])
            # circuit-tracer's own Hub loader on anatomy's folders served by the loopback Hub (config.yaml, then the files)
            publish("anatomy/clt", clt_dir)
            publish("anatomy/set", set_dir)
            hub_clt, hub_config = load_transcoder_from_hub("anatomy/clt", device=CPU, dtype=torch.float32, use_cache=False)
            f, recon = run(hub_clt, xt)
            report.check("anatomy CLT via load_transcoder_from_hub: features", got["trained_clt_acts"].transpose(0, 1), f)
            report.check("anatomy CLT via load_transcoder_from_hub: recons", got["trained_clt_recons"].transpose(0, 1), recon)
            hub_set, _ = load_transcoder_from_hub("anatomy/set", device=CPU, dtype=torch.float32, use_cache=False)
            f, recon = run(hub_set, xt)
            report.check("anatomy set via load_transcoder_from_hub: features", got["trained_set_acts"].transpose(0, 1), f)
            report.check("anatomy set via load_transcoder_from_hub: recons", got["trained_set_recons"].transpose(0, 1), recon)
            report.expect("load_transcoder_from_hub: hooks %s -> %s" % (hub_clt.feature_input_hook, hub_clt.feature_output_hook),
                          hub_clt.feature_input_hook == "ln2.hook_normalized" and hub_set.feature_output_hook == "hook_mlp_out"
                          and hub_config["model_kind"] == "cross_layer_transcoder")
            with open(os.path.join(clt_dir, "config.yaml")) as fh:
                clt_config = yaml.safe_load(fh)
            report.expect("config.yaml: %s" % clt_config, clt_config.get("model_kind") == "cross_layer_transcoder"
                          and config.get("model_kind") == "transcoder_set"
                          and clt_config.get("feature_input_hook") == "ln2.hook_normalized"
                          and clt_config.get("feature_output_hook") == "hook_mlp_out")
    HUB.stop()
    report.finish()


if __name__ == "__main__":
    main()
