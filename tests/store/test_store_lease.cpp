// ddprun's lease (LEASE, ON_LEASE_END) against a ddp-store-server in a process of its own,
// which the tests stop (SIGSTOP) and continue by its pid: a lease ends when its client was
// silent for the ttl while the server could hear it, never because the server itself was
// not running (a loaded host, a paused VM, the store host's own process stalled).
#include <chrono>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "ddp/error.hpp"
#include "ddp/tcp_store.hpp"
#include "store_server_process.hpp"
#include "test_timeouts.hpp"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using ddp::test::scaled;

// The server process (tests/common) and a client of it.
struct ServerProcess : ddp::test::StoreServerProcess {
  ServerProcess() { start(); }

  ddp::TcpStoreOptions client() const {
    ddp::TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = static_cast<uint16_t>(port);
    o.generation = ddp::WireGeneration::kV2;
    o.timeout = scaled(30s);
    o.connect_timeout = scaled(30s);
    o.lazy = false;
    return o;
  }
};

const std::string kLog = "events";

std::unique_ptr<ddp::TcpStore> leased(const ServerProcess& s, std::chrono::milliseconds ttl) {
  auto c = std::make_unique<ddp::TcpStore>(s.client());
  c->lease(ttl);
  c->on_lease_end(kLog, "node1 ");
  return c;
}

// The lease's lines, once written (empty while the lease stands).
std::string lease_lines(ddp::TcpStore& reader) { return reader.check({kLog}) ? reader.get(kLog) : ""; }

// The server stopped for twice the ttl, then continued; `after` runs right after.
template <typename F>
void stall_server(ServerProcess& s, std::chrono::milliseconds ttl, F after) {
  s.freeze();
  std::this_thread::sleep_for(2 * ttl);
  s.thaw();
  after();
}

TEST(StoreLease, ASilentClientsLinesAreWrittenOnceItsTtlHasPassed) {
  ServerProcess s;
  ddp::TcpStore reader(s.client());
  const auto ttl = 300ms;
  auto start = Clock::now();
  auto c = leased(s, ttl);
  std::string lines;
  while ((lines = lease_lines(reader)).empty() && Clock::now() - start < scaled(10s)) std::this_thread::sleep_for(10ms);
  auto took = Clock::now() - start;
  EXPECT_TRUE(lines.starts_with("node1 no keep-alive for ") && lines.ends_with("\n")) << lines;  // 300 ms or more
  EXPECT_GE(took, ttl);
  EXPECT_LT(took, ttl + scaled(1s));
  EXPECT_THROW(c->ping(scaled(5s)), ddp::Error);  // the lease was its connection
}

// A PING sent while the server was stopped is in its socket when it runs again: the
// client was not silent, whichever of its timer and the socket the server looks at first.
TEST(StoreLease, APingSentWhileTheServerWasStoppedKeepsTheLease) {
  ServerProcess s;
  ddp::TcpStore reader(s.client());
  const auto ttl = scaled(500ms);
  auto c = leased(s, ttl);
  s.freeze();
  std::this_thread::sleep_for(ttl / 2);
  std::thread pinger([&] { EXPECT_NO_THROW(c->ping(scaled(10s))); });
  std::this_thread::sleep_for(2 * ttl);
  s.thaw();
  pinger.join();
  EXPECT_EQ(lease_lines(reader), "");
  EXPECT_NO_THROW(c->ping(scaled(10s)));
}

// The store host stalled as a whole (its store and its own lease keeper alike): the time
// the server was not running is not counted against its clients, so a client heard soon
// after the server runs again keeps its lease.
TEST(StoreLease, AClientHeardSoonAfterTheServerRunsAgainKeepsTheLease) {
  ServerProcess s;
  ddp::TcpStore reader(s.client());
  const auto ttl = scaled(1000ms);  // the grace, at most a ttl: the margin for this test's own delays
  auto c = leased(s, ttl);
  std::this_thread::sleep_for(ttl / 2);
  stall_server(s, ttl, [&] {
    std::this_thread::sleep_for(ttl / 10);
    EXPECT_NO_THROW(c->ping(scaled(10s)));
  });
  EXPECT_EQ(lease_lines(reader), "");
  std::this_thread::sleep_for(ttl / 2);
  EXPECT_NO_THROW(c->ping(scaled(10s)));  // and it goes on as before
  EXPECT_EQ(lease_lines(reader), "");
}

