// What the store's budget and abuse tests watch besides the wire: the server's log lines
// (spdlog's default logger) and this process's peak RSS (the server runs in it).
#pragma once

#include <algorithm>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include "store_test_util.hpp"

namespace store_test {

// Keeps the log lines of spdlog's default logger (the server's) while it lives.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<Sink>()), previous_(spdlog::default_logger()) {
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink_));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  // True once a line contains every one of `parts` (within the timeout).
  bool has_line_with(const std::vector<std::string>& parts, std::chrono::milliseconds timeout = hang_guard()) {
    return ddp::test::wait_until([&] { return sink_->any_line([&](const std::string& l) {
                                   return std::all_of(parts.begin(), parts.end(), [&](auto& p) {
                                     return l.find(p) != std::string::npos;
                                   });
                                 }); },
                                 timeout);
  }
  std::string all() { return sink_->joined(); }

 private:
  class Sink : public spdlog::sinks::base_sink<std::mutex> {
   public:
    template <typename F>
    bool any_line(F f) {
      std::lock_guard lk(mutex_);
      return std::any_of(lines_.begin(), lines_.end(), f);
    }
    std::string joined() {
      std::lock_guard lk(mutex_);
      std::string s;
      for (auto& l : lines_) s += l + "\n";
      return s;
    }

   protected:
    void sink_it_(const spdlog::details::log_msg& m) override {
      lines_.emplace_back(m.payload.data(), m.payload.size());
    }
    void flush_() override {}

   private:
    std::vector<std::string> lines_;
  };
  std::shared_ptr<Sink> sink_;
  std::shared_ptr<spdlog::logger> previous_;
};

// A field of /proc/self/status in KiB (VmRSS, VmHWM), 0 when absent.
inline size_t status_kib(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(f, line))
    if (line.rfind(prefix, 0) == 0) return std::stoul(line.substr(prefix.size()));
  return 0;
}

// Resets VmHWM (the peak RSS) to the current RSS.
inline bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

// A round trip on c (generation 2): everything it sent before has been handled.
inline void sync(RawConn& c) {
  auto ping = request(proto::Op::kPing);
  ping.u32 = 0x5eed;
  c.send_request(ping);
  ASSERT_EQ(c.recv_u32(), 0x5eedu);
}

}  // namespace store_test
