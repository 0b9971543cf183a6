#include "launcher/process.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "ddp/error.hpp"
#include "launcher/fileio.hpp"

namespace ddprun {

namespace {

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// A CPU mask sized for the highest CPU in it; null when the set is empty.
struct CpuMask {
  explicit CpuMask(const std::set<int>& cpus) {
    if (cpus.empty()) return;
    const int n = *cpus.rbegin() + 1;
    set = CPU_ALLOC(n);
    size = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(size, set);
    for (int c : cpus) CPU_SET_S(c, size, set);
  }
  ~CpuMask() {
    if (set) CPU_FREE(set);
  }
  CpuMask(const CpuMask&) = delete;
  CpuMask& operator=(const CpuMask&) = delete;
  cpu_set_t* set = nullptr;
  size_t size = 0;
};

// Read as the program loads, before ddprun installs any handler.
const bool g_sighup_ignored = [] {
  struct sigaction a {};
  return sigaction(SIGHUP, nullptr, &a) == 0 && !(a.sa_flags & SA_SIGINFO) && a.sa_handler == SIG_IGN;
}();

// The open-files limit ddprun was started with: its store server raises its own soft limit
// to the hard one (thousands of clients), and the workers must not inherit that (torchrun's
// do not; a container's 1024 became 20000 in every worker; QA).
struct StartLimit {
  rlimit rl{};
  bool known = ::getrlimit(RLIMIT_NOFILE, &rl) == 0;
};
const StartLimit g_nofile_at_start;

}  // namespace

bool sighup_ignored_at_start() { return g_sighup_ignored; }

bool workers_ignore_sighup(const std::vector<int>& signals_to_handle) {
  return g_sighup_ignored && std::find(signals_to_handle.begin(), signals_to_handle.end(), SIGHUP) ==
                                 signals_to_handle.end();
}

SpawnResult spawn(const SpawnSpec& spec) {
  // Everything the child needs is prepared here: after vfork only async-signal-safe calls,
  // and no writes to memory but exec_err, bind_failed and announce_pid (the child borrows
  // ddprun's memory until exec).
  std::vector<char*> argv = c_strings(spec.argv);
  std::vector<char*> envp = c_strings(spec.env);
  const char* path = spec.path.c_str();
  const int in_fd = spec.stdin_fd, out_fd = spec.stdout_fd, err_fd = spec.stderr_fd, keep_fd = spec.inherit_fd;
  const pid_t parent = getpid();
  const bool hup_ignored = spec.ignore_sighup;
  const int announce_fd = spec.announce_fd;
  volatile int32_t announce_pid = 0;  // the child's pid, written by the child (announce_fd)
  sigset_t none;
  sigemptyset(&none);
  const CpuMask cpus(spec.cpus);
  volatile int exec_err = 0;
  volatile bool bind_failed = false;

  // vfork: no page tables to copy, and ddprun resumes only once the child has exec'd or
  // failed, so the exec's outcome is known without a pipe.
  pid_t pid = vfork();
  if (pid < 0) return SpawnResult{-1, errno ? errno : EAGAIN, false, true};
  if (pid == 0) {
    setsid();  // a session and group of its own, no controlling terminal (as torchrun 2.x's)
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(128 + SIGKILL);  // ddprun died before the signal was armed
    if (announce_fd >= 0) {
      announce_pid = static_cast<int32_t>(getpid());
      const int32_t* me = const_cast<const int32_t*>(&announce_pid);
      while (write(announce_fd, me, sizeof *me) < 0 && errno == EINTR) {
      }
    }
    // Dispositions ddprun changed must not leak into the worker (ignored ones survive exec);
    // nohup's ignored SIGHUP is the worker's too.
    struct sigaction dfl {}, ign {};
    dfl.sa_handler = SIG_DFL;
    ign.sa_handler = SIG_IGN;
    for (int s = 1; s < NSIG; ++s)
      if (s != SIGKILL && s != SIGSTOP) sigaction(s, s == SIGHUP && hup_ignored ? &ign : &dfl, nullptr);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (g_nofile_at_start.known) setrlimit(RLIMIT_NOFILE, &g_nofile_at_start.rl);
    if (keep_fd >= 0) fcntl(keep_fd, F_SETFD, 0);  // the child's descriptor table is its own
    if (cpus.set && sched_setaffinity(0, cpus.size, cpus.set) != 0) {  // before exec: every thread inherits it
      exec_err = errno ? errno : EINVAL;
      bind_failed = true;
      _exit(127);
    }
    // dup2 onto itself keeps close-on-exec (ddprun started with that descriptor closed, and
    // opened one of its own there): cleared instead.
    if ((in_fd < 0 || (in_fd == 0 ? fcntl(0, F_SETFD, 0) : dup2(in_fd, 0)) >= 0) &&
        (out_fd < 0 || (out_fd == 1 ? fcntl(1, F_SETFD, 0) : dup2(out_fd, 1)) >= 0) &&
        (err_fd < 0 || (err_fd == 2 ? fcntl(2, F_SETFD, 0) : dup2(err_fd, 2)) >= 0))
      execve(path, argv.data(), envp.data());
    exec_err = errno ? errno : EINVAL;
    _exit(127);
  }
  return SpawnResult{pid, exec_err, bind_failed};
}

bool job_control_above() {
  const pid_t group = getpgrp(), session = getsid(0);
  pid_t p = getppid();
  // Up through this group's members (PID 1 too: it may be a container's shell).
  for (int depth = 0; depth < 64 && p > 0; ++depth) {
    const pid_t pg = getpgid(p);
    if (pg < 0) return false;
    if (pg != group) return getsid(p) == session;
    pid_t up = 0;
    if (!process_state(p, &up)) return false;
    p = up;
  }
  return false;
}

namespace {

// The pids.max of this process's cgroup (v2, or v1's pids hierarchy); "" when none is set.
std::string cgroup_pids_max() {
  std::istringstream in(read_file("/proc/self/cgroup", 64 << 10).value_or(""));
  for (std::string line; std::getline(in, line);) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string ctl = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::string file;
    if (ctl == "pids") file = "/sys/fs/cgroup/pids" + path + "/pids.max";
    else if (ctl.empty() && line.compare(0, a, "0") == 0) file = "/sys/fs/cgroup" + path + "/pids.max";
    else continue;
    std::string v = read_file(file, 64).value_or("");
    while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
    if (!v.empty() && v != "max") return v;
  }
  return "";
}

}  // namespace

