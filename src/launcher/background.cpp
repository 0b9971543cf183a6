#include "launcher/background.hpp"

#include <atomic>

namespace ddprun {

namespace {
std::atomic<bool> g_abandoned{false};
}

bool abandoned_anything() { return g_abandoned.load(); }
void note_abandoned() { g_abandoned = true; }

BackgroundTask::BackgroundTask(std::function<void()> f) : s_(std::make_shared<Shared>()) {
  t_ = std::thread([s = s_, f = std::move(f)] {
    try {
      f();
    } catch (...) {
      // The function reports its own errors; nothing may escape a thread.
    }
    std::lock_guard lk(s->mu);
    s->done = true;
    s->cv.notify_all();
  });
}

BackgroundTask& BackgroundTask::operator=(BackgroundTask&& other) {
  if (this != &other) {
    if (t_.joinable()) t_.join();
    s_ = std::move(other.s_);
    t_ = std::move(other.t_);
  }
  return *this;
}

BackgroundTask::~BackgroundTask() {
  if (t_.joinable()) t_.join();
}

bool BackgroundTask::wait_until(Clock::time_point t) const {
  if (!s_) return true;
  std::unique_lock lk(s_->mu);
  return s_->cv.wait_until(lk, t, [&] { return s_->done; });
}

void BackgroundTask::wait() const {
  if (!s_) return;
  std::unique_lock lk(s_->mu);
  s_->cv.wait(lk, [&] { return s_->done; });
}

void BackgroundTask::abandon() {
  if (!t_.joinable()) return;
  note_abandoned();
  t_.detach();
}

}  // namespace ddprun
