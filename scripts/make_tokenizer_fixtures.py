#!/usr/bin/env python3
"""Make the tokenizer test fixtures under tests/fixtures/tokenizers/ with HF `tokenizers`.

  1. Trains small BPE tokenizers (vocab ~4000) on the license texts in
     /usr/share/common-licenses (not the test corpus):
       gpt2          ByteLevel(use_regex=True) pre-tokenizer, merges written as "a b" strings
       llama3        Sequence[Split(Llama-3 regex, Isolated), ByteLevel(use_regex=False)],
                     ignore_merges, TemplateProcessing "<|begin_of_text|> $A"
       qwen2         NFC + Sequence[Split(Qwen2 regex, Isolated), ByteLevel(use_regex=False)]
       spm           SentencePiece-style BPE: byte_fallback + unk, normalizer
                     Prepend("▁")+Replace(" ","▁"), no pre-tokenizer, decoder
                     Replace/ByteFallback/Fuse/Strip, TemplateProcessing "<s> $A"
       spm_metaspace the spm model behind a Metaspace(prepend_scheme=first) pre-tokenizer and a
                     ByteFallback/Metaspace/Fuse decoder (newer Mistral/Gemma conversions)
     each with added tokens: special ones (one with lstrip, one with rstrip), non-special ones
     (one single_word, one normalized=True written decomposed).
  2. Builds corpus.jsonl (one JSON string per line, >= 2000 entries): fortunes, the Jargon
     File, hand-written lines (accents, CJK, emoji with ZWJ sequences and flags, digit and
     whitespace runs, tabs, CRLF, special tokens inside text) and seeded random mixtures.
  3. Writes per tokenizer <name>/expected.txt: for each corpus entry the ids of
     encode(entry, add_special_tokens=True), space-separated, one line per entry; and
     <name>/decoded.jsonl: HF decode results where they differ from the entry itself:
     {"i": index, "dec": decode(ids without the post-processor prefix, skip_special=False)}
     and/or "skip": decode(all ids, skip_special_tokens=True).
  4. Writes variants.jsonl: pipelines that are cheaper to describe than to commit whole. Each
     entry names a base fixture, replacement values for its top-level keys (normalizer,
     pre_tokenizer, decoder), whether it needs PCRE2, and HF's ids and decoded text for a
     subset of the corpus ("lines": [[index, [ids...], decoded], ...]).

Usage: python3 scripts/make_tokenizer_fixtures.py   (deterministic; needs tokenizers >= 0.20)
"""
import glob
import gzip
import json
import os
import random
import re
import sys

import tokenizers
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizers")
VOCAB_SIZE = 4000

GPT2_RE = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
            r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Added tokens shared by every fixture: (content, special, lstrip, rstrip, normalized, single_word)
ADDED = [
    ("<|endoftext|>", True, False, False, False, False),
    ("<|im_start|>", True, False, False, False, False),
    ("<|im_end|>", True, False, False, False, False),
    ("<mask>", True, True, False, False, False),
    ("[RSTRIP]", True, False, True, False, False),
    ("<tool_call>", False, False, False, False, False),
    ("foo", False, False, False, False, True),
    ("cafe\u0301", False, False, False, True, False),  # normalized: matches "café" under NFC
]

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def license_texts():
    files = sorted(f for f in glob.glob("/usr/share/common-licenses/*")
                   if os.path.isfile(f) and not os.path.islink(f))
    if not files:
        sys.exit("no license texts under /usr/share/common-licenses")
    return files


def train(pre_tok, normalizer, model, special, limit_alphabet=None, initial_alphabet=None):
    tok = Tokenizer(model)
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tok
    kwargs = dict(vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=special,
                  show_progress=False)
    if limit_alphabet is not None:
        kwargs["limit_alphabet"] = limit_alphabet
    if initial_alphabet is not None:
        kwargs["initial_alphabet"] = initial_alphabet
    tok.train(license_texts(), trainers.BpeTrainer(**kwargs))
    return tok


def set_added_flags(data, flags):
    """Rewrites the added_tokens flags of a tokenizer.json dict; appends missing tokens."""
    by_content = {t["content"]: t for t in data["added_tokens"]}
    next_id = max(max(data["model"]["vocab"].values()),
                  max((t["id"] for t in data["added_tokens"]), default=-1)) + 1
    for content, special, lstrip, rstrip, normalized, single_word in flags:
        t = by_content.get(content)
        if t is None:
            t = {"id": data["model"]["vocab"].get(content, next_id), "content": content}
            if t["id"] == next_id:
                next_id += 1
            data["added_tokens"].append(t)
        t.update(special=special, lstrip=lstrip, rstrip=rstrip, normalized=normalized,
                 single_word=single_word)
    data["added_tokens"].sort(key=lambda t: t["id"])


