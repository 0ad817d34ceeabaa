#include "strata/types.h"

#include <string>

namespace strata {

const DTypeInfo& dtype_info(DType dt) {
  // Block layouts follow ggml: Q8_0 = f16 d + 32 i8; Q4_0 = f16 d + 16 nibble bytes;
  // Q4_1 = f16 d, f16 m + 16; Q5_0 = f16 d + u32 high bits + 16; Q5_1 = d, m + u32 + 16;
  // K-quants use 256-value super-blocks: Q4_K 144 B, Q5_K 176 B, Q6_K 210 B.
  static const DTypeInfo kF32{"f32", 1, 4, true, false};
  static const DTypeInfo kF16{"f16", 1, 2, true, false};
  static const DTypeInfo kBF16{"bf16", 1, 2, true, false};
  static const DTypeInfo kI8{"i8", 1, 1, false, false};
  static const DTypeInfo kFP8{"fp8_e4m3", 1, 1, true, false};
  static const DTypeInfo kI32{"i32", 1, 4, false, false};
  static const DTypeInfo kI64{"i64", 1, 8, false, false};
  static const DTypeInfo kU8{"u8", 1, 1, false, false};
  static const DTypeInfo kQ8_0{"q8_0", 32, 34, false, true};
  static const DTypeInfo kQ4_0{"q4_0", 32, 18, false, true};
  static const DTypeInfo kQ4_1{"q4_1", 32, 20, false, true};
  static const DTypeInfo kQ5_0{"q5_0", 32, 22, false, true};
  static const DTypeInfo kQ5_1{"q5_1", 32, 24, false, true};
  static const DTypeInfo kQ4_K{"q4_k", 256, 144, false, true};
  static const DTypeInfo kQ5_K{"q5_k", 256, 176, false, true};
  static const DTypeInfo kQ6_K{"q6_k", 256, 210, false, true};
  switch (dt) {
    case DType::kF32:
      return kF32;
    case DType::kF16:
      return kF16;
    case DType::kBF16:
      return kBF16;
    case DType::kI8:
      return kI8;
    case DType::kFP8E4M3:
      return kFP8;
    case DType::kI32:
      return kI32;
    case DType::kI64:
      return kI64;
    case DType::kU8:
      return kU8;
    case DType::kQ8_0:
      return kQ8_0;
    case DType::kQ4_0:
      return kQ4_0;
    case DType::kQ4_1:
      return kQ4_1;
    case DType::kQ5_0:
      return kQ5_0;
    case DType::kQ5_1:
      return kQ5_1;
    case DType::kQ4_K:
      return kQ4_K;
    case DType::kQ5_K:
      return kQ5_K;
    case DType::kQ6_K:
      return kQ6_K;
  }
  return kU8;
}

bool parse_dtype(std::string_view text, DType* out) {
  std::string t(text);
  for (char& c : t) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (t == "f32" || t == "float32" || t == "float")
    *out = DType::kF32;
  else if (t == "f16" || t == "float16" || t == "half")
    *out = DType::kF16;
  else if (t == "bf16" || t == "bfloat16")
    *out = DType::kBF16;
  else
    return false;
  return true;
}

}  // namespace strata
