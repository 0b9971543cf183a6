// --preload (docs/preload.md): one warm Python process per node that imports the listed
// modules once and forks every worker from it, first attempt and restarts alike. The
// worker is adopted by ddprun (a child subreaper) as soon as it exists, so it is reaped,
// signalled and reported exactly like a worker ddprun started itself.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/options.hpp"
#include "launcher/process.hpp"
#include "launcher/worker.hpp"

namespace ddprun {

class Guardian;

class WarmPython {
 public:
  using Env = std::map<std::string, std::string>;

  // Inert unless --preload was given for Python workers.
  WarmPython(const Options& o, Guardian& guardian);
  ~WarmPython();
  WarmPython(const WarmPython&) = delete;
  WarmPython& operator=(const WarmPython&) = delete;

  bool enabled() const { return enabled_; }
  // Starts the warm process unless one runs or is starting. env: warm_environment().
  void start(const Env& env);
  // The descriptor that becomes readable when the warm process has said it is ready (or
  // why not, or ended); -1 when no start is pending.
  int pending_fd() const { return ready_ ? -1 : fd_; }
  // Reads the answer once pending_fd() is readable. Throws ddp::Error naming the module
  // that failed, or initialised CUDA; warns about threads alive at fork time.
  void on_ready();
  bool ready() const { return ready_; }
  // The warm process exited (ddprun reaped it): the next start() makes a new one.
  void exited(pid_t pid, int status);
  pid_t pid() const { return pid_; }
  // While the warm process imports (no worker runs yet), a stack dump shows where: a line
  // saying so, then faulthandler's dump of its threads, which it writes to ddprun's stderr
  // on SIGURG. False when it is not importing (ready, or none).
  bool show_stack(const std::string& why);

  // Forks the workers of `specs` (each a python -u [-m] script command line, its
  // environment and descriptors), 64 at a time through one child between. One result per
  // spec, in order; those it could not fork (the warm process is gone) are left to the
  // caller to start cold (pid -1).
  std::vector<SpawnResult> spawn(const std::vector<SpawnSpec>& specs);

  // Ends the warm process and its spare workers, and waits until they are gone (the job
  // is over: nothing of it outlives ddprun).
  void stop();
  // The import did not end within --hang-timeout: stopped, and no warm process again for
  // this job (its workers start cold, and their own imports count against the timeout).
  void give_up() {
    stop();
    enabled_ = false;
  }

 private:
  std::string how_it_ended();
  std::vector<pid_t> fork_batch(const std::vector<SpawnSpec>& specs, size_t from, size_t to);

  const Options& o_;
  Guardian& guardian_;
  bool enabled_ = false;
  std::string script_;  // ddprun_preload.py
  int fd_ = -1;         // our end of the socket
  pid_t pid_ = -1;                // -1 once reaped
  std::optional<int> exit_status_;  // how it ended, when ddprun's reaper saw it
  bool ready_ = false;
  int starts_ = 0;
};

// The error when the list is not one of Python module names ("" when it is).
std::string check_preload_list(const std::vector<std::string>& modules);

}  // namespace ddprun
