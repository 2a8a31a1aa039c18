"""anatomy's Hub client against a Hub on loopback (fake_hub.py), without the
internet: tiny GPT-2 checkpoints written by `transformers` at three
revisions (fixtures.py), fetched by name through models.from_pretrained,
data.tokenizer and hub.hf_hub_download into huggingface_hub's cache layout.

Checks: the download and the cache layout (blobs named by ETag, snapshot
links, refs, nothing the loader does not read); revisions by branch, tag and
commit (each revision's logits equal transformers' own model of it within
1e-5); shards; offline mode (no request at all; what is missing named); a
body cut short (continued with a Range request) and a killed download
(the .incomplete part continued by the next run, no file under its final
name before); two processes at once (one download); a corrupt body (refused,
removed); a pickle-only repository refused; 401 without a token, 403, and the
token sent to the endpoint only (never to the CDN a redirect names); 404s;
huggingface_hub and transformers sharing the cache both ways; and the series
autopsy (hub_series.lua) against separate autopsy.run calls.
Needs the PyPI build's venv (transformers, huggingface_hub); exits 77 without.
Usage: test_hub.py ANATOMY_EXECUTABLE
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

try:
    import torch
    import huggingface_hub
    import transformers
    from fake_hub import NO_ACCESS_TOKEN, TOKEN, FakeHub
    import fixtures
except ImportError as e:
    print(f"skip: {e}; the PyPI build's venv has transformers and huggingface_hub (scripts/test)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
EXE = sys.argv[1]
passed, failures = 0, []


def check(name, ok, detail=""):
    global passed
    if ok:
        passed += 1
        print(f"ok    {name}")
    else:
        failures.append(name)
        print(f"FAIL  {name}: {detail}")


def env_for(cache, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update({"HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": cache, "HF_HOME": os.path.join(TMP, "hf_home")})
    env.update(extra)
    return env


def anatomy(cache, *args, env=None, wait=True, script="hub_client.lua"):
    cmd = [EXE, "--threads=1", os.path.join(HERE, script), *args]
    if not wait:
        return subprocess.Popen(cmd, env=env or env_for(cache), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p = subprocess.run(cmd, env=env or env_for(cache), capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def load(cache, name, rev="-", **env):
    out = os.path.join(TMP, "out.json")
    if os.path.exists(out):
        os.remove(out)
    rc, _, err = anatomy(cache, "load", name, rev, out, env=env_for(cache, **env) if env else None)
    return (json.load(open(out)) if rc == 0 else None), err


def reference_logits(model, got):
    ids = torch.tensor([got["ids"]]) - 1  # anatomy's ids count from 1
    with torch.no_grad():
        return model(ids).logits[0]


def max_diff(got, model):
    return (torch.tensor(got["logits"]) - reference_logits(model, got)).abs().max().item()


def repo_dir(cache, name):
    return os.path.join(cache, "models--" + name.replace("/", "--"))


def fresh_cache(name):
    path = os.path.join(TMP, name)
    shutil.rmtree(path, ignore_errors=True)
    return path


def test_download_and_layout():
    cache = fresh_cache("cache_layout")
    before = len(hub.log)
    got, err = load(cache, "org/tiny")
    check("from_pretrained('org/tiny') loads", got is not None, err)
    if got is None:
        return
    d = max_diff(got, FX["steps"]["step2"][1])
    print(f"      main: largest |logit difference| against transformers: {d:.3g}")
    check("main's logits equal transformers' (1e-5)", d <= 1e-5, d)
    root = repo_dir(cache, "org/tiny")
    commit = FX["commits"]["step2"]
    check("refs/main holds the commit", open(os.path.join(root, "refs", "main")).read() == commit)
    snap = os.path.join(root, "snapshots", commit)
    names = sorted(os.listdir(snap))
    expected = sorted(f for f in hub.repos["org/tiny"].commits[commit] if f in (
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"))
    check("only the files the loader reads are fetched", names == expected, f"{names} vs {expected}")
    links_ok = all(os.path.islink(os.path.join(snap, f)) and os.readlink(os.path.join(snap, f)).startswith("../../blobs/")
                   for f in names)
    check("snapshot files are relative links into blobs/", links_ok, [os.readlink(os.path.join(snap, f)) for f in names])
    import hashlib
    st = open(os.path.join(snap, "model.safetensors"), "rb").read()
    blob = os.path.basename(os.readlink(os.path.join(snap, "model.safetensors")))
    check("an LFS blob is named by its SHA-256", blob == hashlib.sha256(st).hexdigest(), blob)
    cfg = os.path.basename(os.readlink(os.path.join(snap, "config.json")))
    check("a git file's blob is named by its git blob id", cfg == fixtures_git_id(open(os.path.join(snap, "config.json"), "rb").read()))
    leftovers = [f for f in os.listdir(os.path.join(root, "blobs")) if f.endswith(".incomplete")]
    check("no .incomplete file is left", not leftovers, leftovers)
    asked = [r["path"] for r in hub.log[before:]]
    check("README.md, flax and pickle weights are never asked for",
          not any(p.endswith(("README.md", "flax_model.msgpack", "pytorch_model.bin")) for p in asked), asked)
    # a second load asks the Hub for the listing only, and fetches nothing
    before = len(hub.log)
    got2, err = load(cache, "org/tiny")
    asked = [r["path"] for r in hub.log[before:]]
    check("a cached checkpoint is not fetched again", got2 is not None and asked == ["/api/models/org/tiny/revision/main"], asked)


def fixtures_git_id(data):
    from fake_hub import git_blob_id
    return git_blob_id(data)


def test_revisions():
    cache = fresh_cache("cache_revisions")
    for rev, step in (("step0", "step0"), ("v1.0", "step1"), (FX["commits"]["step0"], "step0"), ("step1", "step1")):
        got, err = load(cache, "org/tiny", rev)
        if got is None:
            check(f"revision {rev}", False, err)
            continue
        d = max_diff(got, FX["steps"][step][1])
        check(f"revision {rev[:12]} gives {step}'s logits (1e-5; {d:.2g})", d <= 1e-5, d)
        check(f"revision {rev[:12]} is in snapshots/<{step}'s commit>", FX["commits"][step] in got["folder"], got["folder"])
    root = repo_dir(cache, "org/tiny")
    check("refs/v1.0 (a tag) names step1's commit", open(os.path.join(root, "refs", "v1.0")).read() == FX["commits"]["step1"])
    check("no ref is written for a commit", not os.path.exists(os.path.join(root, "refs", FX["commits"]["step0"])))
    rc, _, err = anatomy(cache, "load", "org/tiny", "step9", os.path.join(TMP, "x.json"))
    check("an unknown revision is a 404 naming it", rc != 0 and "has no revision 'step9' (404)" in err, err)
    hub.omit_error_codes = True
    try:
        rc, _, err = anatomy(cache, "load", "org/tiny", "step9", os.path.join(TMP, "x.json"))
    finally:
        hub.omit_error_codes = False
    check("a 404 without X-Error-Code at an unknown revision never claims the repository is missing",
          rc != 0 and "no repository" not in err and ("has no revision 'step9'" in err or "without saying whether" in err), err)
    got, err = load(cache, "org/sharded")
    check("a sharded checkpoint loads (index and every shard)", got is not None and max_diff(got, FX["steps"]["step2"][1]) <= 1e-5, err)
    shards = [f for f in hub.repos["org/sharded"].commits[next(iter(hub.repos["org/sharded"].commits))] if f.endswith(".safetensors")]
    check(f"the {len(shards)} shards are in the snapshot", got is not None and all(
        os.path.exists(os.path.join(got["folder"], f)) for f in shards), shards)


def test_tokenizer_and_download():
    cache = fresh_cache("cache_tok")
    out = os.path.join(TMP, "tok.json")
    rc, _, err = anatomy(cache, "tokenize", "org/tiny", "step1", "hello world", out)
    want = fixtures.tokenizer().encode("hello world").ids
    got = json.load(open(out))["ids"] if rc == 0 else None
    check("data.tokenizer('org/tiny', {revision = 'step1'}) encodes as tokenizers does",
          got is not None and [i - 1 for i in got] == want, err or f"{got} vs {want}")
    snap = os.path.join(repo_dir(cache, "org/tiny"), "snapshots", FX["commits"]["step1"])
    check("data.tokenizer fetches no weights", not os.path.exists(os.path.join(snap, "model.safetensors")), os.listdir(snap))
    rc, stdout, err = anatomy(cache, "download", "org/nested", "extra/notes.txt", "-")
    path = stdout.strip().splitlines()[-1] if rc == 0 else ""
    check("hf_hub_download of a file in a subfolder", rc == 0 and open(path).read() == "a file in a subfolder\n", err)
    check("its link climbs out of the subfolder", rc == 0 and os.readlink(path).startswith("../../../blobs/"),
          rc == 0 and os.readlink(path))
    rc, _, err = anatomy(cache, "download", "org/nested", "missing.txt", "-")
    check("a missing file is named", rc != 0 and "has no file missing.txt" in err, err)
    out = os.path.join(TMP, "refs.json")
    rc, _, err = anatomy(cache, "refs", "org/tiny", out)
    refs = json.load(open(out)) if rc == 0 else {}
    names = sorted(b["name"] for b in refs.get("branches", []))
    check("hub.list_repo_refs lists the branches and tags", names == ["main", "step0", "step1", "step2", "step3"] and
          refs["tags"][0]["commit"] == FX["commits"]["step1"], err or refs)


def test_offline():
    cache = fresh_cache("cache_offline")
    load(cache, "org/tiny", "step1")
    before = len(hub.log)
    got, err = load(cache, "org/tiny", "step1", HF_HUB_OFFLINE="1")
    check("HF_HUB_OFFLINE=1 loads a cached revision", got is not None and max_diff(got, FX["steps"]["step1"][1]) <= 1e-5, err)
    check("... without a single request", len(hub.log) == before, hub.log[before:])
    got, err = load(cache, "org/tiny", "step0", HF_HUB_OFFLINE="1")
    check("HF_HUB_OFFLINE=1 names the missing revision and ref file",
          got is None and "HF_HUB_OFFLINE=1, and revision 'step0' of 'org/tiny' is not in the cache" in err and
          "refs/step0" in err, err)
    snap = os.path.join(repo_dir(cache, "org/tiny"), "snapshots", FX["commits"]["step1"])
    os.remove(os.path.join(snap, "model.safetensors"))
    got, err = load(cache, "org/tiny", "step1", HF_HUB_OFFLINE="1")
    check("HF_HUB_OFFLINE=1 names missing weights", got is None and "model.safetensors" in err and "in the cache" in err, err)
    check("... and still asks nothing", len(hub.log) == before, hub.log[before:])


def lfs_digest(repo, step="step2"):
    import hashlib
    commit = FX["commits"][step] if repo == "org/tiny" else next(iter(hub.repos[repo].commits))
    return hashlib.sha256(hub.repos[repo].commits[commit]["model.safetensors"]).hexdigest()


def test_cut_and_resume():
    cache = fresh_cache("cache_cut")
    digest = lfs_digest("org/tiny")
    size = len(hub.repos["org/tiny"].commits[FX["commits"]["step2"]]["model.safetensors"])
    hub.arm("cut", size // 3, digest)
    before = len(hub.log)
    got, err = load(cache, "org/tiny")
    ranges = [r["range"] for r in hub.log[before:] if r["path"].startswith("/lfs/")]
    check("a body cut short is continued with a Range request", got is not None and ranges == [None, f"bytes={size // 3}-"],
          err or ranges)
    check("... and the checkpoint is whole (1e-5)", got is not None and max_diff(got, FX["steps"]["step2"][1]) <= 1e-5)
    # a killed download: the next run continues the .incomplete part
    cache = fresh_cache("cache_kill")
    hub.arm("slow", 0.05, digest)
    p = anatomy(cache, "load", "org/tiny", "-", os.path.join(TMP, "k.json"), wait=False)
    part = os.path.join(repo_dir(cache, "org/tiny"), "blobs", digest + ".incomplete")
    deadline = time.time() + 60
    while time.time() < deadline and (not os.path.exists(part) or os.path.getsize(part) < 3 * 16384):
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    have = os.path.getsize(part) if os.path.exists(part) else 0
    final = os.path.join(repo_dir(cache, "org/tiny"), "blobs", digest)
    link = os.path.join(repo_dir(cache, "org/tiny"), "snapshots", FX["commits"]["step2"], "model.safetensors")
    check("a killed download leaves its part, never the blob or the link", have > 0 and not os.path.exists(final) and
          not os.path.lexists(link), (have, os.path.exists(final), os.path.lexists(link)))
    before = len(hub.log)
    got, err = load(cache, "org/tiny")
    ranges = [r["range"] for r in hub.log[before:] if r["path"].startswith("/lfs/")]
    check(f"the next run continues it from byte {have}", got is not None and ranges == [f"bytes={have}-"], err or ranges)
    check("... and the checkpoint is whole (1e-5)", got is not None and max_diff(got, FX["steps"]["step2"][1]) <= 1e-5)


def test_concurrent_and_corrupt():
    cache = fresh_cache("cache_two")
    digest = lfs_digest("org/tiny")
    hub.arm("slow", 0.02, digest)
    before = len(hub.log)
    procs = [anatomy(cache, "load", "org/tiny", "-", os.path.join(TMP, f"c{i}.json"), wait=False) for i in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    ok = all(p.returncode == 0 for p in procs)
    gets = [r for r in hub.log[before:] if r["path"] == f"/lfs/{digest}"]
    check("two processes fetching one checkpoint both succeed", ok, [o[1] for o in outs])
    check("... and the blob is downloaded once (a lock per blob)", len(gets) == 1, len(gets))
    cache = fresh_cache("cache_corrupt")
    hub.arm("corrupt", 0, digest)
    got, err = load(cache, "org/tiny")
    blobs = os.listdir(os.path.join(repo_dir(cache, "org/tiny"), "blobs"))
    check("a corrupt body is refused, naming both digests", got is None and "SHA-256" in err and digest in err, err)
    check("... and removed: nothing under the blob's name", digest not in blobs and digest + ".incomplete" not in blobs, blobs)
    got, err = load(cache, "org/tiny")
    check("the next try fetches it whole", got is not None, err)


def test_refusals_and_tokens():
    cache = fresh_cache("cache_refuse")
    got, err = load(cache, "org/pickle")
    check("a pickle-only repository is refused, saying why and how to convert",
          got is None and "pytorch_model.bin, a Python pickle" in err and "safetensors only" in err and "save_pretrained" in err, err)
    got, err = load(cache, "org/nonexistent")
    check("an unknown repository without a token: 401, how to log in", got is None and "401" in err and "hf auth login" in err, err)
    got, err = load(cache, "org/gated")
    check("a gated repository without a token: 401, how to log in", got is None and "401" in err and "hf auth login" in err, err)
    got, err = load(cache, "org/gated", HF_TOKEN=NO_ACCESS_TOKEN)
    check("a token without access: 403, which token", got is None and "403" in err and "HF_TOKEN" in err and NO_ACCESS_TOKEN not in err, err)
    got, err = load(cache, "org/gated", HF_TOKEN="hf_wrong")
    check("a refused token is never printed", got is None and "hf_wrong" not in err and "401" in err, err)
    before = len(hub.log)
    got, err = load(cache, "org/gated", HF_TOKEN=TOKEN)
    log = hub.log[before:]
    check("with HF_TOKEN the gated repository loads", got is not None, err)
    to_hub = [r for r in log if not r["path"].startswith(("/lfs/", "/bridge/"))]
    to_cdn = [r for r in log if r["path"].startswith(("/lfs/", "/bridge/"))]
    check("the token goes to every request to the endpoint", to_hub and all(r["token"] for r in to_hub), to_hub)
    check("... and never to the CDN a redirect names", to_cdn and not any(r["token"] for r in to_cdn), to_cdn)
    # the token file `hf auth login` writes (HF_HOME/token)
    home = os.path.join(TMP, "hf_home")
    os.makedirs(home, exist_ok=True)
    with open(os.path.join(home, "token"), "w") as f:
        f.write(TOKEN + "\n")
    got, err = load(fresh_cache("cache_tokfile"), "org/gated")
    os.remove(os.path.join(home, "token"))
    check("the token file under HF_HOME is read", got is not None, err)
    got, err = load(cache, "org/tiny", HF_ENDPOINT="http://127.0.0.1:1")
    check("an unreachable endpoint is named, with the offline hint", got is None and "cannot reach http://127.0.0.1:1/api/models/org/tiny"
          in err and "HF_HUB_OFFLINE=1" in err, err)
    rc, _, err = anatomy(cache, "load", "./no/such/folder", "-", os.path.join(TMP, "x.json"))
    check("a missing local path is not sent to the Hub", rc != 0 and "is not a folder" in err, err)


def test_interop():
    cache = fresh_cache("cache_python")
    env = env_for(cache)
    code = ("import huggingface_hub as h; print(h.snapshot_download('org/tiny', revision='step0'))")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    check("huggingface_hub downloads from the fake Hub", p.returncode == 0, p.stderr[-500:])
    got, err = load(cache, "org/tiny", "step0", HF_HUB_OFFLINE="1")
    check("anatomy opens huggingface_hub's download with HF_HUB_OFFLINE=1",
          got is not None and max_diff(got, FX["steps"]["step0"][1]) <= 1e-5, err)
    cache = fresh_cache("cache_anatomy")
    got, err = load(cache, "org/tiny", "step1")
    code = ("import sys, json, torch, transformers\n"
            "m = transformers.AutoModelForCausalLM.from_pretrained('org/tiny', revision='step1', local_files_only=True)\n"
            "t = transformers.AutoTokenizer.from_pretrained('org/tiny', revision='step1', local_files_only=True)\n"
            "ids = torch.tensor([json.loads(sys.argv[1])]) - 1\n"
            "print(json.dumps({'logits': m(ids).logits[0].tolist(), 'ids': t('the quick brown fox')['input_ids']}))\n")
    p = subprocess.run([sys.executable, "-c", code, json.dumps(got["ids"] if got else [1])], env=env_for(cache, HF_HUB_OFFLINE="1"),
                       capture_output=True, text=True)
    ok = p.returncode == 0 and got is not None
    if ok:
        theirs = json.loads(p.stdout.strip().splitlines()[-1])
        d = (torch.tensor(theirs["logits"]) - torch.tensor(got["logits"])).abs().max().item()
        print(f"      transformers on anatomy's download: largest |logit difference| {d:.3g}")
        ok = d <= 1e-5 and theirs["ids"] == [i - 1 for i in got["ids"]]
    check("transformers opens anatomy's download with local_files_only=True", ok, p.stderr[-800:])


def test_series():
    cache = fresh_cache("cache_series")
    rc, out, err = anatomy(cache, os.path.join(TMP, "series"), script="hub_series.lua")
    print("\n".join("      " + line for line in out.strip().splitlines()[-6:]))
    check("the series over three Hub revisions equals separate autopsy.run calls", rc == 0 and "series: ok" in out, err[-1500:])
    check("a revision serving another's weights is named as one checkpoint measured twice",
          rc == 0 and "step1 and step3 serve the same weights" in err and "duplicates: ok" in out, err[-1500:])


# ---- a hostile Hub, cache or folder (docs/pretrained.md, "What the Hub client trusts") ----

def tree_outside(root, inside):
    """Every path under root that is not under `inside` (what a client must never create)."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        if os.path.abspath(dirpath).startswith(os.path.abspath(inside)):
            continue
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            if not os.path.abspath(p).startswith(os.path.abspath(inside)):
                found.add(p)
    return found


