#include "launcher/supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "launcher/attempt.hpp"
#include "launcher/event_loop.hpp"
#include "launcher/file_timer.hpp"
#include "launcher/guardian.hpp"
#include "launcher/job_record.hpp"
#include "launcher/log.hpp"
#include "launcher/node_signals.hpp"
#include "launcher/output.hpp"
#include "launcher/preload.hpp"
#include "launcher/process.hpp"
#include "launcher/rendezvous.hpp"
#include "launcher/stack_dump.hpp"
#include "launcher/streams.hpp"
#include "launcher/tmpdirs.hpp"

namespace ddprun {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

sigset_t supervised_set(const Options& o) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : o.stop_signals()) sigaddset(&set, s);
  for (int s : {SIGCHLD, SIGUSR1, SIGUSR2, SIGTSTP, SIGWINCH}) sigaddset(&set, s);
  for (int s : StackDumps::trigger_signals(o)) sigaddset(&set, s);
  return set;
}

// Whether two descriptors reach the same file, pipe or terminal (`2>&1`).
bool same_file(int a, int b) {
  struct stat x {}, y {};
  if (fstat(a, &x) != 0 || fstat(b, &y) != 0) return false;
  return x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

// epoll_wait's timeout until `next` (rounded up: never woken just before it).
int timeout_ms(Clock::time_point next) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count();
  return static_cast<int>(std::max<long>(0, ms + 1));
}

constexpr size_t kConsoleBound = 4 << 20;  // bytes queued per console before readers pause
constexpr int kTailLines = 20;
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

namespace {

// What the parts of the supervisor share: the rendezvous, the running round and attempt.
struct Job {
  Job(Rendezvous& r, std::map<std::string, std::string> env) : rdzv(r), base_env(std::move(env)) {}
  std::string attempt_dir() const { return fmt::format("{}/attempt_{}", log_root, attempt); }

  Rendezvous& rdzv;
  std::map<std::string, std::string> base_env;
  JobPlan plan;
  int attempt = 0;
  int max_restarts = 0;   // --max-restarts
  std::string log_root;  // <log_dir>/<run_id>_<suffix>
};

// Where output goes: ddprun's stdout and stderr, each written by a thread of its own with
// a bound (output.hpp; spdlog goes through stderr's), and the attempt's worker streams
// (streams.hpp), each with its log file, console and prefix.
class NodeOutput {
 public:
  NodeOutput(const Options& o, const JobPlan& plan) : o_(o), plan_(plan) {}
  ~NodeOutput() { close_filtered(); }
  NodeOutput(const NodeOutput&) = delete;
  NodeOutput& operator=(const NodeOutput&) = delete;

  void start(EventLoop& loop) {
    streams_ = std::make_unique<WorkerStreams>(loop.epfd());
    out_writer_ = std::make_unique<ConsoleWriter>(1, kConsoleBound, loop.wakefd());
    out_console_.writer = out_writer_.get();
    if (same_file(1, 2)) {  // `2>&1 | tee log`: two writers' writevs would tear each other's lines
      err_ = &out_console_;
    } else {
      err_writer_ = std::make_unique<ConsoleWriter>(2, kConsoleBound, loop.wakefd());
      err_console_.writer = err_writer_.get();
    }
    route_logging_through(err_->writer);
  }
  void close_streams() { streams_.reset(); }
  void flush() {
    if (out_writer_) out_writer_->flush();
    if (err_writer_) err_writer_->flush();
  }
  // The last flush when a signal stops ddprun: a console whose reader does not take the rest
  // within `limit` is left behind (its output dropped), so that ddprun exits.
  void flush_within(std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    bool behind[2] = {false, false};
    for (auto* w : {&out_writer_, &err_writer_})
      if (*w && !(*w)->flush_until(deadline)) {
        (*w)->abandon();
        (void)w->release();  // its thread may still be in a write: the writer outlives ddprun
        behind[w == &err_writer_] = true;
      }
    if (behind[0] && !behind[1] && err_ == &err_console_)  // (nowhere to say it when stderr is behind)
      spdlog::warn("the console did not take the workers' last output within {} s: exiting without it",
                   limit.count());
    // ddprun's own last lines would wait for a stderr that is behind: they are dropped.
    if (behind[1] || (behind[0] && err_ == &out_console_)) {
      abandoned_err_ = err_->writer;
      route_logging_through(abandoned_err_);
    }
  }
  // Where ddprun's log goes once the workers' output is done: straight to fd 2, or nowhere
  // when stderr's writer was left behind (flush_within).
  void log_to_stderr() { route_logging_through(abandoned_err_); }

  WorkerStreams& streams() { return *streams_; }
  ConsoleWriter& err() { return *err_->writer; }

  // The pipes of one worker's stdout and stderr (worker w, index idx), their forwarders,
  // log files and console routing: their write ends. Where both streams end on one console
  // (`2>&1`, a terminal) and in no file, one pipe takes both, so that a traceback or a log
  // line stays where the worker wrote it among its prints.
  std::pair<int, int> open_streams(const WorkerResult& w, int idx, const std::string& dir) {
    const int lr = w.local_rank;
    if (err_ == &out_console_ && o_.redirects.of(lr) == 0 && o_.tee.of(lr) == 0) {
      const int fd = open_stream(w, idx, WorkerStreams::Carries::kBoth, dir);
      const int again = fcntl(fd, F_DUPFD_CLOEXEC, 3);
      if (again < 0) {
        const int err = errno;
        ::close(fd);
        throw ddp::SystemError(fmt::format("cannot open the stderr of local rank {}", lr), err);
      }
      return {fd, again};
    }
    const int out = open_stream(w, idx, WorkerStreams::Carries::kStdout, dir);
    try {
      return {out, open_stream(w, idx, WorkerStreams::Carries::kStderr, dir)};
    } catch (...) {
      ::close(out);
      throw;
    }
  }

