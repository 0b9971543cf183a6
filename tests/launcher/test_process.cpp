// WorkerGroup (launcher/process.hpp): a worker's process group, signalled safely after the
// worker is reaped. (That a reused number is never signalled needs a pid namespace to hand
// the number out at once: integration/test_signals.py, ReusedGroupNumberTest.)
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "launcher/process.hpp"

namespace {

using ddprun::WorkerGroup;

// `sh -c script` in a group of its own; what it prints on stdout comes back in *out.
pid_t start_shell(const std::string& script, std::string* out = nullptr) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return -1;
  ddprun::SpawnSpec spec{"/bin/sh", {"sh", "-c", script}, {"PATH=/usr/bin:/bin"}, -1, p[1]};
  const pid_t pid = ddprun::spawn(spec).pid;
  close(p[1]);
  std::string text;
  char buf[64];
  for (ssize_t n; (n = read(p[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  close(p[0]);
  if (out) *out = text;
  return pid;
}

bool gone_within(pid_t pid, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!ddprun::process_gone(pid) && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return ddprun::process_gone(pid);
}

TEST(LauncherWorkerGroup, AWorkerThatLeftNothingBehindLeavesAnEmptyGroup) {
  const pid_t pid = start_shell("exit 0");
  ASSERT_GT(pid, 0);
  WorkerGroup g(pid);
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  EXPECT_TRUE(g.leader_reaped());
  g.signal(SIGKILL);  // (nothing to reach: not sent)
}

TEST(LauncherWorkerGroup, WhatAReapedWorkerLeftInItsGroupIsReachedThroughItsPidfd) {
  // The worker leaves a child in its group (stdout closed, so the pipe ends) and exits.
  std::string out;
  const pid_t pid = start_shell("sleep 300 >/dev/null & echo $!", &out);
  ASSERT_GT(pid, 0);
  WorkerGroup g(pid);
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  const pid_t child = std::stoi(out);
  EXPECT_EQ(getpgid(child), pid);
  EXPECT_FALSE(g.leader_reaped()) << "its child still holds the group";
  g.signal(SIGKILL);
  const bool reached = gone_within(child, std::chrono::seconds(10));
  if (!reached && !ddprun::process_gone(child)) kill(child, SIGKILL);  // the child this test started
  if (!ddprun::kernel_at_least(6, 9)) GTEST_SKIP() << "PIDFD_SIGNAL_PROCESS_GROUP needs Linux 6.9";
  EXPECT_TRUE(reached) << "the group's SIGKILL never reached the worker's child " << child;
}

TEST(LauncherWorkerGroup, ARunningWorkersGroupIsSignalledByItsNumber) {
  std::string out;
  const pid_t pid = start_shell("sleep 300 >/dev/null & echo $!; exec sleep 300 >/dev/null", &out);
  ASSERT_GT(pid, 0);
  WorkerGroup g(pid);
  const pid_t child = std::stoi(out);
  g.signal(SIGKILL);
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  EXPECT_TRUE(gone_within(child, std::chrono::seconds(10)));
}

}  // namespace
