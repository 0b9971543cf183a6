// The signals Slurm sends to a job's processes, taken once (docs/slurm.md, "Signals").
//
// What Slurm 22.05 delivers depends on its process tracking plugin (measured with
// tests/slurm/workers/signal_probe.py, and read in Slurm's proctrack plugins):
//   proctrack/cgroup    only the task (ddprun, a child of slurmstepd) gets scancel's
//                       SIGCONT+SIGTERM, a time limit's SIGTERM (sent twice), --signal's and
//                       scancel -s's signals; the workers get nothing but the final SIGKILL.
//   proctrack/linuxproc every descendant of slurmstepd gets them all, straight from Slurm,
//                       workers in their own process groups included (deepest first).
//   proctrack/pgid      ddprun's process group only; workers lead their own groups.
// So whether a worker already got a signal cannot be told from the signal alone. ddprun
// measures it: a probe process, placed exactly like a worker (a child of ddprun leading its
// own session), reports every signal it gets. When Slurm's signal reaches ddprun and
// the probe got it from Slurm too, the workers did as well and ddprun does not send it
// again; otherwise ddprun forwards it. The answer is learnt from the first signal (at most
// kProbeWait after it) and kept for the job.
//
// Slurm's duplicates (the second SIGTERM of a time limit) never count as the "second
// signal" that kills at once: ddprun stops once, each worker gets one SIGTERM from one of
// them, and ddprun exits 128+signal.
#pragma once

#include <sys/signalfd.h>
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "launcher/options.hpp"

namespace ddprun {

// Slurm's stop reaches the nodes of a step at different times (each node's slurmd gets
// its own message). A node that gets it first tells the others with this note (through
// the rendezvous, as a node leaving), so that one that has not got it yet stops the same
// way (exit 128+signal) instead of taking the first node's exit for a failure of the job.
// `direct`: Slurm signals the workers itself (proctrack/linuxproc; the same on every node
// of a cluster), so a node that reads the note sends its workers nothing and lets Slurm's
// own signal reach them. `step` is "<job>.<step>": only the same step's note counts.
struct SlurmStop {
  int sig = 0;
  bool direct = false;
};
std::string slurm_stop_note(const std::string& step, SlurmStop stop, const std::string& host);
// The stop announced by `step`'s note in `text` (a round end's description), if any.
std::optional<SlurmStop> slurm_stop_in(const std::string& text, const std::string& step);

class SlurmSignals {
 public:
  static constexpr std::chrono::milliseconds kProbeWait{300};

  // nullptr outside a Slurm job (no SLURM_JOB_ID) or with --no-slurm.
  static std::unique_ptr<SlurmSignals> create(const Options& o);
  ~SlurmSignals();

  // Before an attempt's workers start: a probe runs (ddprun kills all it started at the end
  // of each attempt, the probe too).
  void attempt_starting();
  // The probe's pid while it runs, else -1: ddprun's own, not a worker's leftover.
  pid_t probe_pid() const { return probe_; }

  enum class Act {
    kNotSlurm,   // not from Slurm: ddprun's usual rules apply
    kIgnore,     // a duplicate of a stop signal already taken
    kForward,    // a notification the workers did not get: send it to them, keep running
    kNoted,      // a notification the workers got from Slurm themselves: keep running
    kStop,       // stop, sending this signal to the workers
    kStopQuiet,  // stop; the workers got this signal from Slurm themselves
  };
  // What a signal read from ddprun's signalfd means. `stops`: one of --signals-to-handle.
  // Logs what it decided. May wait up to kProbeWait for the probe (the first time only).
  Act classify(const signalfd_siginfo& si, bool stops);

  // Stop notes (slurm_stop_note) for this step: the one this node sends after a stop signal
  // of its own, and whether a round end is another node's (then this node stops too, and
  // Slurm's own signal, when it comes, is a duplicate).
  std::string stop_note(SlurmStop stop, const std::string& host) const { return slurm_stop_note(step_, stop, host); }
  std::optional<SlurmStop> stopped_elsewhere(const std::string& round_end);

 private:
  explicit SlurmSignals(const Options& o);
  bool from_slurm(pid_t sender);
  bool workers_got(int sig, pid_t sender);
  bool read_reports(int timeout_ms);
  void start_probe();
  void stop_probe();

  const Options& o_;
  std::string step_;  // "<SLURM_JOB_ID>.<SLURM_STEP_ID>"
  bool peer_stop_ = false;  // the stop came from another node's note
  pid_t stepd_ = -1;  // the slurmstepd that sent a signal, once seen
  pid_t probe_ = -1;
  int probe_fd_ = -1;  // the probe's reports: {signal, sender pid} pairs
  enum class Direct { kUnknown, kYes, kNo } direct_ = Direct::kUnknown;
  bool stopping_ = false;    // a stop signal from Slurm was taken
  int pending_[64][2] = {};  // reports read, not yet matched
  int npending_ = 0;
};

}  // namespace ddprun
