#!/usr/bin/env python3
"""Write the GGUF test fixtures under tests/fixtures/gguf/ (and fuzz seeds under
tests/fuzz/corpus/gguf/) with the `gguf` Python package (gguf-py, the format's reference writer).

  all_types.gguf    v3: one metadata key of every value type (plus string arrays, int/float
                    arrays, a nested array of string arrays) and two tensors of every type strata
                    reads: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, shaped
                    [7, 256] ("<type>.a") and [3, 512] ("<type>.b"), plus a 3-D f32 tensor.
  <type>.a.f32, <type>.b.f32
                    the reference values gguf.quants.dequantize gives for those tensors, raw
                    little-endian f32, row-major outermost-first.
  llama_q4_k_m.gguf a tiny llama (hidden 256, 4 heads of 64 / 2 KV heads, ffn 256, 2 layers,
                    vocab 256) whose linear weights mix the GPU block formats the
                    way llama.cpp's Q4_K_M does and beyond: layer 0 Q/K/gate/up/output-proj
                    Q4_K, V and down Q6_K; layer 1 Q/K/V Q8_0, output-proj Q5_K, gate/up Q4_0,
                    down Q4_K; token_embd Q4_K, output Q6_K; norms f32; a byte-level
                    tokenizer (256 byte tokens, no merges). For the GPU's
                    block-format tests (tests/cuda/test_cuda_gguf.cpp, tests/model/
                    test_gguf_device.cpp): every in-feature count is a multiple of 256.
The metadata values are repeated in tests/io/test_gguf.cpp: change both together.

Quantized data: q8_0 .. q5_1 come from gguf.quants.quantize of seeded normal data (one row is
all zeros, one has a large outlier). gguf-py has no K-quant quantizer, so q4_k/q5_k/q6_k blocks
are random bytes with the f16 super-block scales set to small finite values; dequantize still
gives the exact reference for them.

Run from the repository root:  python3 scripts/make_gguf_fixtures.py
"""
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T, GGUFValueType as V

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "gguf")
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus", "gguf")

QUANT_TYPES = {
    "q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1,
}
K_TYPES = {"q4_k": T.Q4_K, "q5_k": T.Q5_K, "q6_k": T.Q6_K}
SHAPES = {"a": (7, 256), "b": (3, 512)}


