// One attempt's workers on this node: started together (one per local rank, each leading
// its own session, watched by the guardian), signalled together, reaped one by one as
// SIGCHLD comes, and escalated to SIGKILL when they outlive the stop's deadline. What the
// job does about a failure (the root cause, telling the other nodes) is the supervisor's.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "launcher/options.hpp"
#include "launcher/process.hpp"
#include "launcher/report.hpp"
#include "launcher/worker.hpp"

namespace ddprun {

class Guardian;
class WarmPython;

class AttemptWorkers {
 public:
  using Clock = std::chrono::steady_clock;
  // How long what the workers left running has between SIGTERM and SIGKILL.
  static constexpr Clock::duration kLeftoverGrace = std::chrono::seconds(3);
  using Env = std::map<std::string, std::string>;
  // Opens the pipes of one worker's stdout and stderr and returns their write ends (two
  // descriptors, maybe of one pipe); `dir` is the worker's folder under the attempt's.
  using StreamOpener = std::function<std::pair<int, int>(int index, const std::string& dir)>;
  // Adds to a worker's environment before it starts (the stack-dump bootstrap, say).
  using EnvHook = std::function<void(Env&, const WorkerResult&)>;

  // warm: --preload's warm process, which forks the Python workers (nullptr: none).
  AttemptWorkers(const Options& o, Guardian& guardian, WarmPython* warm = nullptr)
      : o_(o), guardian_(guardian), warm_(warm) {}

  // Starts every local rank of `plan`'s attempt `attempt`; folders under `dir`. Workers
  // whose exec failed are returned (their state says so), in local-rank order.
  std::vector<WorkerResult*> start(const JobPlan& plan, int attempt, const std::string& dir, int stdin_fd,
                                   const Env& base_env, const StreamOpener& open_stream, const EnvHook& env_hook);

  // Sends sig to every running worker's process group (mark_stopped: its exit is then
  // "stopped by ddprun", never a root cause); returns how many that was.
  int signal_live(int sig, bool mark_stopped);
  // The stop: sig (0: none, someone else signals them) now, SIGKILL at --shutdown-timeout.
  // Once per attempt; after restart_stop() a later call sends its own signal (and restarts
  // the deadline).
  void begin_stop(int sig);
  void restart_stop() { stopping_ = false; }
  // SIGKILL when the stop's deadline has passed.
  void escalate_if_due();
  // Reaps every child that exited; returns the workers that failed on their own, in the
  // order they were reaped. Orphans ddprun adopted (a subreaper) are reaped and ignored;
  // the warm process's exit is told to it.
  std::vector<WorkerResult*> reap();
  // Stops whatever the workers left behind: their groups, then every other descendant (the
  // guardian and the warm process excepted) get SIGTERM, and the deadline (kLeftoverGrace
  // from now) by which kill_leftovers() ends those still running; nullopt when nothing was
  // left. What was in groups of their own is named in a warning. `helper` (ddprun's own
  // process: Slurm's probe; -1: none) is left to kill_leftovers().
  std::optional<Clock::time_point> stop_leftovers(pid_t helper = -1);
  // Whether every descendant has ended (or is a zombie): those stop_leftovers() signalled,
  // and what they started since (but the guardian, the warm process and the helper).
  bool leftovers_gone() const;
  // SIGKILL for whatever is still left, and the groups forgotten.
  void kill_leftovers();
  // Hands the guardian the process groups of descendants that left their worker's group (a
  // new session: setsid, Popen(start_new_session=True)), which a SIGKILLed ddprun's guardian
  // would otherwise miss, and forgets those that emptied: when due (next_stray_look()).
  // Once a second while workers run, at once when one has exited (what it left would
  // otherwise be known to the leftovers' sweep alone), every 50 ms in the leftovers' grace.
  void look_for_strays();
  Clock::time_point next_stray_look() const { return next_stray_look_; }

  bool stopping() const { return stopping_; }
  int live() const { return live_; }
  std::optional<Clock::time_point> kill_deadline() const { return kill_deadline_; }
  // The job was suspended for d (Ctrl-Z): the workers' --shutdown-timeout is not spent.
  void suspended(Clock::duration d) {
    if (kill_deadline_) *kill_deadline_ += d;
  }
  // --preload's warm process (-1: none), stopped and continued with the workers.
  pid_t warm_pid() const;
  // WarmPython::show_stack, when there is a warm process.
  bool show_warm_stack(const std::string& why);
  std::vector<WorkerResult>& all() { return workers_; }
  const std::vector<WorkerResult>& all() const { return workers_; }

 private:
  void watch_strays();
  void forget_empty_strays();  // strays_ that emptied: the guardian forgets them
  void make_records(const JobPlan& plan, int attempt, const std::string& dir);

  const Options& o_;
  Guardian& guardian_;
  WarmPython* warm_;
  std::vector<WorkerResult> workers_;
  std::vector<WorkerGroup> groups_;  // workers_[i]'s process group
  std::set<pid_t> strays_;           // other groups of descendants, watched by the guardian
  Clock::time_point next_stray_look_ = Clock::now() + std::chrono::seconds(1);
  std::vector<pid_t> leftovers_;     // the descendants stop_leftovers() signalled
  pid_t leftover_helper_ = -1;       // stop_leftovers()'s helper: not waited for
  int live_ = 0;
  bool stopping_ = false;
  std::optional<Clock::time_point> kill_deadline_;
};

}  // namespace ddprun
