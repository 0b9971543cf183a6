#include "launcher/slurm_signals.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

namespace ddprun {

namespace {

int g_probe_fd = -1;  // in the probe process only

void on_probe_signal(int sig, siginfo_t* si, void*) {
  int32_t msg[2] = {sig, static_cast<int32_t>(si->si_pid)};
  ssize_t r = ::write(g_probe_fd, msg, sizeof msg);  // async-signal-safe; 8 bytes are atomic on a pipe
  (void)r;
}

// The probe: after fork, only async-signal-safe calls (ddprun may have threads by now).
[[noreturn]] void probe_main(int fd, pid_t parent) {
  setsid();  // its own session and process group, as every worker
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(0);
  prctl(PR_SET_NAME, "ddprun-probe");
  int nul = ::open("/dev/null", O_RDWR);
  for (int i = 0; i < 3 && nul >= 0; ++i) dup2(nul, i);
  if (fd != 3) {
    dup2(fd, 3);
    fd = 3;
  }
  close_range(4, ~0U, 0);  // no store socket or console pipe held open by the probe
  g_probe_fd = fd;
  struct sigaction sa {};
  sa.sa_sigaction = on_probe_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigfillset(&sa.sa_mask);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT, SIGALRM, SIGPIPE, SIGXCPU})
    sigaction(s, &sa, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);  // ddprun's blocked signals arrive now
  for (;;) pause();
}

std::string comm_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/comm");
  std::string c;
  std::getline(f, c);
  return c;
}

}  // namespace

std::unique_ptr<SlurmSignals> SlurmSignals::create(const Options& o) {
  if (o.no_slurm) return nullptr;
  const char* job = getenv("SLURM_JOB_ID");
  if (!job || !*job) return nullptr;
  return std::unique_ptr<SlurmSignals>(new SlurmSignals(o));
}

SlurmSignals::SlurmSignals(const Options& o) : o_(o) {
  const char* step = getenv("SLURM_STEP_ID");
  step_ = fmt::format("{}.{}", getenv("SLURM_JOB_ID"), step && *step ? step : "batch");
}

namespace {
std::string stop_marker(const std::string& step) { return fmt::format("Slurm is stopping step {} (signal ", step); }
constexpr std::string_view kDirect = "; Slurm signals the workers too)";
constexpr std::string_view kPassedOn = "; Slurm signals ddprun only)";
}  // namespace

std::string slurm_stop_note(const std::string& step, SlurmStop stop, const std::string& host) {
  return fmt::format("{}{}, {}{}: ddprun on {} got it first", stop_marker(step), stop.sig, signal_name(stop.sig),
                     stop.direct ? kDirect : kPassedOn, host);
}

std::optional<SlurmStop> slurm_stop_in(const std::string& text, const std::string& step) {
  const std::string marker = stop_marker(step);
  size_t at = text.find(marker);
  if (at == std::string::npos) return std::nullopt;
  SlurmStop stop;
  const char* p = text.data() + at + marker.size();
  const char* end = text.data() + text.size();
  auto [after, ec] = std::from_chars(p, end, stop.sig);
  if (ec != std::errc() || after == end || *after != ',' || stop.sig <= 0 || stop.sig >= NSIG) return std::nullopt;
  const std::string_view rest(after, static_cast<size_t>(end - after));
  const size_t close = rest.find(')');
  if (close == std::string_view::npos) return std::nullopt;
  const std::string_view inside = rest.substr(0, close + 1);
  stop.direct = inside.ends_with(kDirect);
  if (!stop.direct && !inside.ends_with(kPassedOn)) return std::nullopt;
  return stop;
}

std::optional<SlurmStop> SlurmSignals::stopped_elsewhere(const std::string& round_end) {
  auto stop = slurm_stop_in(round_end, step_);
  if (stop && !stopping_) stopping_ = peer_stop_ = true;
  return stop;
}

SlurmSignals::~SlurmSignals() { stop_probe(); }

void SlurmSignals::attempt_starting() {
  if (read_reports(0)) return;  // still running (its pipe is not at EOF)
  stop_probe();
  start_probe();
}

