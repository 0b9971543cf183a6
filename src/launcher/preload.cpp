#include "launcher/preload.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "launcher/guardian.hpp"
#include "launcher/process.hpp"
#include "launcher/report.hpp"
#include "launcher/stack_dump.hpp"

namespace ddprun {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kReplyTimeoutMs = 10000;  // a fork answers in milliseconds

// Whether another attempt or round may come, so the warm process keeps spare workers ready
// for it (forked ahead: a restart forks nothing).
bool refills(const Options& o) { return o.max_restarts > 0 || (o.dynamic() && o.max_nodes > 1); }

bool uses_python(const Options& o) {
  WorkerCommand probe = worker_command(o, 0, {});
  return probe.argv.size() >= 2 && probe.argv[1] == "-u";
}

void send_all(int fd, const std::string& data, const int* fds, int nfds) {
  const uint32_t n = htonl(static_cast<uint32_t>(data.size()));
  msghdr msg{};
  iovec iov{const_cast<uint32_t*>(&n), sizeof n};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<cmsghdr> ctrl(CMSG_SPACE(static_cast<size_t>(nfds) * sizeof(int)) / sizeof(cmsghdr) + 1);
  if (nfds > 0) {
    msg.msg_control = ctrl.data();
    msg.msg_controllen = CMSG_SPACE(static_cast<size_t>(nfds) * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(static_cast<size_t>(nfds) * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds, static_cast<size_t>(nfds) * sizeof(int));
  }
  ssize_t w;
  while ((w = sendmsg(fd, &msg, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
  }
  if (w != static_cast<ssize_t>(sizeof n)) throw ddp::SystemError("sending to the warm Python process", errno);
  for (size_t off = 0; off < data.size();) {
    ssize_t k = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) throw ddp::SystemError("sending to the warm Python process", errno);
    off += static_cast<size_t>(k);
  }
}

// Exactly n bytes within the deadline; false at the socket's end or the deadline.
bool read_exact(int fd, char* p, size_t n, int timeout_ms) {
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    ssize_t k = ::read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

std::optional<json> read_message(int fd, int timeout_ms) {
  uint32_t n = 0;
  if (!read_exact(fd, reinterpret_cast<char*>(&n), sizeof n, timeout_ms)) return std::nullopt;
  std::string data(ntohl(n), '\0');
  if (!read_exact(fd, data.data(), data.size(), timeout_ms)) return std::nullopt;
  try {
    return json::parse(data);
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

// "a\0b\0c": how the warm process reads arguments and environments (bytes, no encoding).
std::string nul_joined(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += '\0';
    out += items[i];
  }
  return out;
}

// Until every process of `pids` (killed) is gone: reaped here once its parent died and
// ddprun, the subreaper, adopted it, or a zombie of another. At most 2 s.
void wait_gone(std::vector<pid_t> pids) {
  for (int i = 0; i < 2000 && !pids.empty(); ++i) {
    std::erase_if(pids, [](pid_t p) { return waitpid(p, nullptr, WNOHANG) == p || process_gone(p); });
    if (!pids.empty()) usleep(1000);
  }
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) return "was killed by " + signal_name(WTERMSIG(status));
  return fmt::format("exited with code {}", WEXITSTATUS(status));
}

}  // namespace

std::string check_preload_list(const std::vector<std::string>& modules) {
  static const std::regex name(R"([A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)");
  if (modules.empty()) return "expected Python modules like torch,numpy";
  for (const auto& m : modules)
    if (!std::regex_match(m, name)) return fmt::format("'{}' is not a Python module name (expected e.g. torch,numpy)", m);
  return "";
}

WarmPython::WarmPython(const Options& o, Guardian& guardian) : o_(o), guardian_(guardian) {
  if (o.preload.empty()) return;
  if (!uses_python(o)) {
    spdlog::warn("--preload: {} does not run through Python: its workers start cold", o.script);
    return;
  }
  std::string dir = bootstrap_dir();
  if (dir.empty())
    throw ddp::Error(fmt::format("--preload: ddprun's warm process (share/ddprun/python/ddprun_preload.py next "
                                 "to {}) is missing",
                                 fs::read_symlink("/proc/self/exe").string()));
  script_ = dir + "/ddprun_preload.py";
  enabled_ = true;
}

WarmPython::~WarmPython() { stop(); }

void WarmPython::stop() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  if (pid_ > 0) {
    const std::vector<pid_t> below = descendants(-1, pid_);  // its spare workers (own groups) and their cat
    for (pid_t p : below) kill(p, SIGKILL);
    kill(-pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);  // ECHILD when ddprun's reaper had it already
    wait_gone(below);
    guardian_.forget(pid_);  // (reaped: its number is free)
  }
  pid_ = -1;
  ready_ = false;
}

bool WarmPython::show_stack(const std::string& why) {
  if (fd_ < 0 || pid_ <= 0 || ready_ || process_gone(pid_)) return false;
  spdlog::warn("{}: no worker runs yet: the warm Python process (pid {}, --preload) is importing {}; where it is "
               "(innermost frame first):",
               why, pid_, fmt::join(o_.preload, ","));
  return ::kill(pid_, SIGURG) == 0;
}

void WarmPython::start(const Env& env) {
  if (!enabled_) return;
  // One runs, unless it died since and ddprun has not read that yet (killed with a worker
  // whose end was read first): reaped here, it is replaced now, not asked in vain.
  if (fd_ >= 0 && pid_ > 0 && process_dying(pid_)) {
    how_it_ended();  // reaps it (a second at most)
    if (exit_status_) exited(pid_, *exit_status_);
  }
  if (fd_ >= 0) return;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    throw ddp::SystemError("socketpair for the warm Python process", errno);
  WorkerCommand py = worker_command(o_, 0, env);
  SpawnSpec spec{py.path,
                 {py.argv[0], "-u", script_, std::to_string(sv[1]), std::to_string(getpid()),
                  fmt::format("{}", fmt::join(o_.preload, ",")), std::to_string(o_.nproc_per_node),
                  refills(o_) ? "1" : "0"},
                 to_envp(env)};
  // [-m] SCRIPT ARGS: local rank 0's, what its preloaded modules see in sys.argv
  spec.argv.insert(spec.argv.end(), py.argv.begin() + 2, py.argv.end());
  spec.inherit_fd = sv[1];
  spec.ignore_sighup = workers_ignore_sighup(o_.signals_to_handle);  // (its forks' too)
  spec.stdout_fd = 2;  // what it prints (an import's warning) goes to ddprun's stderr
  spec.stdin_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  SpawnResult r = ddprun::spawn(spec);
  close(sv[1]);
  if (spec.stdin_fd >= 0) close(spec.stdin_fd);
  if (r.exec_errno) {  // the workers start cold, and fail as they would have without --preload
    close(sv[0]);
    if (r.pid > 0) waitpid(r.pid, nullptr, 0);
    spdlog::warn("--preload: {}: the workers start cold",
                 r.fork_failed ? describe_fork_failure(r.exec_errno) : describe_exec_failure(py.path, r.exec_errno));
    enabled_ = false;
    return;
  }
  guardian_.watch(r.pid);
  try {  // what it was started with: it tells the worker what its start-up changed
    send_all(sv[0], nul_joined(spec.env), nullptr, 0);
  } catch (const ddp::Error&) {
  }  // (it died at once: the answer says how)
  fd_ = sv[0];
  pid_ = r.pid;
  exit_status_.reset();
  ready_ = false;
  if (starts_++ > 0) spdlog::warn("--preload: started a new warm Python process (pid {})", pid_);
}

// Why the warm process ended before it answered: its exit status, once it can be had.
std::string WarmPython::how_it_ended() {
  for (int i = 0; i < 100 && pid_ > 0 && !exit_status_; ++i) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) exit_status_ = status;
    else usleep(10000);
  }
  return exit_status_ ? describe_status(*exit_status_) : "stopped answering";
}

