// Taking every local rank's stack (docs/stacks.md): the workers' side is the Python
// bootstrap that ddprun puts first on their PYTHONPATH; this is ddprun's side.
//
//   take_stacks     the node-level entry point: signal every worker that announced its
//                   bootstrap, wait (bounded) until each dump is complete, return them all;
//                   a worker that does not answer is named, never waited for past the deadline
//   StackDumps      the supervisor's hooks: the workers' environment, the triggers (SIGQUIT,
//                   SIGURG), a dump on demand, before the survivors of a failure are stopped,
//                   and --hang-timeout
//   dump_stacks_command   `ddprun --dump-stacks [PID]`: finds the job and triggers it
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/options.hpp"
#include "launcher/report.hpp"
#include "launcher/stacks.hpp"
#include "launcher/worker.hpp"
#include "rendezvous/events.hpp"

namespace ddprun {

struct StackTarget {
  int rank = 0, local_rank = 0;
  pid_t pid = -1;
  std::string file;  // the worker's stack file (DDPRUN_STACK_FILE); a forked child's: /proc/<pid>/fd/<n>
};

// Asks each target for its stack and returns one RankStack per target, in order, by
// `deadline`. Call it on the thread that reaps the workers: a pid it signals cannot have
// been reused (an unreaped worker keeps its pid; a forked child's announcement, read through
// /proc the moment before, names it). Workers without the bootstrap are not
// signalled (their kernel-side state is shown instead). This is what a dump asked on
// another node will call on this one, once the rendezvous relays it.
// `interrupted` (polled while waiting) ends the wait early, as the deadline would: the
// supervisor passes "a stop signal is pending", so that a signal never waits for a dump.
std::vector<RankStack> take_stacks(const std::vector<StackTarget>& targets,
                                   std::chrono::steady_clock::time_point deadline,
                                   const std::function<bool()>& interrupted = nullptr);

// Then asks the processes each answering rank forked (16 at most per rank), those that answer
// into a file of their own (the bootstrap's at-fork hook gives them one: not a process that
// exec'd since), as take_stacks asks the ranks, by the same deadline: into each rank's
// RankStack::forked. Nothing is asked once the deadline has passed.
void take_forked_stacks(const std::vector<StackTarget>& targets, std::vector<RankStack>& stacks,
                        std::chrono::steady_clock::time_point deadline,
                        const std::function<bool()>& interrupted = nullptr);

// The kernel's view of a process's threads: "3 threads: 2x S futex_wait_queue, 1x R".
std::string native_threads(pid_t pid);

// The folder of the worker bootstrap (sitecustomize.py), found from ddprun's own path:
// <bin>/../share/ddprun/python, in the build tree and installed alike; "" when missing.
std::string bootstrap_dir();

// `ddprun --dump-stacks [PID]`: triggers a dump in the running ddprun job of this user on
// this machine (the only one, or PID). Returns the exit status; errors throw ddp::Error.
int dump_stacks_command(pid_t pid);

// What a dump asked of the other nodes is for; its name says so on every node.
enum class DumpKind {
  kOnDemand,  // "dump 2 asked on node 1 (hostb)": a signal or --dump-stacks; the job runs on
  kHang,      // "hang on node 0 (hosta)": --hang-timeout ran out there; the job does not run on
  kFailure,   // "failure on node 1 (hostb)": each node answers with where its ranks were as it
              // stops them for that failure
};
// The name of the dump of `kind` asked on `node` (`number`: the node's count of on-demand dumps).
std::string dump_name(DumpKind kind, int node, const std::string& host, int number = 0);
// The kind of the dump named `what` (an on-demand one unless its name says otherwise).
DumpKind dump_kind(std::string_view what);

// A failure view's ranks caught exiting (no Python frame, or in threading's shutdown) or not
// answering, that then exited 0 by themselves (not on ddprun's stop signal): named so, as the
// hang report names a rank that ended early. Whether any was.
bool name_exited_by_themselves(std::vector<RankStack>& stacks, const std::vector<WorkerResult>& workers);

class StackDumps {
 public:
  using Clock = std::chrono::steady_clock;
  // Deadlines: a dump asked for, the survivors of a failure, a hang.
  static constexpr std::chrono::milliseconds kOnDemand{2000}, kAtFailure{1000}, kAtHang{2000};
  static constexpr int kHangExitCode = ddprun::kHangExitCode;  // report.hpp

  StackDumps(const Options& o, std::string hostname);

  // The worker's environment: the bootstrap first on PYTHONPATH and its stack file; with
  // --hang-timeout, DDPRUN_HEARTBEAT_FILE.
  void add_env(std::map<std::string, std::string>& env, const WorkerResult& w) const;
  bool enabled() const { return o_.stack_dumps; }  // (--no-stack-dumps: false)
  // Whether signal `sig` to ddprun asks for a dump (SIGURG; SIGQUIT unless it stops).
  bool is_trigger(int sig) const;
  static std::vector<int> trigger_signals(const Options& o);

