// One node alone (--standalone, --nnodes 1): no network, no threads. Every multi-node job
// (static --node-rank, c10d, etcd) goes through the one rendezvous in src/rendezvous/
// (rendezvous_nodes.cpp).
#include "launcher/rendezvous.hpp"

#include <cerrno>

#include <fmt/format.h>

#include "ddp/error.hpp"
#include "launcher/net.hpp"
#include "store/server.hpp"

namespace ddprun {

std::string unsent_note() {
  return "rendezvous: the other nodes could not be told in time that this node stops (the rendezvous does not "
         "answer); they notice its absence within their keep-alive window";
}

std::unique_ptr<ddp::detail::StoreServer> host_master_store(const Options& o) {
  const int port = o.master_port;
  ddp::detail::StoreServerOptions so;
  so.host = "";  // every interface, dual stack
  so.port = static_cast<uint16_t>(o.standalone ? 0 : port);
  std::unique_ptr<ddp::detail::StoreServer> server;
  try {
    server = std::make_unique<ddp::detail::StoreServer>(so);
  } catch (const ddp::SystemError& e) {
    if (e.code() != EADDRINUSE) throw;
    const std::string holder = held_by(port);
    if (auto ep = o.given.find("rdzv-endpoint"); ep != o.given.end() && !o.rdzv_endpoint.empty())
      throw ddp::Error(fmt::format("{} {}: the port {} is already in use{}; give the endpoint another port, or use "
                                   "--standalone to pick a free one",
                                   ep->second, o.rdzv_endpoint, port, holder));
    // One node may pick a free port; nodes of a job must agree on theirs.
    throw ddp::Error(fmt::format("--master-port {}: the port is already in use{}; {}", port, holder,
                                 o.max_nodes > 1 ? "is node 0 of this job running here already (two nodes with "
                                                   "--node-rank 0)? Else choose another port with --master-port (or "
                                                   "PET_MASTER_PORT) on every node"
                                                 : "choose another with --master-port (or PET_MASTER_PORT), or use "
                                                   "--standalone to pick a free one"));
  }
  server->start();
  return server;
}

namespace {

// A port free now on every interface (where a worker's TCPStore listens), left at once.
int free_port_now() {
  ddp::detail::StoreServer probe(ddp::detail::StoreServerOptions{.host = "", .port = 0});
  return probe.port();
}

// The node hosts the workers' store (TORCHELASTIC_USE_AGENT_STORE) and restarts alone; with
// --standalone and TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, rank 0's worker hosts it instead, on a
// free port each attempt (torchrun's c10d rounds).
class LocalRendezvous : public Rendezvous {
 public:
  LocalRendezvous(const Options& o, std::string hostname) : o_(o), hostname_(std::move(hostname)) {}

  JobPlan next_round() override {
    if (!started_) {
      started_ = true;
      plan_.hostname = hostname_;
      plan_.run_id = o_.rdzv_id;
      plan_.world_size = o_.nproc_per_node;
      plan_.master_addr = o_.standalone ? "localhost" : o_.master_addr;
      plan_.use_agent_store = o_.share_worker_store;
      if (o_.share_worker_store) {
        server_ = host_master_store(o_);
        plan_.master_port = server_->port();
      }
    } else {
      ++plan_.restart_count;
    }
    if (!o_.share_worker_store) plan_.master_port = free_port_now();
    return plan_;
  }
  bool joins_over_network() const override { return false; }
  int notify_fd() override { return -1; }
  std::optional<RoundEnd> round_end() override { return std::nullopt; }
  void end_round(RoundEnd::Kind, const std::string&) override {}
  std::optional<RoundEnd> arrive_exit() override { return RoundEnd{RoundEnd::Kind::kDone, "", ""}; }
  std::string restart_refused(const RoundEnd& end) override {
    if (plan_.restart_count >= o_.max_restarts)
      return fmt::format("{}; no restart left ({} of --max-restarts {} used)", end.describe(), plan_.restart_count,
                         o_.max_restarts);
    return "";
  }
  void finish(FinishKind, const std::string&, std::optional<Deadline>) override {
    if (server_) server_->stop();
  }

 private:
  const Options& o_;
  std::string hostname_;
  JobPlan plan_;
  bool started_ = false;
  std::unique_ptr<ddp::detail::StoreServer> server_;
};

}  // namespace

std::unique_ptr<Rendezvous> make_rendezvous(const Options& o, const std::string& hostname) {
  if (!o.dynamic() && o.max_nodes == 1) return std::make_unique<LocalRendezvous>(o, hostname);
  return make_node_rendezvous(o, hostname);
}

}  // namespace ddprun
