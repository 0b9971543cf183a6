#include "launcher/attempt.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "launcher/guardian.hpp"
#include "launcher/numa.hpp"
#include "launcher/preload.hpp"
#include "launcher/process.hpp"

namespace ddprun {

namespace fs = std::filesystem;

void AttemptWorkers::make_records(const JobPlan& plan, int attempt, const std::string& dir) {
  workers_.clear();
  std::vector<int> folderless;
  std::string why;
  for (int lr = 0; lr < o_.nproc_per_node; ++lr) {
    WorkerResult w;
    w.attempt = attempt;
    w.local_rank = lr;
    w.rank = plan.rank_base + lr;
    w.round = plan.round;
    w.host = plan.hostname;
    const std::string wdir = fmt::format("{}/{}", dir, lr);
    // A folder that cannot be made (a full disk) is said, and the attempt runs without it:
    // no error file, heartbeat or progress file is named to the worker, its log files are
    // left out (redirected lines go to the console), and its failure is reported from its
    // exit status.
    std::error_code ec;
    fs::create_directories(wdir, ec);
    if (ec) {
      w.no_folder = true;
      folderless.push_back(w.rank);
      if (why.empty()) why = fmt::format("{} ({})", wdir, ec.message());
    }
    w.error_file = wdir + "/error.json";
    ::unlink(w.error_file.c_str());  // a stale file must not be mistaken for this attempt's
    workers_.push_back(std::move(w));
  }
  if (!folderless.empty())
    spdlog::warn("cannot create {}: rank{} {} run{} without error file{} and log files this attempt (what "
                 "--redirects sends to them goes to the console)",
                 why, folderless.size() > 1 ? "s" : "", fmt::join(folderless, ", "),
                 folderless.size() > 1 ? "" : "s", folderless.size() > 1 ? "s" : "");
  groups_.clear();
  groups_.resize(workers_.size());
}

std::vector<WorkerResult*> AttemptWorkers::start(const JobPlan& plan, int attempt, const std::string& dir,
                                                 int stdin_fd, const Env& base_env, const StreamOpener& open_stream,
                                                 const EnvHook& env_hook) {
  live_ = 0;
  stopping_ = false;
  kill_deadline_.reset();
  next_stray_look_ = Clock::now() + std::chrono::seconds(1);
  make_records(plan, attempt, dir);
  std::vector<SpawnSpec> specs;
  for (size_t i = 0; i < workers_.size(); ++i) {
    WorkerResult& w = workers_[i];
    const std::string wdir = fmt::format("{}/{}", dir, w.local_rank);
    WorkerCommand cmd = worker_command(o_, w.local_rank, base_env);
    w.interpreter = cmd.interpreter;
    Env env = worker_environment(o_, plan, w.local_rank, w.error_file, base_env);
    if (env_hook) env_hook(env, w);
    if (w.no_folder)  // (files in a folder that is not there: torch's @record would fail writing its own)
      for (const char* k : {"TORCHELASTIC_ERROR_FILE", "DDPRUN_HEARTBEAT_FILE", "DDPRUN_PROGRESS_FILE"}) env.erase(k);
    const auto [out_fd, err_fd] = open_stream(static_cast<int>(i), wdir);
    // A worker writing into a terminal of ddprun's (streams.hpp) has no keyboard on it: a
    // pager (`git log`, pydoc's help(), psql) would wait there for keys that never come, the
    // one a user's shell exports too. Its pager is cat.
    if (isatty(out_fd) == 1 || isatty(err_fd) == 1)
      for (const char* pager : {"PAGER", "GIT_PAGER", "MANPAGER", "SYSTEMD_PAGER"}) env[pager] = "cat";
    specs.push_back(SpawnSpec{cmd.path, cmd.argv, to_envp(env), stdin_fd, out_fd, err_fd});
    specs.back().ignore_sighup = workers_ignore_sighup(o_.signals_to_handle);
    specs.back().announce_fd = guardian_.announce_fd();
    if (!o_.worker_cpus.empty()) specs.back().cpus = o_.worker_cpus.at(static_cast<size_t>(w.local_rank));
  }
  // --preload: forked by the warm process, all at once; what it could not, cold.
  std::vector<SpawnResult> started = warm_ && warm_->ready() ? warm_->spawn(specs) : std::vector<SpawnResult>();
  started.resize(specs.size());
  for (size_t i = 0; i < workers_.size(); ++i) {
    WorkerResult& w = workers_[i];
    w.start = std::chrono::system_clock::now();
    const bool cold = started[i].pid <= 0;
    if (cold) started[i] = spawn(specs[i]);
    close(specs[i].stdout_fd);
    close(specs[i].stderr_fd);
    if (started[i].fork_failed) continue;  // no process: failed below
    w.pid = started[i].pid;
    w.state = WorkerResult::State::kRunning;
    // A stray group whose number this worker now has emptied unseen (a wrap of the pid
    // space): the guardian forgets that copy and keeps this worker's.
    if (strays_.erase(w.pid)) guardian_.forget(w.pid);
    groups_[i] = WorkerGroup(w.pid);
    if (!cold) guardian_.watch(w.pid);  // (a cold start told the guardian itself, before its exec)
    ++live_;
  }
  std::vector<WorkerResult*> failed;
  for (size_t i = 0; i < workers_.size(); ++i) {
    WorkerResult& w = workers_[i];
    if (int err = started[i].exec_errno) {
      w.state = WorkerResult::State::kExecFailed;
      w.exit_code = started[i].fork_failed ? 1 : err == ENOENT ? 127 : 126;
      w.exec_error = started[i].fork_failed ? describe_fork_failure(err)
                     : started[i].bind_failed
                         ? fmt::format("cannot bind to CPUs {} (--numa-binding): {}", cpu_list_text(specs[i].cpus),
                                       ddp::errno_text(err))
                         : describe_exec_failure(specs[i].path, err);
      w.end = std::chrono::system_clock::now();
      spdlog::error("rank {}: {}", w.rank, w.exec_error);
      failed.push_back(&w);
    }
  }
  return failed;
}

namespace {

// Whether pid has exited and waits to be reaped (looked at, not reaped): ddprun may not
// have read its exit yet (a failure's stacks being taken, several exits in one wake-up).
bool exited_unreaped(pid_t pid) {
  siginfo_t si{};
  return waitid(P_PID, static_cast<id_t>(pid), &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid;
}

}  // namespace

pid_t AttemptWorkers::warm_pid() const { return warm_ ? warm_->pid() : -1; }

bool AttemptWorkers::show_warm_stack(const std::string& why) { return warm_ && warm_->show_stack(why); }

// A worker that had exited before the stop signal failed (or succeeded) by itself: it is
// not marked as stopped by ddprun, or the summary would hide its failure.
int AttemptWorkers::signal_live(int sig, bool mark_stopped) {
  int n = 0;
  for (size_t i = 0; i < workers_.size(); ++i) {
    WorkerResult& w = workers_[i];
    if (w.state != WorkerResult::State::kRunning) continue;
    // (looked at before the signal: a worker it kills at once must count as stopped)
    if (mark_stopped && !w.stopped_by_ddprun && !exited_unreaped(w.pid)) w.stopped_by_ddprun = true;
    groups_[i].signal(sig);
    ++n;
  }
  return n;
}

void AttemptWorkers::begin_stop(int sig) {
  if (stopping_) return;
  stopping_ = true;
  signal_live(sig, true);
  if (o_.shutdown_timeout <= 0) {
    signal_live(SIGKILL, true);
  } else {
    kill_deadline_ = Clock::now() + std::chrono::milliseconds(static_cast<long>(o_.shutdown_timeout * 1000));
  }
}

void AttemptWorkers::escalate_if_due() {
  if (!kill_deadline_ || Clock::now() < *kill_deadline_) return;
  spdlog::warn("workers still running {} s after the stop signal: sending SIGKILL", o_.shutdown_timeout);
  signal_live(SIGKILL, true);
  kill_deadline_.reset();
}

std::vector<WorkerResult*> AttemptWorkers::reap() {
  std::vector<WorkerResult*> failed;
  int st;
  pid_t pid;
  bool reaped = false;
  while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
    reaped = true;
    auto it = std::find_if(workers_.begin(), workers_.end(), [&](auto& w) { return w.pid == pid; });
    if (it == workers_.end()) {  // an orphan ddprun adopted as subreaper, or the warm process
      if (warm_) warm_->exited(pid, st);
      continue;
    }
    WorkerResult& w = *it;
    --live_;
    next_stray_look_ = Clock::now();  // what it left, at the loop's next look (after the failure's handling)
    if (groups_[it - workers_.begin()].leader_reaped()) guardian_.forget(w.pid);
    if (w.state == WorkerResult::State::kExecFailed) continue;
    w.end = std::chrono::system_clock::now();
    if (WIFSIGNALED(st)) w.signal = WTERMSIG(st);
    else w.exit_code = WEXITSTATUS(st);
    if (!w.signal && w.exit_code == 0) {
      w.state = WorkerResult::State::kSucceeded;
    } else if (w.stopped_by_ddprun) {
      w.state = WorkerResult::State::kStopped;
    } else {
      w.state = WorkerResult::State::kFailed;
      failed.push_back(&w);
    }
  }
  if (reaped && !strays_.empty()) forget_empty_strays();  // (their numbers are free once empty)
  return failed;
}

void AttemptWorkers::look_for_strays() {
  const auto now = Clock::now();
  if ((live_ == 0 && leftovers_.empty()) || now < next_stray_look_) return;
  watch_strays();
  // (During the leftovers' grace, as often as ddprun looks whether they are gone: a SIGTERM
  // handler may start a clean-up of its own in a new session.)
  next_stray_look_ = now + (live_ == 0 ? std::chrono::milliseconds(50) : std::chrono::milliseconds(1000));
}

void AttemptWorkers::watch_strays() {
  forget_empty_strays();
  std::set<pid_t> known{::getpgrp()};
  for (const auto& g : groups_)
    if (g.id() > 0) known.insert(g.id());
  std::set<pid_t> warm;  // the warm process and its spare workers are not the workers'
  if (warm_ && warm_->pid() > 0) {
    warm.insert(warm_->pid());
    for (pid_t p : descendants(-1, warm_->pid())) warm.insert(p);
  }
  for (pid_t p : descendants(guardian_.pid())) {
    const pid_t g = ::getpgid(p);
    if (g <= 0 || warm.count(p) || known.count(g) || strays_.count(g)) continue;
    spdlog::debug("pid {} left its worker's process group (group {}): the guardian watches that group too", p, g);
    guardian_.watch(g);
    strays_.insert(g);
  }
}

namespace {

// "1234 (sleep 300)": a pid and the start of its command line; empty when it has just gone
// (nothing to name as being stopped).
std::string leftover_name(pid_t p) {
  std::string cmd = cmdline_of(p);
  if (cmd.empty()) return "";
  if (cmd.size() > 60) cmd = cmd.substr(0, 57) + "...";
  return fmt::format("{} ({})", p, cmd);
}

}  // namespace

// What the workers left running gets SIGTERM first: a daemon or an upload they started can
// end cleanly (a partial file removed) within the grace; then SIGKILL.
std::optional<AttemptWorkers::Clock::time_point> AttemptWorkers::stop_leftovers(pid_t helper) {
  for (auto& g : groups_) g.signal(SIGTERM);  // (a group long empty: not by its number, process.hpp)
  std::set<pid_t> known{::getpgrp()};
  for (const auto& g : groups_)
    if (g.id() > 0) known.insert(g.id());
  // What the workers left in groups of their own was likely left running on purpose: say so,
  // a group a line (its leader, or the first found, and how many more).
  std::map<pid_t, std::pair<std::string, size_t>> own_groups;
  leftovers_.clear();
  leftover_helper_ = helper;
  // (Not the warm process's own children: its spare workers wait there for the next attempt.)
  for (pid_t p : descendants(warm_ ? warm_->pid() : -1)) {
    // (Slurm's probe would report a SIGTERM as Slurm's: it gets its SIGKILL with the rest.)
    if (p == guardian_.pid() || p == helper || process_gone(p)) continue;
    if (const pid_t g = ::getpgid(p); g > 0 && !known.count(g)) {
      if (strays_.insert(g).second) guardian_.watch(g);  // (if ddprun dies within the grace)
      if (std::string name = leftover_name(p); !name.empty()) {
        auto& [named, count] = own_groups[g];
        if (named.empty() || p == g) named = std::move(name);
        ++count;
      }
    }
    kill(p, SIGTERM);
    leftovers_.push_back(p);
  }
  if (!own_groups.empty()) {
    std::vector<std::string> names;
    for (const auto& [g, left] : own_groups)
      names.push_back(left.second > 1 ? fmt::format("{} and {} more in its group", left.first, left.second - 1)
                                      : left.first);
    spdlog::warn("the workers have exited, and what they left running in process groups of their own (setsid, "
                 "start_new_session) is stopped (SIGTERM, SIGKILL {} s later): {}. A worker's processes never "
                 "outlive its attempt: start what must go on outside ddprun",
                 std::chrono::duration_cast<std::chrono::seconds>(kLeftoverGrace).count(), fmt::join(names, "; "));
  }
  if (leftovers_.empty()) return std::nullopt;
  return Clock::now() + kLeftoverGrace;
}

// Every descendant, not only those signalled: a leftover's SIGTERM handler may start a
// clean-up of its own, which has the rest of the grace too.
bool AttemptWorkers::leftovers_gone() const {
  for (pid_t p : descendants(warm_ ? warm_->pid() : -1))
    if (p != guardian_.pid() && p != leftover_helper_ && !process_gone(p)) return false;
  return true;
}

void AttemptWorkers::kill_leftovers() {
  for (auto& g : groups_) g.signal(SIGKILL);
  // Every descendant still there, not the pids recorded (one reaped since may be reused).
  for (pid_t p : descendants(warm_ ? warm_->pid() : -1))
    if (p != guardian_.pid()) kill(p, SIGKILL);
  leftovers_.clear();
  // Forgotten once empty, not before: a process a listing missed (reparented to ddprun as
  // it was read) stays the guardian's. Those not yet empty are looked at as strays are.
  for (auto& g : groups_) {
    if (!g.empty() && g.id() > 0) strays_.insert(g.id());
    g = WorkerGroup();
  }
  forget_empty_strays();
}

void AttemptWorkers::forget_empty_strays() {
  for (auto it = strays_.begin(); it != strays_.end();) {
    if (::kill(-*it, 0) != 0 && errno == ESRCH) {
      guardian_.forget(*it);  // (its number is free: never to be killed now)
      it = strays_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace ddprun
