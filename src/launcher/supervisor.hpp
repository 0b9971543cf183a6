// The supervisor: one event loop (epoll over a signalfd, the workers' pipes, an eventfd
// from the console writers and the rendezvous's notify fd) that starts the workers of each
// round, forwards their output, notices an exit the moment SIGCHLD arrives, tears the
// group down on the first failure (here or on another node), goes on to the next round
// while the rendezvous allows it, and reports.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "launcher/options.hpp"
#include "launcher/report.hpp"
#include "launcher/worker.hpp"

namespace ddprun {

// Signals ddprun handles must be blocked before any thread starts; call first thing.
void block_supervised_signals(const Options& o);

class Guardian;
class Rendezvous;

class Supervisor {
 public:
  // guardian: started by the caller before any thread exists (see process.hpp). rdzv: how
  // this node meets the others, round after round.
  Supervisor(const Options& o, std::map<std::string, std::string> base_env, Guardian& guardian, Rendezvous& rdzv,
             std::string hostname);
  ~Supervisor();
  // Runs every attempt; returns the outcome (exit_code is what ddprun exits with).
  JobOutcome run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun
