#!/usr/bin/env python3
"""Make tiny random-weight Hugging Face checkpoints and reference outputs for strata's tests.

Writes tests/fixtures/models/<name>/ for every model in MODELS: config.json, weights
(model.safetensors, or shards + model.safetensors.index.json), generation_config.json,
tokenizer.json, tokenizer_config.json and reference.safetensors (see tests/fixtures/README.md).

Deterministic: fixed seeds, one CPU thread, eager attention. Rerunning it with the same torch /
transformers / tokenizers versions on the same kind of CPU reproduces byte-identical files.

    python3 scripts/make_fixtures.py            # regenerate everything, then self-check
    python3 scripts/make_fixtures.py --check    # only the self-check against the files on disk
"""

import argparse
import copy
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)

import safetensors  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "models"

# ----------------------------------------------------------------------------------------------
# Tokenizer: byte-level BPE (GPT-2 style) trained on two licence texts.

TOKENIZER_CORPUS = ["/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0"]
# Including the three special tokens (ids 0, 1, 2). ~1031 was the first choice, but with eight
# fixtures the embeddings, lm_heads and logits scale with the vocab and the set came to 7.4 MB;
# 431 keeps tests/fixtures/models under 5 MB without touching any layer dimension.
TARGET_VOCAB = 431
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ENDOFTEXT, IM_START, IM_END = 0, 1, 2
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Text of the greedy prompt; it must encode to exactly GREEDY_PROMPT_LEN tokens.
GREEDY_PROMPT_TEXT = "The license is"
GREEDY_PROMPT_LEN = 5
GREEDY_NEW_TOKENS = 32
SEQ_LENS = (7, 13)


def train_tokenizer() -> Tokenizer:
    text = "".join(Path(f).read_text(encoding="utf-8") for f in TOKENIZER_CORPUS)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TARGET_VOCAB,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([text], trainer=trainer)
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def tokenizer_config(eos_token: str, max_len: int) -> dict:
    return {
        "added_tokens_decoder": {
            str(i): {
                "content": s,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for i, s in enumerate(SPECIAL_TOKENS)
        },
        "bos_token": "<|endoftext|>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": eos_token,
        "model_max_length": max_len,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


# ----------------------------------------------------------------------------------------------
# Models. `seed` drives the weights; models with the same seed and class get identical weights.


def llama_config(vocab):
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=176,
        num_hidden_layers=3,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        tie_word_embeddings=False,
        bos_token_id=ENDOFTEXT,
        eos_token_id=IM_END,
    )


def mistral_config(vocab):
    return MistralConfig(
        vocab_size=vocab,
        hidden_size=72,
        num_attention_heads=6,
        num_key_value_heads=1,
        head_dim=12,
        intermediate_size=200,
        num_hidden_layers=2,
        max_position_embeddings=256,
        sliding_window=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=ENDOFTEXT,
        eos_token_id=IM_END,
    )


def qwen2_config(vocab):
    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=72,
        num_attention_heads=3,
        num_key_value_heads=1,
        intermediate_size=144,
        num_hidden_layers=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling={"type": "linear", "factor": 2.0},
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=ENDOFTEXT,
        eos_token_id=IM_END,
    )


def gpt2_config(vocab):
    return GPT2Config(
        vocab_size=vocab,
        n_embd=64,
        n_head=4,
        n_layer=2,
        n_positions=128,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=True,
        bos_token_id=ENDOFTEXT,
        eos_token_id=ENDOFTEXT,
    )


def neox_config(vocab, parallel, rotary_pct):
    return GPTNeoXConfig(
        vocab_size=vocab,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=176,
        num_hidden_layers=2,
        max_position_embeddings=256,
        rotary_pct=rotary_pct,
        rotary_emb_base=10000,
        use_parallel_residual=parallel,
        hidden_act="gelu",
        layer_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=ENDOFTEXT,
        eos_token_id=ENDOFTEXT,
    )


def gemma3_config(vocab):
    # Sliding window 8 (shorter than the 13-token reference sequence and the 37-token greedy
    # path) on layers 0 and 2, global attention on layer 1 with its own rope base and a linear
    # scaling the local layers must not use; query_pre_attn_scalar != head_dim. Untied LM head: the
    # embedding is small (see randomize), the head keeps the logits at the other fixtures' scale.
    return Gemma3TextConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        query_pre_attn_scalar=24,
        hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=False,
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        bos_token_id=ENDOFTEXT,
        eos_token_id=IM_END,
        pad_token_id=ENDOFTEXT,
    )


