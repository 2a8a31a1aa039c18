"""The tokenizers of the families of issue #57, as their Hub folders ship them,
against Hugging Face `tokenizers` (Tokenizer.from_file on tokenizer.json) and
`transformers` 5 (AutoTokenizer on the folder: tokenizer.json,
tokenizer_config.json and config.json, whose model_type picks the class):

- Gemma 2 and Gemma 3: SentencePiece-style BPE with byte fallback over all
  256 <0xNN> tokens, fuse_unk, the Replace(' ' -> '\u2581') normalizer and no
  prefix space, pre-tokenizer none (older conversions) or Split(' ',
  MergedWithPrevious) (transformers' GemmaConverter), decoder Replace +
  ByteFallback + Fuse, a "<bos> $A" template; special tokens <pad> <eos>
  <bos> <unk> <start_of_turn> <end_of_turn>, and SentencePiece's user-defined
  pieces as added tokens that are not special: newline runs, a tab, runs of
  '\u2581', HTML tags, <mask>, <unusedN>.
- Qwen2 and Qwen3: byte-level BPE, NFC, Qwen's split pattern (digits one by
  one: \\p{N}, not GPT-4's \\p{N}{1,3}), ByteLevel without its own pattern, no
  BOS; <|endoftext|> <|im_start|> <|im_end|> special, <tool_call> and (Qwen3)
  <think> added but not special.
- OLMo 2: byte-level BPE with cl100k's split pattern (\\p{N}{1,3}), no
  normalizer, <|endoftext|> and <|pad|> special, the PII masks
  (|||IP_ADDRESS|||, ...) added, not special, normalized.
- Phi-3: Llama 2's layout (Prepend + Replace normalizers, byte fallback,
  decoder Replace + ByteFallback + Fuse + Strip), "<s> $A" in tokenizer.json;
  <|endoftext|> and the chat tokens (<|user|>, <|assistant|>, <|end|>, ...)
  special, with rstrip as the Hub has them.
- GPT-J: GPT-2's byte-level BPE, as tokenizer.json and as vocab.json +
  merges.txt, with its 143 <|extratoken_N|> added tokens (added_tokens.json).

Each trained here on a short text (the test machine has no network), saved
as its family's files, read by anatomy from the folder and by name from a Hub
on loopback (tests/hub/fake_hub.py); the texts stress Unicode, emoji with joiners, bytes
outside the vocabulary (byte fallback), digits, whitespace runs, newlines,
special tokens inside the text, leading spaces, and decoding ids that cut a
character.

Exact: every id and every decoded string must equal transformers'; the test
names each place where `tokenizers` alone says otherwise (Gemma: transformers
makes the tokens tokenizer_config.json names, and GemmaTokenizer's default
<mask>, special, so decode skips them; tokenizer.json has them as plain added
tokens). transformers 5.23 keeps tokenizer.json's template where
tokenizer_config.json sets add_bos_token / add_eos_token false (Phi-3-mini's,
OLMo 2's), and so does anatomy: those cases are here too. Each family's
texts are checked to reach what they are meant to stress (byte-fallback
tokens, Qwen's digits one by one against OLMo 2's three by three, the chat
tokens as one token each).
Needs `tokenizers` and `transformers` (the PyPI builds' venv); exits 77
(skip) without them.
Usage: test_family_tokenizers_parity.py ANATOMY_EXECUTABLE
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    import transformers
except ImportError:
    print(f"skip: the python running this ({sys.executable}) has no `tokenizers` or `transformers`; "
          "the PyPI build's venv has them (scripts/test)")
    sys.exit(77)

transformers.logging.set_verbosity_error()

SP = "\u2581"

CORPUS = [
    "The quick brown fox jumps over the lazy dog. I'm sure you'll see it's 1234 times better!",
    "Ünïcödé text: naïve café, façade, Straße — «quotes» and “smart quotes”.",
    "Numbers 3.14159, 2,718 and 1000000; year 2024, pi 314159265.",
    "    indented code():\n\treturn x  # comment\r\n\n\n",
    "def f(a, b):\n    return a + b\n\n\nclass K:\n        pass\n",
    "Hello world! Hello, world. hello WORLD   spaced    out",
] * 20

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "I'm can't you'll we've they're it's HE'S SHE'LL",
    "naïve café Straße «quotes» “smart”",
    "日本語のテキスト 中文 한국어",
    "👋🏽 family: 👨‍👩‍👧 party 🎉🎉",
    "unseen letters: ǅ ẞ Ω ∑ ∞ ⊕ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \u0001\u007f",
    "12345 3.14159 1,000,000 007 2024年 ١٢٣ ⅷ",
    "a  b\t\tc\n\n\nd   ",
    "   leading spaces and trailing   ",
    " one leading space",
    "\n\nnewlines first\nthen\r\nCRLF\n",
    "def f(x):\n    return x  # two spaces\n\n\n\n",
    "decomposed: cafe\u0301 A\u030a \u1100\u1161 and composed: café Å 가",
    "",
    " ",
    "x",
    "  two leading, \u2581 a literal U+2581 and \u2581\u2581 two",
    "\x00nul\x00", " " * 40 + "x", "\t \n \r\n\r\n  \u3000ideographic space", "a\u200bzero\u200dwidth\ufeffbom",
    "emoji 🧑🏿‍🚀 flags 🇫🇷🇯🇵 keycap 1️⃣ and ⚠️", "ǅungla ﬁ ligature ｆｕｌｌｗｉｄｔｈ ¼ ½ ²³",
    "\u2581", "\u2581\u2581\u2581 x \u2581", "<0x41> <unk> </s> <s>", "1234567890123 ٣٤٥ ১২৩", "'S 'T 'Re 'vE",
    "x" * 300, "ab " * 100,
]

CHAT = {
    "gemma": ["<bos><start_of_turn>user\nHello there<end_of_turn>\n<start_of_turn>model\nHi!<end_of_turn>",
              "text<eos>more <pad> and <unk>, <mask> <unused1>x",
              "<table><h1>Title</h1></table>\n\n\t\tcode",
              "<start_of_turn> spaced <end_of_turn>  twice\u2581\u2581raw"],
    "qwen": ["<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi 123<|im_end|>\n<|im_start|>assistant\n",
             "text<|endoftext|>more <|endoftext|> again",
             "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 42}}\n</tool_call>",
             "<think>\nreasoning 2+2=4\n</think>\n\nanswer"],
    "olmo": ["text<|endoftext|>more <|pad|> again",
             "call me at |||PHONE_NUMBER||| or |||EMAIL_ADDRESS|||, from |||IP_ADDRESS|||",
             "<|endoftext|><|pad|>|||IP_ADDRESS|||"],
    "phi3": ["<|user|>\nHello there<|end|>\n<|assistant|>\nHi!<|end|>",
             "<|system|> spaced <|end|>  twice <|endoftext|>",
             "<s>Hello</s> world<s>",
             "<|placeholder1|>x <|placeholder2|>  y"],
    "gptj": ["text<|endoftext|>more",
             "a<|extratoken_1|>b <|extratoken_143|> c",
             "<|extratoken_12|><|extratoken_1|>"],
}


def trained(tok, vocab_size, specials, texts=CORPUS, initial_alphabet=(), limit_alphabet=None):
    kwargs = {"limit_alphabet": limit_alphabet} if limit_alphabet else {}
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=list(initial_alphabet), **kwargs)
    tok.train_from_iterator(texts, trainer)
    return json.loads(tok.to_str())


def entry(content, id_, special, normalized=None, lstrip=False, rstrip=False):
    return {"id": id_, "content": content, "single_word": False, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}


def template(single, pair, tokens):
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": t, "type_id": 0}} if t != "$A" else {"Sequence": {"id": "A", "type_id": 0}}
                       for t in single],
            "pair": [{"SpecialToken": {"id": t, "type_id": 1 if i >= len(single) else 0}}
                     if t not in ("$A", "$B") else {"Sequence": {"id": t[1], "type_id": 0 if t == "$A" else 1}}
                     for i, t in enumerate(pair)],
            "special_tokens": {t: {"id": t, "ids": [i], "tokens": [t]} for t, i in tokens.items()}}


def config_entries(added):
    """tokenizer_config.json's added_tokens_decoder, from tokenizer.json's added_tokens."""
    return {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
            for a in added}


def gemma(version, pre_tokenizer):
    """Gemma 2 / 3's tokenizer.json: the GemmaConverter layout (transformers)."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[@BOS@]", "<unused0>", "<unused1>", "<unused2>",
                "<start_of_turn>", "<end_of_turn>"]
    user = ["\n", "\n\n", "\n\n\n", "\t", "\t\t", SP * 2, SP * 3, SP * 4, "<table>", "<h1>", "</h1>", "</table>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", SP)
    # trained on the Latin texts, so that CJK, emoji and rare letters reach the byte fallback
    latin = [t for t in CORPUS if t.isascii() or "café" in t]
    j = trained(tok, 900, specials + user + byte_tokens, latin, limit_alphabet=70)
    vocab = j["model"]["vocab"]
    j["added_tokens"] = [entry(t, vocab[t], t in ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"),
                               normalized=False) for t in specials + user]
    j["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": SP}
    j["pre_tokenizer"] = ({"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
                          if pre_tokenizer else None)
    j["post_processor"] = template(["<bos>", "$A"], ["<bos>", "$A", "<bos>", "$B"], {"<bos>": vocab["<bos>"]})
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": SP}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]}
    eos = "<end_of_turn>" if version == 3 else "<eos>"
    config = {"add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": config_entries(j["added_tokens"]),
              "bos_token": "<bos>", "clean_up_tokenization_spaces": False, "eos_token": eos, "pad_token": "<pad>",
              "unk_token": "<unk>", "sp_model_kwargs": {}, "spaces_between_special_tokens": False,
              "tokenizer_class": "GemmaTokenizer", "use_default_system_prompt": False, "model_max_length": 8192}
    if version == 3:
        config.update({"boi_token": "<unused0>", "eoi_token": "<unused1>", "image_token": "<unused2>",
                       "extra_special_tokens": {"boi_token": "<unused0>", "eoi_token": "<unused1>",
                                                "image_token": "<unused2>"}})
    return j, config, {"model_type": "gemma3_text" if version == 3 else "gemma2"}


QWEN_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
CL100K_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def byte_level(pattern, normalizer, added, vocab_size=600):
    """A byte-level BPE with a Split pattern before ByteLevel (Qwen, OLMo 2),
    the added tokens given as (content, special, normalized) appended after
    the vocabulary, as those tokenizers number them."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    if normalizer:
        tok.normalizer = normalizers.NFC()
    j = trained(tok, vocab_size, [], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    n = len(j["model"]["vocab"])
    j["added_tokens"] = [entry(c, n + i, s, normalized=norm) for i, (c, s, norm) in enumerate(added)]
    j["model"].update({"dropout": None, "unk_token": None, "continuing_subword_prefix": "", "end_of_word_suffix": "",
                       "fuse_unk": False, "byte_fallback": False, "ignore_merges": False})
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return j


def qwen(version):
    added = [("<|endoftext|>", True, False), ("<|im_start|>", True, False), ("<|im_end|>", True, False),
             ("<|object_ref_start|>", True, False), ("<|object_ref_end|>", True, False),
             ("<tool_call>", False, False), ("</tool_call>", False, False),
             ("<|fim_prefix|>", False, False), ("<|fim_middle|>", False, False)]
    if version == 3:
        added += [("<think>", False, False), ("</think>", False, False)]
    j = byte_level(QWEN_PATTERN, True, added)
    config = {"add_prefix_space": False, "added_tokens_decoder": config_entries(j["added_tokens"]),
              "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>"],
              "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
              "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
              "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
    return j, config, {"model_type": "qwen3" if version == 3 else "qwen2"}


def olmo2(eos_template):
    """OLMo 2's: cl100k's pattern; its tokenizer_config.json sets add_bos_token
    and add_eos_token false. eos_template: a tokenizer.json whose template
    appends <|endoftext|> anyway (transformers 5 then drops it)."""
    added = [("<|endoftext|>", True, False), ("<|pad|>", True, False), ("|||IP_ADDRESS|||", False, True),
             ("|||EMAIL_ADDRESS|||", False, True), ("|||PHONE_NUMBER|||", False, True)]
    j = byte_level(CL100K_PATTERN, False, added)
    if eos_template:
        eot = j["added_tokens"][0]["id"]
        j["post_processor"] = template(["$A", "<|endoftext|>"], ["$A", "<|endoftext|>", "$B", "<|endoftext|>"],
                                       {"<|endoftext|>": eot})
    config = {"add_bos_token": False, "add_eos_token": False, "added_tokens_decoder": config_entries(j["added_tokens"]),
              "bos_token": "<|endoftext|>", "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>",
              "model_max_length": 4096, "pad_token": "<|pad|>", "tokenizer_class": "GPT2Tokenizer",
              "unk_token": "<|endoftext|>"}
    return j, config, {"model_type": "olmo2"}


def phi3(add_bos_token):
    """Phi-3's: Llama 2's tokenizer.json (Prepend + Replace, byte fallback over
    all 256 bytes, Strip in the decoder, "<s> $A"), chat tokens appended from
    32000 on with rstrip. add_bos_token: tokenizer_config.json's (false in
    Phi-3-mini's: transformers then builds its template without <s>)."""
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SP), normalizers.Replace(" ", SP)])
    latin = [t for t in CORPUS if t.isascii() or "café" in t]
    j = trained(tok, 800, ["<unk>", "<s>", "</s>"] + byte_tokens, latin, limit_alphabet=70)
    vocab = j["model"]["vocab"]
    n = len(vocab)
    chat = ["<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>", "<|placeholder3|>",
            "<|placeholder4|>", "<|system|>", "<|end|>", "<|placeholder5|>", "<|placeholder6|>", "<|user|>"]
    j["added_tokens"] = ([entry(t, vocab[t], True, normalized=False) for t in ("<unk>", "<s>", "</s>")] +
                         [entry(t, n + i, True, normalized=False, rstrip=t != "<|endoftext|>") for i, t in enumerate(chat)])
    j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SP},
                                                           {"type": "Replace", "pattern": {"String": " "}, "content": SP}]}
    j["pre_tokenizer"] = None
    j["post_processor"] = template(["<s>", "$A"], ["<s>", "$A", "<s>", "$B"], {"<s>": vocab["<s>"]})
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": SP}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    config = {"add_bos_token": add_bos_token, "add_eos_token": False, "added_tokens_decoder": config_entries(j["added_tokens"]),
              "bos_token": "<s>", "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>", "legacy": False,
              "model_max_length": 4096, "pad_token": "<|endoftext|>", "padding_side": "left", "sp_model_kwargs": {},
              "tokenizer_class": "LlamaTokenizer", "unk_token": "<unk>", "use_default_system_prompt": False}
    return j, config, {"model_type": "phi3"}


