// torchelastic's file timers (TORCHELASTIC_ENABLE_FILE_TIMER=1): workers arm and disarm
// watchdog timers through torch's FileTimerClient, which writes one JSON line per request
// into a FIFO named by TORCHELASTIC_TIMER_FILE; when a timer expires, its process gets the
// timer's signal. ddprun reads the FIFO in its event loop (no thread, no polling) and signals
// only this node's workers (and processes of their groups). torchrun's agent then also
// kills itself with that signal; ddprun fails the attempt instead, naming the timer.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddprun {

class FileTimers {
 public:
  using Clock = std::chrono::steady_clock;
  struct Timer {
    pid_t pid = 0;
    std::string scope;
    double expires_at = 0;  // seconds since the epoch (the client's time.time())
    int signal = 0;         // <= 0: expiry is only reported
    double late = 0;        // seconds past expires_at when take_expired() found it
  };

  // Inert unless env has TORCHELASTIC_ENABLE_FILE_TIMER=1. The FIFO: TORCHELASTIC_TIMER_FILE,
  // else <tmpdir>/watchdog_timer_<random> (a file already there is replaced, as torch does).
  // Throws ddp::SystemError when it cannot be made.
  explicit FileTimers(const std::map<std::string, std::string>& env);
  ~FileTimers();
  FileTimers(const FileTimers&) = delete;
  FileTimers& operator=(const FileTimers&) = delete;

  bool enabled() const { return read_fd_ >= 0; }
  const std::string& path() const { return path_; }  // for the workers' TORCHELASTIC_TIMER_FILE
  int fd() const { return read_fd_; }                 // readable when requests came

  // Reads the requests that came: arms (or re-arms) and releases timers. A malformed
  // line is reported once and skipped.
  void on_readable();
  // When the next armed timer expires (nullopt: none is armed).
  std::optional<Clock::time_point> next_expiry() const;
  // The timers expired by now, each pid's earliest first; they are disarmed.
  std::vector<Timer> take_expired();
  // Forgets every timer (a new attempt: the last one's workers are gone).
  void clear() { timers_.clear(); }
  // The job was suspended for d (Ctrl-Z): every armed timer expires that much later.
  void suspended(Clock::duration d) {
    for (auto& [key, t] : timers_) t.expires_at += std::chrono::duration<double>(d).count();
  }

 private:
  void request(const std::string& line);
  void close_all();

  std::string path_;
  int read_fd_ = -1, write_fd_ = -1;  // write_fd_ held so that no writer is no end of file
  std::string partial_;
  std::map<std::pair<pid_t, std::string>, Timer> timers_;
  bool said_malformed_ = false;
};

}  // namespace ddprun