 private:
  // A pipe for one worker stream, its forwarder, log file and console routing.
  int open_stream(const WorkerResult& w, int idx, WorkerStreams::Carries what, const std::string& dir) {
    const int lr = w.local_rank;
    const bool is_stderr = what != WorkerStreams::Carries::kStdout;
    const int bit = is_stderr ? 2 : 1;
    const bool redirect = o_.redirects.of(lr) & bit, tee = o_.tee.of(lr) & bit;
    ForwarderConfig cfg;
    int file_fd = -1;
    if (redirect || tee) {
      cfg.file_name = dir + (is_stderr ? "/stderr.log" : "/stdout.log");
      file_fd = cfg.file_fd = open_log(cfg.file_name, redirect && !tee && shown(lr) ? "the console instead" : "");
      if (file_fd < 0) cfg.file_name.clear();
    }
    if ((!(redirect && !tee) || file_fd < 0) && shown(lr)) cfg.console = is_stderr ? err_ : &out_console_;
    cfg.prefix = expand_prefix(o_.log_line_prefix_template.value_or("[rank${rank}]:"), w.rank, lr, o_.role,
                               plan_.hostname);
    cfg.timestamps = o_.log_timestamps;
    cfg.tail_lines = is_stderr ? kTailLines : 0;
    if (tee && shown(lr) && !o_.duplicate_filters[is_stderr].empty()) {  // torchrun's rule: tee'd lines only
      cfg.filtered_fd = filtered_file(dir, is_stderr);
      if (cfg.filtered_fd >= 0) cfg.filters = &o_.duplicate_filters[is_stderr];
    }
    const auto tty = terminal_of(cfg);
    return streams_->open(idx, what, std::move(cfg), file_fd, tty ? &*tty : nullptr);
  }

  // A stream shown on a terminal, and written to no file, is a pseudo-terminal sized from
  // that terminal; nullopt: a pipe.
  std::optional<WorkerStreams::Terminal> terminal_of(const ForwarderConfig& cfg) const {
    if (!o_.worker_tty || !cfg.console || cfg.file_fd >= 0 || !cfg.console->writer->terminal()) return std::nullopt;
    const size_t stamp = cfg.timestamps ? StreamForwarder::kStampColumns : 0;
    return WorkerStreams::Terminal{cfg.console->writer->fd(), stamp + terminal_columns(cfg.prefix)};
  }

  // <attempt>/filtered_std{out,err}.log, opened once an attempt (dir: a worker's folder in it)
  // and shared by its workers' forwarders, which all write on this thread, whole lines.
  int filtered_file(const std::string& dir, bool is_stderr) {
    const std::string attempt = dir.substr(0, dir.rfind('/'));
    if (attempt != filtered_attempt_) {
      close_filtered();
      filtered_attempt_ = attempt;
      filtered_failed_[0] = filtered_failed_[1] = false;
    }
    int& fd = filtered_[is_stderr];
    if (fd < 0 && !filtered_failed_[is_stderr]) {
      fd = open_log(attempt + (is_stderr ? "/filtered_stderr.log" : "/filtered_stdout.log"), "");
      filtered_failed_[is_stderr] = fd < 0;  // (said once this attempt, not once a worker)
    }
    return fd;
  }
  void close_filtered() {
    for (int& fd : filtered_) {
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
  }

  bool shown(int local_rank) const {
    return !o_.local_ranks_filter || o_.local_ranks_filter->count(local_rank) > 0;
  }

  // O_APPEND: a log rotated by copying and truncating it in place (logrotate's copytruncate)
  // goes on from its new end, not from the old offset behind a run of NUL bytes. A log that
  // cannot be made (a full disk) is said and left out, -1: the job runs on without it, and
  // its lines go to `instead` when that is named (else they are on the console already).
  static int open_log(const std::string& path, const char* instead) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 && errno != ENOENT)  // (no folder: said as it failed, AttemptWorkers::make_records)
      spdlog::warn("cannot create {} ({}): the job runs on without it{}{}", path, ddp::errno_text(errno),
                   *instead ? ", its lines go to " : "", instead);
    return fd;
  }

  const Options& o_;
  const JobPlan& plan_;
  std::unique_ptr<ConsoleWriter> out_writer_, err_writer_;
  Console out_console_, err_console_;
  Console* err_ = &err_console_;  // &out_console_ when stdout and stderr are one file
  ConsoleWriter* abandoned_err_ = nullptr;  // stderr's writer, left behind by flush_within
  std::unique_ptr<WorkerStreams> streams_;  // this attempt's output pipes
  std::string filtered_attempt_;            // the attempt folder filtered_ belong to
  int filtered_[2] = {-1, -1};              // its filtered_stdout.log, filtered_stderr.log
  bool filtered_failed_[2] = {false, false};  // could not be made this attempt
};

// The answers to this node's dumps, each shown as the whole job's view; the dumps answered.
std::vector<std::string> show_job_views(Job& job, StackDumps& stacks, NodeOutput& output) {
  std::vector<std::string> shown;
  for (const auto& got : job.rdzv.dump_answers()) {
    output.err().push_line(stacks.job_wide(got, job.plan, job.attempt_dir()));
    shown.push_back(got.what);
  }
  return shown;
}

// This node's workers, attempt after attempt: starts an attempt's workers and serves the
// loop until every one has exited and every stream drained. The first failure here is the
// root cause; it, another node's end of the round, a hang or a stopping signal
// (node_signals.hpp) stops the workers. Signals are read here between attempts too.
class AttemptSupervisor {
 public:
  AttemptSupervisor(Job& job, EventLoop& loop, NodeOutput& output, AttemptWorkers& workers, StackDumps& stacks,
                    NodeSignals& signals, FileTimers& timers, const void* notify_tag)
      : job_(job), rdzv_(job.rdzv), loop_(loop), output_(output), workers_(workers), stacks_(stacks),
        signals_(signals), timers_(timers), notify_tag_(notify_tag) {}
  ~AttemptSupervisor() {
    if (stdin_fd_ >= 0) close(stdin_fd_);
  }

  // Workers lead sessions of their own, with no controlling terminal, so reading a terminal
  // never stops them (SIGTTIN): a ddprun in the terminal's foreground passes it on (input(),
  // pdb, getpass, as under torchrun). One in the background (`&`, or not the terminal's
  // session) gives them /dev/null, since they would take the shell's input. A piped or
  // redirected stdin is inherited. A stdin closed when ddprun started (`<&-`) is /dev/null
  // too: fd 0 is then one of ddprun's own (close-on-exec; a warm worker would be handed it).
  void setup_stdin() {
    const int flags = fcntl(0, F_GETFD);
    const bool own = flags < 0 || (flags & FD_CLOEXEC);
    const bool terminal = isatty(0) == 1;
    if (!own && (!terminal || tcgetpgrp(0) == getpgrp())) {
      termios modes{};
      if (terminal && tcgetattr(0, &modes) == 0) terminal_modes_ = modes;
      return;
    }
    stdin_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }

