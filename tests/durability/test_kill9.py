#!/usr/bin/env python3
"""Checkpoints survive kill -9.

A small training run (kill9_train.lua: checkpoint every 4 steps, a JSON-lines
log) is killed with SIGKILL at 50 random moments: while it starts and loads its
checkpoint, while it trains, and while it writes (ANATOMY_TEST_WRITE_PAUSE makes
every writer sleep halfway through its data, and some kills wait for a temporary
file to appear, so many kills land on a half-written file whatever the machine's
load). After each kill:
  - the checkpoint, if there is one, is a complete safetensors file (its header
    and data account for every byte) naming a step the run checkpoints at;
  - the log holds every step up to the checkpoint's, each a complete record;
  - nothing else is in the folder but the temporary files of killed writers.
Each restart resumes from the newest checkpoint. When the kills are done, a last
run finishes, and its log must equal the uninterrupted run's bit for bit (step,
loss, lr, gradient norm, validation loss), no temporary file may be left, and
the final checkpoint cut short at 20 lengths must be refused by the loader.

    test_kill9.py ANATOMY_EXE [--kills=50] [--seed=S]
"""
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "kill9_train.lua")
STEPS, EVERY = 120, 4
PAUSE_MS = 40
TMP = re.compile(r"^(run\.ckpt|metrics\.jsonl)\.tmp\.(\d+)$")


def arg(name, default):
    for a in sys.argv[2:]:
        if a.startswith("--" + name + "="):
            return a.split("=", 1)[1]
    return default


def start(exe, folder, pause):
    env = dict(os.environ)
    env.pop("ANATOMY_TEST_WRITE_PAUSE", None)
    if pause:
        env["ANATOMY_TEST_WRITE_PAUSE"] = str(PAUSE_MS)
    return subprocess.Popen([exe, "--threads=1", SCRIPT, "--dir=" + folder, "--steps=%d" % STEPS,
                             "--every=%d" % EVERY], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def finish(proc, what):
    out, err = proc.communicate(timeout=300)
    if proc.returncode != 0 or b"done:" not in out:
        sys.exit("FAIL: %s exited %d\n%s%s" % (what, proc.returncode, out.decode(errors="replace"),
                                               err.decode(errors="replace")))


def log_records(path):
    """The log's records, keyed fields as written (strings, so the comparison is exact)."""
    recs = []
    with open(path, "rb") as f:
        text = f.read().decode()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line, parse_float=str, parse_int=str)
        except ValueError:
            if i == len(lines) - 1:
                continue  # a last line cut short; the reader skips it with a warning
            sys.exit("FAIL: %s line %d is not JSON: %r" % (path, i + 1, line))
        recs.append({k: v for k, v in rec.items() if k not in ("time", "tokens_per_second")})
    return recs


def wait_for_write(proc, folder, limit):
    """Sleeps until the process has a temporary file open in the folder, it exits, or limit seconds pass."""
    suffix = ".tmp.%d" % proc.pid
    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < limit:
        if any(name.endswith(suffix) for name in os.listdir(folder)):
            return
        time.sleep(0.002)


