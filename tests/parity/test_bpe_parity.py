"""Byte-level BPE parity: data.tokenizer encodes and decodes token for token
as Hugging Face `tokenizers` does, for tokenizers trained here on a short text
in the layouts the published checkpoints use: GPT-2's (ByteLevel with its own
split pattern; as tokenizer.json and as vocab.json + merges.txt), with a
prefix space, Llama 3's (a Split pattern, ByteLevel without one,
ignore_merges, a BOS added by a template, special tokens with lstrip/rstrip),
and Qwen2's (the same with the NFC normalizer; decomposed and composed text);
and the SentencePiece-style BPE of Llama 2, Mistral and TinyLlama: byte
fallback to <0xNN> tokens (here only some bytes have one, so unknown runs
fuse into one <unk>), spaces as U+2581 through the Prepend + Replace
normalizers (the hub's tokenizer.json) or a Metaspace pre-tokenizer
(transformers 5's LlamaTokenizer, prepend_scheme first; and always with
split), decoded through Replace, ByteFallback, Fuse, Strip or Metaspace;
and a SentencePiece tokenizer.model alone (BPE, byte fallback, a
user-defined piece), against what `transformers` builds from it
(LlamaTokenizer) under tokenizer_config.json's defaults, legacy,
add_eos_token without add_bos_token, and add_prefix_space false.
Texts: Unicode, emoji with joiners, whitespace runs, numbers, contractions,
special tokens inside the text, invalid UTF-8 from partial tokens on decode.
GPT-2's vocab.json + merges.txt also with the files a slow tokenizer's
save_pretrained writes beside them (added and special tokens, lstrip), in
two layouts, against transformers 5 loading the same folders.

Exact: every id and every decoded string must be equal.
Needs `tokenizers`, and for tokenizer.model `transformers` and `sentencepiece`
(the PyPI builds' venv: scripts/setup --tests); exits 77 (skip)
without `tokenizers`.
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
          "the PyPI build's venv has it (scripts/test)")
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
    "<s>Hello</s> world<s>",
    "  two leading, ▁ a literal U+2581 and ▁▁ two",
    "ÀÉÎõü ßðþ then 日本 then 𝔘𝔫 mixed ÀÉ日",
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


def sentencepiece_like(form):
    """Llama 2's tokenizer as its tokenizer.json has it ("legacy": Prepend +
    Replace normalizers, no pre-tokenizer) or as transformers 5 builds it
    ("metaspace": Metaspace with prepend_scheme first, no split), or a
    Metaspace that prepends always and splits ("split"). Byte tokens exist for
    ASCII and the lead bytes of 3- and 4-byte characters only, so some
    characters fall back to bytes and others (2-byte ones) are unknown."""
    from tokenizers import AddedToken, normalizers
    bytes_ = [f"<0x{b:02X}>" for b in list(range(0x00, 0x80)) + list(range(0xE0, 0xF5)) + list(range(0x80, 0xC0))]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if form == "legacy":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.pre_tokenizer = None
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(content=" ", left=1)])
    else:
        first = form == "metaspace"
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first" if first else "always",
                                                     split=not first)
        if first:
            tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                             decoders.Strip(content=" ", left=1)])
        else:
            tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="\u2581", prepend_scheme="always")])
    # trained on a text without most non-Latin letters, so they reach the fallback
    latin = [t for t in CORPUS if t.isascii() or "café" in t]
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"] + bytes_, show_progress=False,
                                  limit_alphabet=60)
    tok.train_from_iterator(latin, trainer)
    tok.add_special_tokens([AddedToken("<|eot|>", lstrip=True, rstrip=True)])
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    return tok


class FromTransformers:
    """A transformers tokenizer with the `tokenizers` calls check() makes."""

    class Encoding:
        def __init__(self, ids):
            self.ids = ids

    def __init__(self, tok):
        self.tok = tok

    def encode(self, text, add_special_tokens=True):
        return self.Encoding(self.tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids, skip_special_tokens=False):
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def get_vocab_size(self, with_added_tokens=True):
        return len(self.tok)


def sentencepiece_model_cases(tmp):
    """A SentencePiece BPE model trained here, in folders whose
    tokenizer_config.json set LlamaTokenizer's switches; each loaded by
    transformers from the tokenizer.model alone."""
    import sentencepiece
    import transformers
    text = os.path.join(tmp, "spm-train.txt")
    with open(text, "w") as f:
        f.write("\n".join(t for t in CORPUS if "日本" not in t))
    prefix = os.path.join(tmp, "spm")
    sentencepiece.SentencePieceTrainer.train(
        input=text, model_prefix=prefix, vocab_size=500, model_type="bpe", byte_fallback=True, character_coverage=0.99,
        user_defined_symbols=["<|eot|>"], normalization_rule_name="identity", remove_extra_whitespaces=False,
        minloglevel=2)
    cases = []
    for name, config in (("defaults", {}), ("legacy, add_bos_token", {"legacy": True, "add_bos_token": True}),
                         ("add_eos_token, no add_bos_token", {"add_bos_token": False, "add_eos_token": True}),
                         ("add_prefix_space false", {"add_prefix_space": False})):
        folder = os.path.join(tmp, "spm-" + "".join(c if c.isalnum() else "_" for c in name))
        os.mkdir(folder)
        with open(prefix + ".model", "rb") as src, open(os.path.join(folder, "tokenizer.model"), "wb") as dst:
            dst.write(src.read())
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "LlamaTokenizer", **config}, f)
        tok = transformers.AutoTokenizer.from_pretrained(folder)
        cases.append((f"tokenizer.model (LlamaTokenizer, {name})", folder, FromTransformers(tok)))
    return cases


ADDED_TEXTS = [
    "text<|endoftext|>more",
    "a<|pad|>b <|pad|> c  <|user|>d<|user|>",
    "x<extra>y <extra> z",
    "a  <mask>b and <mask> and\t<mask>",
    "<|endoftext|><|pad|><extra><mask><|user|>",
]


def slow_gpt2_cases(tmp, gpt2):
    """GPT-2's vocab.json + merges.txt with the files transformers' slow
    GPT2Tokenizer.save_pretrained writes beside them (transformers 4): special
    and added tokens in tokenizer_config.json's added_tokens_decoder,
    special_tokens_map.json and added_tokens.json; and the older layout with
    only added_tokens.json and special_tokens_map.json. The reference is
    transformers 5 loading each folder (it converts the slow files)."""
    import transformers
    V = gpt2.get_vocab_size()

    def entry(content, special, lstrip=False, rstrip=False):
        return {"content": content, "lstrip": lstrip, "normalized": not special, "rstrip": rstrip,
                "single_word": False, "special": special}

    special_map = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
                   "pad_token": "<|pad|>", "additional_special_tokens": ["<|user|>"]}
    added = {"<|pad|>": V, "<|user|>": V + 1, "<extra>": V + 2, "<mask>": V + 3}
    layouts = {
        "slow GPT2Tokenizer (transformers 4.34+): added_tokens_decoder": {
            "tokenizer_config.json": {
                "add_bos_token": False, "add_prefix_space": False, "errors": "replace", "model_max_length": 1024,
                "tokenizer_class": "GPT2Tokenizer", "clean_up_tokenization_spaces": False, **special_map,
                "added_tokens_decoder": {"0": entry("<|endoftext|>", True), str(V): entry("<|pad|>", True),
                                         str(V + 1): entry("<|user|>", True), str(V + 2): entry("<extra>", False),
                                         str(V + 3): entry("<mask>", False, lstrip=True)}},
            "special_tokens_map.json": special_map, "added_tokens.json": added},
        "slow GPT2Tokenizer (older): added_tokens.json and special_tokens_map.json": {
            "tokenizer_config.json": {"tokenizer_class": "GPT2Tokenizer", "model_max_length": 1024, "errors": "replace",
                                      "clean_up_tokenization_spaces": False},
            "special_tokens_map.json": special_map, "added_tokens.json": added},
    }
    cases = []
    for i, (name, files) in enumerate(layouts.items()):
        folder = os.path.join(tmp, f"gpt2-slow-{i}")
        os.mkdir(folder)
        gpt2.model.save(folder)
        for file, content in files.items():
            with open(os.path.join(folder, file), "w") as f:
                json.dump(content, f)
        tok = transformers.AutoTokenizer.from_pretrained(folder)
        assert len(tok) == V + 4, f"transformers read {len(tok)} tokens from {folder}"
        cases.append((name, folder, FromTransformers(tok), TEXTS + ADDED_TEXTS))
    # special tokens named in tokenizer_config.json alone, which vocab.json lacks: transformers appends them
    # (bos, eos, unk, sep, pad, cls, mask order), as one token each, never split
    folder = os.path.join(tmp, "gpt2-slow-missing-eos")
    os.mkdir(folder)
    gpt2.model.save(folder)
    with open(os.path.join(folder, "vocab.json")) as f:
        vocab = json.load(f)
    vocab["<|other|>"] = vocab.pop("<|endoftext|>")
    with open(os.path.join(folder, "vocab.json"), "w") as f:
        json.dump(vocab, f)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GPT2Tokenizer", "model_max_length": 1024, "bos_token": "<|endoftext|>",
                   "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "pad_token": "<|pad|>"}, f)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert len(tok) == V + 2 and tok.convert_tokens_to_ids("<|endoftext|>") == V, (len(tok), folder)
    cases.append(("slow GPT2Tokenizer: bos/eos/unk and pad named in tokenizer_config.json, missing from vocab.json", folder,
                  FromTransformers(tok), TEXTS + ADDED_TEXTS[:2]))
    return cases


def check(exe, name, path, tok, tmp, texts=TEXTS):
    expected = [tok.encode(t).ids for t in texts]
    plain = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    # decode Hugging Face's ids, plus ids that cut a multi-byte character
    to_decode = [list(ids) for ids in expected]
    emoji = tok.encode("👋🏽", add_special_tokens=False).ids
    to_decode.append(emoji[:-1] if len(emoji) > 1 else emoji)
    stem = "".join(c if c.isalnum() else "_" for c in name)
    texts_path, ids_path, out_path = (os.path.join(tmp, f"{stem}.{k}.json") for k in ("texts", "ids", "out"))
    with open(texts_path, "w") as f:
        json.dump(texts + ["(decode only)"], f)
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
    for i, text in enumerate(texts):
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
        for form, label in (("legacy", "Llama 2 tokenizer.json: Prepend + Replace normalizers, byte fallback"),
                            ("metaspace", "transformers 5 LlamaTokenizer: Metaspace prepend first"),
                            ("split", "Metaspace prepend always, split, Metaspace decoder")):
            sp = sentencepiece_like(form)
            sp.save(os.path.join(tmp, f"sp-{form}.json"))
            cases.append((label, os.path.join(tmp, f"sp-{form}.json"), sp))
        cases += sentencepiece_model_cases(tmp)
        cases += slow_gpt2_cases(tmp, gpt2)
        for name, path, tok, *texts in cases:
            p, f = check(exe, name, path, tok, tmp, *texts)
            passed += p
            failed += f
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