  // A worker that reads the terminal may change its modes (pdb's readline: no echo, no
  // line editing; getpass: no echo) and be killed before it puts them back: once an
  // attempt's workers are gone, the terminal gets the modes it had (from the foreground
  // only: a background group's change would stop ddprun, SIGTTOU).
  void restore_terminal() const {
    if (terminal_modes_ && tcgetpgrp(0) == getpgrp()) tcsetattr(0, TCSANOW, &*terminal_modes_);
  }

  // Starts the running attempt's workers (an exec that failed is a failure at once).
  void start() {
    signals_.attempt_starting();
    output_.streams().clear();
    drain_deadline_.reset();
    leftovers_until_.reset();
    killed_leftovers_ = false;
    root_.reset();
    remote_end_.reset();
    hang_elsewhere_.reset();
    stacks_.attempt_started();
    timers_.on_readable();  // what the last attempt's workers wrote as they ended: dropped
    timers_.clear();
    auto open_stream = [this](int idx, const std::string& dir) {
      return output_.open_streams(workers_.all()[static_cast<size_t>(idx)], idx, dir);
    };
    auto add_env = [this](AttemptWorkers::Env& env, const WorkerResult& w) { stacks_.add_env(env, w); };
    const JobPlan& plan = job_.plan;
    auto failed =
        workers_.start(plan, job_.attempt, job_.attempt_dir(), stdin_fd_, job_.base_env, open_stream, add_env);
    for (WorkerResult* w : failed) fail(*w);
    spdlog::info("attempt {}: started {} workers (ranks {}..{} of {})", job_.attempt, workers_.all().size(),
                 plan.rank_base, plan.rank_base + static_cast<int>(workers_.all().size()) - 1, plan.world_size);
  }

  // Runs one attempt to its end: every worker exited and every stream drained.
  void supervise() {
    // The timer FIFO is watched only while workers run: unread between attempts, it would
    // wake every wait there at once.
    struct Watch {
      EventLoop& loop;
      FileTimers& t;
      Watch(EventLoop& l, FileTimers& timers) : loop(l), t(timers) {
        if (t.enabled()) loop.add(t.fd(), &t);
      }
      ~Watch() {
        if (t.enabled()) loop.remove(t.fd());
      }
    } watch(loop_, timers_);
    while (!over()) {
      const Clock::time_point next = next_due();
      // Output that trickles in small writes (python -u writes every line on its own) is
      // read in batches: a short pause lets the pipes fill, so a burst of lines costs one
      // wake-up instead of one per line. Floods (full reads) and idle pipes never pause.
      if (output_.streams().trickling() && !workers_.stopping()) {
        timespec pause{0, kTricklePauseNs};
        nanosleep(&pause, nullptr);
      }
      loop_.wait(timeout_ms(next), EventLoop::kMaxEvents, [this](void* tag) { on_ready(tag); });
      expire_timers();
      workers_.escalate_if_due();
      if (!workers_.stopping() && workers_.live() > 0) check_hang();
      look_for_strays();
    }
    await_answers();
    keep_tails();
    restore_terminal();
  }

  void on_ready(void* tag) {
    if (tag == notify_tag_) on_remote();
    else if (tag == &timers_) timers_.on_readable();
    else output_.streams().on_readable(*static_cast<WorkerStreams::Stream*>(tag));
  }

  // A hang or a failure asked the other nodes for their ranks' stacks: the summary waits
  // for their answers, until the gather's deadline at most (a signal ends the wait).
  void await_answers() {
    while (answers_by_ && Clock::now() < *answers_by_ && !signals_.got())
      loop_.wait(timeout_ms(*answers_by_), EventLoop::kMaxEvents, [this](void* tag) { on_ready(tag); });
    answers_by_.reset();
  }

  // The loop's signals handler: SIGCHLD reaps, a stack-dump trigger dumps; the others stop
  // this node or reach its workers (NodeSignals).
  void on_signals() {
    signalfd_siginfo si;
    while (loop_.next_signal(si)) {
      const int sig = static_cast<int>(si.ssi_signo);
      if (sig == SIGCHLD) reap();
      else if (sig == SIGTSTP && !signals_.stops(sig)) suspend();
      else if (sig == SIGWINCH && !signals_.stops(sig)) resized();
      else if (stacks_.is_trigger(sig)) on_trigger(sig, static_cast<pid_t>(si.ssi_pid));
      else signals_.take(si);
    }
  }

  // The terminal's size changed (SIGWINCH; or perhaps while the job was stopped): so do the
  // workers' terminals. A program that asks for its size sees the new one; none is sent
  // SIGWINCH (as under torchrun, whose workers' sessions get none): a handler that
  // readline installs would otherwise make a blocking call in C fail with EINTR.
  void resized() { output_.streams().resize(); }

  // Ctrl-Z: the job stops as a whole, as a shell's job does. Workers lead sessions of their
  // own, so the terminal's SIGTSTP reaches ddprun alone (and would be discarded in their
  // orphaned groups): they get SIGSTOP, then ddprun stops itself; fg or bg (SIGCONT)
  // continues it, and it continues them. The time stopped is spent by no timeout. With no
  // job-control shell above ddprun (tmux or ssh running it directly, PID 1) nothing could
  // continue the job, and it runs on, as the kernel decides for torchrun. Nor does one node
  // of several stop: its lease would lapse and the others go on without it.
  void suspend() {
    if (getpid() == 1 || !job_control_above()) {
      spdlog::info("received SIGTSTP: nothing above ddprun could continue the job (no job-control shell): not "
                   "stopping it");
      return;
    }
    if (job_.plan.group_world_size > 1) {
      spdlog::warn("received SIGTSTP: not stopping one node of {}: the others would count it lost after the "
                   "keep-alive window; Ctrl-C stops the job",
                   job_.plan.group_world_size);
      return;
    }
    const pid_t warm = workers_.warm_pid();  // (importing, or forking workers): its group
    workers_.signal_live(SIGSTOP, false);
    if (warm > 0) kill(-warm, SIGSTOP);
    const auto t0 = Clock::now();
    kill(getpid(), SIGSTOP);  // returns once continued
    if (warm > 0) kill(-warm, SIGCONT);
    workers_.signal_live(SIGCONT, false);
    resized();
    const auto stopped = Clock::now() - t0;
    stopped_for_ += stopped;
    stacks_.suspended(stopped);
    workers_.suspended(stopped);
    timers_.suspended(stopped);
    if (drain_deadline_) *drain_deadline_ += stopped;
    if (leftovers_until_) *leftovers_until_ += stopped;
    if (stdin_fd_ < 0 && isatty(0) && tcgetpgrp(0) != getpgrp())
      spdlog::warn("continued in the background: the workers still read this terminal (their stdin), and "
                   "would take what is typed to the shell; `fg` brings the job back");
  }