void WarmPython::on_ready() {
  if (ready_ || fd_ < 0) return;
  auto msg = read_message(fd_, kReplyTimeoutMs);
  if (!msg || !msg->is_object()) {
    std::string how = how_it_ended();
    stop();
    throw ddp::Error(fmt::format("--preload: the warm Python process {} before it was ready (its output is above)",
                                 how));
  }
  if (msg->contains("error")) {
    std::string why = msg->value("error", std::string());
    stop();
    throw ddp::Error("--preload: " + why);
  }
  ready_ = true;
  std::vector<std::string> threads = msg->value("threads", std::vector<std::string>());
  if (!threads.empty())
    spdlog::warn("--preload: {} thread(s) run in the warm process after importing {}, and a forked worker has "
                 "none of them: {}",
                 threads.size(), fmt::join(o_.preload, ","), fmt::join(threads, ", "));
  spdlog::info("--preload: imported {} in {} s (warm process pid {})", fmt::join(o_.preload, ","),
               msg->value("seconds", 0.0), pid_);
}

void WarmPython::exited(pid_t pid, int status) {
  if (pid != pid_) return;
  pid_ = -1;
  // Its number is free: the guardian must not kill it later. (What may be left in its group,
  // children between that are `cat`s on its pipes, ends with that pipe.)
  guardian_.forget(pid);
  exit_status_ = status;
  if (!ready_) return;  // on_ready() reads the socket's end and says how it ended
  spdlog::warn("--preload: the warm Python process (pid {}) {}: the next workers come from a new one", pid,
               describe_status(status));
  stop();
}

