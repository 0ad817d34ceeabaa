#include "core/log.h"

#include <atomic>

namespace strata {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};  // NOTE: process-wide verbosity only
}

void set_log_level(LogLevel level) {
  g_level.store(static_cast<int>(level));
}
LogLevel log_level() {
  return static_cast<LogLevel>(g_level.load());
}

void log_write(LogLevel level, const std::string& message) {
  const char* tag = level == LogLevel::kError  ? "error"
                    : level == LogLevel::kWarn ? "warn"
                    : level == LogLevel::kInfo ? "info"
                                               : "debug";
  std::fprintf(stderr, "strata %s: %s\n", tag, message.c_str());
}

void check_failed(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "strata internal error: check failed: %s at %s:%d\n", expr, file, line);
  std::abort();
}

}  // namespace strata
