"""Sparse autoencoders in SAELens's format, both ways, against SAELens 6.54
itself:
  - SAEs written by SAELens (save_model: 'standard', 'topk' and 'jumprelu',
    random weights) read by anatomy's sae.load: the features and the
    reconstruction of the same activations as SAELens's encode and decode;
  - SAEs written by anatomy's s:save (relu, topk, jumprelu, and a batchtopk,
    which is written as the JumpReLU it computes after training) read by
    SAELens's SAE.load_from_disk: SAELens's features and reconstruction
    against anatomy's own.
Tolerance: |anatomy - SAELens| <= 1e-5, both in float32. SAELens pins
transformer-lens < 4, so it lives in its own venv (build/venv-sae, made by
scripts/setup --tests beside build/venv); this test runs itself there, and
exits 77 (skipped) where there is none.
Usage: test_sae_parity.py ANATOMY_EXECUTABLE
"""
import os
import subprocess
import sys
import tempfile

import peer_env  # noqa: E402

peer_env.use_venv(("torch", "sae_lens"), "venv-sae", "ANATOMY_SAE_VENV", "SAELens")
import torch  # noqa: E402
from sae_lens import SAE, JumpReLUSAE, StandardSAE, TopKSAE  # noqa: E402
from sae_lens.saes.jumprelu_sae import JumpReLUSAEConfig  # noqa: E402
from sae_lens.saes.standard_sae import StandardSAEConfig  # noqa: E402
from sae_lens.saes.topk_sae import TopKSAEConfig  # noqa: E402

import safetensors_io

TOL = 1e-5
D, F = 24, 64


def saelens_written(folder):
    """SAELens SAEs of its three inference architectures, random weights, saved with save_model."""
    torch.manual_seed(0)
    made = []
    for name, cls, cfg in (("standard", StandardSAE, StandardSAEConfig(d_in=D, d_sae=F)),
                           ("topk", TopKSAE, TopKSAEConfig(d_in=D, d_sae=F, k=7)),
                           ("jumprelu", JumpReLUSAE, JumpReLUSAEConfig(d_in=D, d_sae=F))):
        cfg.metadata.hook_name = "blocks.1.hook_resid_post"
        sae = cls(cfg)
        with torch.no_grad():
            for p in sae.parameters():
                p.copy_(torch.randn_like(p) * 0.3)
            if name == "jumprelu":
                sae.threshold.copy_(torch.rand(F) * 0.4)
        path = os.path.join(folder, name)
        sae.save_model(path)
        made.append((name, sae, path))
    return made


def main():
    exe = sys.argv[1]
    report = peer_env.Report("SAELens", TOL, width=34)
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(1)
        x = torch.randn(200, D)
        acts = os.path.join(tmp, "acts.safetensors")
        safetensors_io.save(acts, {"x": x})
        made = saelens_written(tmp)
        out_dir = os.path.join(tmp, "anatomy")
        os.makedirs(out_dir)
        here = os.path.dirname(os.path.abspath(__file__))
        p = subprocess.run([exe, "--threads=1", os.path.join(here, "sae_parity.lua"), acts, out_dir] + [m[2] for m in made],
                           capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stdout + p.stderr)
            print("FAIL anatomy failed")
            sys.exit(1)
        got = safetensors_io.load(os.path.join(out_dir, "anatomy.safetensors"))[0]
        with torch.no_grad():
            for i, (name, sae, _) in enumerate(made, 1):
                f = sae.encode(x)
                report.check("SAELens %s read: features" % name, got["read_%d_acts" % i], f)
                report.check("SAELens %s read: reconstruction" % name, got["read_%d_recons" % i], sae.decode(f))
            for kind in ("relu", "topk", "jumprelu", "batchtopk"):
                sae = SAE.load_from_disk(os.path.join(out_dir, kind))
                f = sae.encode(x)
                report.check("anatomy %s written: features" % kind, got["written_%s_acts" % kind], f)
                report.check("anatomy %s written: reconstruction" % kind, got["written_%s_recons" % kind], sae.decode(f))
                if kind == "topk":
                    report.expect("anatomy topk written: k %s, hook_name %s" % (sae.cfg.k, sae.cfg.metadata.hook_name),
                                  sae.cfg.k == 6 and sae.cfg.metadata.hook_name == "blocks.2.resid_post")
    report.finish()


if __name__ == "__main__":
    main()
