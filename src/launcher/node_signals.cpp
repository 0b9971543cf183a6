#include "launcher/node_signals.hpp"

#include <signal.h>

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "launcher/attempt.hpp"

namespace ddprun {

NodeSignals::~NodeSignals() = default;

void NodeSignals::start() { slurm_ = SlurmSignals::create(o_); }

void NodeSignals::attempt_starting() {
  if (slurm_) slurm_->attempt_starting();
}

pid_t NodeSignals::helper_pid() const { return slurm_ ? slurm_->probe_pid() : -1; }

bool NodeSignals::stops(int sig) const {
  const auto stop_signals = o_.stop_signals();
  return std::find(stop_signals.begin(), stop_signals.end(), sig) != stop_signals.end();
}

void NodeSignals::take(const signalfd_siginfo& si) {
  const int sig = static_cast<int>(si.ssi_signo);
  const bool stopping = stops(sig);
  if (slurm_ && on_slurm_signal(slurm_->classify(si, stopping), sig)) return;
  if (!stopping) {  // SIGUSR1/SIGUSR2: Slurm's pre-emption notice, passed on
    spdlog::info("forwarding {} to the workers", signal_name(sig));
    pass_on(sig);
    return;
  }
  if (got_ && copy_of_first(si)) return;
  ++stops_taken_;
  if (got_) {
    spdlog::warn("received {} again: killing the workers now", signal_name(sig));
    workers_.signal_live(SIGKILL, true);
    return;
  }
  got_ = sig;
  at_ = Clock::now();
  const int forward = o_.forwarded(sig);
  if (workers_.stopping() && workers_.live() > 0) {  // (a failure, a restart): no second signal, no new clock
    while_stopping_ = true;
    spdlog::warn("received {} while the workers are stopping already: they are not signalled again, and get "
                 "SIGKILL when they would have",
                 signal_name(sig));
  } else if (workers_.live() == 0)  // in the rendezvous, the warm process's import, or after the workers ended
    spdlog::warn("received {} while no worker runs: stopping", signal_name(sig));
  else if (forward == sig)
    spdlog::warn("received {}: forwarding it to the workers, SIGKILL after {} s", signal_name(sig), o_.shutdown_timeout);
  else
    spdlog::warn("received {} (not in --signals-to-handle): stopping the workers with {}, SIGKILL after {} s",
                 signal_name(sig), signal_name(forward), o_.shutdown_timeout);
  if (!while_stopping_) {
    workers_.restart_stop();       // begin_stop sends this signal, not SIGTERM
    workers_.begin_stop(forward);  // before anything that talks to the network
  }
  end_note_ = fmt::format("ddprun on {} received {}", plan_.hostname, signal_name(sig));
  if (!joining_) end_round();  // (while joining there is no round to end: join_round cancels the join)
}

// `timeout` sends its signal to ddprun and then to its process group (ddprun again), and a
// wrapper that forwards signals sends one more: copies of the first, microseconds to a few
// milliseconds later, read as a second signal when the first was read in between. A
// keypress at the terminal (sent by the kernel) is always a person's second Ctrl-C.
bool NodeSignals::copy_of_first(const signalfd_siginfo& si) const {
  const auto since = Clock::now() - at_;
  if (si.ssi_code == SI_KERNEL || since >= kCopies) return false;
  spdlog::info("received {} again from pid {}, {:.3f} s after the first: taken as a copy of it (as `timeout` sends "
               "one to ddprun and one to its process group), not as a second signal that kills at once",
               signal_name(static_cast<int>(si.ssi_signo)), si.ssi_pid,
               std::chrono::duration<double>(since).count());
  return true;
}

void NodeSignals::end_round() {
  if (!end_note_.empty()) rdzv_.end_round(RoundEnd::Kind::kLeft, end_note_);
}

// A signal Slurm sent (launcher/slurm_signals.hpp decides what it means); false when it
// did not come from Slurm. Slurm signals every node of the step, but not at the same
// moment: a stop is announced (stop_note) so that a node still waiting for it stops the
// same way instead of taking this node's exit for a failure (stopped_elsewhere).
bool NodeSignals::on_slurm_signal(SlurmSignals::Act act, int sig) {
  using A = SlurmSignals::Act;
  if (act == A::kNotSlurm) return false;
  if (act == A::kForward) pass_on(sig);
  if (act == A::kStop || act == A::kStopQuiet) {
    const bool was_stopping = workers_.stopping();
    workers_.begin_stop(act == A::kStop ? o_.forwarded(sig) : 0);  // 0: nothing sent, the SIGKILL deadline set
    if (!got_) {
      got_ = sig;
      at_ = Clock::now();
      if (!was_stopping) end_note_ = slurm_->stop_note({sig, act == A::kStopQuiet}, plan_.hostname);
      if (!joining_) end_round();
    }
  }
  return true;
}

// A signal that does not stop the job, to the running workers. None running (the round is
// forming, or the workers finished or restart): it is not kept for the next ones, which
// could die of it before their handler is in place; the user hears that it reached nobody.
void NodeSignals::pass_on(int sig) {
  if (workers_.signal_live(sig, false) == 0)
    spdlog::warn("{} reached no worker: none is running on this node now ({}); the job keeps running",
                 signal_name(sig), joining_ ? "it is joining the rendezvous" : "its workers have finished, or restart");
}

bool NodeSignals::stopped_elsewhere(const RoundEnd& end) {
  if (!slurm_ || got_) return false;
  auto stop = slurm_->stopped_elsewhere(end.describe());
  if (!stop) return false;
  spdlog::warn("{}: Slurm stops every node of the step, so this node stops too ({}, SIGKILL after {} s or at Slurm's "
               "KillWait, when that comes first)",
               end.describe(),
               stop->direct ? "its workers get " + signal_name(stop->sig) + " from Slurm"
                            : signal_name(stop->sig) + " to the workers",
               o_.shutdown_timeout);
  got_ = stop->sig;
  at_ = Clock::now();
  workers_.begin_stop(stop->direct ? 0 : stop->sig);
  return true;
}

NodeSignals::Clock::time_point NodeSignals::leave_by() const {
  return std::max(at_ + std::chrono::milliseconds(static_cast<long>(o_.shutdown_timeout * 1000)),
                  Clock::now() + kLastGoodbye);
}

}  // namespace ddprun
