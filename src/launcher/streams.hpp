// The workers' output during one attempt: one pipe per stream (stdout, stderr), or one for
// both where they go to the same place (their order kept), read in the supervisor's epoll
// loop and forwarded line by line (output.hpp). A stream shown on a terminal is a
// pseudo-terminal instead of a pipe (its worker sees isatty(), and C stdio line-buffers).
// A stream whose console is behind is taken out of the epoll set (its worker then blocks on
// the full pipe) until the console's writer drains and wakes the loop.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "launcher/output.hpp"

namespace ddprun {

class WorkerStreams {
 public:
  using Clock = std::chrono::steady_clock;
  struct Stream;  // the epoll tag of a stream's pipe
  enum class Carries { kStdout, kStderr, kBoth };  // what a worker writes into a pipe
  // A worker's pseudo-terminal: as wide as the console's terminal (fd) less `lead`, the
  // columns of the prefix each line gets there (so that a progress bar fits its line).
  struct Terminal {
    int console_fd = -1;
    size_t lead = 0;
  };

  explicit WorkerStreams(int epfd);
  ~WorkerStreams();
  // A pipe for what worker `worker` writes to stdout, stderr or both; returns the write end
  // for the child (the caller closes it once the child has it). file_fd: a log file the
  // stream owns, or -1. tty: a pseudo-terminal instead, where one can be had (else a pipe,
  // as without it).
  int open(int worker, Carries what, ForwarderConfig cfg, int file_fd, const Terminal* tty = nullptr);
  // The terminal was resized (SIGWINCH): so are the workers' pseudo-terminals.
  void resize();
  void clear();  // a new attempt

  // An epoll event whose tag is a Stream: whether more may be waiting (it stopped at its
  // bound on reads a wake-up).
  bool on_readable(Stream& s);
  // Reads what worker `worker` left in its pipes (it exited: all of it is there), as far as
  // its consoles take it.
  void read_worker(int worker);
  // The console writers drained: streams paused on them are read again.
  void resume_paused();
  // Unfinished lines idle for StreamForwarder::kIdleFlush go out; the earliest time the
  // next one is due (or `limit`).
  Clock::time_point flush_idle(Clock::time_point limit);
  // The drain deadline passed: every stream that is not paused is read as far as its
  // console takes it, and closed if it then is not paused. Whether some paused ones remain.
  bool close_unpaused();
  void close_all();

  int open_count() const { return open_; }
  // stderr's last lines of a worker (for the failure report), once its stream closed: with
  // stdout's between them where one pipe carried both (carries_both).
  std::vector<std::string> stderr_tail(int worker) const;
  bool carries_both(int worker) const;
  // Whether the reads since the last call were small (output trickling in lines): the loop
  // then pauses a moment so that a burst costs one wake-up. Resets the count.
  bool trickling();
  // When a worker last wrote anything (its streams' last read; --hang-timeout's progress).
  Clock::time_point last_read() const { return last_read_; }
  // The last output read, or now while a stream is paused: its worker is writing, and
  // waits for the console (a `| less`), not hung.
  Clock::time_point last_output() const;

 private:
  void close(Stream& s);

  int epfd_;
  std::vector<std::unique_ptr<Stream>> streams_;
  int open_ = 0;
  bool said_no_pty_ = false;  // (once a job: a container without /dev/ptmx is no news each attempt)
  size_t cycle_reads_ = 0, cycle_bytes_ = 0;
  Clock::time_point last_read_{};
};

}  // namespace ddprun