def sandbox(name):
    """(root, cache): a cache four folders deep in its own root, so that a
    name climbing out of it lands inside root, where the test can see it."""
    root = os.path.join(TMP, "sandbox_" + name)
    shutil.rmtree(root, ignore_errors=True)
    cache = os.path.join(root, "a", "b", "c", "cache")
    os.makedirs(cache)
    return root, cache


def test_hostile_paths():
    step2 = hub.repos["org/tiny"].commits[FX["commits"]["step2"]]
    evil = hub.repo("org/evil")
    sha = evil.commit({"config.json": step2["config.json"], "../../../../escape.txt": b"planted\n",
                       "sub/../../../../../escape2.txt": b"planted\n"}, branches=["main"])
    root, cache = sandbox("names")
    # a file the old client returned as the repository's: where the link would have gone
    planted = os.path.normpath(os.path.join(repo_dir(cache, "org/evil"), "snapshots", sha, "../../../../escape.txt"))
    os.makedirs(os.path.dirname(planted), exist_ok=True)
    open(planted, "w").write("not the repository's\n")
    before = tree_outside(root, cache)
    for name in ("../../../../escape.txt", "sub/../../../../../escape2.txt"):
        rc, out, err = anatomy(cache, "download", "org/evil", name, "-")
        check(f"a listed file name {name!r} is refused, never fetched or returned",
              rc != 0 and "refused" in err and "'..' segment" in err and "not the repository's" not in out, err or out)
    rc, out, err = anatomy(cache, "download", "org/evil", "config.json", "-")
    check("the repository's plain files still download beside the refused names", rc == 0, err)
    check("... and nothing was made outside the cache", tree_outside(root, cache) == before,
          tree_outside(root, cache) - before)
    # shard names with ./ segments in the index
    sharded = hub.repos["org/sharded"].commits[next(iter(hub.repos["org/sharded"].commits))]
    index = json.loads(sharded["model.safetensors.index.json"])
    index["weight_map"] = {k: "./" + v for k, v in index["weight_map"].items()}
    files = dict(sharded)
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    files.update({"./" + k: v for k, v in sharded.items() if k.endswith(".safetensors")})
    hub.repo("org/dotshard").commit(files, branches=["main"])
    root, cache = sandbox("shards")
    before = tree_outside(root, cache)
    got, err = load(cache, "org/dotshard")
    check("an index naming a shard './model-…' is refused, naming the shard", got is None and "has a '.' segment" in err
          and "./model-" in err, err)
    check("... and nothing was made outside the cache", tree_outside(root, cache) == before, tree_outside(root, cache) - before)
    # revision ../../…
    root, cache = sandbox("revision")
    before = tree_outside(root, cache)
    rc, _, err = anatomy(cache, "load", "org/tiny", "../../../../../x", os.path.join(TMP, "x.json"))
    check("revision '../../…' is refused before anything is written", rc != 0 and "not a branch, tag or commit name" in err, err)
    check("... and nothing was made outside the cache", tree_outside(root, cache) == before, tree_outside(root, cache) - before)


