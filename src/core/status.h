// Status helpers for the library's own code: fmt-formatted constructors.
//   return errorf(StatusCode::kDataLoss, "{}: tensor '{}' ends at {} past EOF ({})", path, ...);
#pragma once

#include <fmt/core.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "strata/status.h"

namespace strata {

template <class... Args>
Status errorf(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}

// User-controlled text (tensor names, JSON keys and excerpts) made safe for a one-line message:
// control and non-ASCII bytes as \xNN, cut after `max_chars`.
std::string printable_for_message(std::string_view text, size_t max_chars = 160);

}  // namespace strata
