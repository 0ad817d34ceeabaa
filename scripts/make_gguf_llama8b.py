#!/usr/bin/env python3
"""Write a Llama-3-8B-shape GGUF with random weights in llama.cpp's Q4_K_M mix, for comparing
strata's GPU block-format kernels with llama.cpp's CUDA backend on the same file (issue 15), on
a machine the real checkpoint cannot reach.

  python3 scripts/make_gguf_llama8b.py OUT.gguf [--layers N] [--tiny]

Shape: hidden 4096, 32 heads of 128 / 8 KV heads, ffn 14336, 32 layers, vocab 128256, rope base
500000 (--tiny: hidden 256, 4 / 2 heads of 64, ffn 512, 2 layers, vocab 512, for a quick check).
Formats as llama.cpp's Q4_K_M picks them for Llama: token_embd and every linear Q4_K, output
Q6_K, and attn_v / ffn_down Q6_K in the layers where llama.cpp "uses more bits" (the first and
last eighth, and every third in between); norms f32 (about 4.9 GB at full size).
The K-quant blocks are random bytes with small finite f16 super-block scales (as the tests'
fixtures make them: scripts/make_gguf_fixtures.py), so every weight is a valid Q4_K / Q6_K value
of magnitude below ~0.05. The tokenizer is byte-level BPE: 256 byte tokens spelled as GPT-2 does,
then "ab" (the one merge, a + b) and placeholder tokens; BOS 128000 and EOS 128001 as Llama 3
has them.

Plain Python (struct, os.urandom): no numpy or gguf-py needed, so it runs on the GPU machine.
Each tensor's blocks repeat a random 4 MiB pattern (the kernels read every byte all the same).
"""
import argparse
import os
import random
import struct

Q4_K, Q6_K, F32 = 12, 14, 0
BLOCK = {Q4_K: (256, 144), Q6_K: (256, 210)}
ALIGN = 32


def use_more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def gstr(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    out = gstr(key) + struct.pack("<I", vtype)
    if vtype == 4:  # uint32
        return out + struct.pack("<I", value)
    if vtype == 6:  # float32
        return out + struct.pack("<f", value)
    if vtype == 8:  # string
        return out + gstr(value)
    raise ValueError(vtype)


def kv_array(key, etype, values):
    out = gstr(key) + struct.pack("<IIQ", 9, etype, len(values))
    if etype == 8:
        return out + b"".join(gstr(v) for v in values)
    if etype == 5:  # int32
        return out + struct.pack(f"<{len(values)}i", *values)
    raise ValueError(etype)


def pattern(rng, qt, max_bytes=4 << 20):
    """Whole blocks of random bytes with small finite f16 super-block scales."""
    _, size = BLOCK[qt]
    n = max_bytes // size
    raw = bytearray(os.urandom(n * size))
    f16 = lambda lo, hi: struct.pack("<e", rng.uniform(lo, hi))
    for j in range(n):
        o = j * size
        if qt == Q4_K:
            raw[o:o + 2] = f16(2e-5, 6e-5)  # d
            raw[o + 2:o + 4] = f16(2e-5, 8e-5)  # dmin
        else:  # Q6_K: d is the last two bytes
            raw[o + size - 2:o + size] = f16(1e-5, 3e-5)
    return bytes(raw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    if a.tiny:
        H, NH, NKV, HD, F, L, VOCAB, BOS, EOS = 256, 4, 2, 64, 512, 2, 512, 300, 301
    else:
        H, NH, NKV, HD, F, L, VOCAB, BOS, EOS = 4096, 32, 8, 128, 14336, 32, 128256, 128000, 128001
    if a.layers:
        L = a.layers
    rng = random.Random(2026)

    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) +
                 list(range(0xAE, 0xFF + 1)))
    spelling, extra = {}, 0
    for b in range(256):
        if b in printable:
            spelling[b] = chr(b)
        else:
            spelling[b] = chr(256 + extra)
            extra += 1
    tokens = [spelling[b] for b in range(256)] + ["ab"] + [f"<tok{i}>" for i in range(257, VOCAB)]
    types = [1] * VOCAB
    types[BOS] = types[EOS] = 3  # control
    kvs = [
        kv("general.architecture", 8, "llama"),
        kv("general.name", 8, "random llama3-8b shape, Q4_K_M mix"),
        kv("general.file_type", 4, 15),  # LLAMA_FTYPE_MOSTLY_Q4_K_M
        kv("llama.block_count", 4, L),
        kv("llama.context_length", 4, 8192),
        kv("llama.embedding_length", 4, H),
        kv("llama.feed_forward_length", 4, F),
        kv("llama.attention.head_count", 4, NH),
        kv("llama.attention.head_count_kv", 4, NKV),
        kv("llama.rope.dimension_count", 4, HD),
        kv("llama.rope.freq_base", 6, 500000.0),
        kv("llama.attention.layer_norm_rms_epsilon", 6, 1e-5),
        kv("tokenizer.ggml.model", 8, "gpt2"),
        kv("tokenizer.ggml.pre", 8, "default"),
        kv_array("tokenizer.ggml.tokens", 8, tokens),
        kv_array("tokenizer.ggml.token_type", 5, types),
        kv_array("tokenizer.ggml.merges", 8, ["a b"]),
        kv("tokenizer.ggml.bos_token_id", 4, BOS),
        kv("tokenizer.ggml.eos_token_id", 4, EOS),
    ]

    # (name, type, rows, cols): ggml lists dims fastest first, [cols, rows].
    tensors = [("token_embd.weight", Q4_K, VOCAB, H), ("output_norm.weight", F32, 1, H),
               ("output.weight", Q6_K, VOCAB, H)]
    for i in range(L):
        b = f"blk.{i}."
        more = Q6_K if use_more_bits(i, L) else Q4_K
        tensors += [(b + "attn_norm.weight", F32, 1, H), (b + "ffn_norm.weight", F32, 1, H),
                    (b + "attn_q.weight", Q4_K, NH * HD, H),
                    (b + "attn_k.weight", Q4_K, NKV * HD, H),
                    (b + "attn_v.weight", more, NKV * HD, H),
                    (b + "attn_output.weight", Q4_K, H, NH * HD),
                    (b + "ffn_gate.weight", Q4_K, F, H), (b + "ffn_up.weight", Q4_K, F, H),
                    (b + "ffn_down.weight", more, H, F)]

    def nbytes(qt, rows, cols):
        if qt == F32:
            return 4 * rows * cols
        block, size = BLOCK[qt]
        return rows * cols // block * size

    infos, offset = [], 0
    for name, qt, rows, cols in tensors:
        dims = [cols] if rows == 1 else [cols, rows]
        infos.append(gstr(name) + struct.pack("<I", len(dims)) +
                     struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", qt, offset))
        offset += (nbytes(qt, rows, cols) + ALIGN - 1) // ALIGN * ALIGN
    pats = {Q4_K: pattern(rng, Q4_K), Q6_K: pattern(rng, Q6_K)}
    with open(a.out, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
        for x in kvs + infos:
            f.write(x)
        f.write(b"\0" * ((-f.tell()) % ALIGN))
        for name, qt, rows, cols in tensors:
            n = nbytes(qt, rows, cols)
            if qt == F32:
                f.write(struct.pack(f"<{n // 4}f", *(1.0 + 0.1 * rng.gauss(0, 1)
                                                   for _ in range(n // 4))))
            else:
                p = pats[qt]
                for _ in range(n // len(p)):
                    f.write(p)
                f.write(p[:n % len(p)])
            f.write(b"\0" * ((-n) % ALIGN))


if __name__ == "__main__":
    main()
