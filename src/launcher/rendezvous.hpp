// Static rendezvous: the store node 0 hosts, and (multi-node) how the nodes agree on the
// world and keep in step.
#pragma once

#include <memory>
#include <string>

#include "launcher/options.hpp"
#include "launcher/supervisor.hpp"
#include "launcher/worker.hpp"

namespace ddprun {

struct RendezvousConfig {
  const Options& o;
  std::string hostname;
};

class Rendezvous {
 public:
  explicit Rendezvous(RendezvousConfig c);
  ~Rendezvous();
  // Hosts the store (node 0), meets the other nodes, and says who is who.
  JobPlan join();
  // nullptr for a single node.
  NodeSync* sync();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun
