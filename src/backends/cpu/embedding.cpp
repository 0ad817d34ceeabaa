// Embedding lookup on the CPU: one output row per token, converted to f32. Ids are checked
// first (serially) so the parallel copy never reads outside the table. A vocab-parallel shard
// writes zeros for ids another shard owns; the all-reduce afterwards sums the shards.
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/quant.h"
#include "core/status.h"

namespace strata::cpu {

Status embedding(const EmbeddingParams& p) {
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    const int64_t id = p.ids[t];
    if (id < 0 || id >= p.vocab) {
      return errorf(StatusCode::kOutOfRange, "embedding: token {} has id {} outside [0, {})", t, id,
                    p.vocab);
    }
  }
  const bool quantized = dtype_info(p.table_dtype).is_quantized;
  if (quantized && (p.table_stride % dtype_info(p.table_dtype).block_size != 0 ||
                    p.hidden % dtype_info(p.table_dtype).block_size != 0)) {
    return errorf(StatusCode::kInvalidArgument, "embedding: {} rows of {} are not whole blocks",
                  dtype_name(p.table_dtype), p.hidden);
  }
#pragma omp parallel if (p.n_tokens * p.hidden >= kParallelMinElems)
  {
    std::vector<float> row_f32;  // the row in f32 when it must be scaled or added
    if (p.accumulate) row_f32.resize(static_cast<size_t>(p.hidden));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < p.n_tokens; ++t) {
      float* out = p.out + t * p.out_stride;
      const int64_t row = p.ids[t] - p.vocab_offset;
      if (row < 0 || row >= p.vocab_shard) {
        if (!p.accumulate) std::memset(out, 0, static_cast<size_t>(p.hidden) * sizeof(float));
        continue;
      }
      const void* src =
          static_cast<const char*>(p.table) + dtype_bytes(p.table_dtype, row * p.table_stride);
      float* dst = p.accumulate ? row_f32.data() : out;
      if (quantized) {
        (void)dequantize_row(p.table_dtype, src, dst, p.hidden);  // dtype checked above
      } else if (p.table_dtype == DType::kF32) {
        std::memcpy(dst, src, static_cast<size_t>(p.hidden) * sizeof(float));
      } else {
        for (int64_t i = 0; i < p.hidden; ++i) dst[i] = load_as_f32(src, p.table_dtype, i);
      }
      if (p.accumulate) {
        for (int64_t i = 0; i < p.hidden; ++i) out[i] += p.scale * dst[i];
      } else if (p.scale != 1.0f) {
        for (int64_t i = 0; i < p.hidden; ++i) out[i] *= p.scale;
      }
    }
  }
  return ok_status();
}

}  // namespace strata::cpu