  // The time the job spent suspended so far (timeouts spend none of it).
  Clock::duration stopped_for() const { return stopped_for_; }

  const std::optional<WorkerResult>& root() const { return root_; }
  const std::optional<RoundEnd>& remote_end() const { return remote_end_; }
  void ended_elsewhere(const RoundEnd& end) { remote_end_ = end; }
  void round_over() { looked_ahead_ = false; }  // the next round's prejoin() may be asked

 private:
  // The attempt is over once every worker has exited and every stream drained; 5 s after
  // the last exit, streams still open are closed, unless one is paused on a full console
  // (a reader that pauses loses nothing), but not when a signal stops ddprun: a stalled
  // console must not keep the summary, the other nodes' news and ddprun's exit waiting for
  // it. The first time no worker lives, what they left behind is killed.
  bool over() {
    const int live = workers_.live();
    if (live == 0 && !drain_deadline_) {
      leftovers_until_ = workers_.stop_leftovers(signals_.helper_pid());
      stops_at_leftovers_ = signals_.stops_taken();
      drain_deadline_ = Clock::now() + std::chrono::seconds(5);
    }
    if (live > 0) return false;
    if (leftovers_until_) {  // (a stop signal during their grace cuts it short; one before, as Ctrl-C, does not)
      if (Clock::now() < *leftovers_until_ && !workers_.leftovers_gone() &&
          signals_.stops_taken() == stops_at_leftovers_)
        return false;
      leftovers_until_.reset();
    }
    if (!killed_leftovers_) {
      workers_.kill_leftovers();
      killed_leftovers_ = true;
    }
    if (output_.streams().open_count() == 0) return true;
    if (Clock::now() < *drain_deadline_) return false;
    if (!output_.streams().close_unpaused()) return true;  // (none was paused)
    if (!signals_.got()) return false;
    spdlog::warn("stopping on {}: the console is behind, and what the workers wrote that it did not take is "
                 "dropped", signal_name(signals_.got()));
    output_.streams().close_all();
    return true;
  }

  // Descendants that left their worker's process group are handed to the guardian
  // (AttemptWorkers::look_for_strays).
  void look_for_strays() { workers_.look_for_strays(); }

  // The next deadline: the SIGKILL escalation, the drain, the hang check, an unfinished
  // line's idle flush (those due are flushed now), the next look for strays.
  Clock::time_point next_due() {
    const auto now = Clock::now();
    auto next = now + std::chrono::seconds(3600);
    if (workers_.live() > 0 || leftovers_until_) next = std::min(next, workers_.next_stray_look());
    for (auto& d : {workers_.kill_deadline(), stacks_.next_hang_check(), timers_.next_expiry()})
      if (d) next = std::min(next, *d);
    // Once passed, streams still paused wait for their console's wake-up, not in a busy loop.
    if (drain_deadline_ && *drain_deadline_ > now) next = std::min(next, *drain_deadline_);
    // Leftovers whose parent is another leftover end unseen: looked at every 50 ms.
    if (leftovers_until_) next = std::min({next, *leftovers_until_, now + std::chrono::milliseconds(50)});
    return output_.streams().flush_idle(next);
  }

  // The streams are closed; every worker's record gets its stderr tail.
  void keep_tails() {
    output_.streams().close_all();
    auto& all = workers_.all();
    for (size_t i = 0; i < all.size(); ++i) {
      all[i].stderr_tail = output_.streams().stderr_tail(static_cast<int>(i));
      all[i].tail_has_stdout = output_.streams().carries_both(static_cast<int>(i));
      all[i].crash_stack = stacks_.crash_stack_of(all[i]);
    }
    for (auto& w : all)
      if (root_ && w.rank == root_->rank) root_ = w;  // now with its stderr tail
    if (root_) stacks_.settle_root(all, *root_);
  }

  // The first failure is the root cause: the workers are stopped first, then the other
  // nodes told (in the background).
  void fail(WorkerResult& w) {
    if (root_) return;
    root_ = w;
    if (w.state != WorkerResult::State::kExecFailed) take_failure_stacks(w);  // bounded
    const std::string what = fmt::format("rank {} on {} exited with {}", w.rank, w.host,
                                         w.signal ? signal_name(w.signal) : std::to_string(w.exit_code));
    workers_.begin_stop(SIGTERM);
    rdzv_.end_round(RoundEnd::Kind::kFailed, what);
    look_ahead(RoundEnd{RoundEnd::Kind::kFailed, "", what});
  }

  // A failed rank's last output (all in its pipes now) comes before the line that says it
  // failed, a line a person can read while the rest shuts down.
  void reap() {
    for (WorkerResult* w : workers_.reap()) {
      output_.streams().read_worker(static_cast<int>(w - workers_.all().data()));
      spdlog::warn("rank {} (local_rank {}, pid {}) {}", w->rank, w->local_rank, w->pid,
                   w->signal ? fmt::format("was killed by {}", signal_name(w->signal))
                             : fmt::format("exited with code {}", w->exit_code));
      fail(*w);
    }
    prefer_announced_root();
  }

  // A rank that announced its uncaught exception failed first, in whatever order the exits
  // are reaped: its peers fail on its closed sockets while its own exit may still run. (Not
  // when the stop's SIGTERM ended it: its exit status would tell nothing.)
  void prefer_announced_root() {
    const pid_t first = stacks_.announced_failure();
    if (!root_ || first <= 0 || root_->pid == first) return;
    for (auto& w : workers_.all())
      if (w.pid == first && (w.state == WorkerResult::State::kStopped || w.state == WorkerResult::State::kFailed) &&
          !w.signal && w.exit_code != 0) {
        w.state = WorkerResult::State::kFailed;
        root_ = w;
      }
  }

