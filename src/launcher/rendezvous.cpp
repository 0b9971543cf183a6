#include "launcher/rendezvous.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "ddp/error.hpp"

namespace ddprun {

struct Rendezvous::Impl {
  RendezvousConfig c;
};

Rendezvous::Rendezvous(RendezvousConfig c) : impl_(std::make_unique<Impl>(Impl{std::move(c)})) {}
Rendezvous::~Rendezvous() = default;
NodeSync* Rendezvous::sync() { return nullptr; }

namespace {
int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw ddp::SystemError("pick a free port on localhost", errno);
  close(fd);
  return ntohs(a.sin_port);
}
}  // namespace

JobPlan Rendezvous::join() {
  const Options& o = impl_->c.o;
  if (o.max_nodes > 1)
    throw ddp::UsageError(fmt::format("--nnodes {}: multi-node jobs are not supported yet", o.max_nodes));
  JobPlan p;
  p.world_size = o.nproc_per_node;
  p.hostname = impl_->c.hostname;
  p.run_id = o.rdzv_id;
  if (o.standalone) {
    p.master_addr = "localhost";
    p.master_port = free_port();
  } else {
    p.master_addr = o.master_addr;
    p.master_port = o.master_port;
  }
  p.use_agent_store = false;
  return p;
}

}  // namespace ddprun
