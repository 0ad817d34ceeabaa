#!/usr/bin/env python3
"""Write a Hugging Face-style Llama checkpoint of a named shape with random bf16 weights.

For measuring weight streaming from disk (`--offload-weights disk` reads the checkpoint file
itself, so `--model-config` random weights cannot be used): config.json plus one
model.safetensors whose tensors are stored layer by layer (each layer one contiguous range).
The weights are a 1 MiB block of N(0, 0.02) bf16 values repeated: meaningless text, real bytes.
Pure Python (no numpy needed).

  scripts/make_random_checkpoint.py --shape llama3-8b --out /tmp/llama3-8b-random
  strata bench -m /tmp/llama3-8b-random --device cuda --offload-weights disk --batch 16 --ctx 512
"""
import argparse
import json
import os
import random
import struct
import sys

# layers, hidden, heads, kv_heads, head_dim, ffn, vocab, rope_theta (as src/model/presets.cpp)
SHAPES = {
    "llama3-8b": (32, 4096, 32, 8, 128, 14336, 128256, 500000.0),
    "llama2-7b": (32, 4096, 32, 32, 128, 11008, 32000, 10000.0),
    "llama-34b": (48, 8192, 64, 8, 128, 22016, 32000, 1000000.0),
    "llama3-70b": (80, 8192, 64, 8, 128, 28672, 128256, 500000.0),
    "llama3.2-1b": (16, 2048, 32, 8, 64, 8192, 128256, 500000.0),
}


def bf16_block(n_values, seed=0):
    rng = random.Random(seed)
    out = bytearray()
    for _ in range(n_values):
        f = struct.pack("<f", rng.gauss(0.0, 0.02))
        out += f[2:4]  # the high half of an f32 is its bf16 (truncated)
    return bytes(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", required=True, choices=sorted(SHAPES))
    p.add_argument("--out", required=True, help="directory to create")
    p.add_argument("--layers", type=int, default=0, help="override the layer count")
    a = p.parse_args()
    L, H, nh, nkv, hd, F, V, theta = SHAPES[a.shape]
    if a.layers > 0:
        L = a.layers
    os.makedirs(a.out, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
        "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": nh,
        "num_key_value_heads": nkv, "head_dim": hd, "vocab_size": V, "rms_norm_eps": 1e-5,
        "rope_theta": theta, "max_position_embeddings": 8192, "tie_word_embeddings": False,
        "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tensors = [("model.embed_tokens.weight", [V, H])]
    for l in range(L):
        pre = f"model.layers.{l}."
        tensors += [
            (pre + "input_layernorm.weight", [H]),
            (pre + "self_attn.q_proj.weight", [nh * hd, H]),
            (pre + "self_attn.k_proj.weight", [nkv * hd, H]),
            (pre + "self_attn.v_proj.weight", [nkv * hd, H]),
            (pre + "self_attn.o_proj.weight", [H, nh * hd]),
            (pre + "post_attention_layernorm.weight", [H]),
            (pre + "mlp.gate_proj.weight", [F, H]),
            (pre + "mlp.up_proj.weight", [F, H]),
            (pre + "mlp.down_proj.weight", [H, F]),
        ]
    tensors += [("model.norm.weight", [H]), ("lm_head.weight", [V, H])]
    header, offset = {}, 0
    for name, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    block = bf16_block(1 << 19)  # 1 MiB
    one = struct.pack("<H", 0x3F80) * (1 << 19)  # 1.0 in bf16 for the norms
    path = os.path.join(a.out, "model.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        done = 0
        for name, shape in tensors:
            left = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            src = one if name.endswith("norm.weight") else block
            while left > 0:
                k = min(left, len(src))
                f.write(src[:k])
                left -= k
            done += 1
            if done % 50 == 0:
                print(f"{done}/{len(tensors)} tensors", file=sys.stderr)
    print(f"wrote {path} ({offset / 2**30:.2f} GiB of weights, {L} layers)")


if __name__ == "__main__":
    main()
