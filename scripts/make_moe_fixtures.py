#!/usr/bin/env python3
"""Make tiny random-weight mixture-of-experts checkpoints and their transformers references.

Writes tests/fixtures/moe/<name>/ for every model in MODELS, with the same files, tokenizer,
inputs, seeded init and reference.safetensors layout as scripts/make_fixtures.py (whose helpers
this script imports; see tests/fixtures/README.md), plus a GGUF file for the models listed in
GGUF_MODELS, written with the `gguf` package from the same weights in llama.cpp's layout
(3-D stacked experts `blk.N.ffn_{gate,up,down}_exps`, router `ffn_gate_inp`, shared expert
`ffn_*_shexp` and `ffn_gate_inp_shexp`), checked here to give the safetensors model's logits
through an independent numpy forward of the GGUF tensors.

    python3 scripts/make_moe_fixtures.py           # rewrite tests/fixtures/moe, then self-check
    python3 scripts/make_moe_fixtures.py --check   # self-check only

Needs torch, transformers, tokenizers, safetensors, numpy and gguf (only to regenerate: the
outputs are committed and the C++ tests read them without Python).
"""

import argparse
import copy
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402

import gguf  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import (  # noqa: E402
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

OUT = mf.ROOT / "tests" / "fixtures" / "moe"


def common(vocab):
    return dict(vocab_size=vocab, max_position_embeddings=256, bos_token_id=mf.ENDOFTEXT,
                eos_token_id=mf.IM_END, pad_token_id=mf.ENDOFTEXT, tie_word_embeddings=False)


def mixtral_config(vocab):
    # 6 experts, top-2 renormalised; every layer sparse.
    return MixtralConfig(hidden_size=48, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=40, num_hidden_layers=2, num_local_experts=6,
                         num_experts_per_tok=2, rms_norm_eps=1e-5, rope_theta=10000.0,
                         **common(vocab))


def qwen2_moe_config(vocab):
    # 8 experts, top-2 without renormalisation, a gated shared expert, layer 1 dense
    # (mlp_only_layers) between two sparse layers; q/k/v biases.
    return Qwen2MoeConfig(hidden_size=44, num_attention_heads=2, num_key_value_heads=1,
                          intermediate_size=52, moe_intermediate_size=20,
                          shared_expert_intermediate_size=28, num_hidden_layers=3,
                          num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
                          decoder_sparse_step=1, mlp_only_layers=[1], rms_norm_eps=1e-6,
                          rope_theta=10000.0, use_sliding_window=False, **common(vocab))


def qwen3_moe_config(vocab):
    # 7 experts, top-3 renormalised (norm_topk_prob), decoder_sparse_step 2 (layer 1 sparse,
    # layers 0 and 2 dense), per-head q/k norms, head_dim != hidden / heads.
    return Qwen3MoeConfig(hidden_size=48, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16, intermediate_size=64, moe_intermediate_size=20,
                          num_hidden_layers=3, num_experts=7, num_experts_per_tok=3,
                          norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[],
                          rms_norm_eps=1e-6, rope_theta=10000.0, **common(vocab))


def olmoe_config(vocab):
    # 5 experts, top-2 without renormalisation, q/k RMSNorm over the whole projections.
    return OlmoeConfig(hidden_size=48, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=32, num_hidden_layers=2, num_experts=5,
                       num_experts_per_tok=2, norm_topk_prob=False, rms_norm_eps=1e-5,
                       rope_theta=10000.0, **common(vocab))


# name: (model class, config factory, storage dtype, weight seed, init std). Seeds picked (from
# 1..24) for a greedy path of many distinct tokens with a clear top-1/top-2 gap.
MODELS = {
    "mixtral": (MixtralForCausalLM, mixtral_config, torch.float32, 3, 0.2),
    "mixtral_bf16": (MixtralForCausalLM, mixtral_config, torch.bfloat16, 3, 0.2),
    "qwen2_moe": (Qwen2MoeForCausalLM, qwen2_moe_config, torch.float32, 6, 0.2),
    "qwen3_moe_bf16": (Qwen3MoeForCausalLM, qwen3_moe_config, torch.bfloat16, 4, 0.2),
    "olmoe": (OlmoeForCausalLM, olmoe_config, torch.float32, 22, 0.2),
}
# name: GGUF architecture. Mixtral is llama.cpp's "llama" with experts (Q/K rows permuted for
# interleaved rotary pairs, as convert_hf_to_gguf.py writes them); its tensors stay bf16.
GGUF_MODELS = {"qwen2_moe": "qwen2moe", "mixtral_bf16": "llama"}


def build(name, vocab):
    cls, cfg_fn, dtype, seed, std = MODELS[name]
    return mf.build_model(cls, cfg_fn(vocab), seed, std)


def min_router_gap(d: Path, inputs: dict) -> float:
    """Smallest gap between the k-th and (k+1)-th router probability over every reference
    input: routing decisions closer than float rounding would make the logits ill-conditioned."""
    model = mf.load_from_disk(d)
    k = model.config.num_experts_per_tok
    gaps = []

    def hook(mod, inp, _out):
        h = inp[0].reshape(-1, inp[0].shape[-1]).float()
        p = torch.softmax(h @ mod.weight.float().T, dim=-1)
        top = p.topk(k + 1, dim=-1).values
        gaps.append((top[:, k - 1] - top[:, k]).min().item())

    hooks = [m.register_forward_hook(hook) for n, m in model.named_modules()
             if n.endswith((".mlp.gate", ".block_sparse_moe.gate"))]
    assert hooks, "no router found"
    for key in ("input_ids_0", "input_ids_1"):
        mf.full_logits(model, inputs[key])
    for h in hooks:
        h.remove()
    return min(gaps) if gaps else float("inf")


# ---- GGUF -----------------------------------------------------------------------------------


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: rotate_half pairs -> interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def bf16_bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def write_gguf(d: Path, arch: str) -> Path:
    """The safetensors model in llama.cpp's GGUF layout (the HF [out, in] matrices are stored as
    they are, GGUF's dims being reversed; bf16 checkpoints keep their bf16 bits)."""
    cfg = mf.read_json(d / "config.json")
    raw = load_file(str(d / "model.safetensors"))
    bf16 = next(iter(raw.values())).dtype == torch.bfloat16
    llama = arch == "llama"
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def prepare(name, t):
        if llama and name.endswith("self_attn.q_proj.weight"):
            t = torch.from_numpy(llama_permute(t.float().numpy(), nh)).to(t.dtype)
        if llama and name.endswith("self_attn.k_proj.weight"):
            t = torch.from_numpy(llama_permute(t.float().numpy(), nkv)).to(t.dtype)
        return t

    w = {k: prepare(k, v) for k, v in raw.items()}
    # Mixtral's names, mapped onto the Qwen/OLMoE ones used below.
    for k in list(w):
        m = k.replace("block_sparse_moe.gate.", "mlp.gate.").replace("block_sparse_moe.experts.", "mlp.experts.")
        m = m.replace(".w1.", ".gate_proj.").replace(".w3.", ".up_proj.").replace(".w2.", ".down_proj.")
        w[m] = w.pop(k)
    path = d / "model.gguf"
    g = gguf.GGUFWriter(str(path), arch)
    L = cfg["num_hidden_layers"]
    E = cfg.get("num_experts") or cfg["num_local_experts"]
    g.add_block_count(L)
    g.add_context_length(cfg["max_position_embeddings"])
    g.add_embedding_length(cfg["hidden_size"])
    g.add_feed_forward_length(cfg["intermediate_size"])
    g.add_head_count(cfg["num_attention_heads"])
    g.add_head_count_kv(cfg["num_key_value_heads"])
    g.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    g.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    g.add_expert_count(E)
    g.add_expert_used_count(cfg["num_experts_per_tok"])
    g.add_expert_feed_forward_length(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
    if cfg.get("shared_expert_intermediate_size"):
        g.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    g.add_uint32("tokenizer.ggml.bos_token_id", cfg["bos_token_id"])
    g.add_uint32("tokenizer.ggml.eos_token_id", cfg["eos_token_id"])

    def t(name, x):
        if isinstance(x, np.ndarray):
            x = torch.from_numpy(x)
        if bf16 and x.dim() >= 2:  # matrices keep their bf16 bits, vectors (norms) go to f32
            g.add_tensor(name, np.ascontiguousarray(bf16_bits(x.to(torch.bfloat16))),
                         raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            g.add_tensor(name, np.ascontiguousarray(x.float().numpy()))

    t("token_embd.weight", w["model.embed_tokens.weight"])
    t("output_norm.weight", w["model.norm.weight"])
    t("output.weight", w["lm_head.weight"])
    for i in range(L):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        t(b + "attn_norm.weight", w[p + "input_layernorm.weight"])
        for hf, gg in (("q", "q"), ("k", "k"), ("v", "v")):
            t(b + f"attn_{gg}.weight", w[p + f"self_attn.{hf}_proj.weight"])
            if p + f"self_attn.{hf}_proj.bias" in w:
                t(b + f"attn_{gg}.bias", w[p + f"self_attn.{hf}_proj.bias"])
        t(b + "attn_output.weight", w[p + "self_attn.o_proj.weight"])
        t(b + "ffn_norm.weight", w[p + "post_attention_layernorm.weight"])
        if p + "mlp.gate.weight" in w:
            t(b + "ffn_gate_inp.weight", w[p + "mlp.gate.weight"])
            for hf, gg in (("gate", "gate"), ("up", "up"), ("down", "down")):
                t(b + f"ffn_{gg}_exps.weight",
                  torch.stack([w[p + f"mlp.experts.{e}.{hf}_proj.weight"] for e in range(E)]))
            if p + "mlp.shared_expert.gate_proj.weight" in w:
                for hf in ("gate", "up", "down"):
                    t(b + f"ffn_{hf}_shexp.weight", w[p + f"mlp.shared_expert.{hf}_proj.weight"])
                # llama.cpp reads the shared expert's gate as a vector [n_embd].
                t(b + "ffn_gate_inp_shexp.weight", w[p + "mlp.shared_expert_gate.weight"].reshape(-1))
        else:
            for hf in ("gate", "up", "down"):
                t(b + f"ffn_{hf}.weight", w[p + f"mlp.{hf}_proj.weight"])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    return path


def gguf_forward(path: Path, ids: np.ndarray) -> np.ndarray:
    """A numpy forward of a qwen2moe GGUF, reading only the GGUF (an independent check that the
    file holds the safetensors model in llama.cpp's layout)."""
    r = gguf.GGUFReader(str(path))
    T = {t.name: np.array(t.data, dtype=np.float64).reshape([int(x) for x in reversed(t.shape)])
         for t in r.tensors}

    def kv(key):
        f = r.fields[key]
        return f.parts[f.data[0]][0].item()

    arch = "qwen2moe"
    L, H = kv(f"{arch}.block_count"), kv(f"{arch}.embedding_length")
    nh, nkv = kv(f"{arch}.attention.head_count"), kv(f"{arch}.attention.head_count_kv")
    E, K = kv(f"{arch}.expert_count"), kv(f"{arch}.expert_used_count")
    eps, theta = kv(f"{arch}.attention.layer_norm_rms_epsilon"), kv(f"{arch}.rope.freq_base")
    D = H // nh
    n = len(ids)

    def rms(x, wt):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * wt

    silu = lambda v: v / (1 + np.exp(-v))  # noqa: E731
    inv = 1.0 / theta ** (np.arange(0, D, 2) / D)
    ang = np.arange(n)[:, None] * inv[None]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(x):  # [n, heads, D], rotate_half
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return x * cos[:, None] + np.concatenate([-x2, x1], -1) * sin[:, None]

    x = T["token_embd.weight"][ids]
    for i in range(L):
        b = f"blk.{i}."
        h = rms(x, T[b + "attn_norm.weight"])
        q = (h @ T[b + "attn_q.weight"].T + T[b + "attn_q.bias"]).reshape(n, nh, D)
        k = (h @ T[b + "attn_k.weight"].T + T[b + "attn_k.bias"]).reshape(n, nkv, D)
        v = (h @ T[b + "attn_v.weight"].T + T[b + "attn_v.bias"]).reshape(n, nkv, D)
        q, k = rope(q), rope(k)
        rep = nh // nkv
        k, v = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(D)
        s = s + np.triu(np.full((n, n), -np.inf), 1)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = np.einsum("hqk,khd->qhd", s, v).reshape(n, nh * D)
        x = x + a @ T[b + "attn_output.weight"].T
        h = rms(x, T[b + "ffn_norm.weight"])
        if b + "ffn_gate_inp.weight" in T:
            lg = h @ T[b + "ffn_gate_inp.weight"].T
            p = np.exp(lg - lg.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            out = np.zeros_like(x)
            for t in range(n):
                for e in np.argsort(-p[t], kind="stable")[:K]:
                    ge = T[b + "ffn_gate_exps.weight"][e] @ h[t]
                    ue = T[b + "ffn_up_exps.weight"][e] @ h[t]
                    out[t] += p[t, e] * (T[b + "ffn_down_exps.weight"][e] @ (silu(ge) * ue))
            sh = (silu(h @ T[b + "ffn_gate_shexp.weight"].T) * (h @ T[b + "ffn_up_shexp.weight"].T)) \
                @ T[b + "ffn_down_shexp.weight"].T
            gate = 1 / (1 + np.exp(-(h @ T[b + "ffn_gate_inp_shexp.weight"])))
            x = x + out + gate[:, None] * sh
        else:
            x = x + (silu(h @ T[b + "ffn_gate.weight"].T) * (h @ T[b + "ffn_up.weight"].T)) \
                @ T[b + "ffn_down.weight"].T
    return rms(x, T["output_norm.weight"]) @ T["output.weight"].T


def check_llama_gguf(path: Path, d: Path) -> None:
    """Read the Mixtral GGUF back: each tensor, un-permuted and un-stacked, is bit-identical to
    the safetensors tensor it came from."""
    cfg = mf.read_json(d / "config.json")
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    st = {k: v.float().numpy() for k, v in load_file(str(d / "model.safetensors")).items()}
    r = gguf.GGUFReader(str(path))
    got = {}
    for t in r.tensors:
        a = np.array(t.data).reshape(-1)
        if t.tensor_type == gguf.GGMLQuantizationType.BF16:  # raw bytes of bf16 values
            a = (a.view(np.uint8).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        got[t.name] = a.reshape([int(x) for x in reversed(t.shape)]).astype(np.float32)

    def inv_permute(w, n_head):
        return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    pairs = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
             "output_norm.weight": "model.norm.weight"}
    n = 0
    for i in range(cfg["num_hidden_layers"]):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        pairs.update({b + "attn_norm.weight": p + "input_layernorm.weight",
                      b + "attn_v.weight": p + "self_attn.v_proj.weight",
                      b + "attn_output.weight": p + "self_attn.o_proj.weight",
                      b + "ffn_norm.weight": p + "post_attention_layernorm.weight",
                      b + "ffn_gate_inp.weight": p + "block_sparse_moe.gate.weight"})
        assert np.array_equal(inv_permute(got[b + "attn_q.weight"], nh), st[p + "self_attn.q_proj.weight"])
        assert np.array_equal(inv_permute(got[b + "attn_k.weight"], nkv), st[p + "self_attn.k_proj.weight"])
        for gg, hf in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
            for e in range(cfg["num_local_experts"]):
                assert np.array_equal(got[b + f"ffn_{gg}_exps.weight"][e],
                                      st[p + f"block_sparse_moe.experts.{e}.{hf}.weight"]), (i, gg, e)
                n += 1
    for gk, hk in pairs.items():
        assert np.array_equal(got[gk], st[hk]), gk
    assert len(got) == len(pairs) + 5 * cfg["num_hidden_layers"], sorted(set(got) - set(pairs))


# ----------------------------------------------------------------------------------------------


def generate_all(only=None) -> None:
    tok = mf.train_tokenizer()
    vocab = tok.get_vocab_size(with_added_tokens=True)
    prompt_ids = tok.encode(mf.GREEDY_PROMPT_TEXT).ids
    inputs = mf.make_inputs(vocab, prompt_ids)
    if only is None and OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True, exist_ok=True)
    built = {}
    for name, (cls, cfg_fn, dtype, seed, std) in MODELS.items():
        if only is not None and name not in only:
            continue
        d = OUT / name
        if d.exists():
            shutil.rmtree(d)
        key = (cls.__name__, seed)
        if key not in built:
            built[key] = mf.build_model(cls, cfg_fn(vocab), seed, std)
        model = built[key]
        stored = copy.deepcopy(model).to(dtype) if dtype != torch.float32 else model
        stored.save_pretrained(d)
        tok.save(str(d / "tokenizer.json"), pretty=True)
        mf.write_json(d / "tokenizer_config.json", mf.tokenizer_config("<|im_end|>", 256))
        ref = mf.compute_reference(d, inputs)
        rounded = copy.deepcopy(model)
        with torch.no_grad():
            for p in rounded.parameters():
                p.copy_(p.to(dtype).float())
        mem = mf.full_logits(rounded, inputs["input_ids_1"])
        diff = (mem - ref["logits_1"]).abs().max().item()
        assert diff < 1e-5, f"{name}: reloaded model differs from the in-memory one by {diff}"
        meta = mf.metadata(name, mf.greedy_min_gap(d, ref))
        meta["generator"] = "scripts/make_moe_fixtures.py"
        meta["router_min_topk_gap"] = f"{min_router_gap(d, inputs):.6f}"
        mf.write_safetensors(d / "reference.safetensors", ref, meta)
        if GGUF_MODELS.get(name) == "llama":
            path = write_gguf(d, "llama")
            check_llama_gguf(path, d)
            print(f"  {path.relative_to(mf.ROOT)}: every tensor equals the safetensors one "
                  "(Q/K un-permuted)")
        elif name in GGUF_MODELS:
            path = write_gguf(d, GGUF_MODELS[name])
            got = gguf_forward(path, inputs["input_ids_1"])
            err = np.abs(got - ref["logits_1"].numpy()).max() / np.abs(ref["logits_1"].numpy()).max()
            assert err < 1e-5, f"{name}: GGUF forward differs from transformers by {err}"
            print(f"  {path.relative_to(mf.ROOT)}: numpy forward of the GGUF vs transformers {err:.2e}")
        print(f"wrote {d.relative_to(mf.ROOT)} (router gap {meta['router_min_topk_gap']}, "
              f"greedy gap {meta['greedy_min_top2_gap']})")


def self_check(only=None) -> None:
    rows = []
    for name, (cls, _, dtype, *_rest) in MODELS.items():
        if only is not None and name not in only:
            continue
        d = OUT / name
        ref = load_file(str(d / "reference.safetensors"))
        model = mf.load_from_disk(d)
        assert type(model) is cls, (name, type(model))
        weights = load_file(str(d / "model.safetensors"))
        for k, w in weights.items():
            assert w.dtype == dtype, (name, k, w.dtype, dtype)
            assert w.float().std() > 0, f"{name}: {k} is constant"
        assert any(".experts.0." in k for k in weights), f"{name}: no per-expert tensors"
        for i in range(len(mf.SEQ_LENS)):
            lg = mf.full_logits(model, ref[f"input_ids_{i}"].numpy())
            assert torch.equal(lg, ref[f"logits_{i}"]), f"{name}: logits not reproducible"
        g = mf.greedy(model, ref["greedy_prompt"].numpy())
        assert np.array_equal(g, ref["greedy_tokens"].numpy()), name
        assert np.array_equal(mf.greedy_no_cache(model, ref["greedy_prompt"].numpy()), g), name
        assert len(set(g.tolist())) > 1, f"{name}: greedy continuation is one repeated token"
        rows.append((name, cls.__name__, str(dtype).removeprefix("torch."), mf.dir_size(d),
                     g[:10].tolist()))
    for r in rows:
        print(f"{r[0]:16} {r[1]:22} {r[2]:9} {r[3]:9}  {r[4]}")
    total = mf.dir_size(OUT)
    print(f"total {total} bytes ({total / 1e6:.2f} MB) in {OUT.relative_to(mf.ROOT)}")
    assert total < 3_000_000, "MoE fixtures over the 3 MB budget"
    print("self-check OK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only run the self-check")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="(re)make and check these models")
    args = ap.parse_args()
    t0 = time.time()
    if not args.check:
        generate_all(args.only)
    self_check(args.only)
    print(f"done in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
