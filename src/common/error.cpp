#include "ddp/error.hpp"

#include <cstring>

#include <fmt/format.h>

namespace ddp {

SystemError::SystemError(const std::string& what, int err)
    : Error(what + ": " + errno_text(err)), err_(err) {}

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns a pointer that may or may not be buf.
  const char* s = strerror_r(err, buf, sizeof buf);
  return s ? std::string(s) : fmt::format("errno {}", err);
}

std::string format_duration(std::chrono::milliseconds d) {
  auto ms = d.count();
  if (ms < 1000) return fmt::format("{} ms", ms);
  if (ms % 1000 == 0) return fmt::format("{} s", ms / 1000);
  return fmt::format("{:.3g} s", static_cast<double>(ms) / 1000.0);
}

}  // namespace ddp