def test_hostile_etags_and_planted_entries():
    commit = FX["commits"]["step2"]
    for etag in ('".."', '"."', '"abc"'):
        cache = fresh_cache("cache_etag")
        hub.etags["config.json"] = etag
        hub.etags["model.safetensors"] = etag
        try:
            got, err = load(cache, "org/tiny")
        finally:
            hub.etags.clear()
        snap = os.path.join(repo_dir(cache, "org/tiny"), "snapshots", commit)
        links = {f: os.readlink(os.path.join(snap, f)) for f in ("config.json", "model.safetensors")} if got else {}
        check(f"ETag {etag}: the file is checked against the listing's digest and linked to its blob",
              got is not None and max_diff(got, FX["steps"]["step2"][1]) <= 1e-5 and
              links.get("model.safetensors") == "../../blobs/" + lfs_digest("org/tiny"), err or links)
    # a snapshot whose links were made by someone else: repaired online, never followed
    root, cache = sandbox("planted")
    got, err = load(cache, "org/tiny")
    snap = os.path.join(repo_dir(cache, "org/tiny"), "snapshots", commit)
    zeros = os.path.join(root, "zeros.safetensors")
    shutil.copy(os.path.join(FX["steps"]["step2"][0], "model.safetensors"), zeros)
    raw = bytearray(open(zeros, "rb").read())
    n = int.from_bytes(raw[:8], "little")
    raw[8 + n:] = bytes(len(raw) - 8 - n)  # the same header, all-zero tensors
    open(zeros, "wb").write(raw)
    for f, target in (("config.json", "../../blobs"), ("model.safetensors", os.path.relpath(zeros, snap))):
        os.remove(os.path.join(snap, f))
        os.symlink(target, os.path.join(snap, f))
    got, err = load(cache, "org/tiny")
    check("links planted in a snapshot (to a folder, to an all-zero file outside) are replaced by checked downloads",
          got is not None and max_diff(got, FX["steps"]["step2"][1]) <= 1e-5 and
          os.readlink(os.path.join(snap, "model.safetensors")) == "../../blobs/" + lfs_digest("org/tiny"), err)
    for f, target in (("model.safetensors", os.path.relpath(zeros, snap)),):
        os.remove(os.path.join(snap, f))
        os.symlink(target, os.path.join(snap, f))
    got, err = load(cache, "org/tiny", HF_HUB_OFFLINE="1")
    check("offline, a link leading outside blobs/ is refused, naming it", got is None and "does not lead into" in err, err)
    # links planted at the part file and the lock
    root, cache = sandbox("partlock")
    digest = lfs_digest("org/tiny")
    blobs = os.path.join(repo_dir(cache, "org/tiny"), "blobs")
    locks = os.path.join(cache, ".locks", "models--org--tiny")
    os.makedirs(blobs)
    os.makedirs(locks)
    victim = os.path.join(root, "victim.txt")
    open(victim, "w").write("keep\n")
    os.symlink(victim, os.path.join(blobs, digest + ".incomplete"))
    os.symlink(os.path.join(root, "lock_victim"), os.path.join(locks, digest + ".lock"))
    got, err = load(cache, "org/tiny")
    check("a link planted at blobs/<digest>.incomplete is removed, not written through", got is not None and
          open(victim).read() == "keep\n", err or open(victim).read()[:80])
    check("a link planted at the lock is replaced by a lock file, creating nothing outside",
          got is not None and not os.path.lexists(os.path.join(root, "lock_victim")) and
          not os.path.islink(os.path.join(locks, digest + ".lock")), err)


