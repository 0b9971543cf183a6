// The dynamic rendezvous's backend in etcd (--rdzv-backend etcd, and etcd-v2 too): etcd's
// v3 API through its JSON gateway, so any etcd 3.4 or later works, with TLS when asked.
// docs/design.md ("etcd rendezvous") explains the keys, the lease-end lines and what "a
// reused run id starts clean" means.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "rendezvous/backend.hpp"

namespace ddprun::rdzv {

struct EtcdOptions {
  std::string endpoints;          // "host[:port][,host[:port]...]", default port 2379
  std::string run_id;             // every key lives under <prefix>/<run_id>/
  std::string protocol = "http";  // http | https (torchrun's --rdzv-conf protocol)
  std::string cacert, cert, key;  // https: PEM files (--rdzv-conf cacert, cert, key)
  milliseconds op_timeout{60000};      // every call ends within it (read_timeout)
  milliseconds connect_timeout{5000};  // one connection attempt to one member
  // How long the run's keys outlive the renewals of its last live node (after a crash of
  // every node); must exceed the node leases' ttl. A clean end removes them at once.
  milliseconds run_ttl{60000};
  bool remove_run_on_last_close = true;
  bool spread = true;  // start at a random member (many nodes spread over the cluster); false: the first
  std::string prefix = "/ddprun/rdzv";
  std::function<void(const std::string&)> still_failing;  // ClientOptions::still_failing
};

// Checks the options (ddp::UsageError for bad endpoints, protocol, run id or TLS files)
// and returns a backend for that run. It connects on first use.
std::unique_ptr<Backend> make_etcd_backend(const EtcdOptions& options);

}  // namespace ddprun::rdzv