# name: (model class, config factory, storage dtype, weight seed, init std, shard size, eos token)
# The seeds were picked once (from 1..40) for the largest smallest top-1/top-2 logit gap along
# the greedy path (for llama also with bf16 weights), so greedy_tokens are not decided by
# rounding noise; the gap is recorded in reference.safetensors' metadata.
MODELS = {
    "llama": (LlamaForCausalLM, llama_config, torch.float32, 9, 0.2, None, "<|im_end|>"),
    "llama_bf16": (LlamaForCausalLM, llama_config, torch.bfloat16, 9, 0.2, None, "<|im_end|>"),
    "llama_sharded": (LlamaForCausalLM, llama_config, torch.float32, 9, 0.2, "450KB", "<|im_end|>"),
    "mistral": (MistralForCausalLM, mistral_config, torch.float16, 38, 0.2, None, "<|im_end|>"),
    "qwen2": (Qwen2ForCausalLM, qwen2_config, torch.float32, 37, 0.2, None, "<|im_end|>"),
    "gpt2": (GPT2LMHeadModel, gpt2_config, torch.float32, 16, 0.2, None, "<|endoftext|>"),
    "neox": (GPTNeoXForCausalLM, lambda v: neox_config(v, True, 0.25), torch.float32, 15, 0.2,
             None, "<|endoftext|>"),
    "neox_seq": (GPTNeoXForCausalLM, lambda v: neox_config(v, False, 0.5), torch.float32, 19,
                 0.2, None, "<|endoftext|>"),
    "gemma3": (Gemma3ForCausalLM, gemma3_config, torch.float32, 4, 0.2, None, "<|im_end|>"),
}


def is_norm(name: str) -> bool:
    return any(k in name for k in ("norm", "ln_", "ln_f"))


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int, std: float) -> None:
    """Overwrite every parameter from a seeded generator (HF's own init is not used).

    Matrices ~ N(0, std); biases ~ N(0, 0.1); norm weights ~ U(0.6, 1.4); norm biases ~ N(0, 0.1).
    Tied weights appear once in named_parameters() so they stay tied.
    """
    g = torch.Generator().manual_seed(seed)
    # Gemma's RMSNorm scales by (1 + w): its weights get U(-0.4, 0.4), the same U(0.6, 1.4) scale.
    # Its embedding is scaled by sqrt(hidden) = 8 on the way in: std 0.2 / 8 keeps the residual
    # stream from being the input token's embedding alone (greedy would repeat one token).
    gemma = isinstance(model, Gemma3ForCausalLM)
    norm_base = -0.4 if gemma else 0.6
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if name.endswith("bias"):
            v = torch.randn(p.shape, generator=g) * 0.1
        elif is_norm(name):
            v = norm_base + 0.8 * torch.rand(p.shape, generator=g)
        elif gemma and "embed_tokens" in name:
            v = torch.randn(p.shape, generator=g) * (std / 8)
        else:
            v = torch.randn(p.shape, generator=g) * std
        p.copy_(v.to(p.dtype))


def build_model(cls, cfg, seed, std):
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = cls(cfg).float().eval()
    randomize(model, seed, std)
    return model


# ----------------------------------------------------------------------------------------------
# config.json post-processing


def read_json(path):
    return json.loads(Path(path).read_text())


def write_json(path, obj):
    Path(path).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def postprocess_config(name: str, d: Path) -> None:
    cfg = read_json(d / "config.json")
    rp = cfg.get("rope_parameters")
    if name.startswith("llama"):
        # Both forms: transformers 5 `rope_parameters` plus the older rope_theta + rope_scaling.
        cfg["rope_theta"] = rp["rope_theta"]
        cfg["rope_scaling"] = {k: v for k, v in rp.items() if k != "rope_theta"}
    elif name == "qwen2":
        # Old style only, as in Qwen2/Qwen2.5 checkpoints in the wild.
        del cfg["rope_parameters"]
        cfg["rope_theta"] = rp["rope_theta"]
        cfg["rope_scaling"] = {"type": "linear", "factor": rp["factor"]}
    elif name == "neox_seq":
        # Old GPT-NeoX/Pythia style: rotary_pct + rotary_emb_base, no rope_parameters.
        del cfg["rope_parameters"]
        cfg["rotary_pct"] = rp["partial_rotary_factor"]
        cfg["rotary_emb_base"] = rp["rope_theta"]
    write_json(d / "config.json", cfg)