// A stall that ends just after the lease was due: the server runs its late timer before
// it can hear the client that stalled with it (the store host's own lease keeper). Only
// the time the server ran counts, so the client has the rest of its ttl. Before, a timer
// less than 20 ms late ended the lease at once ("no keep-alive for 1.0 s").
TEST(StoreLease, AStallEndingJustAfterTheLeaseWasDueKeepsTheClientThatStalledWithIt) {
  ServerProcess s;
  ddp::TcpStore reader(s.client());
  const auto ttl = scaled(1000ms);
  auto c = leased(s, ttl);
  const auto due = Clock::now() + ttl;
  std::this_thread::sleep_for(ttl / 2);
  s.freeze();
  std::this_thread::sleep_until(due + 5ms);
  s.thaw();
  std::this_thread::sleep_for(50ms);  // the keeper's renewal comes a moment later
  EXPECT_NO_THROW(c->ping(scaled(10s)));
  EXPECT_EQ(lease_lines(reader), "");
}

// ...but a client that stays silent after the stall loses its lease: the grace is at most
// one more ttl, counted from when the server ran again.
TEST(StoreLease, AClientSilentAfterTheServerRunsAgainLosesTheLeaseWithinOneMoreTtl) {
  ServerProcess s;
  ddp::TcpStore reader(s.client());
  const auto ttl = scaled(500ms);
  auto c = leased(s, ttl);
  Clock::time_point resumed;
  stall_server(s, ttl, [&] { resumed = Clock::now(); });
  std::string lines;
  while ((lines = lease_lines(reader)).empty() && Clock::now() - resumed < scaled(10s))
    std::this_thread::sleep_for(10ms);
  auto took = Clock::now() - resumed;
  EXPECT_EQ(lines.rfind("node1 no keep-alive for ", 0), 0u) << lines;
  EXPECT_NE(lines.find(" more while this server did not run)"), std::string::npos) << lines;
  EXPECT_LT(took, ttl + scaled(1s));
  EXPECT_THROW(c->ping(scaled(5s)), ddp::Error);
}

// A PING that waited in the socket while the server was stopped is read when it runs again,
// maybe before the server's tick has counted the stop: the stop is still not counted off
// the silence that follows (that client's lease would have lasted a stop longer).
TEST(StoreLease, AClientSilentAfterAPingReadAfterAStallLosesTheLeaseWithinTheTtl) {
  ServerProcess s;
  ddp::TcpStore reader(s.client());
  const auto ttl = 500ms;
  auto c = leased(s, ttl);
  s.freeze();
  std::this_thread::sleep_for(100ms);
  std::thread pinger([&] { EXPECT_NO_THROW(c->ping(scaled(10s))); });
  std::this_thread::sleep_for(3s);
  s.thaw();
  pinger.join();
  const auto heard = Clock::now();
  std::string lines;
  while ((lines = lease_lines(reader)).empty() && Clock::now() - heard < scaled(10s)) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(lines.rfind("node1 no keep-alive for ", 0), 0u) << lines;
  EXPECT_LT(Clock::now() - heard, ttl + scaled(1s)) << lines;
}

// A ttl too long for the clock to count (up to INT64_MAX ms) sets no silence limit: the
// lease ends when its connection closes. Before, it overflowed and ended at once.
TEST(StoreLease, ATtlLongerThanTheClockCountsEndsOnlyWithTheConnection) {
  ServerProcess s;
  ddp::TcpStore reader(s.client());
  for (int64_t ttl : {INT64_MAX, INT64_MAX / 1000000, int64_t{1} << 40}) {
    SCOPED_TRACE(ttl);
    reader.delete_key(kLog);
    auto c = leased(s, std::chrono::milliseconds(ttl));
    std::this_thread::sleep_for(100ms);
    EXPECT_NO_THROW(c->ping(scaled(5s)));
    EXPECT_EQ(lease_lines(reader), "");
    c.reset();
    auto start = Clock::now();
    std::string lines;
    while ((lines = lease_lines(reader)).empty() && Clock::now() - start < scaled(10s))
      std::this_thread::sleep_for(10ms);
    EXPECT_EQ(lines, "node1 connection closed\n");
  }
}

}  // namespace
