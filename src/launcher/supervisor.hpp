// The supervisor: one event loop (epoll over a signalfd, the workers' pipes and an eventfd
// from the console writers) that starts the workers, forwards their output, notices an
// exit the moment SIGCHLD arrives, tears the group down on the first failure, restarts
// it while restarts remain, and reports.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "launcher/options.hpp"
#include "launcher/report.hpp"
#include "launcher/worker.hpp"

namespace ddprun {

// How the nodes of a multi-node job keep in step (none for a single node).
class NodeSync {
 public:
  virtual ~NodeSync() = default;
  // Readable when another node has reported a failure or a stop.
  virtual int notify_fd() = 0;
  // Called when notify_fd is readable: a description of the remote failure for `attempt`,
  // or "" when the wake-up was not about this attempt.
  virtual std::string remote_failure(int attempt) = 0;
  // This node saw its first failure in `attempt` (or was signalled).
  virtual void report_failure(int attempt, const std::string& what) = 0;
  // Every node arrives before `attempt` starts. Throws on timeout.
  virtual void attempt_barrier(int attempt) = 0;
  // Called after a node's workers all succeeded: waits for every node (the store outlives
  // every worker).
  virtual void exit_barrier(int attempt) = 0;
  // After exit_barrier: the failure another node reported for that attempt, or "".
  virtual std::string last_exit_reason() const = 0;
  // A node is gone for good (no heartbeat): restarting would only wait for it. "" if none.
  virtual std::string node_lost() = 0;
};

// Signals ddprun handles must be blocked before any thread starts; call first thing.
void block_supervised_signals(const Options& o);

class Guardian;

class Supervisor {
 public:
  // guardian: started by the caller before any thread exists (see process.hpp).
  Supervisor(const Options& o, JobPlan plan, std::map<std::string, std::string> base_env, Guardian& guardian,
             NodeSync* sync = nullptr);
  ~Supervisor();
  // Runs every attempt; returns the outcome (exit_code is what ddprun exits with).
  JobOutcome run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun
