// Logging and invariant checks. STRATA_CHECK is for programmer errors only (a broken
// invariant inside strata); anything a user can cause returns a Status instead.
#pragma once

#include <fmt/core.h>

#include <cstdio>
#include <cstdlib>

namespace strata {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kSilent = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_write(LogLevel level, const std::string& message);

template <class... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kInfo)
    log_write(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kWarn)
    log_write(LogLevel::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kDebug)
    log_write(LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
}

[[noreturn]] void check_failed(const char* expr, const char* file, int line);

}  // namespace strata

#define STRATA_CHECK(cond)                                          \
  do {                                                              \
    if (!(cond)) ::strata::check_failed(#cond, __FILE__, __LINE__); \
  } while (0)