def test_hostile_integrity():
    original = hub.repos["org/tiny"].commits[FX["commits"]["step2"]]["config.json"]
    tampered = original.replace(b'"layer_norm_epsilon": 1e-05', b'"layer_norm_epsilon": 5e-01')
    assert tampered != original and len(tampered) == len(original)
    hub.bodies["config.json"] = tampered  # same size, other bytes
    hub.etags["config.json"] = '"not-a-digest"'
    try:
        got, err = load(fresh_cache("cache_tamper"), "org/tiny")
        check("a tampered config.json with an ETag of no known form is checked against the listing and refused",
              got is None and "git blob id" in err and "removed" in err, err)
        hub.listing_blobs = False
        got, err = load(fresh_cache("cache_tamper2"), "org/tiny")
        check("... and without a digest in the listing either, it is refused as uncheckable",
              got is None and "cannot be checked" in err, err)
    finally:
        hub.bodies.clear()
        hub.etags.clear()
        hub.listing_blobs = True


def timed_load(cache, **env):
    t = time.time()
    got, err = load(cache, "org/tiny", **env)
    return got, err, time.time() - t


def test_hostile_bounds():
    digest = lfs_digest("org/tiny")
    size = len(hub.repos["org/tiny"].commits[FX["commits"]["step2"]]["model.safetensors"])
    cache = fresh_cache("cache_overlong")
    hub.arm("overlong", 20 * 2**20, digest)
    got, err = load(cache, "org/tiny")
    part = os.path.join(repo_dir(cache, "org/tiny"), "blobs", digest + ".incomplete")
    check(f"a body longer than announced stops at the announced {size} bytes", got is None and
          f"more than the {size} bytes announced" in err and not os.path.exists(part), err)
    hub.arm("endless_json", 0, "org/tiny")
    got, err, took = timed_load(fresh_cache("cache_endless"))
    check(f"an endless listing is cut at 32 MiB ({took:.1f} s)", got is None and "larger than 33554432 bytes" in err, err)
    hub.arm("hang", 30, digest)
    got, err, took = timed_load(fresh_cache("cache_hang"), HF_HUB_DOWNLOAD_TIMEOUT="1")
    check(f"headers and then nothing: one stalled try and an error ({took:.1f} s, HF_HUB_DOWNLOAD_TIMEOUT=1)",
          got is None and "bringing no byte" in err and took < 20, err)
    for _ in range(5):
        hub.arm("trickle", 0.3, digest)
    got, err, took = timed_load(fresh_cache("cache_trickle"), HF_HUB_DOWNLOAD_TIMEOUT="1")
    check(f"an endless trickle is cut by the progress rule, 5 tries ({took:.1f} s)",
          got is None and "after 5 tries" in err and "bytes/s" in err and took < 40, err)
    hub.faults.clear()
    for bad in ("inf", "nan", "9223372036854775808", "-5", "12abc"):
        hub.sizes["model.safetensors"] = bad
        try:
            got, err = load(fresh_cache("cache_size"), "org/tiny")
        finally:
            hub.sizes.clear()
        check(f"X-Linked-Size {bad}: the server sent an impossible size", got is None and
              f"impossible size '{bad}'" in err, err)
    hub.arm("protocol_relative", 0, "model.safetensors")
    got, err = load(fresh_cache("cache_protorel"), "org/tiny")
    check("a protocol-relative Location (//host/path) is followed to that host", got is not None and
          max_diff(got, FX["steps"]["step2"][1]) <= 1e-5, err)