  // A stack-dump trigger from `sender`: a worker about to fail, or a dump asked for.
  // A rank that already died (killed, os._exit) but is not reaped yet failed first: its
  // peers' exceptions follow from it, so it is the root cause, and the announcer's stack is
  // among the others' (before, the summary showed the dead rank as "exited before it
  // answered" and left the announcer out).
  void on_trigger(int sig, pid_t sender) {
    const WorkerResult* failing = nullptr;
    if (!stacks_.failure_notice(sig, sender, workers_.all(), workers_.stopping(), failing)) {
      dump_stacks(signal_name(sig));
    } else if (failing) {
      reap();
      if (stacks_.failure_seen()) return;
      stacks_.announced_by(failing->pid);
      take_failure_stacks(*failing);
    }
  }

  // Where the other ranks were at this node's first failure (bounded). With several nodes,
  // unless another node's failure came first, the others are asked too (they take their
  // ranks' stacks while this node takes its own), and the summary shows every rank of the
  // job once they answered. Not while restarts are left: a restart shows no summary, and
  // would wait for the answers for nothing.
  void take_failure_stacks(const WorkerResult& root) {
    std::string what;
    if (!stacks_.failure_seen() && job_.plan.group_world_size > 1 && stacks_.enabled() &&
        job_.plan.restart_count >= job_.max_restarts)
      what = ask_others(DumpKind::kFailure, StackDumps::kAtFailure + std::chrono::seconds(1));
    stacks_.at_failure(workers_.all(), root, job_.attempt_dir(), what);
  }

  // Asks the other nodes for their ranks' stacks, for the summary (a dump of `kind`): it
  // waits for their answers until `within` from now.
  std::string ask_others(DumpKind kind, Clock::duration within) {
    const std::string what = dump_name(kind, job_.plan.group_rank, job_.plan.hostname);
    rdzv_.ask_dump(what);
    const auto deadline = Clock::now() + within;
    awaited_ = what;
    rdzv_.gather_dump(what, static_cast<size_t>(job_.plan.group_world_size - 1), deadline);
    // The gather reports at its deadline when a node did not answer ("0 of 1 other node
    // answered"): its report comes just after it. Waiting to the same instant lost that
    // report to the summary under load (CI), which then showed this node's ranks alone.
    answers_by_ = deadline + kGatherReportGrace;
    return what;
  }

  // Every local rank's stack on this node's stderr; asked here (`trigger`: the signal), the
  // other nodes are asked too, every node's output names the same dump, and once the others
  // answered (on_remote) this node shows where every rank of the job is.
  void dump_stacks(const std::string& trigger) {
    const std::string what = dump_name(DumpKind::kOnDemand, job_.plan.group_rank, job_.plan.hostname, ++dumps_asked_);
    // (While the warm process imports: its stack stands for this node's; the others still answer.)
    const bool warm = workers_.live() == 0 && workers_.show_warm_stack(trigger.empty() ? what : trigger);
    if (job_.plan.group_world_size > 1) {
      rdzv_.ask_dump(what);
      rdzv_.gather_dump(what, static_cast<size_t>(job_.plan.group_world_size - 1), Clock::now() + kGatherDeadline);
    }
    if (!warm)
      output_.err().push_line(stacks_.on_demand(workers_.all(), job_.attempt_dir(), what, trigger, workers_.stopping()));
  }
  // How long the node that asked for a dump waits for the others' answers: their own dump's
  // deadline, and a second for the ask and the answers to travel.
  static constexpr auto kGatherDeadline = StackDumps::kOnDemand + std::chrono::seconds(1);
  // How long past the gather's deadline a failure's or a hang's summary waits for its report.
  static constexpr auto kGatherReportGrace = std::chrono::milliseconds(300);

  // The stack dumps other nodes asked for (this node answers with its own ranks'), and the
  // answers to this node's. A failure elsewhere asks first, then ends the round: this node
  // takes its ranks' stacks for it then. A node that is stopping its workers answers with
  // the stacks it took as it began to (several nodes that hung at once answer each other).
  void on_remote_dumps() {
    for (const auto& what : rdzv_.dump_requests()) {
      const DumpKind kind = dump_kind(what);
      const bool failure = kind == DumpKind::kFailure;
      if (kind == DumpKind::kHang && !workers_.stopping()) hang_elsewhere_ = Clock::now();
      if (failure && !workers_.stopping()) stacks_.at_remote_failure(workers_.all(), job_.attempt_dir());  // bounded
      if (failure || workers_.stopping()) {
        rdzv_.answer_dump(what, stacks_.answer_while_stopping(job_.plan));
        continue;
      }
      output_.err().push_line(stacks_.on_demand(workers_.all(), job_.attempt_dir(), what));
      rdzv_.answer_dump(what, stacks_.answer(what, job_.plan));
    }
    for (const auto& what : show_job_views(job_, stacks_, output_))
      if (what == awaited_) answers_by_.reset();
  }

  void on_remote() {
    auto end = rdzv_.round_end();
    on_remote_dumps();
    if (!end || workers_.stopping() || remote_end_) return;
    if (signals_.stopped_elsewhere(*end)) return;
    remote_end_ = end;
    using K = RoundEnd::Kind;
    if (end->kind == K::kScaleUp)
      spdlog::warn("round {}: {}: stopping this node's workers to restart them in a bigger round", job_.plan.round,
                   end->describe());
    else if (end->node_only())
      spdlog::error("{}: stopping this node's workers", end->describe());
    else
      spdlog::warn("{}: stopping this node's workers", end->describe());
    if (end->kind == K::kFailed) stacks_.at_remote_failure(workers_.all(), job_.attempt_dir());  // bounded
    workers_.begin_stop(SIGTERM);
    look_ahead(*end);
  }

  // Multi-node: while the workers stop, already ask whether another round may follow and
  // join it (in the background: a last call then runs during their teardown).
  void look_ahead(const RoundEnd& end) {
    if (!rdzv_.joins_over_network() || looked_ahead_ || signals_.got()) return;
    looked_ahead_ = true;
    rdzv_.prejoin(end);
  }