def template(bos):
    return processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                         special_tokens=[(bos, 0)])  # id fixed up below


def fix_template_ids(data):
    pp = data.get("post_processor")
    if not pp or pp.get("type") != "TemplateProcessing":
        return
    ids = {t["content"]: t["id"] for t in data["added_tokens"]}
    for name, entry in pp["special_tokens"].items():
        entry["ids"] = [ids[name]]


def finish(tok, name, edit=None, config=None):
    data = json.loads(tok.to_str())
    set_added_flags(data, ADDED)
    fix_template_ids(data)
    if edit:
        edit(data)
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    ref = Tokenizer.from_str(text)  # the reference is exactly the committed file
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(text)
    if config is not None:
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=1)
    return ref


def merges_as_strings(data):
    data["model"]["merges"] = [f"{a} {b}" for a, b in data["model"]["merges"]]


def make_gpt2():
    tok = train(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), None,
                models.BPE(), ["<|endoftext|>"],
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return finish(tok, "gpt2", merges_as_strings,
                  {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                   "add_bos_token": False})


def byte_level_split(regex):
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def make_llama3():
    tok = train(byte_level_split(LLAMA3_RE), None, models.BPE(),
                ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = template("<|begin_of_text|>")

    def edit(data):
        data["model"]["ignore_merges"] = True

    return finish(tok, "llama3", edit,
                  {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                   "chat_template": CHATML})


def make_qwen2():
    tok = train(byte_level_split(QWEN2_RE), normalizers.NFC(), models.BPE(), ["<|endoftext|>"],
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.decoder = decoders.ByteLevel()
    return finish(tok, "qwen2", None,
                  {"eos_token": "<|im_end|>", "bos_token": None,
                   "chat_template": [{"name": "default", "template": CHATML},
                                     {"name": "tool_use", "template": "unused"}]})


def add_byte_tokens(data):
    """Puts <0x00>..<0xFF> into the model vocab right after the first three ids (Llama-2)."""
    vocab = data["model"]["vocab"]
    old = sorted(vocab.items(), key=lambda kv: kv[1])
    byte_names = [f"<0x{b:02X}>" for b in range(256)]
    head = [t for t, _ in old[:3]]
    rest = [t for t, _ in old[3:] if t not in byte_names]
    order = head + byte_names + rest
    new_vocab = {t: i for i, t in enumerate(order)}
    data["model"]["vocab"] = new_vocab
    for t in data["added_tokens"]:
        if t["content"] in new_vocab:
            t["id"] = new_vocab[t["content"]]
    next_id = len(new_vocab)
    for t in sorted(data["added_tokens"], key=lambda t: t["id"]):
        if t["content"] not in new_vocab:
            t["id"] = next_id
            next_id += 1
    data["added_tokens"].sort(key=lambda t: t["id"])


def make_spm():
    model = models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    norm = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    # Words are split at "▁" during training only (SentencePiece never merges across them).
    train_pre = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    tok = train(train_pre, norm, model, ["<unk>", "<s>", "</s>"], limit_alphabet=120)
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.post_processor = template("<s>")

    def edit(data):
        add_byte_tokens(data)
        fix_template_ids(data)

    spm = finish(tok, "spm", edit, {"bos_token": "<s>", "eos_token": "</s>",
                                     "add_bos_token": True, "add_eos_token": False})

    data = json.loads(spm.to_str())
    data["normalizer"] = None
    data["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                             "split": False}
    data["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"},
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False},
        {"type": "Fuse"}]}
    meta = finish(Tokenizer.from_str(json.dumps(data)), "spm_metaspace")
    return spm, meta


# ---- corpus ------------------------------------------------------------------------------------