def test_fifo_readers():
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        folder = os.path.join(TMP, "fifo_" + name.replace(".", "_"))
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(FX["steps"]["step2"][0], folder)
        os.remove(os.path.join(folder, name))
        os.mkfifo(os.path.join(folder, name))
        try:
            rc, _, err = anatomy(fresh_cache("cache_fifo"), "load", folder, "-", os.path.join(TMP, "x.json"))
            ok = rc != 0 and "FIFO" in err
        except subprocess.TimeoutExpired:
            ok, err = False, "hung"
        check(f"a FIFO at {name} in a checkpoint folder is refused, not opened", ok, err)


hub = FakeHub()
TMP = tempfile.mkdtemp(prefix="anatomy-hub-")
try:
    FX = fixtures.build(hub, TMP)
    for test in (test_download_and_layout, test_revisions, test_tokenizer_and_download, test_offline, test_cut_and_resume,
                 test_concurrent_and_corrupt, test_refusals_and_tokens, test_interop, test_series, test_hostile_paths,
                 test_hostile_etags_and_planted_entries, test_hostile_integrity, test_hostile_bounds, test_fifo_readers):
        if os.environ.get("ANATOMY_HUB_TESTS") and test.__name__ not in os.environ["ANATOMY_HUB_TESTS"].split(","):
            continue
        try:
            test()
        except Exception as e:  # a test that crashes is a failure with its reason, and the rest still run
            import traceback
            traceback.print_exc()
            check(test.__name__, False, repr(e))
finally:
    hub.stop()
    if not os.environ.get("ANATOMY_KEEP_HUB_TMP"): shutil.rmtree(TMP, ignore_errors=True)
print(f"{passed} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