# ----------------------------------------------------------------------------------------------
# Reference outputs (always computed from the files on disk)


def load_from_disk(d: Path):
    return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()


@torch.no_grad()
def full_logits(model, ids: np.ndarray) -> torch.Tensor:
    x = torch.from_numpy(ids.astype(np.int64))[None]
    return model(input_ids=x, use_cache=False).logits[0].float()


@torch.no_grad()
def greedy(model, prompt: np.ndarray) -> np.ndarray:
    gc = GenerationConfig(
        do_sample=False,
        max_new_tokens=GREEDY_NEW_TOKENS,
        min_new_tokens=GREEDY_NEW_TOKENS,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=ENDOFTEXT,
    )
    x = torch.from_numpy(prompt.astype(np.int64))[None]
    out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=gc)
    new = out[0, len(prompt):].numpy().astype(np.int32)
    assert new.shape == (GREEDY_NEW_TOKENS,), new.shape
    return new


@torch.no_grad()
def greedy_no_cache(model, prompt: np.ndarray) -> np.ndarray:
    """Plain argmax loop with a full forward per step: checks generate() masked nothing."""
    seq = list(prompt.astype(np.int64))
    for _ in range(GREEDY_NEW_TOKENS):
        seq.append(int(full_logits(model, np.array(seq))[-1].argmax()))
    return np.array(seq[len(prompt):], dtype=np.int32)


def make_inputs(vocab: int, prompt_ids: list[int]) -> dict:
    rng = np.random.default_rng(20240607)
    ids = {f"input_ids_{i}": rng.integers(len(SPECIAL_TOKENS), vocab, size=n).astype(np.int32)
           for i, n in enumerate(SEQ_LENS)}
    ids["greedy_prompt"] = np.array(prompt_ids, dtype=np.int32)
    return ids


def compute_reference(d: Path, inputs: dict) -> dict:
    model = load_from_disk(d)
    ref = {k: torch.from_numpy(v) for k, v in inputs.items()}
    for i in range(len(SEQ_LENS)):
        ref[f"logits_{i}"] = full_logits(model, inputs[f"input_ids_{i}"]).contiguous()
    ref["greedy_tokens"] = torch.from_numpy(greedy(model, inputs["greedy_prompt"]))
    return ref


def greedy_min_gap(d: Path, ref: dict) -> float:
    """Smallest top-1 minus top-2 logit over the 32 greedy steps (teacher-forced full forward)."""
    model = load_from_disk(d)
    p = ref["greedy_prompt"].numpy()
    seq = np.concatenate([p, ref["greedy_tokens"].numpy()])
    top2 = full_logits(model, seq)[len(p) - 1:-1].topk(2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).min().item()


def metadata(name: str, gap: float) -> dict:
    return {
        "greedy_min_top2_gap": f"{gap:.6f}",
        "generator": "scripts/make_fixtures.py",
        "model": name,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "tokenizers_version": tokenizers.__version__,
        "safetensors_version": safetensors.__version__,
        "greedy_prompt_text": GREEDY_PROMPT_TEXT,
        "compute_dtype": "float32",
    }


# ----------------------------------------------------------------------------------------------


ST_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}