def float_rows(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    if shape[0] > 2:
        x[1, :] = 0.0            # all-zero blocks (scale 0)
        x[2, 5] = 40.0           # an outlier dominating its block
    return x


def random_k_blocks(rng, qtype, rows, cols):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    nb = rows * cols // block
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    def f16(lo, hi):
        return rng.uniform(lo, hi, size=nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    if qtype in (T.Q4_K, T.Q5_K):
        raw[:, 0:2] = f16(1e-3, 2e-2)   # d
        raw[:, 2:4] = f16(1e-3, 2e-2)   # dmin
    else:                                # q6_k: d is the last two bytes
        raw[:, size - 2:size] = f16(1e-3, 2e-2)
    return raw.reshape(rows, cols // block * size)


def metadata(w):
    # Keys in a fixed order (tests/io/test_gguf.cpp expects exactly these values).
    def add(key, vtype, value, fn, sub=None):
        if sub is None:
            fn(key, value)
        else:
            w.add_key_value(key, value, V.ARRAY, sub_type=sub)
    add("test.u8", "u8", 200, w.add_uint8)
    add("test.i8", "i8", -100, w.add_int8)
    add("test.u16", "u16", 65000, w.add_uint16)
    add("test.i16", "i16", -32000, w.add_int16)
    add("test.u32", "u32", 4000000000, w.add_uint32)
    add("test.i32", "i32", -2000000000, w.add_int32)
    add("test.u64", "u64", 18000000000000000000, w.add_uint64)
    add("test.i64", "i64", -9000000000000000000, w.add_int64)
    add("test.f32", "f32", 0.1, w.add_float32)
    add("test.f64", "f64", 2.718281828459045, w.add_float64)
    add("test.bool_true", "bool", True, w.add_bool)
    add("test.bool_false", "bool", False, w.add_bool)
    add("test.string", "string", "héllo wörld \u2603 \"quoted\"\nline2", w.add_string)
    add("test.string_array", "array[string]", ["a", "", "Ġthe", "<|im_end|>", "x" * 300],
        w.add_array)
    add("test.i32_array", "array[i32]", [1, -2, 3, 2147483647, -2147483648], w.add_array)
    add("test.f32_array", "array[f32]", [0.5, -1.25, 3.0e-5], w.add_array)
    add("test.u8_array", "array[u8]", [0, 1, 255], None, sub=V.UINT8)
    add("test.i64_array", "array[i64]", [-(2 ** 40), 2 ** 40], None, sub=V.INT64)
    add("test.bool_array", "array[bool]", [True, False, True], None, sub=V.BOOL)
    add("test.nested", "array[array]", [["a", "b"], ["c"], ["d", "e", "f"]], w.add_array)
    add("llama.block_count", "u32", 2, w.add_uint32)


def write_all_types(rng):
    path = os.path.join(OUT, "all_types.gguf")
    w = gguf.GGUFWriter(path, arch="llama")
    metadata(w)
    refs = {}
    for tag, shape in SHAPES.items():
        x = float_rows(rng, shape)
        w.add_tensor(f"f32.{tag}", x)
        refs[f"f32.{tag}"] = x
        h = x.astype(np.float16)
        w.add_tensor(f"f16.{tag}", h)
        refs[f"f16.{tag}"] = h.astype(np.float32)
        b = gguf.quants.quantize(x, T.BF16)
        w.add_tensor(f"bf16.{tag}", b, raw_dtype=T.BF16)
        refs[f"bf16.{tag}"] = gguf.quants.dequantize(b, T.BF16)
        for name, qt in QUANT_TYPES.items():
            q = gguf.quants.quantize(x, qt)
            w.add_tensor(f"{name}.{tag}", q, raw_dtype=qt)
            refs[f"{name}.{tag}"] = gguf.quants.dequantize(q, qt)
        for name, qt in K_TYPES.items():
            q = random_k_blocks(rng, qt, *shape)
            w.add_tensor(f"{name}.{tag}", q, raw_dtype=qt)
            refs[f"{name}.{tag}"] = gguf.quants.dequantize(q, qt)
    w.add_tensor("f32.3d", np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for name, ref in refs.items():
        assert ref.dtype == np.float32
        ref.astype("<f4").tofile(os.path.join(OUT, f"{name}.f32"))


def write_llama_q4_k_m(rng):
    """The tiny mixed-format llama (see the module docstring)."""
    H, NH, NKV, HD, F, L, VOCAB = 256, 4, 2, 64, 256, 2, 256
    path = os.path.join(OUT, "llama_q4_k_m.gguf")
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_block_count(L)
    w.add_context_length(256)
    w.add_embedding_length(H)
    w.add_feed_forward_length(F)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    # A byte-level BPE vocabulary without merges: token b is byte b (GPT-2's byte-to-unicode
    # spelling), so the engine can generate from token ids and print what it made.
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) +
                 list(range(0xAE, 0xFF + 1)))
    spelling, extra = {}, 0
    for b in range(256):
        if b in printable:
            spelling[b] = chr(b)
        else:
            spelling[b] = chr(256 + extra)
            extra += 1
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", [spelling[b] for b in range(VOCAB)])

    def k_blocks(qt, rows, cols):
        block, size = gguf.GGML_QUANT_SIZES[qt]
        nb = rows * cols // block
        raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
        def f16(lo, hi):
            return rng.uniform(lo, hi, size=nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
        if qt in (T.Q4_K, T.Q5_K):
            raw[:, 0:2] = f16(2e-5, 6e-5)  # d: weights d sc q - dmin m within about +-0.05
            raw[:, 2:4] = f16(2e-5, 8e-5)  # dmin
        else:  # q6_k: d is the last two bytes
            raw[:, size - 2:size] = f16(1e-5, 3e-5)
        return raw.reshape(rows, cols // block * size)

    def matrix(name, qt, rows, cols):
        if qt in K_TYPES.values():
            w.add_tensor(name, k_blocks(qt, rows, cols), raw_dtype=qt)
        else:
            x = (rng.standard_normal((rows, cols)) * 0.03).astype(np.float32)
            w.add_tensor(name, gguf.quants.quantize(x, qt), raw_dtype=qt)

    def norm(name):
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(H)).astype(np.float32))

    matrix("token_embd.weight", T.Q4_K, VOCAB, H)
    norm("output_norm.weight")
    matrix("output.weight", T.Q6_K, VOCAB, H)
    formats = [
        {"q": T.Q4_K, "k": T.Q4_K, "v": T.Q6_K, "o": T.Q4_K, "gate": T.Q4_K, "up": T.Q4_K,
         "down": T.Q6_K},
        {"q": T.Q8_0, "k": T.Q8_0, "v": T.Q8_0, "o": T.Q5_K, "gate": T.Q4_0, "up": T.Q4_0,
         "down": T.Q4_K},
    ]
    for i, f in enumerate(formats):
        b = f"blk.{i}."
        norm(b + "attn_norm.weight")
        norm(b + "ffn_norm.weight")
        matrix(b + "attn_q.weight", f["q"], NH * HD, H)
        matrix(b + "attn_k.weight", f["k"], NKV * HD, H)
        matrix(b + "attn_v.weight", f["v"], NKV * HD, H)
        matrix(b + "attn_output.weight", f["o"], H, NH * HD)
        matrix(b + "ffn_gate.weight", f["gate"], F, H)
        matrix(b + "ffn_up.weight", f["up"], F, H)
        matrix(b + "ffn_down.weight", f["down"], H, F)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_small(path, alignment=None):
    """A tiny valid file (two KVs, two small tensors) for fuzz seeds."""
    w = gguf.GGUFWriter(path, arch="llama")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint32("llama.block_count", 1)
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ab"])
    w.add_array("test.nested", [["x"], ["y", "z"]])
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    w.add_tensor("w.f32", x)
    w.add_tensor("w.q4_1", gguf.quants.quantize(x, T.Q4_1), raw_dtype=T.Q4_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_seeds():
    os.makedirs(CORPUS, exist_ok=True)
    small = os.path.join(CORPUS, "small.gguf")
    write_small(small)
    write_small(os.path.join(CORPUS, "small_align64.gguf"), alignment=64)
    data = bytearray(open(small, "rb").read())
    variants = {
        "bad_magic.gguf": lambda d: d.__setitem__(slice(0, 4), b"GGUX"),
        "version1.gguf": lambda d: d.__setitem__(slice(4, 8), struct.pack("<I", 1)),
        "huge_tensor_count.gguf": lambda d: d.__setitem__(slice(8, 16), struct.pack("<Q", 1 << 60)),
        "truncated.gguf": lambda d: d.__delitem__(slice(len(d) // 2, None)),
    }
    for name, edit in variants.items():
        d = bytearray(data)
        edit(d)
        open(os.path.join(CORPUS, name), "wb").write(bytes(d))


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(1234)
    write_all_types(rng)
    # Its own generator: adding it leaves the other fixtures' bytes as they were.
    write_llama_q4_k_m(np.random.default_rng(4321))
    write_seeds()
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"wrote {OUT} ({total} bytes) and seeds in {CORPUS}", file=sys.stderr)


if __name__ == "__main__":
    main()
