#include "launcher/streams.hpp"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"

namespace ddprun {

namespace {

constexpr size_t kReadChunk = 256 << 10;
constexpr int kPipeBytes = 1 << 20;
constexpr size_t kTrickleBytes = 16 << 10;

void watch(int epfd, int fd, void* tag) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = tag;
  if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) throw ddp::SystemError("epoll_ctl", errno);
}

// The size of a worker's pseudo-terminal (0x0, unknown, where the console's is).
winsize window_of(const WorkerStreams::Terminal& t) {
  winsize ws{};
  if (ioctl(t.console_fd, TIOCGWINSZ, &ws) != 0) return winsize{};
  constexpr size_t kNarrowest = 20;  // a terminal too narrow for the prefix keeps its own width
  if (ws.ws_col >= t.lead + kNarrowest) ws.ws_col = static_cast<unsigned short>(ws.ws_col - t.lead);
  return ws;
}

// A pseudo-terminal of size ws: {ddprun's end (non-blocking), the worker's end}, both
// close-on-exec; false where none can be had (no /dev/ptmx in a container, the kernel's
// pty limit). The worker's end is raw: its bytes come through as written ("\n" stays "\n").
// Opened O_NOCTTY, it is no one's controlling terminal (unless the worker, which leads a
// session of its own, opens it again without).
bool open_pty(const winsize& ws, int fds[2]) {
  const int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (m < 0) return false;
  int s = -1;
  if (unlockpt(m) == 0) {
    s = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
    char name[64];
    if (s < 0 && ptsname_r(m, name, sizeof name) == 0) s = ::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  }
  termios t{};
  if (s < 0 || tcgetattr(s, &t) != 0) {
    const int err = errno;  // (what the message says)
    ::close(m);
    if (s >= 0) ::close(s);
    errno = err;
    return false;
  }
  cfmakeraw(&t);
  tcsetattr(s, TCSANOW, &t);
  ioctl(s, TIOCSWINSZ, &ws);
  fcntl(m, F_SETFL, O_NONBLOCK);
  fds[0] = m;
  fds[1] = s;
  return true;
}

}  // namespace

struct WorkerStreams::Stream {
  int fd = -1;
  int worker = 0;
  Carries what = Carries::kStdout;
  bool paused = false;
  std::optional<Terminal> tty;  // fd is a pseudo-terminal's (else a pipe's)
  std::unique_ptr<StreamForwarder> fwd;
  int file_fd = -1;
};

WorkerStreams::WorkerStreams(int epfd) : epfd_(epfd) {}
WorkerStreams::~WorkerStreams() { close_all(); }

int WorkerStreams::open(int worker, Carries what, ForwarderConfig cfg, int file_fd, const Terminal* tty) {
  int p[2];
  const bool pty = tty && open_pty(window_of(*tty), p);
  if (tty && !pty && !said_no_pty_) {
    said_no_pty_ = true;
    spdlog::info("no pseudo-terminal for the workers' output ({}): they write into pipes",
                 ddp::errno_text(errno));
  }
  if (!pty && pipe2(p, O_CLOEXEC) != 0) {
    const int err = errno;
    rlimit rl{};
    std::string why;
    if (err == EMFILE && getrlimit(RLIMIT_NOFILE, &rl) == 0)
      why = fmt::format(" (ddprun may hold {} open files, RLIMIT_NOFILE, and each worker takes four or more: run "
                        "fewer workers per node or raise `ulimit -n`)",
                        rl.rlim_cur);
    throw ddp::SystemError(fmt::format("cannot open a pipe for the {} of local rank {}{}",
                                       what == Carries::kStdout   ? "stdout"
                                       : what == Carries::kStderr ? "stderr"
                                                                  : "stdout and stderr",
                                       worker, why),
                           err);
  }
  if (!pty) {
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    // A deeper pipe: a chatty worker blocks less often and ddprun reads bigger batches.
    fcntl(p[0], F_SETPIPE_SZ, kPipeBytes);
  }
  auto s = std::make_unique<Stream>();
  if (pty) s->tty = *tty;
  s->fd = p[0];
  s->worker = worker;
  s->what = what;
  s->file_fd = file_fd;
  s->fwd = std::make_unique<StreamForwarder>(std::move(cfg));
  watch(epfd_, s->fd, s.get());
  ++open_;
  streams_.push_back(std::move(s));
  return p[1];
}

void WorkerStreams::resize() {
  for (auto& s : streams_)
    if (s->fd >= 0 && s->tty) {
      const winsize ws = window_of(*s->tty);
      ioctl(s->fd, TIOCSWINSZ, &ws);
    }
}

