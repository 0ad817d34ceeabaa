// reduce_sum_host (parallel/comm.h): the arithmetic of every sum the host collectives compute, and
// the CPU twin of the one-shot all-reduce kernel (backends/cuda/kernels/oneshot.cu): ranks summed
// in order 0..n-1 in f32 (bf16 / f16 widened, the result rounded once), i32 exactly.
#include <cstring>
#include <vector>

#include "core/half.h"
#include "core/status.h"
#include "parallel/comm.h"

namespace strata {

Status reduce_sum_host(const void* const* ins, int n, int64_t count, DType dt, void* out) {
  if (n < 1 || count < 0) return Status(StatusCode::kInvalidArgument, "reduce_sum: bad sizes");
  auto f32_of = [&](int r, int64_t i) -> float {
    switch (dt) {
      case DType::kF32:
        return static_cast<const float*>(ins[r])[i];
      case DType::kBF16:
        return bf16_to_f32(static_cast<const uint16_t*>(ins[r])[i]);
      case DType::kF16:
        return f16_to_f32(static_cast<const uint16_t*>(ins[r])[i]);
      default:
        return 0.0f;
    }
  };
  switch (dt) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16: {
      // Element by element: out may alias an input, and each element is read before written.
      for (int64_t i = 0; i < count; ++i) {
        float s = f32_of(0, i);
        for (int r = 1; r < n; ++r) s += f32_of(r, i);
        if (dt == DType::kF32) {
          static_cast<float*>(out)[i] = s;
        } else if (dt == DType::kBF16) {
          static_cast<uint16_t*>(out)[i] = f32_to_bf16(s);
        } else {
          static_cast<uint16_t*>(out)[i] = f32_to_f16(s);
        }
      }
      return ok_status();
    }
    case DType::kI32: {
      for (int64_t i = 0; i < count; ++i) {
        int64_t s = 0;
        for (int r = 0; r < n; ++r) s += static_cast<const int32_t*>(ins[r])[i];
        static_cast<int32_t*>(out)[i] = static_cast<int32_t>(s);
      }
      return ok_status();
    }
    default:
      return errorf(StatusCode::kUnimplemented, "reduce_sum: dtype {} is not summed",
                    dtype_name(dt));
  }
}

}  // namespace strata
