#!/usr/bin/env python3
"""Prints the inverse RoPE frequencies Hugging Face transformers computes for the cases of
tests/model/rope_test.cpp, as C++ initializer lists to paste there.

  python3 tests/model/gen_rope_inv_freq.py   (torch + transformers 5.x)

default: LlamaRotaryEmbedding.compute_default_rope_parameters; linear and llama3:
transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS.
"""
import torch
import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

CASES = [
    # name, head_dim, rope_parameters
    ("kDefault64", 64, {"rope_type": "default", "rope_theta": 10000.0}),
    ("kDefault20Theta1e6", 20, {"rope_type": "default", "rope_theta": 1000000.0}),
    ("kLinear24", 24, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    ("kLlama3_128", 128, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192}),
    ("kLlama3_64", 64, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192}),
]


def inv_freq(head_dim, params):
    config = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                         max_position_embeddings=131072, rope_parameters=dict(params))
    if params["rope_type"] == "default":
        f, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        f, _ = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, device="cpu")
    return f.to(torch.float32).tolist()


def cpp_float(v):
    text = f"{v:.9g}"  # 9 significant digits round-trip a float exactly
    if "." not in text and "e" not in text:
        text += ".0"
    return text + "f"


def main():
    print(f"// transformers {transformers.__version__}, torch {torch.__version__}")
    for name, head_dim, params in CASES:
        values = inv_freq(head_dim, params)
        body = ", ".join(cpp_float(v) for v in values)
        print(f"constexpr float {name}[] = {{{body}}};")


if __name__ == "__main__":
    main()
