// Forwarding of worker output: every line of every worker stream reaches ddprun's stdout or
// stderr whole, prefixed, never torn by another worker's, with bounded memory; nothing is
// dropped but what a console that failed (or stalled past a stop signal) could not take.
// (Where one pipe carries a worker's stdout and stderr, a line that the worker itself writes
// in parts to both at once, from two threads, mixes as it would on a terminal.)
//
//   ConsoleWriter   one per console stream; a thread that owns the blocking write(2)s, so
//                   that a stalled console never stalls ddprun's event loop. When more than
//                   its bound is queued, readers pause (workers block on their pipes). A
//                   regular file or /dev/null cannot stall: written directly, no thread.
//   Console         the writer plus which worker left a line unfinished on it.
//   StreamForwarder one per worker stream: splits lines, adds the prefix, splits overlong
//                   lines at a UTF-8 boundary with a visible mark, writes log files, keeps
//                   the tail of stderr for the failure report.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace ddprun {

class ConsoleWriter {
 public:
  // fd: 1 or 2. wake_fd: an eventfd written when the queue drains below half the bound.
  ConsoleWriter(int fd, size_t bound, int wake_fd);
  ~ConsoleWriter();
  void push(std::string&& chunk);
  // A whole line of ddprun's own (a log message): if a worker's unfinished line is open on
  // this console it is ended first, and interruptions() counts up.
  void push_line(std::string&& line);
  uint64_t interruptions() const { return interruptions_.load(std::memory_order_relaxed); }
  bool full() const { return pending_.load(std::memory_order_relaxed) >= bound_; }
  void flush();  // blocks until everything queued is written
  // Waits until everything queued is written or the deadline passes: whether it was.
  bool flush_until(std::chrono::steady_clock::time_point deadline);
  // Leaves a stalled writer behind for good: what is queued (and whatever comes) is dropped
  // once its blocked write returns, and the destructor no longer waits for its thread. For a
  // ddprun on its way out (the object must outlive the thread: the owner leaks it).
  void abandon();
  // ddprun's own log goes through this writer (route_logging_through): a failed write is
  // not logged, it would come back here.
  void carry_log() { carries_log_ = true; }
  // A terminal (isatty when made; settable for tests): a progress bar that another worker's
  // line interrupts is erased and drawn again below it, not left as a line of its own.
  bool terminal() const { return terminal_; }
  int fd() const { return fd_; }
  void set_terminal(bool on) { terminal_ = on; }

 private:
  void run();
  void start_locked();
  void lost(int err);
  int fd_;
  size_t bound_;
  int wake_fd_;
  std::atomic<size_t> pending_{0};
  std::atomic<bool> waiting_for_room_{false};
  std::atomic<uint64_t> interruptions_{0};
  std::atomic<bool> lost_{false};  // a write failed: said once
  std::atomic<bool> carries_log_{false};
  bool at_line_start_ = true;  // the last byte queued was '\n' (guarded by mu_)
  bool direct_ = false;        // a file or /dev/null: written by the caller, no thread
  bool terminal_ = false;
  std::mutex mu_;
  std::condition_variable cv_, drained_;
  std::deque<std::string> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// The columns `text` takes on a terminal: its escape sequences none, a wide character
// (CJK, emoji) two (the prefix's width, taken from a worker's terminal).
size_t terminal_columns(std::string_view text);

struct Console {
  ConsoleWriter* writer = nullptr;
  const void* dangling = nullptr;  // forwarder whose last line on this console is unfinished
  uint64_t dangling_epoch = 0;     // writer->interruptions() when it was left unfinished
  bool dangling_bar = false;       // that line is a progress bar's state (it follows a '\r')
  std::vector<const void*> erased;  // forwarders whose bar another's line erased (a terminal)
  // The unfinished line, if it is still open (no log line ended it since).
  const void* open_line() const {
    return dangling && writer->interruptions() == dangling_epoch ? dangling : nullptr;
  }
};

struct ForwarderConfig {
  std::string prefix;              // already expanded; "" = raw
  bool timestamps = false;
  Console* console = nullptr;      // nullptr: not shown (filtered, or redirected to a file)
  int file_fd = -1;                // log file (raw bytes), -1 = none
  std::string file_name;           // its path, for the one line when a write to it fails
  size_t tail_lines = 0;           // keep the last N lines (stderr, for the failure report)
  // --duplicate-std{out,err}-filters: whole lines containing any of `filters` also go,
  // stamped and prefixed as on the console, to filtered_fd (the attempt's file, shared).
  const std::vector<std::string>* filters = nullptr;
  int filtered_fd = -1;
};

class StreamForwarder {
 public:
  // Longer lines are split (a bound on what one stream holds); a JSON or base64 line of a
  // few hundred kB goes out whole, as under torchrun.
  static constexpr size_t kMaxLine = 1024 * 1024;
  static constexpr size_t kKeepCapacity = 64 * 1024;  // what a stream's line buffer keeps after a longer line
  static constexpr std::chrono::milliseconds kIdleFlush{100};
  static constexpr const char* kContinuation = "\\\n";  // ends each piece of a split line
  static constexpr size_t kStampColumns = 27;  // --log-timestamps' "YYYY-mm-dd HH:MM:SS.uuuuuu " (stamp)

