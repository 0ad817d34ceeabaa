// Helpers shared by the communicator implementations.
#pragma once

#include <cstdint>

#include "parallel/comm.h"

namespace strata {

// dst[0..bytes) = src[0..bytes) in the memory `s` names: memcpy for host memory, an async device
// copy on s.cuda_stream for device memory (kUnimplemented in a build without CUDA).
Status comm_copy(void* dst, const void* src, int64_t bytes, const CommStream& s);

// kInvalidArgument unless count >= 0 and the pointers are set where count > 0.
Status check_count(const char* op, int64_t count, std::initializer_list<const void*> ptrs);

}  // namespace strata
