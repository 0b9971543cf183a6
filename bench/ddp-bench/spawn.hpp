// spawn_local(n, fn): forks n ranks on this host that rendezvous through a FileStore in a
// fresh temporary directory; fn(rank, store) runs in each child, whose exit code is fn's.
// Returns 0 if every child exited 0, else 1 (naming the failed ranks on stderr). For trying
// programs without a launcher; under ddprun use ddp::init_process_group_from_env instead.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/error_file.hpp"
#include "ddp/process_group.hpp"
#include "ddp/ddp.hpp"
#include "file_store.hpp"

namespace ddp_testing {

inline int spawn_local(int n, const std::function<int(int, std::shared_ptr<ddp::Store>)>& fn) {
  char tmpl[] = "/tmp/ddp-spawn-XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("mkdtemp");
    return 1;
  }
  std::string dir = tmpl;
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      for (pid_t p : pids) kill(p, SIGKILL);
      break;
    }
    if (pid == 0) {
      int rc = fn(r, std::make_shared<FileStore>(dir));
      std::fflush(nullptr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  int result = static_cast<int>(pids.size()) == n ? 0 : 1;
  for (int r = 0; r < static_cast<int>(pids.size()); ++r) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      std::fprintf(stderr, "spawn: rank %d %s %d\n", r, WIFSIGNALED(st) ? "killed by signal" : "exited with",
                   WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
      result = 1;
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return result;
}

// Joins the job and runs body on the group: as `spawn` forked ranks meeting in a FileStore
// when spawn > 0, else from ddprun's environment.
inline int with_process_group(int spawn, const ddp::ProcessGroupOptions& options,
                              const std::function<int(ddp::ProcessGroup&)>& body) {
  if (spawn > 0)
    return spawn_local(spawn, [&](int rank, std::shared_ptr<ddp::Store> store) {
      return ddp::run_main([&] {
        ddp::ProcessGroupOptions so = options;
        so.rank = rank;
        so.world_size = spawn;
        so.local_rank = rank;
        so.store = std::move(store);
        auto pg = ddp::init_process_group(so);
        return body(*pg);
      });
    });
  auto pg = ddp::init_process_group_from_env(options);
  return body(*pg);
}

}  // namespace ddp_testing
