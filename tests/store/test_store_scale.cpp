// Thousands of concurrent connections: 4096 raw clients (half of each generation) each ADD
// a counter and WAIT for a release key that the last one sets; all must be released. And
// 4096 connects issued at once against a store that has just started: none may wait for a
// SYN retransmit (the listen backlog must hold them all).
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "store_test_util.hpp"

using namespace store_test;
using proto::Op;

TEST(StoreScale, FourThousandConcurrentClients) {
  raise_fd_limit();
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  constexpr int kClients = 4096;
  ASSERT_GE(rl.rlim_cur, rlim_t{2 * kClients + 64})
      << "the open-file limit (" << rl.rlim_cur << ") is too low for " << kClients << " clients";

  ddp::detail::StoreServerOptions o;
  o.backlog = 8192;
  auto server = start_server(o);
  auto t0 = std::chrono::steady_clock::now();

  std::vector<std::unique_ptr<RawConn>> conns;
  conns.reserve(kClients);
  for (int i = 0; i < kClients; ++i) {
    auto g = i % 2 ? proto::Generation::kV2 : proto::Generation::kV1;
    conns.push_back(std::make_unique<RawConn>(server->port(), g));
    proto::Request add = request(Op::kAdd, {"scale/count"});
    add.i64 = 1;
    conns.back()->send_request(add);
  }
  // Every client holds a connection at the same time.
  ddp::test::wait_until([&] { return server->num_connections() >= size_t{kClients}; }, hang_guard());
  EXPECT_EQ(server->num_connections(), size_t{kClients});

  // Each reads its ADD result, then waits; the one that saw kClients releases everyone.
  std::vector<int64_t> seen;
  int releaser = -1;
  for (int i = 0; i < kClients; ++i) {
    int64_t v = conns[i]->recv_i64();
    seen.push_back(v);
    if (v == kClients) releaser = i;
    conns[i]->send_request(request(Op::kWait, {"scale/release"}));
  }
  std::sort(seen.begin(), seen.end());
  for (int i = 0; i < kClients; ++i) ASSERT_EQ(seen[i], i + 1);
  ASSERT_GE(releaser, 0);
  conns[releaser]->send_request(request(Op::kSet, {"scale/release"}, {"go"}));

  std::vector<pollfd> fds;
  for (auto& c : conns) fds.push_back({c->fd(), POLLIN, 0});
  int released = 0;
  auto deadline = std::chrono::steady_clock::now() + scaled(60s);  // a hang guard
  std::vector<bool> done(kClients, false);
  while (released < kClients && std::chrono::steady_clock::now() < deadline) {
    ::poll(fds.data(), fds.size(), 100);
    for (int i = 0; i < kClients; ++i) {
      if (done[i] || !(fds[i].revents & POLLIN)) continue;
      uint8_t b = 0xff;
      ASSERT_EQ(::recv(fds[i].fd, &b, 1, 0), 1);
      ASSERT_EQ(b, proto::kWaitStopWaiting);
      done[i] = true;
      fds[i].fd = -1;
      ++released;
    }
  }
  EXPECT_EQ(released, kClients);
  auto dt = std::chrono::steady_clock::now() - t0;
  std::printf("4096 clients connected, counted and released in %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(dt).count()));
  conns.clear();
  ddp::test::wait_until([&] { return server->num_connections() == 0; }, hang_guard());
  EXPECT_EQ(server->num_connections(), 0u);
}

namespace {

// One client of the burst: a non-blocking socket whose connect is in flight.
struct Burst {
  int fd = -1;
  std::string out, in;
  size_t want = 0;  // reply bytes expected
  bool done = false;
};

int start_connect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Client i's request: generation 2 VALIDATE + PING(i) (reply: i), or generation 1 ADD
// (reply: the counter).
void prepare(Burst& b, int i) {
  proto::Request r;
  if (i % 2) {
    r.op = Op::kValidate;
    r.u32 = proto::kValidationMagic;
    proto::encode_request(proto::Generation::kV2, r, b.out);
    r = request(Op::kPing);
    r.u32 = static_cast<uint32_t>(i);
    proto::encode_request(proto::Generation::kV2, r, b.out);
    b.want = 4;
  } else {
    r = request(Op::kAdd, {"burst/count"});
    r.i64 = 1;
    proto::encode_request(proto::Generation::kV1, r, b.out);
    b.want = 8;
  }
}

// Handles one readiness event of client b; false on an error (the test then fails).
bool step(Burst& b, uint32_t events) {
  if (!b.out.empty() && (events & EPOLLOUT)) {
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(b.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return false;
    ssize_t n = ::send(b.fd, b.out.data(), b.out.size(), MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN;
    b.out.erase(0, static_cast<size_t>(n));
  }
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
    char buf[64];
    ssize_t n = ::recv(b.fd, buf, sizeof buf, 0);
    if (n == 0) return false;
    if (n < 0) return errno == EAGAIN;
    b.in.append(buf, static_cast<size_t>(n));
    b.done = b.in.size() >= b.want;
  }
  return true;
}

// Drives every client until it has its reply (or one fails: `failed` says which, or the
// deadline passes); returns how many have it.
int run_burst(std::vector<Burst>& clients, std::chrono::steady_clock::time_point deadline,
              std::string& failed) {
  int ep = ::epoll_create1(EPOLL_CLOEXEC);
  for (size_t i = 0; i < clients.size(); ++i) {
    epoll_event ev{EPOLLIN | EPOLLOUT, {}};
    ev.data.u32 = static_cast<uint32_t>(i);
    ::epoll_ctl(ep, EPOLL_CTL_ADD, clients[i].fd, &ev);
  }
  int done = 0;
  std::vector<epoll_event> events(1024);
  while (done < static_cast<int>(clients.size()) && failed.empty() &&
         std::chrono::steady_clock::now() < deadline) {
    int n = ::epoll_wait(ep, events.data(), static_cast<int>(events.size()), 100);
    for (int e = 0; e < n && failed.empty(); ++e) {
      Burst& b = clients[events[e].data.u32];
      if (b.done) continue;
      if (!step(b, events[e].events)) failed = "client " + std::to_string(events[e].data.u32) + " failed";
      if (b.done) {
        ++done;
        ::epoll_ctl(ep, EPOLL_CTL_DEL, b.fd, nullptr);
      } else if (b.out.empty() && (events[e].events & EPOLLOUT)) {
        epoll_event ev{EPOLLIN, {}};  // sent: only the reply is awaited now
        ev.data.u32 = events[e].data.u32;
        ::epoll_ctl(ep, EPOLL_CTL_MOD, b.fd, &ev);
      }
    }
  }
  ::close(ep);
  return done;
}

uint32_t total_retransmits(int fd) {
  tcp_info ti{};
  socklen_t len = sizeof ti;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return 0;
  return ti.tcpi_total_retrans;
}

}  // namespace

TEST(StoreScale, FourThousandConnectsAtOnceOnAFreshStoreNeedNoSynRetransmit) {
  constexpr int kClients = 4096;
  raise_fd_limit();
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  ASSERT_GE(rl.rlim_cur, rlim_t{2 * kClients + 64})
      << "the open-file limit (" << rl.rlim_cur << ") is too low for " << kClients << " clients";
  if (ddp::detail::listen_backlog(0) < kClients)
    GTEST_SKIP() << "net.core.somaxconn is " << ddp::detail::listen_backlog(0) << ", below " << kClients;

  // The defaults, as ddprun's stores get them. The server listens now but serves only once
  // every connect has been issued: the accept queue alone must hold the burst, as it must
  // whenever the store's thread falls behind (on a loaded 2-core machine a store listening
  // with 2048 did, in about one run of three).
  ddp::detail::StoreServerOptions o;
  o.host = "127.0.0.1";
  ddp::detail::StoreServer server(o);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Burst> clients(kClients);
  for (int i = 0; i < kClients; ++i) {
    clients[i].fd = start_connect(server.port());
    ASSERT_GE(clients[i].fd, 0) << "connect " << i << ": " << std::strerror(errno);
    prepare(clients[i], i);
  }
  server.start();
  std::string failed;
  const int done = run_burst(clients, t0 + hang_guard(), failed);
  const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  ASSERT_TRUE(failed.empty()) << failed;
  ASSERT_EQ(done, kClients);
  std::vector<int64_t> counts;
  uint32_t retransmits = 0;
  for (int i = 0; i < kClients; ++i) {
    Burst& b = clients[i];
    if (i % 2) {
      uint32_t echo;
      std::memcpy(&echo, b.in.data(), 4);
      EXPECT_EQ(echo, static_cast<uint32_t>(i));
    } else {
      int64_t v;
      std::memcpy(&v, b.in.data(), 8);
      counts.push_back(v);
    }
    retransmits += total_retransmits(b.fd);
    linger lg{1, 0};  // reset: no TIME_WAIT left behind by 4096 sockets
    ::setsockopt(b.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    ::close(b.fd);
  }
  std::sort(counts.begin(), counts.end());
  for (size_t i = 0; i < counts.size(); ++i) ASSERT_EQ(counts[i], static_cast<int64_t>(i + 1));
  std::printf("%d connects at once: all answered in %lld ms, %u retransmits\n", kClients,
              static_cast<long long>(elapsed.count()), retransmits);
  // A SYN dropped by a full accept queue is sent again after 1 s, and counted on the
  // client's socket (tcpi_total_retrans). The burst's time is only printed: under CI's load
  // it once took 1007 ms with no retransmit at all.
  EXPECT_EQ(retransmits, 0u);
}