  // TORCHELASTIC_ENABLE_FILE_TIMER: an expired timer's signal goes to its process when that
  // is a worker of this attempt or in one's process group (never to a stranger).
  void expire_timers() {
    for (const auto& t : timers_.take_expired()) {
      WorkerResult* w = worker_of(t.pid);
      if (!w) {
        spdlog::warn("TORCHELASTIC_TIMER_FILE: timer '{}' of pid {} expired, but pid {} is none of this node's "
                     "workers (nor in their process groups): left alone",
                     t.scope, t.pid, t.pid);
      } else if (t.signal <= 0 || t.signal >= NSIG) {
        spdlog::warn("rank {}: its timer '{}' expired {:.1f} s ago; it asked for no signal, so it runs on", w->rank,
                     t.scope, t.late);
      } else {
        spdlog::error("rank {}: its timer '{}' expired {:.1f} s ago: {} to pid {} (TORCHELASTIC_ENABLE_FILE_TIMER)",
                      w->rank, t.scope, t.late, signal_name(t.signal), t.pid);
        w->killed_for = fmt::format("its timer '{}' expired: {} to pid {} (TORCHELASTIC_ENABLE_FILE_TIMER)", t.scope,
                                    signal_name(t.signal), t.pid);
        stacks_.at_expiry(workers_.all(), *w, job_.attempt_dir());  // bounded
        ::kill(t.pid, t.signal);
      }
    }
  }

  // The running worker that is pid, or leads pid's process group.
  WorkerResult* worker_of(pid_t pid) {
    const pid_t group = ::getpgid(pid);
    for (auto& w : workers_.all())
      if (w.state == WorkerResult::State::kRunning && (w.pid == pid || w.pid == group)) return &w;
    return nullptr;
  }

  // --hang-timeout: progress is judged over the whole job (a node whose ranks print
  // nothing while rank 0's log moves is not hung), through the rendezvous's count.
  void check_hang() {
    // Between its looks (once a second at most) there is nothing to do: this runs at every
    // wake-up of the loop, a flood of output's too.
    if (!stacks_.next_hang_check() || Clock::now() < *stacks_.next_hang_check()) return;
    bool moved = false;
    const bool several = job_.plan.group_world_size > 1;
    auto job = several ? rdzv_.job_progress() : std::nullopt;
    const bool hung = stacks_.hung_now(output_.streams().last_output(), workers_.all(), several,
                                       job ? std::optional<int64_t>(job->count) : std::nullopt,
                                       job ? job->read_at : Clock::time_point{}, moved);
    if (several) rdzv_.note_progress(moved ? 1 : 0);
    if (!hung) return;
    // Another node declared the hang already (its ask came): its end of the round stops
    // this node too. Declaring here as well asked every node again (each node of a big job
    // asking all the others) and, once the first node had left, waited out the gather's
    // deadline for it. Unless that end does not come within the deadline (that node died).
    if (hang_elsewhere_ && Clock::now() < *hang_elsewhere_ + kGatherDeadline) {
      stacks_.check_hang_at(*hang_elsewhere_ + kGatherDeadline);
      return;
    }
    on_hang();
  }

  // --hang-timeout passed with no progress: stacks shown, the attempt fails (exit 124).
  // With several nodes the others are asked for their ranks' stacks first (they take them
  // while this node takes its own), and the summary shows every rank of the job.
  void on_hang() {
    std::string what;
    if (job_.plan.group_world_size > 1 && stacks_.enabled()) what = ask_others(DumpKind::kHang, kGatherDeadline);
    output_.err().push_line(stacks_.on_hang(workers_.all(), job_.attempt_dir(), what));
    workers_.begin_stop(SIGTERM);
    rdzv_.end_round(RoundEnd::Kind::kFailed, *stacks_.hang());
    look_ahead(RoundEnd{RoundEnd::Kind::kFailed, "", *stacks_.hang()});
  }

  Job& job_;
  Rendezvous& rdzv_;
  EventLoop& loop_;
  NodeOutput& output_;
  AttemptWorkers& workers_;
  StackDumps& stacks_;
  NodeSignals& signals_;
  FileTimers& timers_;      // its fd's epoll tag is its address
  const void* notify_tag_;  // the epoll tag of the rendezvous's notify fd
  int stdin_fd_ = -1;
  std::optional<termios> terminal_modes_;  // the terminal's, when ddprun passes it on (restore_terminal)
  std::optional<Clock::time_point> drain_deadline_;
  std::optional<Clock::time_point> leftovers_until_;  // what the workers left has its SIGTERM until then
  bool killed_leftovers_ = false;
  int stops_at_leftovers_ = 0;  // signals_.stops_taken() when they got their SIGTERM
  Clock::duration stopped_for_{};
  std::optional<WorkerResult> root_;
  std::optional<RoundEnd> remote_end_;  // the round ended elsewhere (or the rendezvous ended it)
  std::optional<Clock::time_point> hang_elsewhere_;  // when another node's hang asked this attempt's stacks
  bool looked_ahead_ = false;           // this round's prejoin() was asked for
  int dumps_asked_ = 0;  // dumps asked on this node (they name the dump on every node)
  std::optional<Clock::time_point> answers_by_;  // until when the summary waits for the others' answers
  std::string awaited_;                          // the dump whose answers it waits for
};

}  // namespace

// The job: rounds one after another, each joined, run (AttemptSupervisor) and ended, while
// the rendezvous allows another; then the report (JobRecord).
struct Supervisor::Impl {
  Job job;
  FileTimers timers;  // TORCHELASTIC_ENABLE_FILE_TIMER (inert without it)
  const Options& o;
  Rendezvous& rdzv;
  Guardian& guardian;
  NodeSignals signals;
  EventLoop loop;
  NodeOutput output;
  std::string tmp_root;  // mkdtemp'd when no --log-dir: removed after success, unless logs went there
  std::unique_ptr<RunTmpDir> tmp_dir;  // tmp_root, locked while this run lives (tmpdirs.hpp)
  WarmPython warm;   // --preload's warm process (inert without the flag)
  int warm_tag = 0;  // epoll tag of its answer
  AttemptWorkers workers;  // this attempt's
  StackDumps stacks;  // every rank's stack: on demand, at a failure, at a hang (stack_dump.hpp)
  int notify_tag = 0;  // epoll tag of the rendezvous's notify fd
  bool notify_registered = false;
  AttemptSupervisor attempts;
  JobRecord record;
  std::string stop_reason;  // why no further round followed a failure