std::string describe_fork_failure(int err) {
  std::string why = fmt::format("cannot make a process for it: vfork: {}", ddp::errno_text(err));
  if (err != EAGAIN) return why;
  std::string limits;
  if (const std::string pids = cgroup_pids_max(); !pids.empty())
    limits = fmt::format("the cgroup's pids.max {} (a container's --pids-limit, Kubernetes' podPidsLimit)", pids);
  rlimit rl{};
  if (getrlimit(RLIMIT_NPROC, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    limits += fmt::format("{}ulimit -u {}", limits.empty() ? "" : ", or ", rl.rlim_cur);
  return why + (limits.empty() ? " (the processes and threads this job may have are used up)"
                               : fmt::format(" (the processes and threads this job may have are used up: {})", limits));
}

std::string describe_exec_failure(const std::string& path, int err) {
  if (err == ENOENT && path.find('/') == std::string::npos) {  // looked for in PATH, and not found
    const char* p = getenv("PATH");
    return fmt::format("cannot execute {}: not found in any folder of PATH ({}){}", path, p && *p ? p : "unset",
                       path.starts_with("python") ? "; PYTHON_EXEC names the Python interpreter the workers run" : "");
  }
  std::string msg = fmt::format("cannot execute {}: {}", path, ddp::errno_text(err));
  if (err == ENOENT || err == EACCES || err == ENOEXEC) {
    auto text = read_file(path, 512);  // the #! line, if any
    std::string first = text ? text->substr(0, text->find('\n')) : "";
    if (first.starts_with("#!")) {
      std::istringstream ss(first.substr(2));
      std::string interp;
      ss >> interp;
      if (!interp.empty() && access(interp.c_str(), X_OK) != 0)
        msg += fmt::format(" (bad interpreter '{}': {})", interp, ddp::errno_text(errno));
    } else if (err == ENOEXEC) {
      msg += " (not a binary and no #! line)";
    }
  }
  return msg;
}

void become_subreaper() { prctl(PR_SET_CHILD_SUBREAPER, 1); }

void open_closed_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    // The lowest free number: fd itself, as the ones below it are open by now.
    int n = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (n < 0) n = ::open("/", O_PATH);  // (no /dev/null: the number is taken all the same)
    if (n >= 0 && n != fd) {
      ::dup2(n, fd);
      ::close(n);
    }
  }
}

bool kernel_at_least(int major, int minor) {
  utsname u{};
  int ma = 0, mi = 0;
  if (uname(&u) != 0 || std::sscanf(u.release, "%d.%d", &ma, &mi) != 2) return false;
  return ma > major || (ma == major && mi >= minor);
}

namespace {
constexpr unsigned kPidfdSignalProcessGroup = 1u << 2;  // PIDFD_SIGNAL_PROCESS_GROUP (Linux 6.9)
}

WorkerGroup::WorkerGroup(pid_t leader) : leader_(leader) {
#ifdef SYS_pidfd_open
  pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, leader, 0));  // -1 before Linux 5.3
#endif
}

WorkerGroup& WorkerGroup::operator=(WorkerGroup&& o) noexcept {
  if (this != &o) {
    close_pidfd();
    leader_ = std::exchange(o.leader_, -1);
    pidfd_ = std::exchange(o.pidfd_, -1);
    reaped_ = o.reaped_;
    empty_ = o.empty_;
  }
  return *this;
}

WorkerGroup::~WorkerGroup() { close_pidfd(); }

void WorkerGroup::close_pidfd() {
  if (pidfd_ >= 0) close(pidfd_);
  pidfd_ = -1;
}

