#!/usr/bin/env python3
"""Reference outputs for the real SmolLM2-135M-Instruct Q4_1 GGUF, computed by Hugging Face
transformers loading the same file (it dequantizes the weights to f32):

  tests/fixtures/smollm2/reference.json
    prompts[i]: text, ids (HF tokenizer, add_special_tokens=False as the GGUF says add_bos false),
                top (per position: the 32 largest logits as [id, value] pairs),
                greedy (64 new token ids from generate(do_sample=False)), greedy_text
    chat: the rendered ChatML prompt for one user message and its ids
  tests/fixtures/smollm2/tokenizer_expected.txt
    one line of space-separated ids per line of tests/fixtures/tokenizers/corpus.jsonl, from
    the HF `tokenizers` library running SmolLM2's published tokenizer.json pipeline
    (Digits(individual_digits) + ByteLevel, the GPT-2 regex) over the vocabulary and merges
    stored in the GGUF. NOTE: transformers' own GGUF->tokenizer conversion drops the Digits
    step and splits whitespace runs differently, so it is not used as the tokenizer reference.

Needs: transformers, torch, gguf, accelerate, and the model (scripts/fetch_model.sh smollm2).
Usage: python3 scripts/make_smollm2_reference.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import json, os, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
import transformers

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
cache = os.environ.get("STRATA_CACHE_DIR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "strata")
path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
d, f = os.path.split(path)
torch.manual_seed(0)
torch.set_num_threads(2)
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
model.eval()

PROMPTS = [
    "The capital of France is",
    "Here is a short story about a robot who learns to paint. Once upon a time, in a small town by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Les élèves ont appris 12345 mots en 2024 — 😀 wow!",
]
out = {"transformers": transformers.__version__, "torch": torch.__version__, "model": f, "prompts": []}
with torch.no_grad():
    for text in PROMPTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        logits = model(torch.tensor([ids])).logits[0]
        top = []
        for row in logits:
            v, i = torch.topk(row, 32)
            top.append([[int(a), float(b)] for a, b in zip(i, v)])
        g = model.generate(torch.tensor([ids]), max_new_tokens=64, min_new_tokens=64, do_sample=False,
                           eos_token_id=None, pad_token_id=tok.eos_token_id)
        new = [int(t) for t in g[0, len(ids):]]
        out["prompts"].append({"text": text, "ids": ids, "top": top, "greedy": new,
                               "greedy_text": tok.decode(new)})
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    chat = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    out["chat"] = {"messages": msgs, "text": chat, "ids": tok(chat, add_special_tokens=False)["input_ids"]}

os.makedirs(os.path.join(root, "tests/fixtures/smollm2"), exist_ok=True)
with open(os.path.join(root, "tests/fixtures/smollm2/reference.json"), "w") as fh:
    json.dump(out, fh, ensure_ascii=False, indent=0)
import gguf
from tokenizers import Tokenizer, AddedToken, models, pre_tokenizers, decoders
reader = gguf.GGUFReader(path)
def field_strings(name):
    f = reader.fields[name]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
tokens = field_strings("tokenizer.ggml.tokens")
merges = [tuple(m.split(" ", 1)) for m in field_strings("tokenizer.ggml.merges")]
types = [int(reader.fields["tokenizer.ggml.token_type"].parts[i][0]) for i in reader.fields["tokenizer.ggml.token_type"].data]
hf = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
hf.decoder = decoders.ByteLevel()
hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
with open(os.path.join(root, "tests/fixtures/tokenizers/corpus.jsonl"), encoding="utf-8") as fh:
    lines = [json.loads(l) for l in fh]
with open(os.path.join(root, "tests/fixtures/smollm2/tokenizer_expected.txt"), "w") as fh:
    for line in lines:
        fh.write(" ".join(str(i) for i in hf.encode(line, add_special_tokens=False).ids) + "\n")
same = sum(hf.encode(l, add_special_tokens=False).ids == tok(l, add_special_tokens=False)["input_ids"] for l in lines)
print(f"tokenizer: {len(lines)} lines; transformers' GGUF conversion agrees on {same}")
for p in out["prompts"]:
    print(repr(p["text"][:40]), "->", repr(p["greedy_text"][:60]))
