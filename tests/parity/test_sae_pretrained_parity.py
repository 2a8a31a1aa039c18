"""sae.from_pretrained against the libraries whose dictionaries it reads,
through a Hub on loopback (tests/hub/fake_hub.py) and a registry YAML in
SAELens's pretrained_saes.yaml layout written here:
  - SAELens's own format, written by SAELens 6.54 (save_model): a standard,
    a TopK and a JumpReLU SAE, a JumpReLU transcoder and a skip transcoder
    (affine skip W_skip); a JumpReLU whose cfg.json says
    normalize_activations 'expected_average_only_in', with the registry's
    norm_scaling_factor to fold in;
  - Gemma Scope: params.npz written by numpy as Gemma Scope lays it out (a
    residual-stream JumpReLU, an embedding one, and a transcoder);
  - Gemma Scope 2: params.safetensors (+ config.json): a residual-stream
    JumpReLU, a transcoder, and one with an affine skip;
  - Llama Scope: hyperparams.json + checkpoints/final.safetensors;
  - a per-layer transcoder in circuit-tracer's layout as mwhanna's releases
    have it (layer_N.safetensors, wandb-config.yaml);
  each against SAELens's SAE.from_pretrained on the same registry (its
  registry file pointed here, huggingface_hub at the loopback Hub);
  - EleutherAI's sparsify 1.3.3 (SparseCoder.save_to_disk): a TopK SAE and a
    transcoder with a skip connection, against sparsify's own encode and
    forward.
Features and reconstruction (forward: a skip transcoder's includes x W_skipᵀ)
of the same activations; tolerance |anatomy - library| <= 1e-5, float32.
Then anatomy reads every dictionary SAELens downloaded from SAELens's own
cache with HF_HUB_OFFLINE=1, the registry found by itself in the sae_lens
folder of $VIRTUAL_ENV: the same reconstruction.
Runs in build/venv-sae (SAELens pins transformer-lens < 4); exits 77 where
SAELens or sparsify is not installed.
Usage: test_sae_pretrained_parity.py ANATOMY_EXECUTABLE
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
import peer_env  # noqa: E402

peer_env.use_venv(("torch", "sae_lens", "sparsify", "numpy", "yaml"), "venv-sae", "ANATOMY_SAE_VENV", "sae-lens or eai-sparsify")
TMP = tempfile.TemporaryDirectory()
# SAELens's downloads go to the loopback Hub; sparsify's own eager decoder (its Triton one needs a GPU)
HUB = peer_env.loopback_hub(TMP.name, cache="py-cache", extra={"SPARSIFY_DISABLE_TRITON": "1"})

import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from sae_lens import SAE  # noqa: E402
from sae_lens.loading import pretrained_saes_directory as directory  # noqa: E402
from sae_lens.saes.jumprelu_sae import JumpReLUSAE, JumpReLUSAEConfig  # noqa: E402
from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig  # noqa: E402
from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig  # noqa: E402
from sae_lens.saes.transcoder import (JumpReLUTranscoder, JumpReLUTranscoderConfig, SkipTranscoder,  # noqa: E402
                                      SkipTranscoderConfig)
from sparsify import SparseCoder, SparseCoderConfig  # noqa: E402

import safetensors_io  # noqa: E402

TOL = 1e-5
D, F = 24, 64


def randomize(module, threshold=None):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        if threshold is not None:
            module.threshold.copy_(torch.rand(F) * threshold)


def folder_files(folder, prefix):
    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            path = os.path.join(root, f)
            out[prefix + "/" + os.path.relpath(path, folder)] = open(path, "rb").read()
    return out


def saelens_repo(tmp):
    """SAELens-format dictionaries, saved by SAELens; registry rows."""
    torch.manual_seed(0)
    made = [("standard", StandardSAE(StandardSAEConfig(d_in=D, d_sae=F)), None),
            ("topk", TopKSAE(TopKSAEConfig(d_in=D, d_sae=F, k=7)), None),
            ("jumprelu", JumpReLUSAE(JumpReLUSAEConfig(d_in=D, d_sae=F)), 0.4),
            ("jumprelu_transcoder", JumpReLUTranscoder(JumpReLUTranscoderConfig(d_in=D, d_sae=F, d_out=D,
                                                                                 apply_b_dec_to_input=False)), 0.4),
            ("skip_transcoder", SkipTranscoder(SkipTranscoderConfig(d_in=D, d_sae=F, d_out=D, apply_b_dec_to_input=False)), None),
            ("scaled", JumpReLUSAE(JumpReLUSAEConfig(d_in=D, d_sae=F, normalize_activations="expected_average_only_in")), 0.4)]
    files, rows = {}, []
    for name, sae, threshold in made:
        sae.cfg.metadata.hook_name = "blocks.1.hook_mlp_in" if "transcoder" in name else "blocks.1.hook_resid_post"
        if "transcoder" in name:
            sae.cfg.metadata.hook_name_out = "blocks.1.hook_mlp_out"
        randomize(sae, threshold)
        path = os.path.join(tmp, "saelens", name)
        sae.save_model(path)
        files.update(folder_files(path, "saes/" + name))
        row = {"id": name, "path": "saes/" + name}
        if name == "scaled":
            row["norm_scaling_factor"] = 2.5
        rows.append(row)
    HUB.repo("tiny/saelens").commit(files, branches=["main"])
    return {"tiny-saelens": {"repo_id": "tiny/saelens", "model": "tiny", "conversion_func": None, "saes": rows}}


def gemma_repo(tmp):
    """Gemma Scope's layout: <path>/params.npz, float32 arrays W_enc (D, F), W_dec (F, D), b_enc, b_dec, threshold."""
    rng = np.random.default_rng(1)
    registry = {}
    for release, repo, paths, conv in (
            ("tiny-gemma-scope-res", "google/gemma-scope-2b-pt-res", ["layer_1/width_tiny/average_l0_5", "embedding/width_tiny/average_l0_5"], "gemma_2"),
            # SAELens's gemma_2_transcoder needs a width_Nk in the path (its d_sae, here 1024)
            ("tiny-gemma-scope-transcoders", "google/gemma-scope-2b-pt-transcoders", ["layer_1/width_1k/average_l0_5"], "gemma_2_transcoder")):
        files, rows = {}, []
        n = 1024 if conv == "gemma_2_transcoder" else F
        for i, path in enumerate(paths):
            arrays = {"W_enc": rng.normal(0, 0.3, (D, n)), "W_dec": rng.normal(0, 0.3, (n, D)), "b_enc": rng.normal(0, 0.2, n),
                      "b_dec": rng.normal(0, 0.1, D), "threshold": rng.uniform(0, 0.4, n)}
            out = os.path.join(tmp, "npz", release, str(i), "params.npz")
            os.makedirs(os.path.dirname(out))
            np.savez(out, **{k: v.astype(np.float32) for k, v in arrays.items()})
            files[path + "/params.npz"] = open(out, "rb").read()
            rows.append({"id": path, "path": path})
        HUB.repo(repo).commit(files, branches=["main"])
        # SAELens takes D and F from the model's name and the path's width_16k: the overrides make them the tiny ones
        registry[release] = {"repo_id": repo, "model": "gemma-2-2b", "conversion_func": conv, "saes": rows,
                             "config_overrides": {"d_in": D, "d_sae": n, "d_out": D}}
    return registry