bool WorkerGroup::leader_reaped() {
  reaped_ = true;
  // Asked at once: the number cannot have been handed on yet (it takes a wrap of the pid space).
  empty_ = kill(-leader_, 0) != 0 && errno == ESRCH;
  if (empty_) close_pidfd();
  return empty_;
}

void WorkerGroup::signal(int sig) {
  if (leader_ <= 0 || empty_) return;
  if (!reaped_) {
    if (kill(-leader_, sig) != 0 && errno == ESRCH) kill(leader_, sig);  // before its setsid
    return;
  }
#ifdef SYS_pidfd_send_signal
  if (pidfd_ >= 0) syscall(SYS_pidfd_send_signal, pidfd_, sig, nullptr, kPidfdSignalProcessGroup);
#endif  // (EINVAL before Linux 6.9: nothing is sent)
}

namespace {

// The state letter of a /proc stat file (a process's or a thread's), 0 when unreadable;
// its parent and its flags (the 9th field) if asked.
char stat_state(const std::string& path, pid_t* ppid, unsigned long* flags = nullptr) {
  auto stat = read_file(path, 1024);
  if (!stat) return 0;
  auto close = stat->rfind(')');
  if (close == std::string::npos || close + 4 >= stat->size()) return 0;
  if (ppid) {
    *ppid = 0;
    const char* p = stat->data() + close + 4;
    std::from_chars(p, stat->data() + stat->size(), *ppid);
  }
  if (flags) {  // (not on the once-a-second walk of descendants())
    std::istringstream fields(stat->substr(close + 4));
    std::string skip;
    fields >> skip >> skip >> skip >> skip >> skip;  // ppid pgrp session tty_nr tpgid
    if (!(fields >> *flags)) *flags = 0;
  }
  return (*stat)[close + 2];
}

}  // namespace

char process_state(pid_t pid, pid_t* ppid) { return stat_state(fmt::format("/proc/{}/stat", pid), ppid); }

std::optional<std::vector<std::pair<std::string, char>>> thread_states(pid_t pid) {
  const std::string dir = fmt::format("/proc/{}/task", pid);
  DIR* d = opendir(dir.c_str());
  if (!d) return std::nullopt;
  std::vector<std::pair<std::string, char>> out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    out.emplace_back(e->d_name, stat_state(dir + "/" + e->d_name + "/stat", nullptr));
  }
  closedir(d);
  return out;
}

bool process_gone(pid_t pid) {
  char s = process_state(pid);
  return s == 0 || s == 'Z' || s == 'X';
}

bool process_dying(pid_t pid) {
  constexpr unsigned long kPfExiting = 0x4;  // the kernel's PF_EXITING
  unsigned long flags = 0;
  const char s = stat_state(fmt::format("/proc/{}/stat", pid), nullptr, &flags);
  if (s == 0 || s == 'Z' || s == 'X' || (flags & kPfExiting)) return true;
  const auto kill = 1ull << (SIGKILL - 1);
  return (status_mask(pid, "SigPnd") & kill) || (status_mask(pid, "ShdPnd") & kill);
}

unsigned long long status_mask(pid_t pid, std::string_view field) {
  std::istringstream status(read_file(fmt::format("/proc/{}/status", pid)).value_or(""));
  for (std::string line; std::getline(status, line);) {
    if (!line.starts_with(field) || line.size() <= field.size() || line[field.size()] != ':') continue;
    unsigned long long mask = 0;
    const size_t at = line.find_first_not_of(" \t", field.size() + 1);
    if (at != std::string::npos) std::from_chars(line.data() + at, line.data() + line.size(), mask, 16);
    return mask;
  }
  return 0;
}

std::vector<pid_t> descendants(pid_t skip, pid_t root) {
  std::vector<pid_t> out;
  std::vector<pid_t> frontier{root > 0 ? root : getpid()};
  while (!frontier.empty()) {
    pid_t p = frontier.back();
    frontier.pop_back();
    std::string taskdir = fmt::format("/proc/{}/task", p);
    DIR* d = opendir(taskdir.c_str());
    if (!d) continue;
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::istringstream f(read_file(taskdir + "/" + e->d_name + "/children").value_or(""));
      pid_t c;
      while (f >> c) {
        if (c == skip) continue;
        out.push_back(c);
        frontier.push_back(c);
      }
    }
    closedir(d);
  }
  return out;
}

std::string find_executable(const std::string& name, const std::string& path_env) {
  auto ok = [](const std::string& p) {
    struct stat st {};
    return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) return name;
  size_t start = 0;
  while (start <= path_env.size()) {
    size_t end = path_env.find(':', start);
    if (end == std::string::npos) end = path_env.size();
    std::string dir = path_env.substr(start, end - start);
    std::string cand = (dir.empty() ? "." : dir) + "/" + name;
    if (ok(cand)) return cand;
    start = end + 1;
  }
  return "";
}

std::string cmdline_of(pid_t pid) {
  std::string raw = read_file(fmt::format("/proc/{}/cmdline", pid), 4096).value_or("");
  while (!raw.empty() && raw.back() == '\0') raw.pop_back();
  for (char& c : raw)
    if (c == '\0') c = ' ';
  return raw;
}

}  // namespace ddprun
