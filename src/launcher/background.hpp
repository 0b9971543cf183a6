// Network work off the supervisor's thread: a signal must reach the workers at once,
// whatever the store, etcd or the network is doing (docs/design.md, "Never blocked by the
// network").
//
// A BackgroundTask runs one function on a thread of its own. Its owner waits for it with a
// deadline; a task that outlives the deadline is abandoned: its thread goes on (or stays
// blocked in a call) on its own, touching only what the function owns, never the owner.
// Once anything was abandoned, the process must end with std::_Exit after flushing (static
// destructors could run beside the thread): abandoned_anything() tells run_main so.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace ddprun {

class BackgroundTask {
 public:
  using Clock = std::chrono::steady_clock;
  BackgroundTask() = default;
  explicit BackgroundTask(std::function<void()> f);
  BackgroundTask(BackgroundTask&&) = default;
  BackgroundTask& operator=(BackgroundTask&& other);
  ~BackgroundTask();  // waits for the task, without a deadline (call wait_until first)

  bool valid() const { return t_.joinable(); }
  // True when the task has ended (or there is none) by `t`. Any thread may wait.
  bool wait_until(Clock::time_point t) const;
  void wait() const;
  // Leaves a task that has not ended to itself (see above). The owner's thread only.
  void abandon();

 private:
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  std::shared_ptr<Shared> s_;
  std::thread t_;
};

// Whether any task was abandoned in this process.
bool abandoned_anything();
void note_abandoned();

}  // namespace ddprun
