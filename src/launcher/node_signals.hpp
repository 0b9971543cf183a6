// The signals to ddprun that stop this node or reach its workers (SIGCHLD and the stack
// dumps' triggers are the supervisor's): one of --signals-to-handle stops the node, the
// workers signalled before anything that talks to the network, and a second one kills them
// at once (not a copy of the first sent within kCopies, see copy_of_first); SIGUSR1/SIGUSR2
// are passed on; inside a Slurm job, Slurm's own signals are taken once (slurm_signals.hpp),
// also when another node announces them.
#pragma once

#include <sys/signalfd.h>

#include <chrono>
#include <memory>

#include "launcher/options.hpp"
#include "launcher/rendezvous.hpp"
#include "launcher/slurm_signals.hpp"
#include "launcher/worker.hpp"

namespace ddprun {

class AttemptWorkers;

class NodeSignals {
 public:
  using Clock = std::chrono::steady_clock;
  // A stop signal that comes within this of the first, from a process (not the terminal),
  // is a copy of it: it does not kill the workers at once.
  static constexpr std::chrono::milliseconds kCopies{1000};
  // plan: the running round's (it names this node in the note to the others).
  NodeSignals(const Options& o, AttemptWorkers& workers, Rendezvous& rdzv, const JobPlan& plan)
      : o_(o), workers_(workers), rdzv_(rdzv), plan_(plan) {}
  ~NodeSignals();

  void start();             // inside a Slurm job: its signals are taken from now on
  void attempt_starting();  // before an attempt's workers start (Slurm's probe)
  pid_t helper_pid() const;  // the process ddprun runs for its signals (Slurm's probe), else -1
  // A signal read from the signalfd, neither SIGCHLD nor a stack-dump trigger.
  void take(const signalfd_siginfo& si);
  // Whether sig stops the job (--signals-to-handle).
  bool stops(int sig) const;
  // True when `end` is another node's note that Slurm is stopping this step: this node
  // stops as if Slurm's signal had come (exit 128+signal): it sends the signal to its
  // workers, or, where Slurm signals the workers itself, leaves that to Slurm. The signal
  // itself, when it comes here, is then a duplicate.
  bool stopped_elsewhere(const RoundEnd& end);
  // While joining there is no round to end (the join is cancelled instead).
  void joining(bool j) { joining_ = j; }
  // Ends the round with the note that says why this node stops (after got(); nothing when
  // its workers were stopping already). take() does when no join runs; join_round does
  // for a round that formed as the signal came (both seen in one wake-up).
  void end_round();

  int got() const { return got_; }  // the signal that stops this node (0: none)
  // The signal came while the workers were stopping already (a failure here or elsewhere, a
  // hang): they were not signalled again, their SIGKILL deadline stands, and the failure,
  // not the signal, is how the job ended (a pod's `podman stop` after a rank failed ended
  // it as 143 with no summary; QA).
  bool came_while_stopping() const { return while_stopping_; }
  int stops_taken() const { return stops_taken_; }  // stop signals taken so far (the first, and "again")
  // Why this node stops, as the other nodes read it ("ddprun on HOST received SIGTERM"; ""
  // when its workers were stopping already).
  const std::string& end_note() const { return end_note_; }
  // When the SIGKILL escalation of the stop would end, at least kLastGoodbye after now (a
  // goodbye on a working network takes milliseconds; one given up is noticed through the
  // lease). A grace period just under --shutdown-timeout (Kubernetes') is kept to within it.
  Clock::time_point leave_by() const;
  static constexpr std::chrono::milliseconds kLastGoodbye{200};

 private:
  bool on_slurm_signal(SlurmSignals::Act act, int sig);
  bool copy_of_first(const signalfd_siginfo& si) const;
  void pass_on(int sig);

  const Options& o_;
  AttemptWorkers& workers_;
  Rendezvous& rdzv_;
  const JobPlan& plan_;
  std::unique_ptr<SlurmSignals> slurm_;  // inside a Slurm job: its signals taken once
  int got_ = 0;
  int stops_taken_ = 0;
  Clock::time_point at_{};  // when got_ came
  bool joining_ = false;    // the supervisor waits for the rendezvous (no round to end)
  bool while_stopping_ = false;  // got_ came while the workers were stopping already
  std::string end_note_;    // what ends the round for the other nodes ("": nothing)
};

}  // namespace ddprun