HANDWRITTEN = [
    "", " ", "  ", "\n", "\t", "\r\n", "a", "Hello", "Hello world", " Hello world", "Hello world ",
    "Hello  world", "Hello   world   ", "   leading spaces", "trailing spaces   ",
    "tab\tseparated\tvalues", "\tindented with a tab", "a\t\tb", "two\n\nnewlines",
    "line one\r\nline two\r\n", "\n\n\nstarts with newlines", "ends with newline\n",
    " \n \n ", "mixed \t \n whitespace \r\n run", "word\u00a0with\u00a0nbsp", "ideographic\u3000space",
    "line\u2028separator", "vertical\u000btab and form\u000cfeed", "next\u0085line",
    "I'm sure you're right, he's here, we've seen, they'll go, she'd know, it's done.",
    "I'M SURE YOU'RE RIGHT, HE'S HERE, WE'VE SEEN, THEY'LL GO, SHE'D KNOW, DON'T.",
    "rock 'n' roll, 'quoted', ''double'', '''triple''', 'sup, 'Tis, o'clock", "can't won't shan't",
    "1234567", "12345678901234567890", "3.14159 2.71828", "1,000,000 and 1.000.000",
    "$1,234.56 or €99,99 or ¥1000", "phone: +1 (555) 123-4567", "2026-11-22T05:30:00Z",
    "v1.2.3-rc4", "0x7fffffff 0b1010 1e-9", "٣٤٥ Arabic-Indic digits", "१२३ Devanagari digits",
    "①②③ circled, Ⅻ roman, ½ ¾ fractions", "１２３ fullwidth digits", "x²+y³=z⁴",
    "Crème brûlée à la française, naïve façade, coöperate, résumé",
    "Straße, Grüße, Äpfel, Öl, Übermut", "Ελληνικά: Γειά σου Κόσμε", "Русский: Привет, мир!",
    "עברית: שלום עולם", "العربية: مرحبا بالعالم", "हिन्दी: नमस्ते दुनिया", "ภาษาไทย: สวัสดีชาวโลก",
    "中文：你好，世界！这是一个测试。", "日本語：こんにちは世界。カタカナとひらがな。",
    "한국어: 안녕하세요 세계", "Tiếng Việt: Xin chào thế giới", "Türkçe: İstanbul ılık",
    "emoji 👍 thumbs", "family 👨‍👩‍👧‍👦 ZWJ", "rainbow flag 🏳️‍🌈 and pirate 🏴‍☠️",
    "flags 🇫🇷🇯🇵🇺🇸🇩🇪", "skin tones 👋🏽 👋🏿", "keycap 1️⃣ #️⃣", "heart ❤️ vs ❤", "🙂🙃😉😊",
    "mixed中文and English混合", "emoji👍glued", "“smart quotes” and ‘single’ — em-dash… ellipsis",
    "«guillemets» „low quotes“", "!!!???...", "----====____", "((()))[[[]]]{{{}}}",
    "def f(x):\n    return x ** 2  # square\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}", "C:\\Users\\name\\file.txt",
    "https://example.com/path?query=1&other=two#frag", "user@example.com",
    "supercalifragilisticexpialidocious" * 3, "a" * 300, "ab " * 50, "😀" * 20,
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\nHi there.<|im_end|>\n",
    "<|endoftext|>", "<|endoftext|><|endoftext|>", "text<|endoftext|>more text",
    "foo <mask> bar", "foo<mask>bar", "   <mask>   ", "<mask><mask> <mask>",
    "x[RSTRIP]   y", "[RSTRIP]\n\nz", "a [RSTRIP] b [RSTRIP]", "<tool_call>{\"name\": 1}</tool_call>",
    "foo", "foo bar", "food foobar _foo foo_ (foo) foo. foo1 1foo", "foo foo foo",
    "café", "cafe\u0301", "un café noir", "A\u030a vs \u00c5", "e\u0301e\u0300e\u0302",
    "\u1100\u1161\u11a8 jamo", "\u0041\u0323\u0307 dot below and above", "ﬁ ligature",
    "<|im_end", "<|im_end|", "<0x41> literal byte token", "▁ literal metaspace ▁▁",
    "Ġ literal byte-level char", "<s> and </s> and <unk>", "<|begin_of_text|>hi",
]

RANDOM_POOL = [
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "GNU", "License", "free",
    "software", "1", "23", "456", "7890", " ", "  ", "\t", "\n", "\r\n", ".", ",", "!", "?", "'s",
    "'ll", "'", "\"", "(", ")", "-", "--", "é", "ü", "ß", "中", "文", "日本", "한", "😀", "👍🏽",
    "👨‍💻", "🇬🇧", "<|im_end|>", "<mask>", "[RSTRIP]", "foo", "café", "Ωμέγα", "Привет", "\u00a0",
    "\u3000", "٣", "①", "x²", "...", "—", "…", "$", "%", "&", "_", "/", "\\",
]


def fortune_lines(rng, count):
    lines = []
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if "." in os.path.basename(path) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for entry in text.split("\n%\n"):
            entry = entry.strip("\n")
            if not entry or "\ufffd" in entry:
                continue
            parts = entry.split("\n")
            lines.extend(p for p in parts if p.strip())
            if len(parts) > 1 and len(entry) < 400:
                lines.append(entry)  # whole multi-line fortunes too
    lines = sorted(set(lines))
    rng.shuffle(lines)
    return lines[:count]