def write_safetensors(path: Path, tensors: dict, meta: dict) -> None:
    """Minimal safetensors writer with a deterministic header (safetensors' own save_file emits
    __metadata__ in hash-map order, so reruns would not be byte-identical). Tensors are stored
    in name order; the JSON header is space-padded to a multiple of 8 bytes."""
    header = {"__metadata__": dict(sorted(meta.items()))}
    blobs, offset = [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name].numpy() if torch.is_tensor(tensors[name]) else tensors[name])
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        raw = a.tobytes()
        header[name] = {"dtype": ST_DTYPES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for raw in blobs:
            f.write(raw)


def dir_size(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


def generate_all(only=None) -> None:
    tok = train_tokenizer()
    vocab = tok.get_vocab_size(with_added_tokens=True)
    prompt_ids = tok.encode(GREEDY_PROMPT_TEXT).ids
    assert len(prompt_ids) == GREEDY_PROMPT_LEN, (GREEDY_PROMPT_TEXT, prompt_ids)
    print(f"tokenizer: vocab {vocab}, greedy prompt {GREEDY_PROMPT_TEXT!r} -> {prompt_ids}")
    inputs = make_inputs(vocab, prompt_ids)

    if only is None and OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True, exist_ok=True)
    built = {}  # (class, seed) -> f32 model, so llama/llama_bf16/llama_sharded share weights
    for name, (cls, cfg_fn, dtype, seed, std, shard, eos) in MODELS.items():
        if only is not None and name not in only:
            continue
        d = OUT / name
        if d.exists():
            shutil.rmtree(d)
        key = (cls.__name__, seed)
        if key not in built:
            built[key] = build_model(cls, cfg_fn(vocab), seed, std)
        model = built[key]
        # Cast a copy: the f32 master must stay unrounded for the fixtures that share it.
        kwargs = {"max_shard_size": shard} if shard else {}
        stored = copy.deepcopy(model).to(dtype) if dtype != torch.float32 else model
        stored.save_pretrained(d, **kwargs)
        if shard:
            n = len(list(d.glob("model-*.safetensors")))
            assert 2 <= n <= 3 and (d / "model.safetensors.index.json").exists(), n
        tok.save(str(d / "tokenizer.json"), pretty=True)
        max_len = model.config.max_position_embeddings if hasattr(model.config, "max_position_embeddings") \
            else model.config.n_positions
        write_json(d / "tokenizer_config.json", tokenizer_config(eos, max_len))

        before = compute_reference(d, inputs)
        postprocess_config(name, d)
        ref = compute_reference(d, inputs)  # reload after the rewrite: reference = files on disk
        for k in ref:
            assert torch.equal(before[k], ref[k]), f"{name}: config rewrite changed {k}"
        # Independent of the loader: the in-memory model with storage-rounded weights, run in f32.
        # Round parameters only: Module.to() would also round buffers such as rotary inv_freq.
        rounded = copy.deepcopy(model)
        with torch.no_grad():
            for p in rounded.parameters():
                p.copy_(p.to(dtype).float())
        mem = full_logits(rounded, inputs["input_ids_1"])
        diff = (mem - ref["logits_1"]).abs().max().item()
        assert diff < 1e-5, f"{name}: reloaded model differs from the in-memory one by {diff}"
        write_safetensors(d / "reference.safetensors", ref, metadata(name, greedy_min_gap(d, ref)))
        print(f"wrote {d.relative_to(ROOT)}")


def config_variant_logits(d: Path, edit, ids: np.ndarray) -> torch.Tensor:
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp) / d.name
        shutil.copytree(d, t)
        cfg = read_json(t / "config.json")
        edit(cfg)
        write_json(t / "config.json", cfg)
        return full_logits(load_from_disk(t), ids)


def check_config_forms() -> None:
    """The rope keys in config.json are really read: removing or changing them changes the
    logits, and llama's two forms (rope_parameters / rope_theta + rope_scaling) agree."""
    def same(name, edit):
        ref = load_file(str(OUT / name / "reference.safetensors"))
        return torch.equal(config_variant_logits(OUT / name, edit, ref["input_ids_1"].numpy()), ref["logits_1"])

    def old_only(c):
        del c["rope_parameters"]

    def new_only(c):
        del c["rope_theta"], c["rope_scaling"]

    def no_scaling(c):
        del c["rope_scaling"]

    def no_llama3(c):
        del c["rope_scaling"], c["rope_parameters"]

    def rotary_quarter(c):
        c["rotary_pct"] = 0.25

    assert same("llama", old_only) and same("llama", new_only), "llama rope forms disagree"
    assert not same("llama", no_llama3), "llama3 rope scaling has no effect"
    assert not same("qwen2", no_scaling), "qwen2 rope_scaling is ignored"
    assert not same("neox_seq", rotary_quarter), "neox_seq rotary_pct is ignored"
    print("config forms OK: llama old-only == new-only; qwen2 rope_scaling and neox_seq rotary_pct are read")