void SlurmSignals::start_probe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return;  // no probe: Slurm's signals are forwarded
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) probe_main(fds[1], parent);
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return;
  }
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  probe_ = pid;
  probe_fd_ = fds[0];
}

void SlurmSignals::stop_probe() {
  // Only while its pipe is open is the probe surely alive (its pid not yet reused).
  if (probe_ > 0 && read_reports(0)) kill(probe_, SIGKILL);  // reaped by the supervisor's waitpid(-1)
  if (probe_fd_ >= 0) close(probe_fd_);
  probe_fd_ = -1;
  probe_ = -1;
}

// Reads the probe's reports, waiting up to timeout_ms for the first; false at EOF.
bool SlurmSignals::read_reports(int timeout_ms) {
  if (probe_fd_ < 0) return false;
  pollfd p{probe_fd_, POLLIN, 0};
  if (timeout_ms > 0 && poll(&p, 1, timeout_ms) <= 0) return true;
  int32_t msg[2];
  ssize_t n;
  while ((n = read(probe_fd_, msg, sizeof msg)) == sizeof msg) {
    if (npending_ == 64) npending_ = 0;  // only ever a few: Slurm sends a handful per job
    pending_[npending_][0] = msg[0];
    pending_[npending_][1] = msg[1];
    ++npending_;
  }
  if (n == 0) {  // the probe died
    close(probe_fd_);
    probe_fd_ = -1;
    return false;
  }
  return true;
}

bool SlurmSignals::from_slurm(pid_t sender) {
  if (sender <= 0) return false;
  if (sender == stepd_) return true;
  if (comm_of(sender) != "slurmstepd") return false;
  stepd_ = sender;
  return true;
}

// Did the workers get Slurm's `sig` from Slurm itself? Asks the probe (see the header).
bool SlurmSignals::workers_got(int sig, pid_t sender) {
  auto take = [&] {
    for (int i = 0; i < npending_; ++i)
      if (pending_[i][0] == sig && pending_[i][1] == sender) {
        pending_[i][0] = pending_[npending_ - 1][0];
        pending_[i][1] = pending_[npending_ - 1][1];
        --npending_;
        return true;
      }
    return false;
  };
  if (direct_ != Direct::kUnknown) {
    read_reports(0);
    take();
    return direct_ == Direct::kYes;
  }
  const auto deadline = std::chrono::steady_clock::now() + kProbeWait;
  for (;;) {
    if (!read_reports(0)) return false;  // no probe: unknown, forward
    if (take()) {
      direct_ = Direct::kYes;
      spdlog::info(
          "Slurm signals every process of this step (proctrack/linuxproc): ddprun does not pass its "
          "signals on to the workers, which get them from Slurm");
      return true;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    read_reports(static_cast<int>(left.count()) + 1);
  }
  direct_ = Direct::kNo;
  spdlog::info("Slurm signals only ddprun in this step, not its workers: ddprun passes its signals on");
  return false;
}

SlurmSignals::Act SlurmSignals::classify(const signalfd_siginfo& si, bool stops) {
  const int sig = static_cast<int>(si.ssi_signo);
  const pid_t sender = static_cast<pid_t>(si.ssi_pid);
  if (!from_slurm(sender)) return Act::kNotSlurm;
  const bool direct = workers_got(sig, sender);
  const std::string name = signal_name(sig);
  if (!stops) {
    spdlog::info("Slurm sent {} (--signal or scancel -s): {}; the job keeps running", name,
                 direct ? "the workers got it from Slurm" : "passing it on to the workers");
    return direct ? Act::kNoted : Act::kForward;
  }
  if (stopping_) {
    spdlog::info("Slurm sent {} {}: already stopping (a duplicate, not a request to kill at once)", name,
                 peer_stop_ ? "here too, after another node" : "again");
    peer_stop_ = false;
    return Act::kIgnore;
  }
  stopping_ = true;
  spdlog::warn("Slurm sent {} (scancel, time limit or preemption): stopping the workers ({}), SIGKILL after {} s "
               "(or at Slurm's KillWait, when that comes first)",
               name, direct ? "they got it from Slurm" : "passing it on", o_.shutdown_timeout);
  return direct ? Act::kStopQuiet : Act::kStop;
}

}  // namespace ddprun
