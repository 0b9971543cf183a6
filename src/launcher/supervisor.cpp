#include "launcher/supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <ctime>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "launcher/background.hpp"
#include "launcher/log.hpp"
#include "launcher/output.hpp"
#include "launcher/process.hpp"
#include "launcher/random.hpp"
#include "launcher/rendezvous.hpp"
#include "launcher/slurm_signals.hpp"
#include "launcher/stack_dump.hpp"
#include "launcher/streams.hpp"
#include "launcher/tmpdirs.hpp"

namespace ddprun {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using SysClock = std::chrono::system_clock;

namespace {

sigset_t supervised_set(const Options& o) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : o.signals_to_handle) sigaddset(&set, s);
  for (int s : {SIGCHLD, SIGUSR1, SIGUSR2}) sigaddset(&set, s);
  for (int s : StackDumps::trigger_signals(o)) sigaddset(&set, s);
  return set;
}

constexpr size_t kConsoleBound = 4 << 20;  // bytes queued per console before readers pause
constexpr int kTailLines = 20;
constexpr int kHistoryAttempts = 64;  // attempts whose workers --summary-json lists
constexpr long kTricklePauseNs = 1'000'000;

std::string random_suffix() {
  static const char* alphabet = "abcdefghijklmnopqrstuvwxyz0123456789_";
  uint64_t r = random_u64();
  std::string s;
  for (int i = 0; i < 8; ++i, r /= 37) s += alphabet[r % 37];
  return s;
}

}  // namespace

