// `ddprun --dump-stacks [PID]`: finds the running ddprun job of this user on this machine and
// asks it for every rank's stack (with SIGURG, which no ddprun stops for and whose default
// action is to ignore it). The stacks appear in that ddprun's output, not here.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>

#include "ddp/error.hpp"
#include "launcher/fileio.hpp"
#include "launcher/process.hpp"
#include "launcher/stack_dump.hpp"

namespace ddprun {

namespace {

struct Job {
  pid_t pid;
  std::string cmdline;
};

// A ddprun started under another name (a `torchrun` symlink or copy, the drop-in use): its
// executable is named ddprun, or is this very binary (looked up once).
bool runs_ddprun(pid_t pid) {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink(fmt::format("/proc/{}/exe", pid), ec);
  if (ec) return false;
  if (exe.filename() == "ddprun") return true;
  static const std::pair<dev_t, ino_t> mine = [] {
    struct stat st {};
    return ::stat("/proc/self/exe", &st) == 0 ? std::pair(st.st_dev, st.st_ino) : std::pair<dev_t, ino_t>{};
  }();
  struct stat theirs {};
  return mine.second != 0 && ::stat(fmt::format("/proc/{}/exe", pid).c_str(), &theirs) == 0 &&
         std::pair(theirs.st_dev, theirs.st_ino) == mine;
}

// A ddprun that supervises a job (not a --dump-stacks like this one, not its guardian,
// which calls itself ddprun-guard), owned by this user (any, for root). Started through
// the dynamic loader (docker/Containerfile.pytorch) it is named after the loader, and its
// command line names the ddprun binary the loader runs.
bool is_job(pid_t pid) {
  struct stat st {};
  if (pid == getpid() || ::stat(fmt::format("/proc/{}", pid).c_str(), &st) != 0) return false;
  if (geteuid() != 0 && st.st_uid != geteuid()) return false;
  const std::string comm = read_file(fmt::format("/proc/{}/comm", pid), 64).value_or("");
  const std::string cmdline = cmdline_of(pid);
  // (ddprun's own helpers, forks of it, rename themselves "ddprun-guard", "ddprun-probe")
  bool named = comm == "ddprun\n" || (!comm.starts_with("ddprun-") && runs_ddprun(pid));
  if (comm.starts_with("ld-linux") || comm.starts_with("ld.so")) {
    std::istringstream args(cmdline);
    std::string arg;
    for (int i = 0; i < 8 && !named && args >> arg; ++i) named = arg.ends_with("/ddprun");
  }
  return named && cmdline.find("--dump-stacks") == std::string::npos;
}

std::vector<Job> running_jobs() {
  std::vector<Job> jobs;
  DIR* d = opendir("/proc");
  if (!d) throw ddp::SystemError("opendir /proc", errno);
  while (dirent* e = readdir(d)) {
    pid_t pid = 0;
    auto [p, ec] = std::from_chars(e->d_name, e->d_name + strlen(e->d_name), pid);
    if (ec != std::errc() || *p != '\0' || !is_job(pid)) continue;
    jobs.push_back(Job{pid, cmdline_of(pid)});
  }
  closedir(d);
  return jobs;
}

// Whether ddprun `pid` reads SIGURG (it blocks the signals it reads from its signalfd).
bool takes_dumps(pid_t pid) { return (status_mask(pid, "SigBlk") >> (kWorkerSignal - 1)) & 1; }

}  // namespace

int dump_stacks_command(pid_t pid) {
  std::vector<Job> jobs = running_jobs();
  Job target{pid, ""};
  if (pid > 0) {
    auto it = std::find_if(jobs.begin(), jobs.end(), [&](const Job& j) { return j.pid == pid; });
    if (it == jobs.end())
      throw ddp::Error(fmt::format("--dump-stacks: pid {} is not a running ddprun job of yours", pid));
    target = *it;
  } else if (jobs.empty()) {
    throw ddp::Error("--dump-stacks: no running ddprun job of yours on this machine");
  } else if (jobs.size() > 1) {
    std::string list;
    for (const auto& j : jobs) list += fmt::format("; {}: {}", j.pid, j.cmdline);
    throw ddp::Error(fmt::format("--dump-stacks: {} ddprun jobs are running, name one (ddprun --dump-stacks PID){}",
                                 jobs.size(), list));
  } else {
    target = jobs.front();
  }
  if (!takes_dumps(target.pid))
    throw ddp::Error(fmt::format("--dump-stacks: ddprun {} takes no stack dumps (--no-stack-dumps, or an older ddprun)",
                                 target.pid));
  if (kill(target.pid, kWorkerSignal) != 0)
    throw ddp::SystemError(fmt::format("--dump-stacks: signal ddprun {}", target.pid), errno);
  fmt::print("ddprun: asked ddprun {} ({}) for every rank's stack; they appear in its output\n", target.pid,
             target.cmdline);
  return 0;
}

}  // namespace ddprun