  Impl(const Options& opt, std::map<std::string, std::string> env, Guardian& g, Rendezvous& r, std::string host)
      : job(r, std::move(env)), timers(job.base_env), o(opt), rdzv(r), guardian(g), signals(opt, workers, r, job.plan),
        output(opt, job.plan), warm(opt, g), workers(opt, g, &warm), stacks(opt, host),
        attempts(job, loop, output, workers, stacks, signals, timers, &notify_tag), record(opt, r) {
    job.plan.run_id = o.rdzv_id;
    job.plan.hostname = std::move(host);
    job.max_restarts = o.max_restarts;
    if (timers.enabled()) job.base_env["TORCHELASTIC_TIMER_FILE"] = timers.path();  // every worker's
  }

  ~Impl() {
    // Also on an exception out of run(): spdlog must not write through a dead writer.
    output.log_to_stderr();
    output.close_streams();  // its pipes leave the epoll set before it closes
    output.flush();
    loop.close();
  }

  void setup() {
    become_subreaper();
    signals.start();
    loop.open(supervised_set(o));
    loop.serve({[this] { attempts.on_signals(); }, [this] { output.streams().resume_paused(); }});
    output.start(loop);
    attempts.setup_stdin();

    RunFolders f = make_run_folders(o.log_dir, job.plan.run_id);
    tmp_dir = std::move(f.tmp_dir);
    tmp_root = f.tmp_root;
    job.log_root = f.log_root;
    // Output that only goes to files must be findable, and outlive the run (torchrun keeps
    // the folder too; its "log directory set to" line is at INFO).
    if (o.log_dir.empty() && o.redirects.any())
      spdlog::warn("--redirects without --log-dir: the workers' redirected output goes to files under {} (kept after "
                   "the run, and pruned by a later run after 24 hours or beyond the newest 10 runs: give --log-dir to "
                   "keep them elsewhere)",
                   job.log_root);
    // --preload: the import runs while this node joins the rendezvous.
    if (warm.enabled()) warm.start(warm_environment(o, job.base_env));
  }

  JobOutcome run() {
    record.start();
    setup();
    for (job.attempt = 0;; ++job.attempt) {
      auto joined = join_or_report();
      if (!joined) break;  // a signal while joining
      job.plan = *joined;
      watch_rendezvous();
      if (!wait_warm()) break;  // a signal while the warm process imports
      if (signals.got()) break;  // one read in the same wake-up as an answer: no worker starts after it
      attempts.start();
      attempts.supervise();
      record.keep(workers.all(), job.attempt);
      auto end = attempt_end();
      if (!end || signals.stopped_elsewhere(*end)) break;  // a signal (here, or Slurm's on another node)
      if (end->kind == RoundEnd::Kind::kDone) break;
      if (!attempts.root() && !stacks.hang()) attempts.ended_elsewhere(*end);  // this node succeeded, the round did not
      if (!restarts(*end)) break;
      announce_restart(*end);
    }
    record.end(job.plan.restart_count);
    finish();
    return record.outcome();
  }

  // --preload: the warm process (a new one if it died) has imported its modules before the
  // workers start; a signal meanwhile stops this node (false). Throws when it cannot be.
  bool wait_warm() {
    warm.start(warm_environment(o, job.base_env));  // nothing while one runs (or without --preload)
    const int fd = warm.pending_fd();
    if (fd < 0) return true;
    loop.add(fd, &warm_tag);
    hold_notify(true);
    bool answered = false;
    // --hang-timeout covers the import as it covers a cold worker's
    std::optional<Clock::time_point> limit;
    if (o.hang_timeout > 0) limit = Clock::now() + std::chrono::milliseconds(static_cast<long>(o.hang_timeout * 1000));
    while (!answered && !signals.got() && !(limit && Clock::now() >= *limit)) {
      const auto stopped = attempts.stopped_for();
      for (void* tag : loop.wait_between_attempts(limit ? timeout_ms(*limit) : -1)) answered |= tag == &warm_tag;
      if (limit) *limit += attempts.stopped_for() - stopped;  // (Ctrl-Z)
    }
    loop.remove(fd);
    hold_notify(false);
    if (answered) warm.on_ready();
    else if (!signals.got()) give_up_warm();
    return answered || !signals.got();
  }

  void give_up_warm() {
    if (o.stack_dumps && warm.show_stack(fmt::format("no import ended within --hang-timeout {} s", o.hang_timeout)))
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // (its dump, written by a signal handler)
    spdlog::warn("--preload: the warm Python process (pid {}) did not import {} within --hang-timeout {} s: it "
                 "is stopped, and this job's workers start cold (their own imports count against the timeout)",
                 warm.pid(), fmt::join(o.preload, ","), o.hang_timeout);
    warm.give_up();
  }

  // While this node is between rounds (joining, its warm process importing), a round's end
  // stays unread until the round's workers run: the fd is out of the epoll set meanwhile
  // (level-triggered, it would wake every wait).
  void hold_notify(bool hold) {
    if (notify_registered && hold) loop.remove(rdzv.notify_fd());
    if (notify_registered && !hold) loop.add(rdzv.notify_fd(), &notify_tag);
  }

  // The rendezvous's notify fd exists once the first round is joined (static: multi-node).
  void watch_rendezvous() {
    if (notify_registered || rdzv.notify_fd() < 0) return;
    loop.add(rdzv.notify_fd(), &notify_tag);
    notify_registered = true;
  }

  // How this attempt's round ended, seen from this node.
  std::optional<RoundEnd> attempt_end() {
    if (signals.got()) return std::nullopt;
    if (const auto& root = attempts.root())
      return RoundEnd{RoundEnd::Kind::kFailed, "",
                      fmt::format("rank {} {}", root->rank,
                                  root->signal ? "was killed by " + signal_name(root->signal)
                                               : fmt::format("exited with code {}", root->exit_code))};
    if (stacks.hang()) return RoundEnd{RoundEnd::Kind::kFailed, "", *stacks.hang()};
    if (attempts.remote_end()) return attempts.remote_end();
    return wait_round_end();
  }

