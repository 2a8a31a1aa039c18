"""Byte-level BPE parity: data.tokenizer encodes and decodes token for token
as Hugging Face `tokenizers` does, for tokenizers trained here on a short text
in the layouts the published checkpoints use: GPT-2's (ByteLevel with its own
split pattern; as tokenizer.json and as vocab.json + merges.txt), with a
prefix space, Llama 3's (a Split pattern, ByteLevel without one,
ignore_merges, a BOS added by a template, special tokens with lstrip/rstrip),
and Qwen2's (the same with the NFC normalizer; decomposed and composed text).
Texts: Unicode, emoji with joiners, whitespace runs, numbers, contractions,
special tokens inside the text, invalid UTF-8 from partial tokens on decode.

Exact: every id and every decoded string must be equal.
Needs `tokenizers` (the PyPI build's venv: scripts/setup --tests --torch=pypi);
exits 77 (skip) without it.
Usage: test_bpe_parity.py ANATOMY_EXECUTABLE
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
except ImportError:
    print(f"skip: the python running this ({sys.executable}) has no `tokenizers`; "
          "the PyPI build's venv has it (scripts/test --torch=pypi)")
    sys.exit(77)

CORPUS = [
    "The quick brown fox jumps over the lazy dog. I'm sure you'll see it's 1234 times better!",
    "Ünïcödé text: naïve café, façade, Straße — «quotes» and “smart quotes”.",
    "日本語のテキストと中文文本，还有한국어 텍스트.",
    "Numbers 3.14159, 2,718 and 1000000; emoji 👋🏽 🎉 👨‍👩‍👧 ok.",
    "    indented code():\n\treturn x  # comment\r\n\n\n",
] * 20

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "I'm can't you'll we've they're it's HE'S SHE'LL",
    "naïve café Straße «quotes» “smart”",
    "日本語のテキスト 中文 한국어",
    "👋🏽 family: 👨‍👩‍👧 party 🎉🎉",
    "a  b\t\tc\n\n\nd   ",
    "   leading spaces and trailing   ",
    "12345 3.14159 1,000,000 007",
    "hello<|endoftext|>world <|endoftext|> again",
    "<|begin_of_text|>start <|eot|>  end",
    "line one\r\nline two\n",
    "",
    " ",
    "x",
    "unseen letters: ǅ ẞ Ω ∑ ∞ ⊕ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "decomposed: cafe\u0301 A\u030a \u1100\u1161 and composed: café Å 가",
]

GPT2_PATTERN = None  # ByteLevel's own
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def gpt2_like(add_prefix_space=False):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def llama3_like():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=["<|begin_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken("<|eot|>", lstrip=True, rstrip=True)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])
    return tok


def qwen2_like():
    """Llama 3's layout with Qwen2's NFC normalizer."""
    from tokenizers import normalizers
    tok = llama3_like()
    tok.normalizer = normalizers.NFC()
    return tok


def check(exe, name, path, tok, tmp):
    expected = [tok.encode(t).ids for t in TEXTS]
    plain = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
    # decode Hugging Face's ids, plus ids that cut a multi-byte character
    to_decode = [list(ids) for ids in expected]
    emoji = tok.encode("👋🏽", add_special_tokens=False).ids
    to_decode.append(emoji[:-1] if len(emoji) > 1 else emoji)
    stem = "".join(c if c.isalnum() else "_" for c in name)
    texts_path, ids_path, out_path = (os.path.join(tmp, f"{stem}.{k}.json") for k in ("texts", "ids", "out"))
    with open(texts_path, "w") as f:
        json.dump(TEXTS + ["(decode only)"], f)
    with open(ids_path, "w") as f:
        json.dump(to_decode, f)
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([exe, "--threads=1", os.path.join(here, "bpe_parity.lua"), path, texts_path, ids_path, out_path],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout, proc.stderr)
        return 0, 1
    got = json.load(open(out_path))
    passed = failed = 0

    def same(what, a, b):
        nonlocal passed, failed
        if a == b:
            passed += 1
        else:
            failed += 1
            print(f"FAIL  {name}: {what}\n  anatomy: {a!r}\n  tokenizers: {b!r}")

    same("vocab size", got["vocab_size"], tok.get_vocab_size(with_added_tokens=True))
    for i, text in enumerate(TEXTS):
        same(f"encode {text!r}", got["encoded"][i], expected[i])
        same(f"encode {text!r} without special tokens", got["plain"][i], plain[i])
    for i, ids in enumerate(to_decode):
        same(f"decode {ids}", got["decoded"][i], tok.decode(ids, skip_special_tokens=False))
        same(f"decode {ids} skipping special tokens", got["decoded_skip"][i], tok.decode(ids, skip_special_tokens=True))
    print(f"{'ok  ' if failed == 0 else 'FAIL'}  {name}: {passed} checks")
    return passed, failed


def main():
    exe = sys.argv[1]
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        gpt2 = gpt2_like()
        gpt2.save(os.path.join(tmp, "gpt2.json"))
        cases.append(("gpt2 tokenizer.json", os.path.join(tmp, "gpt2.json"), gpt2))
        # the same vocabulary and merges as GPT-2's two files, in a folder
        folder = os.path.join(tmp, "gpt2-files")
        os.mkdir(folder)
        gpt2.model.save(folder)
        cases.append(("gpt2 vocab.json + merges.txt", folder, gpt2))
        prefixed = gpt2_like(add_prefix_space=True)
        prefixed.save(os.path.join(tmp, "prefixed.json"))
        cases.append(("add_prefix_space", os.path.join(tmp, "prefixed.json"), prefixed))
        llama = llama3_like()
        llama.save(os.path.join(tmp, "llama3.json"))
        cases.append(("llama3 (Split + ByteLevel, ignore_merges, BOS template, lstrip/rstrip)", os.path.join(tmp, "llama3.json"), llama))
        qwen = qwen2_like()
        qwen.save(os.path.join(tmp, "qwen2.json"))
        cases.append(("qwen2 (NFC normalizer)", os.path.join(tmp, "qwen2.json"), qwen))
        for name, path, tok in cases:
            p, f = check(exe, name, path, tok, tmp)
            passed += p
            failed += f
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
