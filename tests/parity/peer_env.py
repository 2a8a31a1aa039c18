"""What the parity tests against a peer in a venv of its own share (SAELens
and sparsify in build/venv-sae, circuit-tracer in build/venv-ct: their pins
clash with the test venv's transformers):
  - use_venv: run this test again with that venv's python where the peer is
    not importable here, or exit 77 (skipped) where there is no such venv;
  - loopback_hub: a Hub on loopback (tests/hub/fake_hub.py), with
    huggingface_hub's variables pointing at it, set before the peer is
    imported (huggingface_hub reads them then);
  - Report: each comparison printed with its largest difference, the counts
    and the exit status at the end.
"""
import importlib.util
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def use_venv(modules, venv, flag, what):
    """Returns where every module in `modules` imports; else reruns this test
    with build/<venv>'s python (beside this python's own venv), or exits 77
    saying `what` is not installed."""
    if all(importlib.util.find_spec(m) for m in modules):
        return
    other = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))),
                         venv, "bin", "python")
    if os.path.exists(other) and os.path.abspath(sys.executable) != os.path.abspath(other) and not os.environ.get(flag):
        sys.exit(subprocess.run([other] + sys.argv, env=dict(os.environ, **{flag: "1"})).returncode)
    print("skip: %s is not installed; it lives in build/%s (scripts/setup --tests)" % (what, venv))
    sys.exit(77)


def loopback_hub(tmp, cache="hub-cache", extra=None):
    """A FakeHub, with HF_ENDPOINT at it, the caches under `tmp`, every other
    HF_ / HUGGINGFACE_ variable of the caller's environment removed."""
    sys.path.insert(0, os.path.join(HERE, "..", "hub"))
    from fake_hub import FakeHub

    hub = FakeHub()
    for k in [k for k in os.environ if k.startswith(("HF_", "HUGGINGFACE_"))]:
        del os.environ[k]
    os.environ.update({"HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": os.path.join(tmp, cache),
                       "HF_HOME": os.path.join(tmp, "hf-home"), "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    os.environ.update(extra or {})
    return hub


def randomize(module, seed, threshold_type=None):
    """Every parameter of a peer's module drawn N(0, 0.3^2) from `seed`; the
    thresholds of its `threshold_type` submodules (circuit-tracer's JumpReLU)
    uniform in [0, 0.3), around the pre-activations' scale."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        for m in module.modules():
            if threshold_type is not None and isinstance(m, threshold_type):
                m.threshold.copy_(torch.rand_like(m.threshold) * 0.3)


class Report:
    """Comparisons of anatomy's tensors with the peer's: |got - want| <= tol."""

    def __init__(self, peer, tol, width=44):
        self.peer, self.tol, self.width = peer, tol, width
        self.passed, self.failed, self.worst = 0, [], 0.0

    def check(self, what, got, want):
        if got is None or tuple(got.shape) != tuple(want.shape):
            line = "%s: %s, %s %s" % (what, "missing" if got is None else "shape %s" % (tuple(got.shape),), self.peer,
                                      tuple(want.shape))
            print("FAIL " + line)
            self.failed.append(line)
            return
        diff = (got.double() - want.double()).abs().max().item()
        self.worst = max(self.worst, diff)
        ok = diff <= self.tol
        print("%s %-*s max |diff| %.2e  (largest value %.4f, %d nonzero)" % (
            "ok  " if ok else "FAIL", self.width, what, diff, want.abs().max().item(), int((want != 0).sum().item())))
        if ok:
            self.passed += 1
        else:
            self.failed.append("%s: max |diff| %.3g > %g" % (what, diff, self.tol))

    def expect(self, what, ok):
        print("%s %s" % ("ok  " if ok else "FAIL", what))
        if ok:
            self.passed += 1
        else:
            self.failed.append(what)

    def finish(self):
        """Prints the failures and the counts; exits 1 where any failed."""
        for line in self.failed:
            print("FAIL " + line)
        print("%d passed, %d failed (largest difference %.2e, tolerance %g)" % (self.passed, len(self.failed), self.worst,
                                                                                self.tol))
        sys.exit(1 if self.failed else 0)