  explicit StreamForwarder(ForwarderConfig cfg);
  // Feeds bytes read from the worker. Complete lines go out at once.
  void feed(const char* data, size_t n, std::chrono::system_clock::time_point now);
  // Sends an unfinished line (a prompt, a progress bar) after it sat idle.
  void flush_partial(std::chrono::system_clock::time_point now);
  // End of stream: the unfinished line goes out with a newline (raw output: as it is).
  void finish(std::chrono::system_clock::time_point now);
  bool has_partial() const { return !partial_.empty(); }
  std::chrono::steady_clock::time_point last_data() const { return last_data_; }
  // Read again after a pause (its console was behind): the worker was blocked, not idle, so
  // an unfinished line waits kIdleFlush from now for its rest.
  void resumed() { last_data_ = std::chrono::steady_clock::now(); }
  const std::deque<std::string>& tail() const { return tail_; }
  uint64_t lines() const { return lines_; }
  bool console_full() const { return cfg_.console && cfg_.console->writer->full(); }

 private:
  void emit_piece(std::string& out, const char* p, size_t n, bool terminated, const std::string& stamp);
  void tail_piece(const char* p, size_t n, bool terminated, bool overwritable);
  void show_piece(Console& console, std::string& out, const char* p, size_t n, bool terminated, bool overwritable,
                  const std::string& stamp);
  void remember(const char* p, size_t n);
  void end_tail_line();
  void remember_bar(const char* p, size_t n, bool terminated, bool overwritable);
  void forget_bar();
  // No prefix, no time stamps: the worker's bytes go to the console as they are.
  bool raw() const { return cfg_.prefix.empty() && !cfg_.timestamps; }
  void duplicate(const char* p, size_t n, bool terminated, const std::string& stamp);
  void split_overlong(std::string& out, const std::string& stamp);
  size_t open_bytes() const;
  std::string stamp(std::chrono::system_clock::time_point now) const;
  void send(std::string& out);

  ForwarderConfig cfg_;
  std::string partial_;
  size_t flushed_ = 0;          // bytes of the current line on the console already (idle flushes)
  bool after_cr_ = false;       // the last piece ended with '\r' (a following '\n' belongs to it)
  std::deque<std::string> tail_;
  std::string tail_partial_;
  bool tail_overwrite_ = false;  // tail_partial_ ended with a lone '\r': what follows replaces it
  bool bar_line_ = false;        // this line is a progress bar's (a '\r' ended a state of it)
  std::string bar_shown_;        // its last state, as the console shows it (remember_bar)
  bool bar_restart_ = false;     // a '\r' came after it: what follows is the next state
  bool line_open_ = false;       // this worker left its line open on the console (c->dangling)
  bool at_column0_ = false;      // its '\r' was sent: the next piece needs the prefix
  bool cr_dropped_ = false;      // the last piece was a lone '\r' that began a line: not sent
  std::string filtered_line_;  // the line being read, for the filters (idle flushes split it)
  uint64_t lines_ = 0;
  bool file_lost_ = false;      // a write to the log file failed (said once)
  bool filtered_lost_ = false;  // the same for the filtered file
  std::chrono::steady_clock::time_point last_data_{};
};

// Python's string.Template.safe_substitute ($name, ${name}, $$), with value(name) for the
// names it knows (nullopt: left as written).
std::string safe_substitute(const std::string& tmpl,
                            const std::function<std::optional<std::string>(std::string_view)>& value);
// Expands ${rank} ${local_rank} ${role_name} ${hostname} in a prefix template.
std::string expand_prefix(const std::string& tmpl, int rank, int local_rank, const std::string& role,
                          const std::string& hostname);

}  // namespace ddprun