def self_check(only=None) -> None:
    tok_ref = None
    rows = []
    for name, (cls, _, dtype, *_rest) in MODELS.items():
        if only is not None and name not in only:
            continue
        d = OUT / name
        ref = load_file(str(d / "reference.safetensors"))
        model = load_from_disk(d)
        assert type(model) is cls, (name, type(model))
        vocab = model.config.vocab_size
        tok = AutoTokenizer.from_pretrained(d)
        assert len(tok) == vocab, (name, len(tok), vocab)
        assert tok.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2]
        assert model.config.bos_token_id == ENDOFTEXT and model.config.eos_token_id in (ENDOFTEXT, IM_END)
        chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                       add_generation_prompt=True)
        assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", chat
        assert tok.encode(GREEDY_PROMPT_TEXT) == ref["greedy_prompt"].tolist()
        tok_ref = tok_ref or (d / "tokenizer.json").read_bytes()
        assert (d / "tokenizer.json").read_bytes() == tok_ref
        # Stored dtype is what the fixture says; no tensor is left at a constant default.
        weights = {}
        for f in sorted(d.glob("model*.safetensors")):
            weights.update(load_file(str(f)))
        for k, w in weights.items():
            assert w.dtype == dtype, (name, k, w.dtype, dtype)
            assert w.float().std() > 0, f"{name}: {k} is constant"
        with safe_open(str(d / "reference.safetensors"), "np") as f:
            meta = f.metadata()
        assert meta["transformers_version"] == transformers.__version__ and meta["model"] == name
        maxdiff = 0.0
        for i, n in enumerate(SEQ_LENS):
            ids = ref[f"input_ids_{i}"].numpy()
            assert ids.dtype == np.int32 and ids.shape == (n,) and ids.min() >= len(SPECIAL_TOKENS)
            lg = full_logits(model, ids)
            assert ref[f"logits_{i}"].shape == (n, vocab) and ref[f"logits_{i}"].dtype == torch.float32
            maxdiff = max(maxdiff, (lg - ref[f"logits_{i}"]).abs().max().item())
        assert maxdiff == 0.0, f"{name}: logits not reproducible (max diff {maxdiff})"
        g = greedy(model, ref["greedy_prompt"].numpy())
        assert np.array_equal(g, ref["greedy_tokens"].numpy()), name
        assert np.array_equal(greedy_no_cache(model, ref["greedy_prompt"].numpy()), g), \
            f"{name}: generate() differs from the plain argmax loop"
        maxlogit = max(ref[f"logits_{i}"].abs().max().item() for i in range(len(SEQ_LENS)))
        std = ref["logits_1"].std().item()
        rows.append((name, cls.__name__, str(dtype).removeprefix("torch."), vocab, dir_size(d),
                     maxlogit, std, len(set(g.tolist())), g[:10].tolist()))
    print()
    print(f"{'model':14} {'class':20} {'stored':9} {'vocab':>5} {'bytes':>9} {'max|logit|':>10} "
          f"{'std':>6} {'uniq':>4}  greedy[:10]")
    for r in rows:
        print(f"{r[0]:14} {r[1]:20} {r[2]:9} {r[3]:5} {r[4]:9} {r[5]:10.3f} {r[6]:6.3f} {r[7]:4}  {r[8]}")
    total = dir_size(OUT)
    print(f"total {total} bytes ({total / 1e6:.2f} MB) in {OUT.relative_to(ROOT)}")
    # The budget was 5 MB for the first eight models; gemma3 (the ninth) brought it to ~5.4 MB.
    assert total < 6_000_000, "fixtures over the 6 MB budget"
    for r in rows:
        assert r[7] > 1, f"{r[0]}: greedy continuation is one repeated token"
    if only is None:
        check_config_forms()
    print("self-check OK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only run the self-check on existing files")
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help="(re)make and check only these models, leaving the others as they are "
                         "(their logits' last bits depend on the CPU that made them)")
    args = ap.parse_args()
    t0 = time.time()
    if not args.check:
        generate_all(args.only)
    self_check(args.only)
    print(f"done in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