def llama_scope_repo(tmp):
    torch.manual_seed(2)
    path = "Llama3_1-8B-Base-L1R-8x"
    hp = {"d_model": D, "d_sae": F, "jump_relu_threshold": 0.05, "dataset_average_activation_norm": {"in": 3.2, "out": 3.2},
          "hook_point_in": "blocks.1.hook_resid_post", "hook_point_out": "blocks.1.hook_resid_post"}
    weights = {"encoder.weight": torch.randn(F, D) * 0.3, "encoder.bias": torch.randn(F) * 0.2,
               "decoder.weight": torch.randn(D, F) * 0.3, "decoder.bias": torch.randn(D) * 0.1}
    out = os.path.join(tmp, "llama_scope.safetensors")
    save_file(weights, out)
    files = {path + "/hyperparams.json": json.dumps(hp).encode(), path + "/checkpoints/final.safetensors": open(out, "rb").read()}
    HUB.repo("fnlp/Llama3_1-8B-Base-LXR-8x").commit(files, branches=["main"])
    return {"tiny-llama-scope": {"repo_id": "fnlp/Llama3_1-8B-Base-LXR-8x", "model": "meta-llama/Llama-3.1-8B",
                                 "conversion_func": "llama_scope",
                                 "saes": [{"id": "l1r_8x", "path": path, "norm_scaling_factor": 1.5}]}}