void block_supervised_signals(const Options& o) {
  sigset_t set = supervised_set(o);
  // A parent (a container runtime, an init, a shell) may leave signals ignored or blocked,
  // and both survive exec. An ignored SIGCHLD would make the kernel reap the workers before
  // ddprun sees their status, an ignored SIGTERM would never reach the signalfd: the
  // supervised signals get their default disposition back, and the mask is exactly them.
  for (int s = 1; s < NSIG; ++s) {
    struct sigaction old {};
    if (sigismember(&set, s) == 1 && sigaction(s, nullptr, &old) == 0 && old.sa_handler == SIG_IGN)
      signal(s, SIG_DFL);
  }
  pthread_sigmask(SIG_SETMASK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed console must not kill the launcher
}

struct Supervisor::Impl {
  const Options& o;
  JobPlan plan;
  std::map<std::string, std::string> base_env;
  Rendezvous& rdzv;
  int notify_tag = 0;  // epoll tag of the rendezvous's notify fd
  bool notify_registered = false;
  std::unique_ptr<SlurmSignals> slurm;  // inside a Slurm job: its signals taken once

  int epfd = -1, sigfd = -1, wakefd = -1, stdin_fd = -1;
  std::unique_ptr<ConsoleWriter> out_writer, err_writer;
  Console out_console, err_console;
  Guardian& guardian;

  std::string log_root;       // <log_dir>/<run_id>_<suffix>
  std::string tmp_root;       // mkdtemp'd when no --log-dir: removed after success
  std::unique_ptr<RunTmpDir> tmp_dir;  // tmp_root, locked while this run lives (tmpdirs.hpp)
  std::vector<WorkerResult> workers;  // current attempt
  std::unique_ptr<WorkerStreams> streams;  // this attempt's output pipes
  int live = 0;
  bool stopping = false;
  std::optional<Clock::time_point> kill_deadline;
  std::optional<Clock::time_point> drain_deadline;
  std::optional<WorkerResult> root;
  int got_signal = 0;
  Clock::time_point signal_at{};  // when got_signal came
  bool joining = false;           // join_round() is waiting for the next round
  int attempt = 0;
  std::optional<RoundEnd> remote_end;  // the round ended elsewhere (or the rendezvous ended it)
  std::string stop_reason;             // why no further round followed a failure
  bool looked_ahead = false;  // this round's prejoin() was asked for
  JobOutcome outcome;
  StackDumps stacks;  // every rank's stack: on demand, at a failure, at a hang (stack_dump.hpp)

  Impl(const Options& opt, std::map<std::string, std::string> env, Guardian& g, Rendezvous& r, std::string host)
      : o(opt), base_env(std::move(env)), rdzv(r), guardian(g), stacks(opt, host) {
    plan.run_id = o.rdzv_id;
    plan.hostname = std::move(host);
  }

  ~Impl() {
    // Also on an exception out of run(): spdlog must not write through a dead writer.
    route_logging_through(nullptr);
    streams.reset();  // its pipes leave the epoll set before it closes
    if (out_writer) out_writer->flush();
    if (err_writer) err_writer->flush();
    for (int fd : {epfd, sigfd, wakefd, stdin_fd})
      if (fd >= 0) close(fd);
  }

  void setup() {
    become_subreaper();
    slurm = SlurmSignals::create(o);
    sigset_t set = supervised_set(o);
    sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sigfd < 0) throw ddp::SystemError("signalfd", errno);
    wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (wakefd < 0 || epfd < 0) throw ddp::SystemError("epoll/eventfd", errno);
    add_fd(sigfd, nullptr);
    add_fd(wakefd, &wakefd);
    streams = std::make_unique<WorkerStreams>(epfd);
    out_writer = std::make_unique<ConsoleWriter>(1, kConsoleBound, wakefd);
    err_writer = std::make_unique<ConsoleWriter>(2, kConsoleBound, wakefd);
    out_console.writer = out_writer.get();
    err_console.writer = err_writer.get();
    route_logging_through(err_writer.get());
    setup_stdin();

    std::string base = o.log_dir;
    if (base.empty()) {
      // TMPDIR if set; else tmpfs (/dev/shm), where these few folders cost next to nothing
      // to make and remove (on a disk file system they were a third of a launch).
      const char* tmp = getenv("TMPDIR");
      std::string dir = tmp && *tmp ? tmp : access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm" : "/tmp";
      tmp_dir = std::make_unique<RunTmpDir>(dir);
      tmp_root = base = tmp_dir->path();
      if (prune_due(dir)) prune_run_tmp_dirs(dir);  // older finished runs' folders (README, "Using it")
    }
    log_root = base + "/" + plan.run_id + "_" + random_suffix();
    std::error_code ec;
    fs::create_directories(log_root, ec);
    if (ec) throw ddp::Error(fmt::format("--log-dir: cannot create {}: {}", log_root, ec.message()));
  }

  // Workers lead their own process groups, so on a terminal they are background jobs: a
  // read from it (input(), pdb) would stop them with SIGTTIN and hang the job. There they
  // read /dev/null instead (EOF at once); a piped or redirected stdin is inherited.
  void setup_stdin() {
    if (!isatty(0)) return;
    stdin_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }

  void add_fd(int fd, void* tag) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = tag;
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) throw ddp::SystemError("epoll_ctl", errno);
  }

  // ------------------------------------------------------------------ starting

  bool shown(int local_rank) const {
    return !o.local_ranks_filter || o.local_ranks_filter->count(local_rank) > 0;
  }

  int open_log(const std::string& path) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw ddp::SystemError(fmt::format("open log file {}", path), errno);
    return fd;
  }

  // A pipe for one worker stream, its forwarder, log file and console routing.
  int make_stream(int idx, bool is_stderr, const std::string& dir) {
    const int lr = workers[static_cast<size_t>(idx)].local_rank;
    const int bit = is_stderr ? 2 : 1;
    const bool redirect = o.redirects.of(lr) & bit, tee = o.tee.of(lr) & bit;
    ForwarderConfig cfg;
    int file_fd = -1;
    if (redirect || tee) file_fd = cfg.file_fd = open_log(dir + (is_stderr ? "/stderr.log" : "/stdout.log"));
    if (!(redirect && !tee) && shown(lr)) cfg.console = is_stderr ? &err_console : &out_console;
    cfg.prefix = expand_prefix(o.log_line_prefix_template.value_or("[rank${rank}]:"),
                               workers[static_cast<size_t>(idx)].rank, lr, o.role, plan.hostname);
    cfg.timestamps = o.log_timestamps;
    cfg.tail_lines = is_stderr ? kTailLines : 0;
    return streams->open(idx, is_stderr, std::move(cfg), file_fd);
  }

  void start_attempt() {
    if (slurm) slurm->attempt_starting();
    workers.clear();
    streams->clear();
    live = 0;
    stopping = false;
    kill_deadline.reset();
    drain_deadline.reset();
    root.reset();
    remote_end.reset();
    stacks.attempt_started();
    const std::string attempt_dir = this->attempt_dir();
    for (int lr = 0; lr < o.nproc_per_node; ++lr) {
      WorkerResult w;
      w.attempt = attempt;
      w.local_rank = lr;
      w.rank = plan.rank_base + lr;
      w.round = plan.round;
      w.host = plan.hostname;
      const std::string dir = fmt::format("{}/{}", attempt_dir, lr);
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) throw ddp::Error(fmt::format("cannot create {}: {}", dir, ec.message()));
      w.error_file = dir + "/error.json";
      ::unlink(w.error_file.c_str());  // a stale file must not be mistaken for this attempt's
      workers.push_back(std::move(w));
    }
    std::vector<SpawnResult> started;
    std::vector<std::string> paths;
    for (size_t i = 0; i < workers.size(); ++i) {
      WorkerResult& w = workers[i];
      const std::string dir = fmt::format("{}/{}", attempt_dir, w.local_rank);
      int out_w = make_stream(static_cast<int>(i), false, dir);
      int err_w = make_stream(static_cast<int>(i), true, dir);
      WorkerCommand cmd = worker_command(o, w.local_rank, base_env);
      auto env = worker_environment(o, plan, w.local_rank, w.error_file, base_env);
      stacks.add_env(env, w);
      SpawnSpec spec{cmd.path, cmd.argv, to_envp(env), stdin_fd, out_w, err_w};
      w.start = SysClock::now();
      started.push_back(spawn(spec));
      paths.push_back(cmd.path);
      close(out_w);
      close(err_w);
      w.pid = started.back().pid;
      w.state = WorkerResult::State::kRunning;
      guardian.watch(w.pid);
      ++live;
    }
    for (size_t i = 0; i < workers.size(); ++i) {
      WorkerResult& w = workers[i];
      if (int err = started[i].exec_errno) {
        w.state = WorkerResult::State::kExecFailed;
        w.exit_code = err == ENOENT ? 127 : 126;
        w.exec_error = describe_exec_failure(paths[i], err);
        w.end = SysClock::now();
        spdlog::error("rank {}: {}", w.rank, w.exec_error);
        fail(w);
      }
    }
    spdlog::info("attempt {}: started {} workers (ranks {}..{} of {})", attempt, workers.size(), plan.rank_base,
                 plan.rank_base + static_cast<int>(workers.size()) - 1, plan.world_size);
  }

  std::string attempt_dir() const { return fmt::format("{}/attempt_{}", log_root, attempt); }

  // ------------------------------------------------------------------ stopping

  void signal_live(int sig, bool mark_stopped) {
    for (auto& w : workers) {
      if (w.state != WorkerResult::State::kRunning) continue;
      if (kill(-w.pid, sig) != 0 && errno == ESRCH) kill(w.pid, sig);
      if (mark_stopped) w.stopped_by_ddprun = true;
    }
  }

  void begin_stop(int sig) {
    if (stopping) return;
    stopping = true;
    signal_live(sig, true);
    if (o.shutdown_timeout <= 0) {
      signal_live(SIGKILL, true);
    } else {
      kill_deadline = Clock::now() + std::chrono::milliseconds(static_cast<long>(o.shutdown_timeout * 1000));
    }
  }

  void fail(WorkerResult& w) {
    if (root) return;
    root = w;
    if (w.state != WorkerResult::State::kExecFailed) stacks.at_failure(workers, w, attempt_dir());  // bounded
    const std::string what = fmt::format("rank {} on {} exited with {}", w.rank, w.host,
                                         w.signal ? signal_name(w.signal) : std::to_string(w.exit_code));
    begin_stop(SIGTERM);  // the workers first: telling the others goes on in the background
    rdzv.end_round(RoundEnd::Kind::kFailed, what);
    look_ahead(RoundEnd{RoundEnd::Kind::kFailed, "", what});
  }

  // Kills whatever the workers left behind (their groups, then any other descendant).
  void kill_leftovers() {
    for (auto& w : workers)
      if (w.pid > 0) kill(-w.pid, SIGKILL);
    for (pid_t p : descendants())
      if (p != guardian.pid()) kill(p, SIGKILL);
  }

  // ------------------------------------------------------------------ events

  void reap() {
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
      auto it = std::find_if(workers.begin(), workers.end(), [&](auto& w) { return w.pid == pid; });
      if (it == workers.end()) continue;  // an orphan ddprun adopted as subreaper
      WorkerResult& w = *it;
      --live;
      if (w.state == WorkerResult::State::kExecFailed) continue;
      w.end = SysClock::now();
      if (WIFSIGNALED(st)) w.signal = WTERMSIG(st);
      else w.exit_code = WEXITSTATUS(st);
      if (!w.signal && w.exit_code == 0) {
        w.state = WorkerResult::State::kSucceeded;
      } else if (w.stopped_by_ddprun) {
        w.state = WorkerResult::State::kStopped;
      } else {
        w.state = WorkerResult::State::kFailed;
        // A line a person can read while the rest shuts down.
        spdlog::warn("rank {} (local_rank {}, pid {}) {}", w.rank, w.local_rank, w.pid,
                     w.signal ? fmt::format("was killed by {}", signal_name(w.signal))
                              : fmt::format("exited with code {}", w.exit_code));
        fail(w);
      }
    }
  }

  void on_signal() {
    signalfd_siginfo si;
    while (read(sigfd, &si, sizeof si) == sizeof si) {
      int sig = static_cast<int>(si.ssi_signo);
      if (sig == SIGCHLD) {
        reap();
        continue;
      }
      if (stacks.is_trigger(sig)) {
        err_writer->push_line(stacks.on_trigger(sig, static_cast<pid_t>(si.ssi_pid), workers, attempt_dir(), stopping));
        continue;
      }
      bool stops = std::find(o.signals_to_handle.begin(), o.signals_to_handle.end(), sig) != o.signals_to_handle.end();
      if (slurm && on_slurm_signal(slurm->classify(si, stops), sig)) continue;
      if (!stops) {  // SIGUSR1/SIGUSR2: Slurm's pre-emption notice, passed on
        spdlog::info("forwarding {} to the workers", signal_name(sig));
        signal_live(sig, false);
        continue;
      }
      if (got_signal) {
        spdlog::warn("received {} again: killing the workers now", signal_name(sig));
        signal_live(SIGKILL, true);
        continue;
      }
      got_signal = sig;
      signal_at = Clock::now();
      spdlog::warn("received {}: forwarding it to the workers, SIGKILL after {} s", signal_name(sig),
                   o.shutdown_timeout);
      stopping = false;  // begin_stop sends this signal, not SIGTERM
      begin_stop(sig);   // before anything that talks to the network
      if (!joining)      // (while joining there is no round to end: join_round cancels the join)
        rdzv.end_round(RoundEnd::Kind::kLeft, fmt::format("ddprun on {} received {}", plan.hostname, signal_name(sig)));
    }
  }

  // A signal Slurm sent (launcher/slurm_signals.hpp decides what it means); false when it
  // did not come from Slurm. Slurm signals every node of the step, but not at the same
  // moment: a stop is announced (stop_note) so that a node still waiting for it stops the
  // same way instead of taking this node's exit for a failure (slurm_stopped_elsewhere).
  bool on_slurm_signal(SlurmSignals::Act act, int sig) {
    using A = SlurmSignals::Act;
    if (act == A::kNotSlurm) return false;
    if (act == A::kForward) signal_live(sig, false);
    if (act == A::kStop || act == A::kStopQuiet) {
      const bool was_stopping = stopping;
      if (!stopping) begin_stop(act == A::kStop ? sig : 0);  // 0: nothing sent, the SIGKILL deadline set
      if (!got_signal) {
        got_signal = sig;
        signal_at = Clock::now();
        if (!was_stopping && !joining)
          rdzv.end_round(RoundEnd::Kind::kLeft, slurm->stop_note({sig, act == A::kStopQuiet}, plan.hostname));
      }
    }
    return true;
  }

  // True when `end` is another node's note that Slurm is stopping this step: this node
  // stops as if Slurm's signal had come (exit 128+signal): it sends the signal to its
  // workers, or, where Slurm signals the workers itself, leaves that to Slurm. The signal
  // itself, when it comes here, is then a duplicate.
  bool slurm_stopped_elsewhere(const RoundEnd& end) {
    if (!slurm || got_signal) return false;
    auto stop = slurm->stopped_elsewhere(end.describe());
    if (!stop) return false;
    spdlog::warn("{}: Slurm stops every node of the step, so this node stops too ({}, SIGKILL after {} s)",
                 end.describe(),
                 stop->direct ? "its workers get " + signal_name(stop->sig) + " from Slurm"
                              : signal_name(stop->sig) + " to the workers",
                 o.shutdown_timeout);
    got_signal = stop->sig;
    signal_at = Clock::now();
    if (!stopping) begin_stop(stop->direct ? 0 : stop->sig);
    return true;
  }

  void resume_paused() {
    uint64_t v;
    while (read(wakefd, &v, sizeof v) == sizeof v) {
    }
    streams->resume_paused();
  }

  void on_remote() {
    auto end = rdzv.round_end();
    if (!end || stopping || remote_end) return;
    if (slurm_stopped_elsewhere(*end)) return;
    remote_end = end;
    using K = RoundEnd::Kind;
    if (end->kind == K::kScaleUp)
      spdlog::warn("round {}: {}: stopping this node's workers to restart them in a bigger round", plan.round,
                   end->describe());
    else if (end->node_only())
      spdlog::error("{}: stopping this node's workers", end->describe());
    else
      spdlog::warn("{}: stopping this node's workers", end->describe());
    begin_stop(SIGTERM);
    look_ahead(*end);
  }

  // Dynamic rendezvous: while the workers stop, already ask whether another round may
  // follow and join it (in the background: its last call then runs during their teardown).
  void look_ahead(const RoundEnd& end) {
    if (!o.dynamic() || looked_ahead || got_signal) return;
    looked_ahead = true;
    rdzv.prejoin(end);
  }

  // Runs one attempt to its end: every worker exited and every stream drained.
  void supervise() {
    epoll_event evs[64];
    for (;;) {
      if (live == 0 && !drain_deadline) {
        kill_leftovers();
        drain_deadline = Clock::now() + std::chrono::seconds(5);
      }
      if (live == 0 && streams->open_count() == 0) break;
      if (live == 0 && Clock::now() >= *drain_deadline && !streams->close_unpaused()) break;
      auto next = Clock::now() + std::chrono::seconds(3600);
      for (auto& d : {kill_deadline, drain_deadline, stacks.next_hang_check()})
        if (d) next = std::min(next, *d);
      next = streams->flush_idle(next);
      // Output that trickles in small writes (python -u writes every line on its own) is
      // read in batches: a short pause lets the pipes fill, so a burst of lines costs one
      // wake-up instead of one per line. Floods (full reads) and idle pipes never pause.
      if (streams->trickling() && !stopping) {
        timespec pause{0, kTricklePauseNs};
        nanosleep(&pause, nullptr);
      }
      int n = epoll_wait(epfd, evs, 64, timeout_ms(next));
      if (n < 0 && errno != EINTR) throw ddp::SystemError("epoll_wait", errno);
      for (int i = 0; i < n; ++i) {
        void* tag = evs[i].data.ptr;
        if (tag == nullptr) on_signal();
        else if (tag == &wakefd) resume_paused();
        else if (tag == &notify_tag) on_remote();
        else streams->on_readable(*static_cast<WorkerStreams::Stream*>(tag));
      }
      escalate_if_due();
      if (!stopping && live > 0 && stacks.hung_now(streams->last_read(), workers)) on_hang();
    }
    streams->close_all();
    for (auto& w : workers) w.stderr_tail = streams->stderr_tail(static_cast<int>(&w - workers.data()));
  }

  // --hang-timeout passed with no progress: stacks shown, the attempt fails (exit 124).
  void on_hang() {
    err_writer->push_line(stacks.on_hang(workers, attempt_dir()));
    begin_stop(SIGTERM);
    rdzv.end_round(RoundEnd::Kind::kFailed, *stacks.hang());
    look_ahead(RoundEnd{RoundEnd::Kind::kFailed, "", *stacks.hang()});
  }

  static int timeout_ms(Clock::time_point next) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count();
    return static_cast<int>(std::max<long>(0, ms + 1));
  }

  void escalate_if_due() {
    if (!kill_deadline || Clock::now() < *kill_deadline) return;
    spdlog::warn("workers still running {} s after the stop signal: sending SIGKILL", o.shutdown_timeout);
    signal_live(SIGKILL, true);
    kill_deadline.reset();
  }

  // ------------------------------------------------------------------ the job

  // The rendezvous's notify fd exists once the first round is joined (static: multi-node).
  void watch_rendezvous() {
    if (notify_registered || rdzv.notify_fd() < 0) return;
    add_fd(rdzv.notify_fd(), &notify_tag);
    notify_registered = true;
  }

  // After this node's workers all succeeded: how the round ended for everyone (a signal
  // to ddprun meanwhile ends the wait; got_signal says so).
  std::optional<RoundEnd> wait_round_end() {
    if (auto end = rdzv.arrive_exit()) return end;
    while (!got_signal)
      for (void* tag : wait_between_attempts())
        if (tag == &notify_tag)
          if (auto end = rdzv.round_end()) return end;
    return std::nullopt;
  }

  // One wait while no worker runs (joining, waiting for the others at the exit): signals
  // and the console writers are served here; the tags of other ready fds are returned.
  std::vector<void*> wait_between_attempts() {
    epoll_event evs[16];
    int n = epoll_wait(epfd, evs, 16, -1);
    if (n < 0 && errno != EINTR) throw ddp::SystemError("epoll_wait", errno);
    std::vector<void*> ready;
    for (int i = 0; i < n; ++i) {
      void* tag = evs[i].data.ptr;
      if (tag == nullptr) on_signal();
      else if (tag == &wakefd) resume_paused();
      else ready.push_back(tag);
    }
    return ready;
  }

  // How this attempt's round ended, seen from this node.
  std::optional<RoundEnd> attempt_end() {
    if (got_signal) return std::nullopt;
    if (root)
      return RoundEnd{RoundEnd::Kind::kFailed, "",
                      fmt::format("rank {} {}", root->rank,
                                  root->signal ? "was killed by " + signal_name(root->signal)
                                               : fmt::format("exited with code {}", root->exit_code))};
    if (stacks.hang()) return RoundEnd{RoundEnd::Kind::kFailed, "", *stacks.hang()};
    if (remote_end) return remote_end;
    return wait_round_end();
  }

  // --summary-json lists the workers of the last kHistoryAttempts attempts: a job that
  // restarts a thousand times does not hold a thousand attempts' records. Only a failed
  // worker's record keeps its stderr (its traceback).
  void keep_history() {
    for (auto& w : workers) {
      outcome.workers.push_back(w);
      if (!w.failed()) outcome.workers.back().stderr_tail = std::vector<std::string>();
    }
    std::erase_if(outcome.workers, [&](const WorkerResult& w) { return w.attempt <= attempt - kHistoryAttempts; });
  }

  void announce_restart(const RoundEnd& end) {
    if (plan.round >= 0) {
      if (end.counted())
        spdlog::warn("round {} ended ({}): forming the next round (a restart; --max-restarts {})", plan.round,
                     end.describe(), o.max_restarts);
      else
        spdlog::warn("round {} ended ({}): forming the next round (not counted as a restart)", plan.round,
                     end.describe());
      return;
    }
    spdlog::warn("attempt {} failed ({}); restarting all workers: attempt {} of {}", attempt, end.describe(),
                 attempt + 1, o.max_restarts);
  }

  // The next round, joined on a thread of its own while this one still reads signals: a
  // signal during a join (nodes still missing, a store that does not answer) stops this
  // node at once (nullopt). The thread owns what it touches (background.hpp).
  std::optional<JobPlan> join_round() {
    if (!rdzv.joins_over_network()) return rdzv.next_round();
    struct Join {
      std::optional<JobPlan> plan;
      std::exception_ptr error;
      int fd = -1;
      ~Join() {
        if (fd >= 0) close(fd);
      }
    };
    auto j = std::make_shared<Join>();
    j->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (j->fd < 0) throw ddp::SystemError("eventfd", errno);
    BackgroundTask task([j, r = &rdzv] {
      try {
        j->plan = r->next_round();
      } catch (...) {
        j->error = std::current_exception();
      }
      uint64_t one = 1;
      ssize_t n = write(j->fd, &one, sizeof one);
      (void)n;
    });
    add_fd(j->fd, &j->fd);
    // The last round's end stays unread until the next round runs (level-triggered).
    if (notify_registered) epoll_ctl(epfd, EPOLL_CTL_DEL, rdzv.notify_fd(), nullptr);
    joining = true;
    bool joined = false;
    while (!joined && !got_signal)
      for (void* tag : wait_between_attempts()) joined |= tag == &j->fd;
    epoll_ctl(epfd, EPOLL_CTL_DEL, j->fd, nullptr);
    if (notify_registered) add_fd(rdzv.notify_fd(), &notify_tag);
    joining = false;
    if (!joined) {
      rdzv.cancel();
      if (!task.wait_until(Clock::now() + std::chrono::seconds(2))) task.abandon();
      return std::nullopt;
    }
    task.wait();
    if (j->error) std::rethrow_exception(j->error);
    return j->plan;
  }

  JobOutcome run() {
    outcome.start = SysClock::now();
    setup();
    for (attempt = 0;; ++attempt) {
      auto joined = join_round();
      if (!joined) break;  // a signal while joining
      plan = *joined;
      watch_rendezvous();
      start_attempt();
      supervise();
      for (auto& w : workers)
        if (root && w.pid == root->pid) root = w;  // now with its stderr tail
      keep_history();
      auto end = attempt_end();
      if (!end || slurm_stopped_elsewhere(*end)) break;  // a signal (here, or Slurm's on another node)
      if (end->kind == RoundEnd::Kind::kDone) break;
      if (!root && !stacks.hang()) remote_end = end;  // this node succeeded, the round did not
      stop_reason = rdzv.restart_refused(*end);  // prejoin's answer when it was asked
      looked_ahead = false;
      if (!stop_reason.empty()) {
        // A node cut off said why as it stopped its workers, and says it last again: no third line.
        if ((o.max_restarts > 0 || !end->counted()) && !(end->node_only() && stop_reason == end->text))
          spdlog::error("not restarting: {}", stop_reason);
        break;
      }
      announce_restart(*end);
    }
    outcome.restarts = plan.restart_count;
    outcome.end = SysClock::now();
    finish();
    return outcome;
  }

  // A node stopping on a signal is gone by the time the SIGKILL escalation would have
  // ended (at least a second after now): the goodbye to the others is bounded by it.
  void finish_rendezvous() {
    using F = FinishKind;
    if (abandoned_anything()) return;  // a join still runs inside the rendezvous: leave it be
    if (got_signal) {
      auto by = std::max(signal_at + std::chrono::milliseconds(static_cast<long>(o.shutdown_timeout * 1000)),
                         Clock::now() + std::chrono::seconds(1));
      return rdzv.finish(F::kNodeStopped, "", by);
    }
    if (!root && !remote_end && !stacks.hang()) return rdzv.finish(F::kSucceeded, "", std::nullopt);
    rdzv.finish(remote_end && remote_end->node_only() ? F::kNodeStopped : F::kJobFailed, stop_reason, std::nullopt);
  }

  void finish() {
    // Nothing outlives the job (each attempt already killed what its workers left behind),
    // and as PID 1 everything in the namespace goes.
    if (getpid() == 1) kill(-1, SIGKILL);
    guardian.disarm();
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    route_logging_through(nullptr);
    out_writer->flush();
    err_writer->flush();

    if (got_signal) {
      outcome.status = "signaled";
      outcome.signal = got_signal;
      outcome.exit_code = 128 + got_signal;
      spdlog::warn("stopped after {}: exiting with {}", signal_name(got_signal), outcome.exit_code);
    } else if (root) {
      outcome.status = "failed";
      outcome.root_cause = root;
      outcome.exit_code = root->status_code();
      std::vector<WorkerResult> others;
      for (auto& w : workers)
        if (w.pid != root->pid && (w.failed() || w.state == WorkerResult::State::kStopped)) others.push_back(w);
      std::string summary = failure_summary(o.script, *root, others, stacks.failure_note());
      ssize_t r = write(2, summary.data(), summary.size());
      (void)r;
      if (const char* ef = getenv("TORCHELASTIC_ERROR_FILE"); ef && *ef)
        write_root_cause_error_file(ef, *root, o.script);
    } else if (stacks.hang()) {
      outcome.status = "failed";
      outcome.exit_code = StackDumps::kHangExitCode;
      ssize_t r = write(2, stacks.hang_report().data(), stacks.hang_report().size());
      (void)r;
    } else if (remote_end) {
      outcome.status = "failed";
      outcome.exit_code = 1;
      if (remote_end->node_only())
        spdlog::error("{}", remote_end->describe());
      else
        spdlog::error("the job failed on another node: {}", remote_end->describe());
    } else {
      outcome.status = "succeeded";
      outcome.exit_code = 0;
    }
    if (!o.summary_json.empty()) write_summary_json(o.summary_json, outcome, plan.run_id);
    finish_rendezvous();
    if (!tmp_root.empty() && outcome.exit_code == 0) {
      std::error_code ec;
      fs::remove_all(tmp_root, ec);
    }
  }
};

Supervisor::Supervisor(const Options& o, std::map<std::string, std::string> base_env, Guardian& guardian,
                       Rendezvous& rdzv, std::string hostname)
    : impl_(std::make_unique<Impl>(o, std::move(base_env), guardian, rdzv, std::move(hostname))) {}
Supervisor::~Supervisor() = default;
JobOutcome Supervisor::run() { return impl_->run(); }

}  // namespace ddprun