void WorkerStreams::clear() {
  close_all();
  streams_.clear();
  open_ = 0;
}

bool WorkerStreams::on_readable(Stream& s) {
  // Not value-initialised: its pages are touched only as output arrives.
  static thread_local std::unique_ptr<char[]> buf(new char[kReadChunk]);
  // A pseudo-terminal gives at most a few KiB a read: a short read does not mean it is empty.
  const int reads = s.tty ? 32 : 4;
  for (int i = 0; i < reads; ++i) {
    if (s.fwd->console_full()) {
      epoll_ctl(epfd_, EPOLL_CTL_DEL, s.fd, nullptr);
      s.paused = true;  // the console is behind: the worker blocks on its pipe
      return false;
    }
    ssize_t n = read(s.fd, buf.get(), kReadChunk);
    if (n > 0) {
      // (a pseudo-terminal's reads, a few KiB each, count as one: trickling is judged by
      // what one wake-up found, as for a pipe)
      if (i == 0 || !s.tty) ++cycle_reads_;
      last_read_ = Clock::now();
      cycle_bytes_ += static_cast<size_t>(n);
      s.fwd->feed(buf.get(), static_cast<size_t>(n), std::chrono::system_clock::now());
      if (static_cast<size_t>(n) < kReadChunk && !s.tty) return false;
      continue;
    }
    if (n < 0 && errno == EINTR) return true;
    if (n < 0 && errno == EAGAIN) return false;
    close(s);  // the end of a pipe, or EIO: a pseudo-terminal that no process holds open
    return false;
  }
  return true;
}

void WorkerStreams::read_worker(int worker) {
  for (auto& s : streams_)
    if (s->worker == worker && s->fd >= 0 && !s->paused) on_readable(*s);
}

void WorkerStreams::close(Stream& s) {
  if (s.fd < 0) return;
  s.fwd->finish(std::chrono::system_clock::now());
  if (!s.paused) epoll_ctl(epfd_, EPOLL_CTL_DEL, s.fd, nullptr);
  ::close(s.fd);
  s.fd = -1;
  if (s.file_fd >= 0) ::close(s.file_fd);
  s.file_fd = -1;
  --open_;
}

WorkerStreams::Clock::time_point WorkerStreams::last_output() const {
  for (const auto& s : streams_)
    if (s->fd >= 0 && s->paused) return Clock::now();
  return last_read_;
}

void WorkerStreams::resume_paused() {
  for (auto& s : streams_) {
    if (s->fd < 0 || !s->paused || s->fwd->console_full()) continue;
    s->paused = false;
    s->fwd->resumed();
    watch(epfd_, s->fd, s.get());
  }
}

WorkerStreams::Clock::time_point WorkerStreams::flush_idle(Clock::time_point limit) {
  const auto now = Clock::now();
  auto next = limit;
  for (auto& s : streams_) {
    // A paused stream is not idle: ddprun stopped reading it (its console is behind), and
    // the rest of its line may be waiting in the pipe.
    if (s->fd < 0 || s->paused || !s->fwd->has_partial()) continue;
    const auto due = s->fwd->last_data() + StreamForwarder::kIdleFlush;
    if (now >= due) s->fwd->flush_partial(std::chrono::system_clock::now());
    else next = std::min(next, due);
  }
  return next;
}

bool WorkerStreams::close_unpaused() {
  bool any_paused = false;
  for (auto& s : streams_) {
    // What an unpaused stream holds is read first (its console may have just caught up and
    // resumed it): only an empty one, whose writer outlived its worker, is closed unread
    // (and one that such a writer keeps full, after a bound).
    for (int i = 0; i < 64 && s->fd >= 0 && !s->paused && on_readable(*s);) ++i;
    if (s->fd >= 0 && !s->paused) close(*s);
    else if (s->fd >= 0) any_paused = true;
  }
  return any_paused;
}

void WorkerStreams::close_all() {
  for (auto& s : streams_)
    if (s->fd >= 0) close(*s);
}

std::vector<std::string> WorkerStreams::stderr_tail(int worker) const {
  for (auto& s : streams_)
    if (s->worker == worker && s->what != Carries::kStdout) return {s->fwd->tail().begin(), s->fwd->tail().end()};
  return {};
}

bool WorkerStreams::carries_both(int worker) const {
  for (auto& s : streams_)
    if (s->worker == worker && s->what == Carries::kBoth) return true;
  return false;
}

bool WorkerStreams::trickling() {
  const bool small = cycle_reads_ > 0 && cycle_bytes_ / cycle_reads_ < kTrickleBytes;
  cycle_reads_ = cycle_bytes_ = 0;
  return small;
}

}  // namespace ddprun
