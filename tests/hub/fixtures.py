"""Tiny checkpoints written by `transformers`, put on a FakeHub at several
revisions, for test_hub.py.

  org/tiny        a GPT-2 (2 blocks, width 32) at three training steps: branches
                  step0, step1, step2 (main = step2), tag v1.0 = step1; besides
                  the files anatomy reads, a README.md, a flax_model.msgpack and a
                  pytorch_model.bin that it must not fetch
  org/sharded     the step-2 weights in shards (model.safetensors.index.json)
  org/pickle      the step-2 weights as pytorch_model.bin only
  org/gated       the step-2 files, served only with fake_hub.TOKEN
  org/nested      tokenizer files only, one of them in a subfolder
Each revision's model is kept (`models[rev]`) with the folder it was saved to.
"""
import os
import sys

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

TEXT = "the quick brown fox jumps over the lazy dog. " * 20


def tokenizer():
    """GPT-2's byte-level BPE, trained on the parity tests' corpus."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
    from test_bpe_parity import gpt2_like
    return gpt2_like()


def read_folder(folder):
    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            path = os.path.join(root, f)
            out[os.path.relpath(path, folder)] = open(path, "rb").read()
    return out


def build(hub, tmp):
    """Fills `hub`; returns {"steps": {rev: (folder, model)}, "commits": {rev: sha}}."""
    tok = tokenizer()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=4,
                     bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"
    model = GPT2LMHeadModel(cfg)
    ids = torch.tensor([tok.encode(TEXT).ids[:63]])
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    steps, commits = {}, {}
    repo = hub.repo("org/tiny")
    for step in range(3):
        name = f"step{step}"
        folder = os.path.join(tmp, "saved", name)
        model.eval()
        model.save_pretrained(folder)
        fast.save_pretrained(folder)
        files = read_folder(folder)
        files["README.md"] = b"# tiny\n"
        files["flax_model.msgpack"] = b"not fetched" * 100
        files["pytorch_model.bin"] = b"not fetched either" * 100
        commits[name] = repo.commit(files, branches=[name] + (["main"] if step == 2 else []),
                                    tags=["v1.0"] if step == 1 else [])
        steps[name] = (folder, GPT2LMHeadModel.from_pretrained(folder).eval())
        model.train()
        for _ in range(5):  # the next revision: a few steps of training
            loss = model(ids, labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    # a branch that serves step1's files again (as some published series do)
    repo.commit(repo.commits[commits["step1"]], branches=["step3"])
    last = steps["step2"][1]
    sharded = os.path.join(tmp, "saved", "sharded")
    last.save_pretrained(sharded, max_shard_size="20KB")
    fast.save_pretrained(sharded)
    hub.repo("org/sharded").commit(read_folder(sharded), branches=["main"])
    pickled = os.path.join(tmp, "saved", "pickle")
    last.save_pretrained(pickled)
    fast.save_pretrained(pickled)
    os.remove(os.path.join(pickled, "model.safetensors"))
    torch.save(last.state_dict(), os.path.join(pickled, "pytorch_model.bin"))  # what older transformers wrote
    files = read_folder(pickled)
    hub.repo("org/pickle").commit(files, branches=["main"])
    hub.repo("org/gated", gated=True).commit(read_folder(steps["step2"][0]), branches=["main"])
    tok_files = read_folder(steps["step2"][0])
    nested = {k: v for k, v in tok_files.items() if k.startswith("tokenizer")}
    nested["extra/notes.txt"] = b"a file in a subfolder\n"
    hub.repo("org/nested").commit(nested, branches=["main"])
    return {"steps": steps, "commits": commits, "ids": ids}
