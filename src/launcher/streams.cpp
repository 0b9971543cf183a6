#include "launcher/streams.hpp"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

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

}  // namespace

struct WorkerStreams::Stream {
  int fd = -1;
  int worker = 0;
  Carries what = Carries::kStdout;
  bool paused = false;
  std::unique_ptr<StreamForwarder> fwd;
  int file_fd = -1;
};

WorkerStreams::WorkerStreams(int epfd) : epfd_(epfd) {}
WorkerStreams::~WorkerStreams() { close_all(); }

int WorkerStreams::open(int worker, Carries what, ForwarderConfig cfg, int file_fd) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) {
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
  fcntl(p[0], F_SETFL, O_NONBLOCK);
  // A deeper pipe: a chatty worker blocks less often and ddprun reads bigger batches.
  fcntl(p[0], F_SETPIPE_SZ, kPipeBytes);
  auto s = std::make_unique<Stream>();
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

void WorkerStreams::clear() {
  close_all();
  streams_.clear();
  open_ = 0;
}

void WorkerStreams::on_readable(Stream& s) {
  // Not value-initialised: its pages are touched only as output arrives.
  static thread_local std::unique_ptr<char[]> buf(new char[kReadChunk]);
  for (int i = 0; i < 4; ++i) {
    if (s.fwd->console_full()) {
      epoll_ctl(epfd_, EPOLL_CTL_DEL, s.fd, nullptr);
      s.paused = true;  // the console is behind: the worker blocks on its pipe
      return;
    }
    ssize_t n = read(s.fd, buf.get(), kReadChunk);
    if (n > 0) {
      ++cycle_reads_;
      last_read_ = Clock::now();
      cycle_bytes_ += static_cast<size_t>(n);
      s.fwd->feed(buf.get(), static_cast<size_t>(n), std::chrono::system_clock::now());
      if (static_cast<size_t>(n) < kReadChunk) return;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    close(s);
    return;
  }
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
  for (auto& s : streams_)
    if (s->fd >= 0 && !s->paused) close(*s);
    else if (s->fd >= 0) any_paused = true;
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
