// Starting and ending worker processes with POSIX calls (see docs/design.md for why not
// Boost.Process): own session and process group, death signal armed without a race, exec
// failure reported back to ddprun, only async-signal-safe calls between vfork and exec.
#pragma once

#include <sys/types.h>

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddprun {

// Whether SIGHUP was ignored when ddprun started (`nohup ddprun ...`): ddprun then leaves it
// ignored (unless --signals-to-handle lists it), and so do its workers, as they would under
// nohup themselves.
bool sighup_ignored_at_start();

struct SpawnSpec {
  std::string path;               // resolved executable
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // "KEY=VALUE"
  int stdin_fd = -1;              // dup2'ed onto 0 in the child; -1 inherits
  int stdout_fd = -1;             // dup2'ed onto 1 in the child; -1 inherits
  int stderr_fd = -1;             // dup2'ed onto 2 in the child; -1 inherits
  int inherit_fd = -1;            // a close-on-exec descriptor the child keeps (same number)
  std::set<int> cpus{};           // the CPUs it may run on (--numa-binding); empty: ddprun's
  bool ignore_sighup = false;     // starts with SIGHUP ignored (nohup's; else every signal at its default)
  // Before its exec, the child writes its pid (the group it leads) there as an int32: the
  // guardian's (Guardian::announce_fd), which then knows the group before anything in it can
  // fork. Told after spawn() returned, a ddprun SIGKILLed in between left what the worker
  // had started by then to run on.
  int announce_fd = -1;
};

// Whether the workers start with SIGHUP ignored: under nohup, unless ddprun handles SIGHUP
// (then it passes it on, and they must not ignore it).
bool workers_ignore_sighup(const std::vector<int>& signals_to_handle);

struct SpawnResult {
  pid_t pid = -1;
  int exec_errno = 0;       // != 0: execve failed with this errno (the child has exited 127)
  bool bind_failed = false;  // with exec_errno: sched_setaffinity to spec.cpus failed (no exec)
  bool fork_failed = false;  // with exec_errno: vfork itself failed (no child; pid -1)
};

// vfork + exec. The child leads its own session and process group (no controlling
// terminal) and gets SIGKILL if ddprun dies.
// Returns once the child has exec'd (or failed to); fork_failed when vfork failed.
SpawnResult spawn(const SpawnSpec& spec);

// Why no process could be made for a worker (vfork's errno): for EAGAIN, the limits on
// processes that apply (RLIMIT_NPROC, the cgroup's pids.max: a container's --pids-limit).
std::string describe_fork_failure(int err);

// Explains an exec failure: "cannot execute /x/y.sh: Permission denied", with the bad
// interpreter named when a #! line points nowhere.
std::string describe_exec_failure(const std::string& path, int err);

// Makes ddprun the reaper of every orphan its workers leave behind.
void become_subreaper();

// Opens /dev/null on each of stdin, stdout and stderr that ddprun was started with closed
// (`ddprun ... <&- >&-`), first thing: the next descriptor ddprun opened (its signalfd, the
// guardian's pipe) would otherwise take that number, and the workers' output would go into it.
void open_closed_standard_fds();

// Whether the running kernel is at least major.minor (false when it cannot tell).
bool kernel_at_least(int major, int minor);

// A worker's process group: the worker leads it, so its id is the worker's pid. Once the
// worker is reaped that number is free, and when the group has emptied too the kernel may
// give it to an unrelated group (after a wrap of the pid space: minutes on a busy host): the
// number alone is never signalled again. A pidfd of the worker, taken before it can be
// reaped, still names the group itself (Linux 6.9's PIDFD_SIGNAL_PROCESS_GROUP), never a
// newcomer with its number. On older kernels a group whose leader was reaped is not
// signalled: what is left in it descends from ddprun (a subreaper), which kills it by pid.
class WorkerGroup {
 public:
  WorkerGroup() = default;
  explicit WorkerGroup(pid_t leader);  // a worker not yet reaped (a child, or one ddprun adopts)
  WorkerGroup(WorkerGroup&& o) noexcept { *this = std::move(o); }
  WorkerGroup& operator=(WorkerGroup&& o) noexcept;
  ~WorkerGroup();

  pid_t id() const { return leader_; }
  // The worker has just been reaped; true when nothing is left in its group either.
  bool leader_reaped();
  bool empty() const { return empty_; }  // as leader_reaped() found it
  // sig to every process in the group (to the worker alone before it made the group).
  void signal(int sig);

 private:
  void close_pidfd();

  pid_t leader_ = -1;
  int pidfd_ = -1;
  bool reaped_ = false, empty_ = false;
};

// The state letter of /proc/<pid>/stat (R, S, D, Z...), 0 when the process is gone; its
// parent in *ppid if asked.
char process_state(pid_t pid, pid_t* ppid = nullptr);
// Whether this process's group has a job-control parent: a process in another group of its
// session (an interactive shell) that can continue it. When none has (the group is
// orphaned: ddprun leads the session, or a non-interactive shell above it does), the
// kernel drops the terminal's stop signals, since nothing could ever continue the job.
bool job_control_above();
// Each thread of pid (its id in /proc/<pid>/task) and its state letter (0: unreadable);
// nullopt when the process is gone.
std::optional<std::vector<std::pair<std::string, char>>> thread_states(pid_t pid);
// Gone, or a zombie.
bool process_gone(pid_t pid);
// Gone, a zombie, in its exit (a SIGKILLed process frees its memory before its descriptors
// close), or with SIGKILL pending: it ends within moments.
bool process_dying(pid_t pid);
// A signal mask of /proc/<pid>/status ("SigBlk", "SigPnd", "ShdPnd"...); 0 when unreadable.
unsigned long long status_mask(pid_t pid, std::string_view field);

// Every descendant of `root` (this process by default; children first), read from /proc;
// not `skip` nor anything below it.
std::vector<pid_t> descendants(pid_t skip = -1, pid_t root = -1);

// A process's command line, its arguments joined by spaces (the first 4 KiB; "" once gone).
std::string cmdline_of(pid_t pid);

// Resolves a command like execvp would; "" if not found.
std::string find_executable(const std::string& name, const std::string& path_env);

}  // namespace ddprun
