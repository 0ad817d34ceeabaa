#include "parallel/comm_util.h"

#include <cstring>

#include "core/status.h"

#if STRATA_HAS_CUDA
#include "backends/cuda/cuda_kernels.h"
#endif

namespace strata {

Status comm_copy(void* dst, const void* src, int64_t bytes, const CommStream& s) {
  if (bytes <= 0 || dst == src) return ok_status();
  if (s.device.is_cpu()) {
    std::memmove(dst, src, static_cast<size_t>(bytes));
    return ok_status();
  }
#if STRATA_HAS_CUDA
  return cuda::copy_d2d_on_stream(s.cuda_stream, dst, src, static_cast<size_t>(bytes));
#else
  return Status(StatusCode::kUnimplemented, "device collectives need a CUDA build");
#endif
}

Status check_count(const char* op, int64_t count, std::initializer_list<const void*> ptrs) {
  if (count < 0) return errorf(StatusCode::kInvalidArgument, "{}: negative count {}", op, count);
  if (count > 0) {
    for (const void* p : ptrs) {
      if (p == nullptr) return errorf(StatusCode::kInvalidArgument, "{}: null buffer", op);
    }
  }
  return ok_status();
}

}  // namespace strata
