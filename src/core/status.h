// Status helpers for the library's own code: fmt-formatted constructors.
//   return errorf(StatusCode::kDataLoss, "{}: tensor '{}' ends at {} past EOF ({})", path, ...);
#pragma once

#include <fmt/core.h>

#include "strata/status.h"

namespace strata {

template <class... Args>
Status errorf(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace strata
