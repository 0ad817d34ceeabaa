// Element types strata stores tensors in.
//
// Plain types have block_size 1. Block-quantized types (GGUF's Q4_0 ... Q6_K) store
// `block_size` values in `block_bytes` bytes; a row of such a tensor must hold a whole number
// of blocks. Every switch over DType lists every value (no `default:`), so adding a type fails
// to compile until each switch handles it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace strata {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kI8,
  kFP8E4M3,
  kI32,
  kI64,
  kU8,
  // GGUF block-quantized weights (ggml layouts).
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ4_K,
  kQ5_K,
  kQ6_K,
};

struct DTypeInfo {
  std::string_view name;  // "f32", "bf16", "q4_k", ...
  int64_t block_size;     // values per block (1 for plain types)
  int64_t block_bytes;    // bytes per block
  bool is_float;          // plain floating-point type (f32, f16, bf16, fp8)
  bool is_quantized;      // block-quantized (GGUF)
};

const DTypeInfo& dtype_info(DType dt);

inline std::string_view dtype_name(DType dt) {
  return dtype_info(dt).name;
}

// Bytes needed for `n` values; n must be a multiple of the block size for quantized types.
inline int64_t dtype_bytes(DType dt, int64_t n) {
  const DTypeInfo& info = dtype_info(dt);
  return n / info.block_size * info.block_bytes;
}

// Parse "f32", "float32", "bf16", "bfloat16", "f16", "float16", "half"; false on anything else.
bool parse_dtype(std::string_view text, DType* out);

}  // namespace strata
