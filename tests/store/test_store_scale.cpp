// Thousands of concurrent connections: 4096 raw clients (half of each generation) each ADD
// a counter and WAIT for a release key that the last one sets; all must be released.
#include <poll.h>

#include <chrono>
#include <memory>
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