def gemma_scope_2_repo(tmp):
    """Gemma Scope 2's layout: <path>/params.safetensors (w_enc, w_dec, b_enc, b_dec, threshold, a transcoder's
    affine_skip_connection (D, D)), config.json beside where it has one (SAELens infers it from the path otherwise)."""
    torch.manual_seed(6)
    files, rows = {}, []
    for path, config in (("resid_post/layer_1_width_16k_l0_small", {"architecture": "jump_relu", "model_name": "gemma-v3-270m-pt"}),
                         ("transcoder/layer_1_width_16k_l0_small", {"architecture": "jump_relu", "model_name": "gemma-v3-270m-pt",
                                                                    "affine_connection": False}),
                         ("transcoder/layer_1_width_16k_l0_small_affine", None)):
        weights = {"w_enc": torch.randn(D, F) * 0.3, "w_dec": torch.randn(F, D) * 0.3, "b_enc": torch.randn(F) * 0.2,
                   "b_dec": torch.randn(D) * 0.1, "threshold": torch.rand(F) * 0.4}
        if "affine" in path:
            weights["affine_skip_connection"] = torch.randn(D, D) * 0.3
        out = os.path.join(tmp, "gs2.safetensors")
        save_file(weights, out)
        files[path + "/params.safetensors"] = open(out, "rb").read()
        if config:
            files[path + "/config.json"] = json.dumps(config).encode()
        rows.append({"id": path, "path": path})
    HUB.repo("google/gemma-scope-2-270m-pt").commit(files, branches=["main"])
    return {"tiny-gemma-scope-2": {"repo_id": "google/gemma-scope-2-270m-pt", "model": "google/gemma-3-270m",
                                   "conversion_func": "gemma_3", "saes": rows}}


def mwhanna_repo(tmp):
    """circuit-tracer's per-layer transcoder file as mwhanna's releases lay it out: layer_N.safetensors (W_enc (F, D),
    W_dec (F, D), b_enc, b_dec), beside the wandb-config.yaml and config.yaml SAELens reads D and F and the model from."""
    torch.manual_seed(5)
    weights = {"W_enc": torch.randn(F, D) * 0.3, "W_dec": torch.randn(F, D) * 0.3, "b_enc": torch.randn(F) * 0.2,
               "b_dec": torch.randn(D) * 0.1}
    out = os.path.join(tmp, "layer_1.safetensors")
    save_file(weights, out)
    files = {"layer_1.safetensors": open(out, "rb").read(),
             "wandb-config.yaml": yaml.safe_dump({"d_model": {"value": D}, "d_feature": {"value": F},
                                                  "batch_size": {"value": 1024}}).encode(),
             "config.yaml": yaml.safe_dump({"model_name": "Qwen/Qwen3-0.6B"}).encode()}
    HUB.repo("mwhanna/qwen3-tiny-transcoders").commit(files, branches=["main"])
    return {"tiny-mwhanna-transcoders": {"repo_id": "mwhanna/qwen3-tiny-transcoders", "model": "qwen3-tiny",
                                         "conversion_func": "mwhanna_transcoder",
                                         "saes": [{"id": "layer_1", "path": "layer_1.safetensors"}]}}


def sparsify_repo(tmp):
    """sparsify's layout: <hookpoint>/cfg.json + sae.safetensors, written by SparseCoder.save_to_disk."""
    torch.manual_seed(3)
    coders = {"layers.1": SparseCoder(D, SparseCoderConfig(num_latents=F, k=7)),
              "layers.1.mlp": SparseCoder(D, SparseCoderConfig(num_latents=F, k=5, transcode=True, skip_connection=True))}
    files = {}
    for hook, coder in coders.items():
        randomize(coder)
        folder = os.path.join(tmp, "sparsify", hook)
        coder.save_to_disk(folder)
        files.update(folder_files(folder, hook))
    HUB.repo("EleutherAI/sae-tiny").commit(files, branches=["main"])
    registry = {"tiny-sparsify": {"repo_id": "EleutherAI/sae-tiny", "model": "tiny", "conversion_func": "sparsify",
                                  "saes": [{"id": h, "path": h} for h in coders]}}
    return registry, coders