def jargon_lines(rng, count):
    with gzip.open("/usr/share/doc/jargon-text/jargon.txt.gz", "rt", encoding="utf-8",
                   errors="replace") as f:
        lines = [l.rstrip("\n") for l in f if l.strip() and "\ufffd" not in l]
    lines = sorted(set(lines))
    rng.shuffle(lines)
    return lines[:count]


def random_lines(rng, count):
    out = []
    for _ in range(count):
        n = rng.randint(1, 25)
        out.append("".join(rng.choice(RANDOM_POOL) for _ in range(n)))
    return out


def build_corpus():
    rng = random.Random(20261122)
    corpus = HANDWRITTEN + fortune_lines(rng, 1500) + jargon_lines(rng, 450) + \
        random_lines(rng, 250)
    with open(os.path.join(OUT, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for line in corpus:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    return corpus


def write_expected(name, tok, corpus):
    prefix = len(tok.encode("", add_special_tokens=True).ids)
    d = os.path.join(OUT, name)
    diffs = []
    with open(os.path.join(d, "expected.txt"), "w") as f:
        for i, line in enumerate(corpus):
            ids = tok.encode(line, add_special_tokens=True).ids
            f.write(" ".join(map(str, ids)) + "\n")
            entry = {"i": i}
            dec = tok.decode(ids[prefix:], skip_special_tokens=False)
            if dec != line:
                entry["dec"] = dec
            skip = tok.decode(ids, skip_special_tokens=True)
            if skip != line:
                entry["skip"] = skip
            if len(entry) > 1:
                diffs.append(entry)
    with open(os.path.join(d, "decoded.jsonl"), "w", encoding="utf-8") as f:
        for e in diffs:
            f.write(json.dumps(e, ensure_ascii=False) + "\n")
    return prefix, len(diffs)


VARIANTS = [
    # name, base, pcre2, replacements
    ("bytelevel_prefix_space", "gpt2", False, {
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                          "use_regex": True}}),
    ("digits_then_bytelevel", "gpt2", False, {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": True}]}}),
    ("contiguous_digits_removed_spaces", "gpt2", False, {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": False},
            {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]}}),
    ("literal_merged_with_next_inverted", "llama3", False, {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": "e"}, "behavior": "MergedWithNext",
             "invert": True},
            {"type": "Split", "pattern": {"String": "o"}, "behavior": "MergedWithPrevious",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]}}),
    ("regex_merged_with_previous", "llama3", True, {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "MergedWithPrevious",
             "invert": False},
            {"type": "Split", "pattern": {"Regex": "\\p{N}+|[^\\p{L}\\p{N}\\s]+"},
             "behavior": "Contiguous", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]}}),
    ("metaspace_split_always", "spm", False, {
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                          "split": True},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"},
            {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
             "split": True},
            {"type": "Fuse"}]}}),
    ("replace_only_strip_per_token", "spm", False, {
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}}),
    ("no_decoder", "qwen2", False, {"decoder": None}),
]


def variant_lines(corpus):
    return [i for i in range(len(corpus)) if i < len(HANDWRITTEN) or i % 12 == 0]


def make_variants(corpus):
    out = []
    for name, base, pcre2, repl in VARIANTS:
        with open(os.path.join(OUT, base, "tokenizer.json"), encoding="utf-8") as f:
            data = json.load(f)
        data.update(repl)
        tok = Tokenizer.from_str(json.dumps(data))
        lines = []
        for i in variant_lines(corpus):
            ids = tok.encode(corpus[i], add_special_tokens=True).ids
            lines.append([i, ids, tok.decode(ids, skip_special_tokens=False)])
        out.append({"name": name, "base": base, "pcre2": pcre2, "replace": repl, "lines": lines})
    with open(os.path.join(OUT, "variants.jsonl"), "w", encoding="utf-8") as f:
        for v in out:
            f.write(json.dumps(v, ensure_ascii=False, separators=(",", ":")) + "\n")
    return len(out)


def main():
    os.makedirs(OUT, exist_ok=True)
    toks = {"gpt2": make_gpt2(), "llama3": make_llama3(), "qwen2": make_qwen2()}
    toks["spm"], toks["spm_metaspace"] = make_spm()
    corpus = build_corpus()
    for name, tok in toks.items():
        prefix, ndiff = write_expected(name, tok, corpus)
        print(f"{name}: vocab {tok.get_vocab_size()}, prefix {prefix}, "
              f"{ndiff} decode differences")
    print(f"variants: {make_variants(corpus)}")
    print(f"corpus: {len(corpus)} lines; tokenizers {tokenizers.__version__}")


if __name__ == "__main__":
    main()
