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
#include <functional>
#include <optional>
#include <ctime>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "launcher/attempt.hpp"
#include "launcher/background.hpp"
#include "launcher/log.hpp"
#include "launcher/output.hpp"
#include "launcher/preload.hpp"
#include "launcher/process.hpp"
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
  WarmPython warm;         // --preload's warm process (inert without the flag)
  int warm_tag = 0;        // epoll tag of its answer
  AttemptWorkers workers;  // this attempt's
  std::unique_ptr<WorkerStreams> streams;  // this attempt's output pipes
  std::optional<Clock::time_point> drain_deadline;
  std::optional<WorkerResult> root;
  int got_signal = 0;
  Clock::time_point signal_at{};  // when got_signal came
  bool joining = false;           // off_loop() waits for the rendezvous (no round to end)
  int attempt = 0;
  std::optional<RoundEnd> remote_end;  // the round ended elsewhere (or the rendezvous ended it)
  std::string stop_reason;             // why no further round followed a failure
  bool looked_ahead = false;  // this round's prejoin() was asked for
  JobOutcome outcome;
  StackDumps stacks;  // every rank's stack: on demand, at a failure, at a hang (stack_dump.hpp)
  int dumps_asked = 0;  // dumps asked on this node (they name the dump on every node)

  Impl(const Options& opt, std::map<std::string, std::string> env, Guardian& g, Rendezvous& r, std::string host)
      : o(opt), base_env(std::move(env)), rdzv(r), guardian(g), warm(opt, g), workers(opt, g, &warm), stacks(opt, host) {
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

    RunFolders f = make_run_folders(o.log_dir, plan.run_id);
    tmp_dir = std::move(f.tmp_dir);
    tmp_root = f.tmp_root;
    log_root = f.log_root;
    // --preload: the import runs while this node joins the rendezvous.
    if (warm.enabled()) warm.start(node_environment(o, base_env));
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
    const WorkerResult& w = workers.all()[static_cast<size_t>(idx)];
    const int lr = w.local_rank;
    const int bit = is_stderr ? 2 : 1;
    const bool redirect = o.redirects.of(lr) & bit, tee = o.tee.of(lr) & bit;
    ForwarderConfig cfg;
    int file_fd = -1;
    if (redirect || tee) file_fd = cfg.file_fd = open_log(dir + (is_stderr ? "/stderr.log" : "/stdout.log"));
    if (!(redirect && !tee) && shown(lr)) cfg.console = is_stderr ? &err_console : &out_console;
    cfg.prefix = expand_prefix(o.log_line_prefix_template.value_or("[rank${rank}]:"), w.rank, lr, o.role,
                               plan.hostname);
    cfg.timestamps = o.log_timestamps;
    cfg.tail_lines = is_stderr ? kTailLines : 0;
    return streams->open(idx, is_stderr, std::move(cfg), file_fd);
  }

  void start_attempt() {
    if (slurm) slurm->attempt_starting();
    streams->clear();
    drain_deadline.reset();
    root.reset();
    remote_end.reset();
    stacks.attempt_started();
    auto open_stream = [this](int idx, bool is_stderr, const std::string& dir) {
      return make_stream(idx, is_stderr, dir);
    };
    auto add_env = [this](AttemptWorkers::Env& env, const WorkerResult& w) { stacks.add_env(env, w); };
    auto failed = workers.start(plan, attempt, attempt_dir(), stdin_fd, base_env, open_stream, add_env);
    for (WorkerResult* w : failed) fail(*w);
    spdlog::info("attempt {}: started {} workers (ranks {}..{} of {})", attempt, workers.all().size(), plan.rank_base,
                 plan.rank_base + static_cast<int>(workers.all().size()) - 1, plan.world_size);
  }

  // --preload: the warm process (a new one if it died) has imported its modules before the
  // workers start; a signal meanwhile stops this node (false). Throws when it cannot be.
  bool wait_warm() {
    warm.start(node_environment(o, base_env));  // nothing while one runs (or without --preload)
    const int fd = warm.pending_fd();
    if (fd < 0) return true;
    add_fd(fd, &warm_tag);
    bool answered = false;
    while (!answered && !got_signal)
      for (void* tag : wait_between_attempts()) answered |= tag == &warm_tag;
    epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
    if (answered) warm.on_ready();
    return answered;
  }

  std::string attempt_dir() const { return fmt::format("{}/attempt_{}", log_root, attempt); }

  // ------------------------------------------------------------------ stopping

  // The first failure is the root cause: the workers are stopped first, then the other
  // nodes told (in the background).
  void fail(WorkerResult& w) {
    if (root) return;
    root = w;
    if (w.state != WorkerResult::State::kExecFailed) stacks.at_failure(workers.all(), w, attempt_dir());  // bounded
    const std::string what = fmt::format("rank {} on {} exited with {}", w.rank, w.host,
                                         w.signal ? signal_name(w.signal) : std::to_string(w.exit_code));
    workers.begin_stop(SIGTERM);
    rdzv.end_round(RoundEnd::Kind::kFailed, what);
    look_ahead(RoundEnd{RoundEnd::Kind::kFailed, "", what});
  }

  // ------------------------------------------------------------------ events

  void reap() {
    for (WorkerResult* w : workers.reap()) fail(*w);
    prefer_announced_root();
  }

  // A rank that announced its uncaught exception failed first, in whatever order the exits
  // are reaped: its peers fail on its closed sockets while its own exit may still run. (Not
  // when the stop's SIGTERM ended it: its exit status would tell nothing.)
  void prefer_announced_root() {
    const pid_t first = stacks.announced_failure();
    if (!root || first <= 0 || root->pid == first) return;
    for (auto& w : workers.all())
      if (w.pid == first && (w.state == WorkerResult::State::kStopped || w.state == WorkerResult::State::kFailed) &&
          !w.signal && w.exit_code != 0) {
        w.state = WorkerResult::State::kFailed;
        root = w;
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
        if (!stacks.on_failure_notice(sig, static_cast<pid_t>(si.ssi_pid), workers.all(), attempt_dir(),
                                      workers.stopping()))
          dump_stacks(signal_name(sig));
        continue;
      }
      bool stops = std::find(o.signals_to_handle.begin(), o.signals_to_handle.end(), sig) != o.signals_to_handle.end();
      if (slurm && on_slurm_signal(slurm->classify(si, stops), sig)) continue;
      if (!stops) {  // SIGUSR1/SIGUSR2: Slurm's pre-emption notice, passed on
        spdlog::info("forwarding {} to the workers", signal_name(sig));
        workers.signal_live(sig, false);
        continue;
      }
      if (got_signal) {
        spdlog::warn("received {} again: killing the workers now", signal_name(sig));
        workers.signal_live(SIGKILL, true);
        continue;
      }
      got_signal = sig;
      signal_at = Clock::now();
      spdlog::warn("received {}: forwarding it to the workers, SIGKILL after {} s", signal_name(sig),
                   o.shutdown_timeout);
      workers.restart_stop();  // begin_stop sends this signal, not SIGTERM
      workers.begin_stop(sig);  // before anything that talks to the network
      if (!joining)      // (while joining there is no round to end: join_round cancels the join)
        rdzv.end_round(RoundEnd::Kind::kLeft, fmt::format("ddprun on {} received {}", plan.hostname, signal_name(sig)));
    }
  }

  // Every local rank's stack on this node's stderr; asked here (`trigger`: the signal), the
  // other nodes are asked too, and every node's output names the same dump.
  void dump_stacks(const std::string& trigger) {
    const std::string what = fmt::format("dump {} asked on node {} ({})", ++dumps_asked, plan.group_rank,
                                         plan.hostname);
    if (plan.group_world_size > 1) rdzv.ask_dump(what);
    err_writer->push_line(stacks.on_demand(workers.all(), attempt_dir(), fmt::format("{} ({})", trigger, what)));
  }

  // A signal Slurm sent (launcher/slurm_signals.hpp decides what it means); false when it
  // did not come from Slurm. Slurm signals every node of the step, but not at the same
  // moment: a stop is announced (stop_note) so that a node still waiting for it stops the
  // same way instead of taking this node's exit for a failure (slurm_stopped_elsewhere).
  bool on_slurm_signal(SlurmSignals::Act act, int sig) {
    using A = SlurmSignals::Act;
    if (act == A::kNotSlurm) return false;
    if (act == A::kForward) workers.signal_live(sig, false);
    if (act == A::kStop || act == A::kStopQuiet) {
      const bool was_stopping = workers.stopping();
      workers.begin_stop(act == A::kStop ? sig : 0);  // 0: nothing sent, the SIGKILL deadline set
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
    workers.begin_stop(stop->direct ? 0 : stop->sig);
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
    for (const auto& what : rdzv.dump_requests())
      if (!workers.stopping()) err_writer->push_line(stacks.on_demand(workers.all(), attempt_dir(), what));
    if (!end || workers.stopping() || remote_end) return;
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
    if (end->kind == K::kFailed) stacks.at_remote_failure(workers.all(), attempt_dir());  // bounded
    workers.begin_stop(SIGTERM);
    look_ahead(*end);
  }

  // Multi-node: while the workers stop, already ask whether another round may follow and
  // join it (in the background: a last call then runs during their teardown).
  void look_ahead(const RoundEnd& end) {
    if (!rdzv.joins_over_network() || looked_ahead || got_signal) return;
    looked_ahead = true;
    rdzv.prejoin(end);
  }

  // Runs one attempt to its end: every worker exited and every stream drained.
  void supervise() {
    epoll_event evs[64];
    for (;;) {
      const int live = workers.live();
      if (live == 0 && !drain_deadline) {
        workers.kill_leftovers();
        drain_deadline = Clock::now() + std::chrono::seconds(5);
      }
      if (live == 0 && streams->open_count() == 0) break;
      if (live == 0 && Clock::now() >= *drain_deadline && !streams->close_unpaused()) break;
      auto next = Clock::now() + std::chrono::seconds(3600);
      for (auto& d : {workers.kill_deadline(), drain_deadline, stacks.next_hang_check()})
        if (d) next = std::min(next, *d);
      next = streams->flush_idle(next);
      // Output that trickles in small writes (python -u writes every line on its own) is
      // read in batches: a short pause lets the pipes fill, so a burst of lines costs one
      // wake-up instead of one per line. Floods (full reads) and idle pipes never pause.
      if (streams->trickling() && !workers.stopping()) {
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
      workers.escalate_if_due();
      if (!workers.stopping() && workers.live() > 0) check_hang();
    }
    streams->close_all();
    auto& all = workers.all();
    for (size_t i = 0; i < all.size(); ++i) all[i].stderr_tail = streams->stderr_tail(static_cast<int>(i));
  }

  // --hang-timeout: progress is judged over the whole job (a node whose ranks print
  // nothing while rank 0's log moves is not hung), through the rendezvous's count.
  void check_hang() {
    bool moved = false;
    const bool several = plan.group_world_size > 1;
    const bool checked = stacks.next_hang_check() && Clock::now() >= *stacks.next_hang_check();
    auto job = several ? rdzv.job_progress() : std::nullopt;
    const bool hung = stacks.hung_now(streams->last_read(), workers.all(), several,
                                      job ? std::optional<int64_t>(job->count) : std::nullopt,
                                      job ? job->read_at : Clock::time_point{}, moved);
    if (checked && several) rdzv.note_progress(moved ? 1 : 0);
    if (hung) on_hang();
  }

  // --hang-timeout passed with no progress: stacks shown, the attempt fails (exit 124).
  void on_hang() {
    err_writer->push_line(stacks.on_hang(workers.all(), attempt_dir()));
    workers.begin_stop(SIGTERM);
    rdzv.end_round(RoundEnd::Kind::kFailed, *stacks.hang());
    look_ahead(RoundEnd{RoundEnd::Kind::kFailed, "", *stacks.hang()});
  }

  static int timeout_ms(Clock::time_point next) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count();
    return static_cast<int>(std::max<long>(0, ms + 1));
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
    for (auto& w : workers.all()) {
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

  // Runs `call` (a rendezvous call that may wait for the network) on a thread of its own
  // while this one still reads signals: a signal meanwhile stops this node at once
  // (nullopt; the call is cancelled, and abandoned if it does not end within 2 s). The
  // thread owns what it touches (background.hpp).
  template <class T>
  std::optional<T> off_loop(std::function<T()> call) {
    struct Call {
      std::optional<T> value;
      std::exception_ptr error;
      int fd = -1;
      ~Call() {
        if (fd >= 0) close(fd);
      }
    };
    auto c = std::make_shared<Call>();
    c->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->fd < 0) throw ddp::SystemError("eventfd", errno);
    BackgroundTask task([c, call = std::move(call)] {
      try {
        c->value = call();
      } catch (...) {
        c->error = std::current_exception();
      }
      uint64_t one = 1;
      ssize_t n = write(c->fd, &one, sizeof one);
      (void)n;
    });
    add_fd(c->fd, &c->fd);
    // The last round's end stays unread until the next round runs (level-triggered).
    if (notify_registered) epoll_ctl(epfd, EPOLL_CTL_DEL, rdzv.notify_fd(), nullptr);
    joining = true;
    bool done = false;
    while (!done && !got_signal)
      for (void* tag : wait_between_attempts()) done |= tag == &c->fd;
    epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, nullptr);
    if (notify_registered) add_fd(rdzv.notify_fd(), &notify_tag);
    joining = false;
    if (!done) {
      rdzv.cancel();
      if (!task.wait_until(Clock::now() + std::chrono::seconds(2))) task.abandon();
      return std::nullopt;
    }
    task.wait();
    if (c->error) std::rethrow_exception(c->error);
    return c->value;
  }

  // The next round (nullopt: a signal came while joining).
  std::optional<JobPlan> join_round() {
    if (!rdzv.joins_over_network()) return rdzv.next_round();
    return off_loop<JobPlan>([r = &rdzv] { return r->next_round(); });
  }

  // Whether another round may follow `end` ("" when it may; nullopt: a signal came while
  // the rendezvous was asked). prejoin's answer when it was asked.
  std::optional<std::string> restart_refusal(const RoundEnd& end) {
    if (!rdzv.joins_over_network()) return rdzv.restart_refused(end);
    return off_loop<std::string>([r = &rdzv, end] { return r->restart_refused(end); });
  }

  JobOutcome run() {
    outcome.start = SysClock::now();
    setup();
    for (attempt = 0;; ++attempt) {
      auto joined = join_round();
      if (!joined) break;  // a signal while joining
      plan = *joined;
      watch_rendezvous();
      if (!wait_warm()) break;  // a signal while the warm process imports
      start_attempt();
      supervise();
      for (auto& w : workers.all())
        if (root && w.pid == root->pid) root = w;  // now with its stderr tail
      keep_history();
      auto end = attempt_end();
      if (!end || slurm_stopped_elsewhere(*end)) break;  // a signal (here, or Slurm's on another node)
      if (end->kind == RoundEnd::Kind::kDone) break;
      if (!root && !stacks.hang()) remote_end = end;  // this node succeeded, the round did not
      auto refusal = restart_refusal(*end);
      if (!refusal) break;  // a signal
      stop_reason = *refusal;
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
    warm.stop();  // (not left to a destructor: an abandoned goodbye ends ddprun without them)
    guardian.disarm();
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    route_logging_through(nullptr);
    out_writer->flush();
    err_writer->flush();

    JobEnd end;
    end.signal = got_signal;
    if (root) {
      end.root = &*root;
      for (auto& w : workers.all())
        if (w.pid != root->pid && (w.failed() || w.state == WorkerResult::State::kStopped)) end.others.push_back(w);
    }
    end.where = stacks.failure_note();
    if (stacks.hang()) end.hang_report = &stacks.hang_report();
    if (remote_end) {
      end.remote = remote_end->describe();
      end.remote_node_only = remote_end->node_only();
    }
    conclude(outcome, end, o.script);
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
