// ddprun's own messages: spdlog to stderr, marked "[ddprun ...]", level from --log-level
// or LOGLEVEL. While workers run, the lines go through the stderr ConsoleWriter so they
// never tear a forwarded line.
#pragma once

#include <string>

#include <spdlog/spdlog.h>

namespace ddprun {
class ConsoleWriter;
void setup_logging(const std::string& level);
void route_logging_through(ConsoleWriter* writer);  // nullptr: straight to fd 2
}  // namespace ddprun