  // Whether a trigger from `sender` is a worker's bootstrap saying it is about to fail (an
  // uncaught exception); false: a dump was asked for (on_demand). `failing` is that worker
  // when its failure is news: the attempt's first, while the job is not stopping (workers
  // that raise KeyboardInterrupt as it stops are no failure); nullptr otherwise.
  bool failure_notice(int sig, pid_t sender, const std::vector<WorkerResult>& workers, bool stopping,
                      const WorkerResult*& failing) const;
  // Every running worker's stack, for ddprun's stderr; also written under attempt_dir.
  // `what` names the dump on every node ("dump 2 asked on node 1 (hostb)"), `trigger` what
  // asked for it here ("SIGQUIT"; "" when another node asked). The stacks are kept for
  // answer() (asked elsewhere) or job_wide() (asked here). A dump asked elsewhere within
  // kShared of one taken here, or the other way round (Slurm's `scancel -s URG` signals
  // every node at once, and each asks the others), shares that dump's stacks: each rank's
  // stack is shown once.
  static constexpr std::chrono::milliseconds kShared{1000};
  // stopping: the workers are being stopped (the dump's line does not say the job runs on).
  std::string on_demand(const std::vector<WorkerResult>& workers, const std::string& attempt_dir,
                        const std::string& what, const std::string& trigger = "", bool stopping = false);
  // This node's answer to the dump `what` that another node asked for: its ranks' stacks as
  // on_demand took them (encode_node_stacks).
  std::string answer(const std::string& what, const JobPlan& plan);
  // The other nodes' answers to the dump this node asked for (got.what): where every rank of
  // the job is, for ddprun's stderr; every node's dumps are written under attempt_dir. A
  // node that did not answer by the deadline is named, and so are its ranks.
  std::string job_wide(const rdzv::DumpAnswers& got, const JobPlan& plan, const std::string& attempt_dir);
  // Before the survivors of `root`'s failure are stopped: where each one was (taken now,
  // unless `root` announced its failure and they were taken then). `what` (several nodes):
  // the dump that asked the other nodes for theirs; once they answered (job_wide) the
  // summary's note shows every other rank of the job.
  void at_failure(const std::vector<WorkerResult>& workers, const WorkerResult& root, const std::string& attempt_dir,
                  const std::string& what = "");
  // Whether this attempt saw a failure (here or on another node) whose stacks were taken.
  bool failure_seen() const { return failing_ >= 0; }
  // A rank's file timer expired (TORCHELASTIC_ENABLE_FILE_TIMER): every rank's stack, that
  // one's too, before it is signalled; the summary shows them (at_failure keeps them).
  void at_expiry(const std::vector<WorkerResult>& workers, const WorkerResult& expired,
                 const std::string& attempt_dir);
  // A worker failed on another node: where this node's ranks were, before they are
  // stopped (for the line that says the job failed elsewhere).
  void at_remote_failure(const std::vector<WorkerResult>& workers, const std::string& attempt_dir);
  const std::string& failure_note() const { return failure_note_; }
  // The attempt's root cause is final: the note on where the other ranks were leaves out the
  // root and the ranks listed as failures; if the root is not the rank whose announced
  // failure the stacks were taken for (a rank that died without an exception, reaped after
  // the notice of a peer failing because of it), that peer is shown failing.
  void settle_root(const std::vector<WorkerResult>& workers, const WorkerResult& root);
  // A worker killed by a fatal signal (SIGSEGV, SIGABRT, ...): the Python stack its
  // bootstrap wrote then (crash_stack in stacks.hpp); "" for any other end, or none written.
  std::string crash_stack_of(const WorkerResult& w) const;
  // The worker whose uncaught exception's notice is about to take the others' stacks.
  void announced_by(pid_t pid) { announcer_ = pid; }
  // The worker that announced an uncaught exception this attempt (-1: none): it failed first.
  pid_t announced_failure() const { return failing_ > 0 ? failing_ : -1; }