def gptj():
    """GPT-J's: GPT-2's byte-level BPE (<|endoftext|> last in the vocabulary)
    and 143 <|extratoken_N|> after it, added, not special."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    j = trained(tok, 500, [], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    vocab = j["model"]["vocab"]
    eot = len(vocab)
    vocab["<|endoftext|>"] = eot
    j["added_tokens"] = [entry("<|endoftext|>", eot, True, normalized=True)] + [
        entry(f"<|extratoken_{i}|>", eot + i, False, normalized=True) for i in range(1, 144)]
    j["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    config = {"add_bos_token": False, "add_prefix_space": False, "bos_token": "<|endoftext|>",
              "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>", "errors": "replace",
              "model_max_length": 2048, "pad_token": None, "tokenizer_class": "GPT2Tokenizer", "unk_token": "<|endoftext|>",
              "added_tokens_decoder": config_entries(j["added_tokens"])}
    return j, config, {"model_type": "gptj"}


def write_folder(folder, tokenizer_json, tokenizer_config, config, vocab_merges=False):
    os.makedirs(folder)
    if vocab_merges:  # GPT-J's older files: vocab.json + merges.txt, the extra tokens in added_tokens.json
        model = tokenizer_json["model"]
        with open(os.path.join(folder, "vocab.json"), "w") as f:
            json.dump(model["vocab"], f, ensure_ascii=False)
        with open(os.path.join(folder, "merges.txt"), "w") as f:
            f.write("#version: 0.2\n" + "".join((m if isinstance(m, str) else " ".join(m)) + "\n" for m in model["merges"]))
        with open(os.path.join(folder, "added_tokens.json"), "w") as f:
            json.dump({a["content"]: a["id"] for a in tokenizer_json["added_tokens"] if a["content"] != "<|endoftext|>"}, f)
        with open(os.path.join(folder, "special_tokens_map.json"), "w") as f:
            json.dump({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}, f)
        tokenizer_config = {k: v for k, v in tokenizer_config.items() if k != "added_tokens_decoder"}
    else:
        with open(os.path.join(folder, "tokenizer.json"), "w") as f:
            json.dump(tokenizer_json, f, ensure_ascii=False)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config, f, ensure_ascii=False)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)


class Reference:
    """encode / decode by `tokenizers` (the tokenizer.json as is) and by
    transformers' AutoTokenizer on the folder."""

    def __init__(self, folder, has_json):
        self.hf = Tokenizer.from_file(os.path.join(folder, "tokenizer.json")) if has_json else None
        self.tf = transformers.AutoTokenizer.from_pretrained(folder)

    def encode(self, text, special):
        tf = self.tf.encode(text, add_special_tokens=special)
        hf = self.hf.encode(text, add_special_tokens=special).ids if self.hf else tf
        return tf, hf

    def decode(self, ids, skip):
        tf = self.tf.decode(ids, skip_special_tokens=skip)
        hf = self.hf.decode(ids, skip_special_tokens=skip) if self.hf else tf
        return tf, hf


