// The supervisor's one thread of events: an epoll set over ddprun's signalfd, the eventfd
// the console writers wake it through, and whatever the supervisor adds (the workers'
// pipes, the rendezvous's notify fd, --preload's answer). Signals and wake-ups are served
// by the handlers the supervisor gives, in the order they come with the other fds; every
// other ready fd is handed back by its tag.
#pragma once

#include <signal.h>
#include <sys/signalfd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace ddprun {

class EventLoop {
 public:
  static constexpr int kMaxEvents = 64;  // the most one wait() takes
  struct Handlers {
    std::function<void()> signals;  // the signalfd is readable: next_signal() reads them
    std::function<void()> woken;    // a console writer drained (the eventfd is read already)
  };
  // What off_loop() needs from its caller.
  struct OffLoop {
    std::function<bool()> stopped;      // a signal came: the wait ends
    std::function<void()> cancel;       // makes the call end soon
    std::function<void(bool)> waiting;  // true as the wait begins, false once it ended
    std::chrono::milliseconds grace{2000};  // how long a cancelled call may take to end before it is abandoned
  };

  EventLoop() = default;
  ~EventLoop() { close(); }
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // The signalfd reads `signals` (blocked in every thread: block_supervised_signals).
  void open(const sigset_t& signals);
  void close();
  void serve(Handlers h) { handlers_ = std::move(h); }
  int epfd() const { return epfd_; }
  int wakefd() const { return wakefd_; }

  void add(int fd, void* tag);
  void remove(int fd);  // errors ignored (an fd already gone)
  bool next_signal(signalfd_siginfo& si);  // false: none left

  // One epoll_wait for at most max_events (<= kMaxEvents) ready fds (timeout_ms -1: no
  // limit): signals and wake-ups are served, every other ready fd's tag goes to `ready`.
  void wait(int timeout_ms, int max_events, const std::function<void(void*)>& ready);
  // One wait while no worker runs (joining, waiting for the others at the exit): signals
  // and the console writers are served here; the tags of other ready fds are returned
  // (none when timeout_ms, if not -1, passed first).
  std::vector<void*> wait_between_attempts(int timeout_ms = -1);

  // Runs `call` (a rendezvous call that may wait for the network) on a thread of its own
  // while this one still reads signals: a signal meanwhile stops this node at once
  // (nullopt; the call is cancelled, and abandoned if it does not end within how.grace).
  // None runs when how.stopped() already holds. A call that ended in the same wake-up as
  // the signal returns its result, which the caller must undo or drop: stopped() after a
  // result is not a race to ignore (a signal lost there left a node waiting forever).
  // The thread owns what it touches (background.hpp).
  template <class T>
  std::optional<T> off_loop(std::function<T()> call, const OffLoop& how) {
    auto value = std::make_shared<std::optional<T>>();  // the thread's too
    if (!run_off_loop([value, call = std::move(call)] { *value = call(); }, how)) return std::nullopt;
    return std::move(*value);
  }

 private:
  bool run_off_loop(std::function<void()> call, const OffLoop& how);  // false: a signal came
  void drain_wakefd();

  int epfd_ = -1, sigfd_ = -1, wakefd_ = -1;
  Handlers handlers_;
};

}  // namespace ddprun