  // --hang-timeout. Progress: last_output (any worker's output), a touch of a worker's
  // DDPRUN_HEARTBEAT_FILE. Not yet: a libddp collective that completed (libddp could touch
  // the same file, or count in shared memory that ddprun reads here).
  void attempt_started();
  std::optional<Clock::time_point> next_hang_check() const;
  // job_progress: the job-wide progress count other nodes add to (nullopt: one node); a
  // change is progress. moved: set when this node's own ranks made progress since the last
  // check (the caller adds it to the job-wide count).
  // job_read_at: when the rendezvous gave job_progress. With several nodes a hang is only
  // declared on a count read at least a check interval after the timeout ran out (the
  // others add theirs once per interval), so another node's progress is never missed for
  // the time it takes to arrive; a rendezvous that gives no count for 10 s more waits no longer.
  bool hung_now(Clock::time_point last_output, const std::vector<WorkerResult>& workers, bool several_nodes,
                std::optional<int64_t> job_progress, Clock::time_point job_read_at, bool& moved);
  // The next hang check (hung_now) at t, not before: another node declared the hang.
  void check_hang_at(Clock::time_point t) { next_check_ = t; }
  // The job was suspended (Ctrl-Z) for d: not the workers' silence.
  void suspended(Clock::duration d) { not_reading_ += d; }
  // The workers hung: their stacks, the ranks that differ; returns the lines to show now.
  // `what` (several nodes): the dump that asks the other nodes for theirs, so that the
  // report shows every rank of the job once they answered (job_wide).
  std::string on_hang(const std::vector<WorkerResult>& workers, const std::string& attempt_dir,
                      const std::string& what = "");
  // Set once the attempt hung: the one-line reason, and the block for the end of the job.
  const std::optional<std::string>& hang() const { return hang_; }
  const std::string& hang_report() const { return hang_report_; }
  // While this node stops its workers: its answer to a dump asked elsewhere is the stacks it
  // took when it began to stop (a hang, a failure); none when it took none.
  std::string answer_while_stopping(const JobPlan& plan) const;
  // Its answer once its workers all finished (exit 0) while it waits for the other nodes.
  std::string answer_finished(const JobPlan& plan) const;

 private:
  std::vector<StackTarget> targets(const std::vector<WorkerResult>& workers, const WorkerResult* skip) const;
  std::vector<std::string> prefixes(const std::vector<RankStack>& stacks, const std::string& host) const;
  std::vector<std::string> prefixes(const std::vector<RankStack>& stacks) const { return prefixes(stacks, hostname_); }
  // A dump's stacks on this node, kept until they are sent (answer) or shown with the
  // others' (job_wide): the last few only.
  struct Taken {
    std::string what;
    std::string job_file;  // where job_wide saves every node's
    std::vector<RankStack> stacks;
    int root = -1;  // the rank whose failure asked (not among the others shown)
  };
  // The hang's summary block: where each rank is (of this node, then of the job).
  struct HangView {
    std::string named, where, collectives, file;
  };
  void compose_hang_report();  // hang_report_ from hang_view_
  std::optional<Taken> take_kept(const std::string& what);
  // This node's part of a dump: its ranks, those that were running with their stacks.
  NodeStacks mine(const JobPlan& plan, std::vector<RankStack> stacks) const;
  std::string save(const std::string& attempt_dir, const std::string& name, const std::string& text);
  // The libddp collective table of the workers that keep a progress record ("" if none).
  std::string collectives(const std::vector<WorkerResult>& workers) const;
  // How many collectives the worker finished (0: none, or no record).
  uint64_t collectives_done(const WorkerResult& w) const;
  // The survivors' stacks at a failure (all but root), saved, as the summary's block.
  std::string failure_stacks(const std::vector<WorkerResult>& workers, const WorkerResult* root,
                             const std::string& attempt_dir, const std::string& title);
  std::string failure_text(const std::vector<RankStack>& stacks) const;  // the note on these stacks
  // A signal that stops the job is pending (blocked, not yet read from the signalfd).
  bool stop_pending() const;

  const Options& o_;
  std::string hostname_;
  std::string bootstrap_;
  std::chrono::milliseconds hang_timeout_{0};
  Clock::time_point progress_{};  // the last progress seen
  // Time ddprun spent taking an on-demand dump, when it read no output, or suspended: not
  // the workers' silence (hung_now() moves the last progress on by it, once).
  Clock::duration not_reading_{};
  std::optional<Clock::time_point> next_check_;
  std::string failure_note_;
  pid_t failing_ = -1;  // the worker whose announced failure failure_note_ is about
  pid_t announcer_ = -1;  // the worker that announced an uncaught exception (announced_by)
  bool root_note_ = false;  // failure_note_ is at_failure's: where the others were at a root cause
  std::optional<int64_t> job_seen_;  // the job-wide progress count at the last check
  std::map<pid_t, uint64_t> collectives_seen_;  // libddp collectives each worker had finished (--hang-timeout)
  std::map<pid_t, int64_t> heartbeats_seen_;     // each worker's heartbeat mtime (ns) at the last look
  Clock::time_point last_look_{};                // that look
  std::optional<std::string> hang_;
  std::string hang_report_;
  std::string hang_what_;  // the dump a hang asked of the other nodes
  std::string failure_what_;  // the dump this node's failure asked of the other nodes
  std::string failure_table_;  // the libddp collectives when the failure's stacks were taken
  std::string failure_title_, failure_file_;  // this node's failure note's title and saved dump
  HangView hang_view_;
  std::optional<std::vector<RankStack>> at_end_;  // taken as this node began to stop (answer_while_stopping)
  // The last on-demand dump's stacks, for another dump within kShared.
  struct LastDump {
    std::string what;
    bool remote = false;  // asked by another node
    Clock::time_point at{};
    std::vector<RankStack> stacks;
  };
  std::optional<LastDump> last_dump_;
  int dumps_ = 0;
  std::deque<Taken> kept_;
};

}  // namespace ddprun
