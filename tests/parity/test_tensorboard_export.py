#!/usr/bin/env python3
"""TensorBoard reads what anatomy writes.

anatomy trains a small GPT with a JSON-lines log, exports it with
train.export_metrics{tensorboard = ...} and an autopsy with a:tensorboard();
TensorBoard's own reader (EventAccumulator, as `tensorboard --logdir` loads a
folder) must find every scalar at its step with the logged value, rounded to
float32 as TensorBoard stores it (exactly).

Needs the tensorboard package (the PyPI build's venv); exits 77 without.
    test_tensorboard_export.py ANATOMY_EXE
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:
    print("skipped: the tensorboard package is not installed for %s" % sys.executable)
    sys.exit(77)

LUA = r"""
local d = ...
local c = data.from_string(('it was the best of times, it was the worst of times. '):rep(30))
torch.manual_seed(1)
local m = models.gpt{vocab = c.vocab_size, dim = 16, heads = 2, layers = 2, seq = 16, ffn = 32}
local run = train.fit(m, c, {steps = 20, batch = 2, seq = 16, seed = 2, quiet = true, eval_every = 5, log = d .. '/log.jsonl'})
train.export_metrics(d .. '/log.jsonl', {tensorboard = d .. '/train'})
local a = autopsy.run(m, c, {history = run, batch = 2, seq = 16})
a:json(d .. '/autopsy.json')
a:tensorboard(d .. '/autopsy')
"""


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def scalars(folder):
    acc = EventAccumulator(folder, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def main():
    exe = sys.argv[1]
    d = tempfile.mkdtemp(prefix="anatomy-tb-")
    failures = passed = 0
    try:
        script = os.path.join(d, "make.lua")
        with open(script, "w") as f:
            f.write(LUA)
        subprocess.run([exe, "--threads=1", script, d], check=True)
        log = [json.loads(line) for line in open(os.path.join(d, "log.jsonl"))]
        got = scalars(os.path.join(d, "train"))
        for key, tag in [("loss", "train/loss"), ("lr", "train/lr"), ("grad_norm", "train/grad_norm"),
                         ("tokens_per_second", "train/tokens_per_second"), ("val_loss", "val/loss")]:
            want = [(r["step"], f32(r[key])) for r in log if key in r]
            if got.get(tag) == want:
                passed += 1
                print("ok    %-24s %d points, the logged values as float32" % (tag, len(want)))
            else:
                failures += 1
                print("FAIL  %s: TensorBoard read %s, the log has %s" % (tag, got.get(tag), want))
        autopsy = json.load(open(os.path.join(d, "autopsy.json")))
        got = scalars(os.path.join(d, "autopsy"))
        for key in ["grad_norm", "erank", "act_std", "lens_loss", "removal_loss"]:
            want = [(i + 1, f32(r[key])) for i, r in enumerate(autopsy["rows"]) if isinstance(r.get(key), (int, float))]
            if want and got.get("autopsy/" + key) == want:
                passed += 1
                print("ok    autopsy/%-16s %d layers" % (key, len(want)))
            else:
                failures += 1
                print("FAIL  autopsy/%s: TensorBoard read %s, the autopsy has %s" % (key, got.get("autopsy/" + key), want))
        want = [(s, f32(v)) for s, v in enumerate(autopsy["history"]["train"], start=autopsy["history"].get("first_step", 1))]
        if got.get("train/loss") == want:
            passed += 1
            print("ok    the autopsy's training history as train/loss, %d steps" % len(want))
        else:
            failures += 1
            print("FAIL  train/loss in the autopsy's file: %s, want %s" % (got.get("train/loss"), want))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
