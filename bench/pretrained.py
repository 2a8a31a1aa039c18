"""The pretrained-checkpoint benchmark: random-weight checkpoints at the real
shapes of GPT-2 small (124M) and Pythia-410M, made here with `transformers`
and saved with save_pretrained; then, on the same machine and threads, for
each: the time to read the weights file into memory (one read of the whole
file into a new buffer, as any loader must fill new memory with it; best of
3, the file in the page cache) against anatomy's load time
(models.from_pretrained, best of 3 processes); the read's streaming speed
(16 MiB chunks into one reused buffer, which never fills new memory) beside
it for reference; anatomy's peak memory against the weights' size,
forward tokens/s of anatomy against `transformers` (eval, no grad, B x T
random ids, the two sides alternating), and the time of anatomy's autopsy
(logit lens and layer removal included) on B sequences of T tokens.
Writes the table between the `pretrained` markers of bench/RESULTS.md with
the configuration, the commit and the machine.
Then the family column: for every model_type anatomy registers
(models.pretrained.families, asked of the executable, so that a family added
there joins here), a small random checkpoint that transformers builds from
its config class at one set of small sizes (FAMILY_SIZES, with the few
settings a family needs to be small: FAMILY_EXTRA), and the forward
tokens/s of anatomy against transformers on it, the two sides alternating; a
family transformers cannot build, or anatomy cannot load, is skipped with
the reason printed. Its table goes between the `pretrained-families` markers.
Usage: pretrained.py ANATOMY_EXECUTABLE [--models gpt2,pythia-410m] [--families all|llama,phi,...]
       [--threads N] [--rounds N] [--repeats N]
(--models '' or --families '' leaves that part out.)
Needs the PyPI build's venv (transformers). Takes ~20 minutes on 2 cores, the
families ~1 minute each.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import transformers

import sections

MODELS = {
    "gpt2": ("GPT-2 small (124M)", lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config())),
    "pythia-410m": ("Pythia-410M", lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        vocab_size=50304, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
        rotary_pct=0.25, max_position_embeddings=2048, use_parallel_residual=True, tie_word_embeddings=False))),
}
B, T = 8, 256
HERE = os.path.dirname(os.path.abspath(__file__))

# The family column's checkpoints: small sizes in the names most configs take
# (GPT-2's and GPT-J's map them to n_embd, n_layer, ...), token ids within
# the vocabulary, and per family what it needs to be small (a default head
# size of 256, 64 or 128 experts, a rotary width past the head).
FAMILY_SIZES = dict(vocab_size=16384, hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                    num_key_value_heads=4, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
FAMILY_EXTRA = {
    "gptj": dict(rotary_dim=16),
    "olmoe": dict(num_experts=8, num_experts_per_tok=2),
    "qwen3": dict(head_dim=32),
    "qwen3_moe": dict(head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256),
    "gemma": dict(head_dim=32),
    "gemma2": dict(head_dim=32, query_pre_attn_scalar=32),
    "gemma3_text": dict(head_dim=32, query_pre_attn_scalar=32),
}
FB, FT = 4, 128  # the family column's batch
TEXT_OF = {"gemma3": "gemma3_text"}  # multimodal model types whose language model anatomy loads


def anatomy(exe, threads, folder, mode, tmp, repeats=3, batch=(B, T), fail=True):
    out = os.path.join(tmp, "anatomy.json")
    cmd = ["/usr/bin/time", "-f", "%M", exe, f"--threads={threads}", os.path.join(HERE, "pretrained.lua"), folder, out, mode,
           str(batch[0]), str(batch[1]), str(repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        if not fail:
            return {"error": (proc.stdout + proc.stderr).strip()}
        sys.exit(f"anatomy failed: {proc.stdout}{proc.stderr}")
    result = json.load(open(out))
    result["max_rss_bytes"] = int(proc.stderr.strip().splitlines()[-1]) * 1024
    return result


def idle_rss(exe, threads):
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", exe, f"--threads={threads}", "-e", "local m = models"],
                          capture_output=True, text=True)
    return int(proc.stderr.strip().splitlines()[-1]) * 1024


def read_seconds(path, repeats=3):
    """(whole, streamed): the best of `repeats` reads of the whole file into a
    new buffer, and of reads in 16 MiB chunks into one reused buffer."""
    whole = streamed = float("inf")
    for _ in range(repeats):
        s = time.perf_counter()
        with open(path, "rb") as f:
            data = f.read()
        whole = min(whole, time.perf_counter() - s)
        del data
        s = time.perf_counter()
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass
        streamed = min(streamed, time.perf_counter() - s)
    return whole, streamed


def transformers_forward(folder, threads, repeats=3, batch=(B, T)):
    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    torch.manual_seed(0)
    x = torch.randint(0, model.config.vocab_size, batch)
    with torch.no_grad():
        model(x)
        times = []
        for _ in range(repeats):
            s = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - s)
    del model
    return times



def anatomy_families(exe):
    """The model_types anatomy registers (models.pretrained.families), sorted."""
    proc = subprocess.run([exe, "-e", "for k in pairs(require('anatomy.models.pretrained').families) do print('family ' .. k) end"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"anatomy could not list its families: {proc.stdout}{proc.stderr}")
    return sorted(line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("family "))


def family_checkpoint(model_type, folder):
    """(parameters, None) once transformers has written a small random
    checkpoint of model_type to folder, or (None, why not)."""
    if model_type in TEXT_OF:  # a multimodal checkpoint anatomy reads the language model of: measured as that one
        return None, f"its language model is {TEXT_OF[model_type]}'s, measured in that row (transformers' default vision tower would dominate the build)"
    try:
        config = transformers.AutoConfig.for_model(model_type, **FAMILY_SIZES, **FAMILY_EXTRA.get(model_type, {}))
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        model.save_pretrained(folder)
    except Exception as e:  # an unknown model_type, a config it refuses, no causal-LM class
        said = str(e).splitlines()[0].split(". ")[0][:200]
        return None, f"transformers {transformers.__version__} cannot build it: {type(e).__name__}: {said}"
    return sum(p.numel() for p in model.parameters()), None


def families(a, tmp):
    """The family column: forward tokens/s of anatomy against transformers on
    each registered family's small checkpoint. Returns the rows."""
    wanted = anatomy_families(a.anatomy) if a.families == "all" else a.families.split(",")
    load_before = os.getloadavg()[0]  # other processes on the machine: said beside the numbers
    rows = []
    for model_type in wanted:
        folder = os.path.join(tmp, "family-" + model_type)
        params, why = family_checkpoint(model_type, folder)
        ours, theirs = [], []
        for r in range(a.rounds if params else 0):  # the two sides alternate
            got = anatomy(a.anatomy, a.threads, folder, "forward", tmp, repeats=a.repeats, batch=(FB, FT), fail=False)
            if "error" in got:  # its message, less /usr/bin/time's last line (the peak memory)
                lines = [x for x in got["error"].splitlines() if x.strip() and not x.strip().isdigit()]
                said = next((x for x in lines if "models.from_pretrained" in x), lines[0] if lines else "no output")
                why = "anatomy cannot load it: " + said[:200]
                break
            ours += got["forward_seconds"]
            theirs += transformers_forward(folder, a.threads, repeats=a.repeats, batch=(FB, FT))
        if why:
            print(f"skip {model_type}: {why}", file=sys.stderr)
            rows.append({"family": model_type, "skipped": why})
            continue
        rows.append({"family": model_type, "parameters": params, "forward_anatomy": ours, "forward_transformers": theirs,
                     "tokens_per_second_anatomy": FB * FT / statistics.median(ours),
                     "tokens_per_second_transformers": FB * FT / statistics.median(theirs)})
        r = rows[-1]
        print(f"{model_type}: {r['tokens_per_second_anatomy']:.0f} tok/s, transformers {r['tokens_per_second_transformers']:.0f}, "
              f"ratio {r['tokens_per_second_anatomy'] / r['tokens_per_second_transformers']:.2f}", file=sys.stderr)
    sizes = ", ".join(f"{k} {v}" for k, v in FAMILY_SIZES.items() if not k.endswith("token_id"))
    lines = [
        f"Generated by `bench/pretrained.py` on {datetime.date.today().isoformat()}, commit {sections.commit()}; "
        f"{sections.machine()}, {a.threads} threads; LibTorch {torch.__version__} on both sides, transformers {transformers.__version__}. "
        f"Every model_type anatomy registers (`models.pretrained.families`), as a random checkpoint transformers builds from "
        f"its config class ({sizes}; per family: {', '.join(f'{k} {v}' for k, v in FAMILY_EXTRA.items())}), float32, saved by "
        f"`save_pretrained`; forward: eval, no grad, {FB} x {FT} random ids, median of {a.rounds} alternating rounds of {a.repeats}. "
        f"Load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} cores"
        f"{' (other work shared the CPU: the ratios, taken alternating, are the numbers to read)' if load_before > os.cpu_count() else ''}. "
        f"Goal: ratio (anatomy / transformers tokens/s) >= 1/1.1.",
        "",
        "| family | parameters | forward tok/s anatomy | transformers | ratio |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['family']} | skipped: {r['skipped'].replace('|', '/')} | | | |")
        else:
            lines.append(f"| {r['family']} | {r['parameters'] / 1e6:.1f}M | {r['tokens_per_second_anatomy']:.0f} | "
                         f"{r['tokens_per_second_transformers']:.0f} | "
                         f"{r['tokens_per_second_anatomy'] / r['tokens_per_second_transformers']:.2f} |")
    sections.write("pretrained-families", "Pretrained families: forward against transformers", lines, rows, script="pretrained.py")
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("anatomy")
    p.add_argument("--models", default="gpt2,pythia-410m")
    p.add_argument("--families", default="all")
    p.add_argument("--repeats", type=int, default=10, help="forwards per round in the family column")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    rows = []
    idle = idle_rss(a.anatomy, a.threads)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        if a.families:
            families(a, tmp)
        for key in filter(None, a.models.split(",")):
            label, make = MODELS[key]
            torch.manual_seed(0)
            model = make().eval()
            folder = os.path.join(tmp, key)
            model.save_pretrained(folder)
            params = sum(p.numel() for p in model.parameters())
            del model
            weights = os.path.join(folder, "model.safetensors")
            size = os.path.getsize(weights)
            print(f"{label}: {params / 1e6:.0f}M parameters, {size / 1e9:.2f} GB of weights", file=sys.stderr)
            read, streamed = read_seconds(weights)
            loads = [anatomy(a.anatomy, a.threads, folder, "load", tmp) for _ in range(3)]
            load = {"load_seconds": min(x["load_seconds"] for x in loads),
                    "max_rss_bytes": max(x["max_rss_bytes"] for x in loads)}
            ours, theirs = [], []
            for r in range(a.rounds):  # the two sides alternate
                ours += anatomy(a.anatomy, a.threads, folder, "forward", tmp)["forward_seconds"]
                theirs += transformers_forward(folder, a.threads)
            autopsy = anatomy(a.anatomy, a.threads, folder, "autopsy", tmp)
            tok_ours, tok_theirs = B * T / statistics.median(ours), B * T / statistics.median(theirs)
            rows.append({
                "model": label, "parameters": params, "weights_bytes": size, "read_seconds": read,
                "streamed_read_seconds": streamed,
                "load_seconds": load["load_seconds"], "peak_rss_bytes": load["max_rss_bytes"], "idle_rss_bytes": idle,
                "forward_anatomy": ours, "forward_transformers": theirs,
                "tokens_per_second_anatomy": tok_ours, "tokens_per_second_transformers": tok_theirs,
                "autopsy_seconds": autopsy["autopsy_seconds"],
            })
            print(json.dumps(rows[-1]), file=sys.stderr)
    lines = [
        f"Generated by `bench/pretrained.py` on {datetime.date.today().isoformat()}, commit {sections.commit()}; "
        f"{sections.machine()}, {a.threads} threads; LibTorch {torch.__version__} on both sides, "
        f"transformers {transformers.__version__}. Random weights at the real shapes (float32), saved by `save_pretrained`; "
        f"forward: eval, no grad, {B} x {T} random ids, median of {a.rounds} alternating rounds of 3; autopsy: "
        f"`autopsy.run` with logit lens and layer removal on {B} x {T} tokens. Read: the whole file into new memory, "
        f"best of 3 (streamed: 16 MiB chunks into one reused buffer); load: `models.from_pretrained`, best of 3 processes. Memory: peak RSS of a process that only loads, "
        f"less that of one that starts (`{idle / 2**20:.0f} MiB`). Goals: load <= 1.5x the file read, memory <= 1.3x the weights, "
        f"forward >= 1.0x transformers.",
        "",
        "| model | weights | read the file (streamed) | load (x read) | memory over start (x weights) | forward tok/s anatomy | transformers | ratio | autopsy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    if not rows:
        return
    for r in rows:
        mem = r["peak_rss_bytes"] - r["idle_rss_bytes"]
        lines.append(
            f"| {r['model']} | {r['weights_bytes'] / 1e9:.2f} GB | {r['read_seconds']:.2f} s ({r['streamed_read_seconds']:.2f} s) | "
            f"{r['load_seconds']:.2f} s "
            f"({r['load_seconds'] / r['read_seconds']:.1f}x) | {mem / 1e9:.2f} GB ({mem / r['weights_bytes']:.2f}x) | "
            f"{r['tokens_per_second_anatomy']:.0f} | {r['tokens_per_second_transformers']:.0f} | "
            f"{r['tokens_per_second_anatomy'] / r['tokens_per_second_transformers']:.2f} | {r['autopsy_seconds']:.0f} s |")
    sections.write("pretrained", "Pretrained checkpoints", lines, rows)


if __name__ == "__main__":
    main()