def stresses(family, ref):
    """What the family's texts must reach in the reference, or the parity
    would not test it: (what, holds)."""
    tf = ref.tf

    def pieces(text):
        return tf.convert_ids_to_tokens(tf.encode(text, add_special_tokens=False))

    checks = []
    if family in ("gemma", "phi3"):
        fallback = [t for text in TEXTS for t in pieces(text) if t.startswith("<0x")]
        checks.append((f"byte-fallback tokens in the texts ({len(fallback)})", len(fallback) >= 20))
        checks.append(("an unseen letter by its bytes", pieces("ẞ")[-3:] == ["<0xE1>", "<0xBA>", "<0x9E>"]))
    def split(text):
        return [p for p, _ in tf.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)]

    if family == "qwen":
        checks.append(("digits one by one", split("12345") == ["1", "2", "3", "4", "5"]))
    if family == "olmo":
        checks.append(("digits three by three", split("12345") == ["123", "45"]))
    chat = {"gemma": ["<start_of_turn>", "<end_of_turn>", "<bos>", SP * 2, "\n\n"],
            "qwen": ["<|im_start|>", "<|im_end|>", "<tool_call>"], "olmo": ["|||IP_ADDRESS|||", "<|pad|>"],
            "phi3": ["<|user|>", "<|assistant|>", "<|end|>"], "gptj": ["<|extratoken_143|>"]}[family]
    for token in chat:
        checks.append((f"{token!r} is one token", len(tf.encode(token, add_special_tokens=False)) == 1))
    return checks