def main():
    exe = os.path.abspath(sys.argv[1])
    tmp = TMP.name
    registry = {}
    registry.update(saelens_repo(tmp))
    registry.update(gemma_repo(tmp))
    registry.update(llama_scope_repo(tmp))
    registry.update(mwhanna_repo(tmp))
    registry.update(gemma_scope_2_repo(tmp))
    sp_registry, coders = sparsify_repo(tmp)
    registry.update(sp_registry)
    reg_dir = os.path.join(tmp, "registry")
    os.makedirs(reg_dir)
    reg_path = os.path.join(reg_dir, "pretrained_saes.yaml")
    with open(reg_path, "w") as f:
        yaml.safe_dump(registry, f, sort_keys=True)
    cases = [[release, str(row["id"])] for release, e in sorted(registry.items()) for row in e["saes"]]
    torch.manual_seed(4)
    x = torch.randn(50, D)
    acts = os.path.join(tmp, "acts.safetensors")
    safetensors_io.save(acts, {"x": x})
    with open(os.path.join(tmp, "cases.json"), "w") as f:
        json.dump(cases, f)
    out = os.path.join(tmp, "anatomy.safetensors")
    env = dict(os.environ, HF_HUB_CACHE=os.path.join(tmp, "lua-cache"))
    p = subprocess.run([exe, "--threads=1", os.path.join(HERE, "sae_pretrained_parity.lua"), reg_path, acts,
                        os.path.join(tmp, "cases.json"), out], capture_output=True, text=True, env=env)
    print(p.stdout, end="")
    if p.returncode != 0:
        print(p.stderr)
        print("FAIL anatomy failed")
        sys.exit(1)
    got = safetensors_io.load(out)[0]
    report = peer_env.Report("the library", TOL, width=52)
    for line in p.stdout.splitlines():  # what the Lua side checked itself
        report.passed += line.startswith("ok ")
        if line.startswith("FAIL"):
            report.failed.append(line)
    # SAELens reads the same registry: its pretrained_saes.yaml is looked up in its package folder
    directory.files = lambda package: __import__("pathlib").Path(reg_dir)
    directory.get_pretrained_saes_directory.cache_clear()
    with torch.no_grad():
        for i, (release, sae_id) in enumerate(cases, 1):
            if release == "tiny-sparsify":
                coder = coders[sae_id]
                enc = coder.encode(x)
                f = torch.zeros(x.shape[0], F).scatter(-1, enc.top_indices, enc.top_acts)
                recon = coder(x).sae_out
                lib = "sparsify"
            else:
                sae = SAE.from_pretrained(release, sae_id)
                f = sae.encode(x)
                recon = sae(x)
                lib = "SAELens"
            report.check("%s %s: features (%s)" % (release, sae_id, lib), got.get("acts_%d" % i), f)
            report.check("%s %s: reconstruction (%s)" % (release, sae_id, lib), got.get("recons_%d" % i), recon)
    # huggingface_hub's cache is shared both ways: what SAELens downloaded, anatomy reads offline (HF_HUB_OFFLINE=1);
    # and finds the registry itself in the sae_lens package of $VIRTUAL_ENV
    venv_registry = os.path.join(tmp, "venv", "lib", "python3.11", "site-packages", "sae_lens", "pretrained_saes.yaml")
    os.makedirs(os.path.dirname(venv_registry))
    with open(reg_path) as src, open(venv_registry, "w") as dst:
        dst.write(src.read())
    fetched = [c for c in cases if c[0] != "tiny-sparsify"]
    with open(os.path.join(tmp, "cases2.json"), "w") as f:
        json.dump(fetched, f)
    out2 = os.path.join(tmp, "anatomy2.safetensors")
    env2 = {k: v for k, v in os.environ.items() if k not in ("ANATOMY_SAE_REGISTRY", "CONDA_PREFIX")}
    env2.update(HF_HUB_OFFLINE="1", VIRTUAL_ENV=os.path.join(tmp, "venv"))
    p = subprocess.run([exe, "--threads=1", os.path.join(HERE, "sae_pretrained_parity.lua"), "-", acts,
                        os.path.join(tmp, "cases2.json"), out2], capture_output=True, text=True, env=env2)
    if p.returncode != 0:
        report.failed.append("anatomy offline on SAELens's cache: " + (p.stdout + p.stderr)[-2000:])
    else:
        again = safetensors_io.load(out2)[0]
        for j, (release, sae_id) in enumerate(fetched, 1):
            i = cases.index([release, sae_id]) + 1
            report.check("%s %s: offline from SAELens's downloads" % (release, sae_id), again.get("recons_%d" % j),
                         got["recons_%d" % i])
    print("%d dictionaries" % len(cases))
    report.finish()


if __name__ == "__main__":
    try:
        main()
    finally:
        HUB.stop()
