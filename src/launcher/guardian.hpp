// The guardian: a watchdog process that outlives a SIGKILLed ddprun just long enough to
// kill every worker process group it was told about (grandchildren included).
#pragma once

#include <sys/types.h>

namespace ddprun {

// Survives terminal signals (it blocks them all); holds none of ddprun's files but its
// pipe; exits quietly when disarmed. It shares ddprun's memory instead of copying it (see
// guardian.cpp): starting it costs no copy of ddprun's page tables and none of the
// copy-on-write faults that a fork leaves behind.
class Guardian {
 public:
  // The most groups it holds at once; past that, the oldest is forgotten first.
  static constexpr unsigned kMaxGroups = 16384;

  void start();            // starts it (call before any thread starts)
  void watch(pid_t pgid);  // a worker group to kill if ddprun dies
  // Where a child about to exec says watch(its pid) itself (SpawnSpec::announce_fd): the
  // messages are watch()'s; -1 once disarmed.
  int announce_fd() const { return fd_; }
  // A group that is gone: its number is free, and the kernel may give it to an unrelated
  // group (after a wrap of the pid space: minutes on a busy host), which the guardian must
  // then never kill. Told as soon as ddprun knows (launcher/attempt.cpp).
  void forget(pid_t pgid);
  void disarm();           // normal end: it exits without killing
  pid_t pid() const { return pid_; }
  ~Guardian();

 private:
  int fd_ = -1;
  pid_t pid_ = -1;
  void* memory_ = nullptr;  // its stack and its list of groups
};

}  // namespace ddprun