def check(exe, name, family, folder, ref, texts, tmp, env=None):
    disagree = []
    expected, plain = [], []
    for t in texts:
        tf, hf = ref.encode(t, True)
        if tf != hf:
            disagree.append(f"encode {t!r}")
        expected.append(tf)
        plain.append(ref.encode(t, False)[0])
    to_decode = [list(ids) for ids in expected]
    for cut in ("👋🏽", "日本語", "ẞ"):  # ids that end inside a character
        ids = ref.tf.encode(cut, add_special_tokens=False)
        to_decode.append(ids[:-1] if len(ids) > 1 else ids)
    stem = "".join(c if c.isalnum() else "_" for c in name)
    texts_path, ids_path, out_path = (os.path.join(tmp, f"{stem}.{k}.json") for k in ("texts", "ids", "out"))
    with open(texts_path, "w") as f:
        json.dump(texts + ["(decode only)"] * (len(to_decode) - len(texts)), f)
    with open(ids_path, "w") as f:
        json.dump(to_decode, f)
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([exe, "--threads=1", os.path.join(here, "bpe_parity.lua"), folder, texts_path, ids_path, out_path],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        print(f"FAIL  {name}: anatomy could not read it\n{proc.stdout}{proc.stderr}")
        return 0, 1, 0
    got = json.load(open(out_path))
    passed = failed = tokens = 0

    def same(what, a, b):
        nonlocal passed, failed
        if a == b:
            passed += 1
        else:
            failed += 1
            print(f"FAIL  {name}: {what}\n  anatomy:   {a!r}\n  reference: {b!r}")

    same("vocab size", got["vocab_size"], len(ref.tf))
    for what, holds in stresses(family, ref):
        same(f"the texts reach it: {what}", holds, True)
    for i, text in enumerate(texts):
        same(f"encode {text!r}", got["encoded"][i], expected[i])
        same(f"encode {text!r} without special tokens", got["plain"][i], plain[i])
        tokens += len(expected[i]) + len(plain[i])
    for i, ids in enumerate(to_decode):
        for skip, key in ((False, "decoded"), (True, "decoded_skip")):
            tf, hf = ref.decode(ids, skip)
            if tf != hf:
                disagree.append(f"decode{' skipping special tokens' if skip else ''}: transformers {tf!r}, tokenizers {hf!r}")
            same(f"decode {ids}{' skipping special tokens' if skip else ''}", got[key][i], tf)
    print(f"{'ok  ' if failed == 0 else 'FAIL'}  {name}: {passed} checks, {len(texts)} texts, {tokens} tokens")
    for d in disagree:
        print(f"      (tokenizers alone differs: {d})")
    return passed, failed, tokens


def hub_env(hub, cache):
    """anatomy fetching from the Hub on loopback (tests/hub/fake_hub.py) into `cache`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update({"HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": cache, "HF_HOME": os.path.join(cache, "home")})
    return env


def main():
    exe = os.path.abspath(sys.argv[1])
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hub"))
    from fake_hub import FakeHub
    cases = [
        ("Gemma 2 (no pre-tokenizer)", "gemma", lambda: gemma(2, False), False),
        ("Gemma 2 (Split ' ' MergedWithPrevious)", "gemma", lambda: gemma(2, True), False),
        ("Gemma 3", "gemma", lambda: gemma(3, True), False),
        ("Qwen2", "qwen", lambda: qwen(2), False),
        ("Qwen3", "qwen", lambda: qwen(3), False),
        ("OLMo 2", "olmo", lambda: olmo2(False), False),
        ("OLMo 2, an EOS template that tokenizer_config.json turns off", "olmo", lambda: olmo2(True), False),
        ("Phi-3 (add_bos_token true)", "phi3", lambda: phi3(True), False),
        ("Phi-3 (add_bos_token false, as Phi-3-mini's)", "phi3", lambda: phi3(False), False),
        ("GPT-J tokenizer.json", "gptj", gptj, False),
        ("GPT-J vocab.json + merges.txt + added_tokens.json", "gptj", gptj, True),
    ]
    passed = failed = tokens = 0
    hub = FakeHub()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            env = hub_env(hub, os.path.join(tmp, "hub-cache"))
            for i, (name, family, build, vocab_merges) in enumerate(cases):
                folder = os.path.join(tmp, f"case{i}")
                write_folder(folder, *build(), vocab_merges=vocab_merges)
                ref = Reference(folder, not vocab_merges)
                # from the folder, then by name from the Hub (data.tokenizer fetches the tokenizer files)
                files = {f: open(os.path.join(folder, f), "rb").read() for f in os.listdir(folder)}
                hub.repo(f"family/case{i}").commit(files, branches=["main"])
                for where, path, run_env in ((f"", folder, None), (" by name", f"family/case{i}", env)):
                    p, f, n = check(exe, name + where, family, path, ref, TEXTS + CHAT[family], tmp, run_env)
                    passed, failed, tokens = passed + p, failed + f, tokens + n
    finally:
        hub.stop()
    print(f"{passed} passed, {failed} failed ({tokens} tokens compared)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