  // After this node's workers all succeeded: how the round ended for everyone (a signal
  // to ddprun meanwhile ends the wait; signals.got() says so).
  std::optional<RoundEnd> wait_round_end() {
    if (auto end = rdzv.arrive_exit()) return end;
    // Said when the round has not ended a second later (the last node's arrival ends it).
    std::optional<Clock::time_point> say_at = Clock::now() + std::chrono::seconds(1);
    while (!signals.got()) {
      for (void* tag : loop.wait_between_attempts(say_at ? timeout_ms(*say_at) : -1))
        if (tag == &notify_tag) {
          auto end = rdzv.round_end();  // (first: it clears the fd that dumps wake too)
          answer_dumps_finished();
          if (end) return end;
        }
      if (say_at && Clock::now() >= *say_at) {
        spdlog::info("round {}: this node's workers all succeeded; waiting for the other nodes' workers (for as long "
                     "as those nodes are alive)",
                     std::max<int64_t>(job.plan.round, 0));
        say_at.reset();
      }
    }
    return std::nullopt;
  }

  // While this node waits for the others after its workers all finished: a dump asked
  // elsewhere is answered at once (its ranks finished), and the answers to one asked here
  // before its workers finished are shown.
  void answer_dumps_finished() {
    for (const auto& what : rdzv.dump_requests()) {
      spdlog::info("{}: this node's workers have all finished", what);
      rdzv.answer_dump(what, stacks.answer_finished(job.plan));
    }
    show_job_views(job, stacks, output);
  }

  // Whether another round follows `end` (false: a signal came, or the rendezvous refused).
  bool restarts(const RoundEnd& end) {
    auto refusal = restart_refusal(end);
    if (!refusal) return false;  // a signal
    stop_reason = *refusal;
    attempts.round_over();
    if (stop_reason.empty()) return true;
    // A node cut off (or told the job was closed) said why as it stopped its workers, and
    // says it last again: no third line.
    const bool said = (end.node_only() || end.kind == RoundEnd::Kind::kClosed) && stop_reason == end.text;
    if ((o.max_restarts > 0 || !end.counted()) && !said)
      spdlog::error("not restarting: {}", stop_reason);
    return false;
  }

  void announce_restart(const RoundEnd& end) {
    if (job.plan.round >= 0) {
      if (end.counted())
        spdlog::warn("round {} ended ({}): forming the next round (a restart; --max-restarts {})", job.plan.round,
                     end.describe(), o.max_restarts);
      else
        spdlog::warn("round {} ended ({}): forming the next round (not counted as a restart)", job.plan.round,
                     end.describe());
      return;
    }
    spdlog::warn("attempt {} failed ({}); restarting all workers: attempt {} of {}", job.attempt, end.describe(),
                 job.attempt + 1, o.max_restarts);
  }

  // A rendezvous call that may wait for the network, off this thread (EventLoop::off_loop;
  // nullopt: a signal came meanwhile).
  template <class T>
  std::optional<T> off_loop(std::function<T()> call) {
    EventLoop::OffLoop how;
    how.stopped = [this] { return signals.got() != 0; };
    how.cancel = [this] { rdzv.cancel(); };
    how.waiting = [this](bool waiting) {
      hold_notify(waiting);
      signals.joining(waiting);
    };
    return loop.off_loop<T>(std::move(call), how);
  }

  // A join that fails (the job closed meanwhile, replace_timeout over, this node declared
  // lost) ends the job as an error of ddprun's (exit 1; 2 for a command line the others'
  // refuse), with --summary-json written first; so does one no longer needed (exit 0).
  std::optional<JobPlan> join_or_report() {
    try {
      return join_round();
    } catch (const rdzv::NotNeeded& e) {  // the job succeeded while this node waited: exit 0
      record.report_join_end(e.what(), 0, job.plan.restart_count, job.plan.run_id);
      throw;
    } catch (const ddp::UsageError& e) {  // the others run another command line: exit 2
      record.report_join_end(e.what(), 2, job.plan.restart_count, job.plan.run_id);
      throw;
    } catch (const std::exception& e) {
      record.report_join_end(e.what(), 1, job.plan.restart_count, job.plan.run_id);
      throw;
    }
  }

  // The next round (nullopt: a signal came while joining).
  std::optional<JobPlan> join_round() {
    if (!rdzv.joins_over_network()) return rdzv.next_round();
    auto plan = off_loop<JobPlan>([r = &rdzv] { return r->next_round(); });
    if (plan && signals.got()) {  // joined as the signal came: no worker starts
      signals.end_round();
      return std::nullopt;
    }
    return plan;
  }

  // Whether another round may follow `end` ("" when it may; nullopt: a signal came while
  // the rendezvous was asked). prejoin's answer when it was asked.
  std::optional<std::string> restart_refusal(const RoundEnd& end) {
    if (!rdzv.joins_over_network()) return rdzv.restart_refused(end);
    auto refusal = off_loop<std::string>([r = &rdzv, end] { return r->restart_refused(end); });
    return signals.got() ? std::nullopt : refusal;
  }

  void finish() {
    // Nothing outlives the job (each attempt already killed what its workers left behind),
    // and as PID 1 everything in the namespace goes.
    if (getpid() == 1) kill(-1, SIGKILL);
    warm.stop();  // (not left to a destructor: an abandoned goodbye ends ddprun without them)
    guardian.disarm();
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    // The summary after the workers' output (on both consoles: stdout may be another file),
    // unless a signal stops ddprun: then the summary (queued behind the output on its own
    // console; its file written at once) and the other nodes' news come before the wait for
    // the consoles, which a stalled reader could make endless: it ends after 5 s.
    if (!signals.got()) output.flush();
    const JobRecord::Ending e{signals, attempts.root(), workers.all(), stacks, attempts.remote_end(), stop_reason};
    record.report(e, job.plan.run_id, [this](const std::string& text) { output.err().push_line(std::string(text)); });
    record.leave(e);
    route_logging_through(nullptr);
    if (signals.got())
      output.flush_within(std::chrono::seconds(5));
    else
      output.flush();
    if (!tmp_root.empty() && record.outcome().status == "succeeded" && !o.redirects.any() && !o.tee.any()) {
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