// One request: specs[from, to) forked through one child between; their pids in order.
std::vector<pid_t> WarmPython::fork_batch(const std::vector<SpawnSpec>& specs, size_t from, size_t to) {
  std::vector<std::string> req{std::to_string(to - from)};
  std::vector<int> fds;
  for (size_t i = from; i < to; ++i) {
    const SpawnSpec& s = specs[i];
    // (-m|s) argc argv... envc env... cpus: python, -u and -m are not arguments of the script.
    std::vector<std::string> argv(s.argv.begin() + (o_.module ? 3 : 2), s.argv.end());
    req.push_back(o_.module ? "m" : "s");
    req.push_back(std::to_string(argv.size()));
    req.insert(req.end(), argv.begin(), argv.end());
    req.push_back(std::to_string(s.env.size()));
    req.insert(req.end(), s.env.begin(), s.env.end());
    std::string cpus;  // "0,1,5": the CPUs it runs on; "": the warm process's
    for (int c : s.cpus) {
      if (!cpus.empty()) cpus += ',';
      cpus += std::to_string(c);
    }
    req.push_back(cpus);
    fds.insert(fds.end(), {s.stdin_fd >= 0 ? s.stdin_fd : 0, s.stdout_fd, s.stderr_fd});
  }
  send_all(fd_, nul_joined(req), fds.data(), static_cast<int>(fds.size()));
  auto reply = read_message(fd_, kReplyTimeoutMs);
  if (!reply || !reply->contains("pids"))
    throw ddp::Error(reply ? reply->value("error", std::string("no pids")) : std::string("no answer"));
  return reply->at("pids").get<std::vector<pid_t>>();
}

std::vector<SpawnResult> WarmPython::spawn(const std::vector<SpawnSpec>& specs) {
  constexpr size_t kBatch = 64;  // 192 descriptors: under the kernel's 253 a message
  std::vector<SpawnResult> out(specs.size());
  for (size_t from = 0; from < specs.size() && ready_ && fd_ >= 0; from += kBatch) {
    const size_t to = std::min(specs.size(), from + kBatch);
    try {
      std::vector<pid_t> pids = fork_batch(specs, from, to);
      size_t cold = to - from;
      for (size_t i = 0; i < pids.size() && from + i < to; ++i)
        if (pids[i] > 0) out[from + i].pid = pids[i], --cold;
      if (cold) spdlog::warn("--preload: {} worker(s) could not be forked: they start cold", cold);
    } catch (const ddp::Error& e) {
      spdlog::warn("--preload: the warm Python process did not fork the workers ({}): they start cold", e.what());
      stop();
    }
  }
  return out;
}

}  // namespace ddprun