def checkpoint_step(path):
    """The step a checkpoint names, after checking that the file is complete."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        data = f.read()
    if size < 8:
        sys.exit("FAIL: the checkpoint is %d bytes" % size)
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > size:
        sys.exit("FAIL: the checkpoint's header runs past its end (a partial file at the final name)")
    header = json.loads(data[8:8 + n])
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    if 8 + n + end != size:
        sys.exit("FAIL: the checkpoint holds %d bytes, its header accounts for %d" % (size, 8 + n + end))
    meta = header["__metadata__"]
    if meta.get("format") != "anatomy-checkpoint":
        sys.exit("FAIL: the checkpoint's metadata: %r" % meta)
    step = int(meta["step"])
    if step % EVERY != 0 and step != STEPS:
        sys.exit("FAIL: the checkpoint names step %d, not one the run checkpoints at" % step)
    return step


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    exe = sys.argv[1]
    kills = int(arg("kills", "50"))
    seed = int(arg("seed", str(random.SystemRandom().randrange(1 << 30))))
    rng = random.Random(seed)
    print("kill -9 test: %d kills, seed %d (--seed=%d reproduces the kill moments)" % (kills, seed, seed))
    root = tempfile.mkdtemp(prefix="anatomy-kill9-")
    try:
        # the uninterrupted run, and how long starting and a step take
        ref = os.path.join(root, "ref")
        os.mkdir(ref)
        # startup: until the run opens its log (the model is built, the checkpoint read)
        t0 = time.monotonic()
        proc = start(exe, ref, pause=False)
        while not os.path.exists(os.path.join(ref, "metrics.jsonl")) and proc.poll() is None:
            time.sleep(0.002)
        startup = time.monotonic() - t0
        finish(proc, "the uninterrupted run")
        train_time = max(time.monotonic() - t0 - startup, 0.05) + PAUSE_MS / 1000 * (STEPS // EVERY + 1)
        reference = log_records(os.path.join(ref, "metrics.jsonl"))
        if [int(r["step"]) for r in reference] != list(range(1, STEPS + 1)):
            sys.exit("FAIL: the uninterrupted run's log does not hold steps 1..%d" % STEPS)

        folder = os.path.join(root, "killed")
        os.mkdir(folder)
        ckpt, log = os.path.join(folder, "run.ckpt"), os.path.join(folder, "metrics.jsonl")
        mid_write = during_start = finished = 0
        steps_seen = set()
        for k in range(kills):
            done = checkpoint_step(ckpt) if os.path.exists(ckpt) else 0
            remaining = STEPS - done
            # spread the kills over what is left of the run: some while the
            # process starts (and loads its checkpoint), most while it trains
            # and writes
            budget = 1.5 * train_time * remaining / STEPS / max(1, kills - k)
            r = rng.random()
            if r < 0.2:
                moment = rng.uniform(0.3 * startup, startup)
            else:
                moment = startup + rng.uniform(0, budget)
            proc = start(exe, folder, pause=True)
            if r >= 0.7:
                # a kill aimed at a write: wait until the run opens a
                # temporary file (the writer then sleeps PAUSE_MS halfway
                # through it), so that machine load cannot move every kill
                # off the writes
                wait_for_write(proc, folder, startup + budget * 4)
            else:
                time.sleep(moment)
            proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate(timeout=60)
            if proc.returncode != -signal.SIGKILL:
                if proc.returncode != 0:
                    sys.exit("FAIL: kill %d: the run failed on its own (exit %d):\n%s" % (k + 1, proc.returncode,
                                                                                     err.decode(errors="replace")))
                finished += 1
            if b"rror" in err:
                sys.exit("FAIL: kill %d: the resumed run reported:\n%s" % (k + 1, err.decode(errors="replace")))
            names = os.listdir(folder)
            for name in names:
                m = TMP.match(name)
                if name in ("run.ckpt", "metrics.jsonl"):
                    continue
                if not m:
                    sys.exit("FAIL: kill %d left %r in the folder" % (k + 1, name))
                if int(m.group(2)) == proc.pid:
                    mid_write += 1
            step = checkpoint_step(ckpt) if os.path.exists(ckpt) else 0
            if step < done:
                sys.exit("FAIL: kill %d: the checkpoint went back from step %d to %d" % (k + 1, done, step))
            if step > 0:
                logged = [int(r["step"]) for r in log_records(log)]
                if logged[:step] != list(range(1, step + 1)):
                    sys.exit("FAIL: kill %d: the checkpoint is at step %d but the log holds steps %s"
                             % (k + 1, step, logged[:step + 2]))
            if r < 0.2:
                during_start += 1
            steps_seen.add(step)
        finish(start(exe, folder, pause=False), "the last, unkilled run")
        left = [n for n in os.listdir(folder) if n not in ("run.ckpt", "metrics.jsonl")]
        if left:
            sys.exit("FAIL: after the last run the folder still holds %s" % left)
        got = log_records(log)
        if got != reference:
            for i, (a, b) in enumerate(zip(got, reference)):
                if a != b:
                    sys.exit("FAIL: the killed-and-resumed log differs from the uninterrupted one at record %d:\n"
                             "  resumed:       %s\n  uninterrupted: %s" % (i + 1, a, b))
            sys.exit("FAIL: the resumed log has %d records, the uninterrupted %d" % (len(got), len(reference)))
        if mid_write < 5:
            sys.exit("FAIL: only %d of %d kills landed while a file was being written" % (mid_write, kills))

        # a partial checkpoint is never taken for a valid one
        cut = os.path.join(root, "cut.ckpt")
        size = os.path.getsize(ckpt)
        lengths = sorted(set([0, 7, 8, 9, size - 1] + [rng.randrange(1, size) for _ in range(15)]))
        lua = ("local m = models.gpt{vocab = %d, dim = 32, heads = 2, layers = 2, seq = 32, ffn = 64}\n"
               "for _, n in ipairs{%s} do\n"
               "  local f = io.open('%s', 'rb'); local s = f:read(n); f:close()\n"
               "  local g = io.open('%s', 'wb'); g:write(s or ''); g:close()\n"
               "  local ok, err = pcall(train.load_checkpoint, '%s', m)\n"
               "  if ok then print('LOADED ' .. n) else print('refused ' .. n .. ': ' .. tostring(err)) end\n"
               "end\n") % (vocab_size(ckpt), ", ".join(map(str, lengths)), ckpt, cut, cut)
        out = subprocess.run([exe, "-e", lua], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        text = out.stdout.decode(errors="replace")
        refused = text.count("refused ")
        if out.returncode != 0 or "LOADED" in text or refused != len(lengths):
            sys.exit("FAIL: a checkpoint cut short was loaded, or the loader failed otherwise:\n" + text)
        first = [line for line in text.splitlines() if line.startswith("refused %d:" % lengths[-1])][0]
        print("ok    %d kills (%d while starting, %d mid-write, %d after the run had finished), checkpoints at steps %s"
              % (kills, during_start, mid_write, finished, sorted(steps_seen)))
        print("ok    the killed and resumed run's log equals the uninterrupted run's: %d steps, bit for bit" % STEPS)
        print("ok    no temporary file left; %d cut-short checkpoints refused, e.g. %s" % (refused, first))
        print("3 passed, 0 failed")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def vocab_size(ckpt):
    with open(ckpt, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    for name, v in header.items():
        if name.endswith("embed.weight") or name.endswith("tok_emb.weight") or name.endswith("wte.weight"):
            return v["shape"][0]
    sys.exit("FAIL: no embedding in the checkpoint: %s" % sorted(header))


if __name__ == "__main__":
    main()
