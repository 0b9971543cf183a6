#include "launcher/log.hpp"

#include <unistd.h>

#include <mutex>

#include <spdlog/sinks/base_sink.h>

#include "launcher/output.hpp"

namespace ddprun {

namespace {

std::atomic<ConsoleWriter*> g_writer{nullptr};

class StderrSink : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    std::string line(buf.data(), buf.size());
    if (ConsoleWriter* w = g_writer.load()) {
      w->push_line(std::move(line));
      return;
    }
    const char* p = line.data();
    size_t n = line.size();
    while (n > 0) {
      ssize_t k = ::write(2, p, n);
      if (k <= 0) return;
      p += k;
      n -= static_cast<size_t>(k);
    }
  }
  void flush_() override {}
};

}  // namespace

void setup_logging(const std::string& level) {
  auto logger = std::make_shared<spdlog::logger>("ddprun", std::make_shared<StderrSink>());
  auto lvl = spdlog::level::from_str(level == "warning" ? "warn" : level);
  // Debugging a rendezvous or a slow start wants milliseconds; everyday lines do not.
  logger->set_pattern(lvl <= spdlog::level::debug ? "[ddprun %H:%M:%S.%e %^%l%$] %v" : "[ddprun %H:%M:%S %^%l%$] %v");
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
}

void route_logging_through(ConsoleWriter* writer) {
  if (writer) writer->carry_log();
  g_writer.store(writer);
}

}  // namespace ddprun
