#include "launcher/event_loop.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <exception>

#include "ddp/error.hpp"
#include "launcher/background.hpp"

namespace ddprun {

void EventLoop::open(const sigset_t& signals) {
  sigfd_ = signalfd(-1, &signals, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sigfd_ < 0) throw ddp::SystemError("signalfd", errno);
  wakefd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  if (wakefd_ < 0 || epfd_ < 0) throw ddp::SystemError("epoll/eventfd", errno);
  add(sigfd_, nullptr);
  add(wakefd_, &wakefd_);
}

void EventLoop::close() {
  for (int* fd : {&epfd_, &sigfd_, &wakefd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

void EventLoop::add(int fd, void* tag) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = tag;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) throw ddp::SystemError("epoll_ctl", errno);
}

void EventLoop::remove(int fd) { epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr); }

bool EventLoop::next_signal(signalfd_siginfo& si) { return read(sigfd_, &si, sizeof si) == sizeof si; }

void EventLoop::drain_wakefd() {
  uint64_t v;
  while (read(wakefd_, &v, sizeof v) == sizeof v) {
  }
}

void EventLoop::wait(int timeout_ms, int max_events, const std::function<void(void*)>& ready) {
  epoll_event evs[kMaxEvents];
  int n = epoll_wait(epfd_, evs, max_events, timeout_ms);
  if (n < 0 && errno != EINTR) throw ddp::SystemError("epoll_wait", errno);
  for (int i = 0; i < n; ++i) {
    void* tag = evs[i].data.ptr;
    if (tag == nullptr) {
      handlers_.signals();
    } else if (tag == &wakefd_) {
      drain_wakefd();
      handlers_.woken();
    } else {
      ready(tag);
    }
  }
}

std::vector<void*> EventLoop::wait_between_attempts(int timeout_ms) {
  std::vector<void*> ready;
  wait(timeout_ms, 16, [&](void* tag) { ready.push_back(tag); });
  return ready;
}

bool EventLoop::run_off_loop(std::function<void()> call, const OffLoop& how) {
  using Clock = std::chrono::steady_clock;
  if (how.stopped()) return false;
  struct Call {
    std::exception_ptr error;
    int fd = -1;
    ~Call() {
      if (fd >= 0) ::close(fd);
    }
  };
  auto c = std::make_shared<Call>();
  c->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (c->fd < 0) throw ddp::SystemError("eventfd", errno);
  BackgroundTask task([c, call = std::move(call)] {
    try {
      call();
    } catch (...) {
      c->error = std::current_exception();
    }
    uint64_t one = 1;
    ssize_t n = write(c->fd, &one, sizeof one);
    (void)n;
  });
  add(c->fd, &c->fd);
  how.waiting(true);
  bool done = false;
  while (!done && !how.stopped())
    for (void* tag : wait_between_attempts()) done |= tag == &c->fd;
  remove(c->fd);
  how.waiting(false);
  if (!done) {
    how.cancel();
    if (!task.wait_until(Clock::now() + how.grace)) task.abandon();
    return false;
  }
  task.wait();
  if (c->error) std::rethrow_exception(c->error);
  return true;
}

}  // namespace ddprun
