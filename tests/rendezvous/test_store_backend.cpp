// The store backend against a real store server on loopback: the state's compare-and-set,
// logs (waits wake on appends, time out on silence), counters, and the lease (its lines
// written when the connection closes, when its process dies, when it falls silent).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "ddp/error.hpp"
#include "rendezvous/store_backend.hpp"
#include "store/server.hpp"

namespace {

using namespace ddprun::rdzv;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kGuard = 20s;  // hang guard, far above the milliseconds these steps take

struct StoreBackendTest : ::testing::Test {
  void SetUp() override {
    ddp::detail::StoreServerOptions so;
    so.host = "127.0.0.1";
    server = std::make_unique<ddp::detail::StoreServer>(so);
    server->start();
  }
  std::unique_ptr<StoreBackend> backend(const std::string& run = "run1") {
    StoreBackendOptions o;
    o.host = "127.0.0.1";
    o.port = server->port();
    o.run_id = run;
    o.timeout = kGuard;
    o.connect_timeout = kGuard;
    return std::make_unique<StoreBackend>(o);
  }
  // Waits (up to the guard) for the log to have `n` lines.
  std::vector<std::string> await_lines(Backend& b, const std::string& log, size_t n) {
    auto deadline = Clock::now() + kGuard;
    std::vector<std::string> lines;
    while (lines.size() < n && Clock::now() < deadline) {
      auto more = b.wait(log, lines.size(), 500ms);
      lines.insert(lines.end(), more.begin(), more.end());
    }
    return lines;
  }
  std::unique_ptr<ddp::detail::StoreServer> server;
};

TEST_F(StoreBackendTest, CompareAndSetWithTokens) {
  auto a = backend(), b = backend();
  Snapshot s0 = a->load();
  EXPECT_FALSE(s0.state.has_value());
  CasResult r1 = a->compare_and_set("one", s0.token);
  EXPECT_TRUE(r1.ok);
  EXPECT_EQ(r1.current.state, "one");
  CasResult stale = b->compare_and_set("two", s0.token);  // b still holds the empty token
  EXPECT_FALSE(stale.ok);
  EXPECT_EQ(stale.current.state, "one");  // the winner's, to go on from
  CasResult r2 = b->compare_and_set("two", stale.current.token);
  EXPECT_TRUE(r2.ok);
  EXPECT_EQ(a->load().state, "two");
  // Another run id at the same store is another state.
  EXPECT_FALSE(backend("run2")->load().state.has_value());
}

// Whether the state changed, asked without fetching it: every write makes a new version,
// even a write of the same value.
TEST_F(StoreBackendTest, ChangedTellsANewVersionWithoutALoad) {
  auto a = backend(), b = backend();
  Snapshot s0 = a->load();
  EXPECT_EQ(a->changed(s0.token), false);  // no state yet, still none
  CasResult r1 = a->compare_and_set("one", s0.token);
  ASSERT_TRUE(r1.ok);
  EXPECT_EQ(b->changed(s0.token), true);
  EXPECT_EQ(b->changed(r1.current.token), false);
  CasResult r2 = b->compare_and_set("one", r1.current.token);  // the same value again
  ASSERT_TRUE(r2.ok);
  EXPECT_EQ(a->changed(r1.current.token), true);
  EXPECT_EQ(a->changed(r2.current.token), false);
  CasResult r3 = a->compare_and_set("a longer value", r2.current.token);
  ASSERT_TRUE(r3.ok);
  EXPECT_EQ(b->changed(r2.current.token), true);
  // A value without ddprun's version (a torchrun agent's) cannot be told apart cheaply.
  EXPECT_EQ(a->changed(Token{"gASVxyz"}), std::nullopt);
}

// A reader that starts at a line another reader located (position) fetches from there, not
// from the log's first line, and reads on as usual.
TEST_F(StoreBackendTest, ReadFromAPositionAnotherReaderFound) {
  auto a = backend(), b = backend();
  for (int i = 0; i < 5; ++i) a->append("log", "line " + std::to_string(i));
  ASSERT_EQ(a->read("log", 0).size(), 5u);
  EXPECT_EQ(a->position("log", 0), 0);
  const int64_t at3 = a->position("log", 3);
  EXPECT_EQ(at3, 3 * 7);  // "line N\n"
  EXPECT_EQ(a->position("log", 5), 5 * 7);
  EXPECT_EQ(a->position("log", 6), -1);  // not read that far
  EXPECT_EQ(b->position("log", 3), -1);  // b has read nothing
  EXPECT_EQ(b->read("log", 3, at3), (std::vector<std::string>{"line 3", "line 4"}));
  a->append("log", "line 5");
  EXPECT_EQ(b->read("log", 3, at3), (std::vector<std::string>{"line 3", "line 4", "line 5"}));
  EXPECT_EQ(b->wait("log", 6, 100ms), std::vector<std::string>{});
  // An earlier line than the hint's starts over from the first line, as before.
  EXPECT_EQ(b->read("log", 1).size(), 5u);
  // Dropped lines: the hint does not hide that they are gone.
  ASSERT_TRUE(a->trim_log("log", 4));
  auto c = backend();
  EXPECT_THROW(c->read("log", 3, at3), LogTrimmed);
  EXPECT_EQ(c->read("log", 4), (std::vector<std::string>{"line 4", "line 5"}));
}

TEST_F(StoreBackendTest, LogsAppendReadAndWait) {
  auto a = backend(), b = backend();
  EXPECT_TRUE(a->read("log", 0).empty());
  a->append("log", "first");
  a->append("log", "second line");
  EXPECT_EQ(b->read("log", 0), (std::vector<std::string>{"first", "second line"}));
  EXPECT_EQ(b->read("log", 1), (std::vector<std::string>{"second line"}));
  EXPECT_TRUE(b->read("log", 2).empty());
  // Silence: the wait returns empty at its timeout (bounded well below the guard).
  auto t0 = Clock::now();
  EXPECT_TRUE(b->wait("log", 2, 100ms).empty());
  EXPECT_LT(Clock::now() - t0, kGuard);
  // An append wakes a waiter at once.
  auto w = std::async(std::launch::async, [&] { return b->wait("log", 2, kGuard); });
  std::this_thread::sleep_for(50ms);
  a->append("log", "third");
  ASSERT_EQ(w.wait_for(kGuard), std::future_status::ready);
  EXPECT_EQ(w.get(), (std::vector<std::string>{"third"}));
  EXPECT_EQ(a->add("n", 2), 2);
  EXPECT_EQ(b->add("n", 3), 5);
}

// A store server from before log trimming: trim_log says it cannot (and the connection
// stays usable), and every line stays readable, as before.
TEST_F(StoreBackendTest, AServerWithoutLogTrimKeepsEveryLine) {
  server.reset();
  ddp::detail::StoreServerOptions so;
  so.host = "127.0.0.1";
  so.log_trim = false;
  server = std::make_unique<ddp::detail::StoreServer>(so);
  server->start();
  auto a = backend(), b = backend();
  for (int i = 0; i < 4; ++i) a->append("log", std::to_string(i));
  EXPECT_FALSE(a->trim_log("log", 3));
  EXPECT_EQ(b->read("log", 0).size(), 4u);
  a->append("log", "4");
  EXPECT_EQ(a->read("log", 1), (std::vector<std::string>{"1", "2", "3", "4"}));
  EXPECT_EQ(b->wait("log", 4, kGuard), std::vector<std::string>{"4"});
}

TEST_F(StoreBackendTest, LeaseLinesAreWrittenWhenTheLeaseCloses) {
  auto a = backend(), watcher = backend();
  a->open_lease(0ms);
  a->on_lease_end("gone", "a");
  a->on_lease_end("round/0", "lost a");
  a->keep_alive(1s);
  EXPECT_TRUE(watcher->read("gone", 0).empty());
  a->close();
  auto gone = await_lines(*watcher, "gone", 1);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0], "a connection closed");
  EXPECT_EQ(await_lines(*watcher, "round/0", 1).at(0), "lost a connection closed");
}

TEST_F(StoreBackendTest, LeaseLinesAreWrittenWhenItsProcessDies) {
  auto watcher = backend();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  if (child == 0) {
    try {
      auto b = backend();
      b->open_lease(0ms);
      b->on_lease_end("gone", "child");
      char x = 1;
      if (write(ready[1], &x, 1) != 1) _exit(2);
      pause();
    } catch (...) {
    }
    _exit(3);
  }
  char x = 0;
  ASSERT_EQ(read(ready[0], &x, 1), 1);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  auto t0 = Clock::now();
  auto gone = await_lines(*watcher, "gone", 1);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0], "child connection closed");
  // "At once": the kernel closes the socket on exit; far below any keep-alive window.
  EXPECT_LT(Clock::now() - t0, 5s);
  close(ready[0]);
  close(ready[1]);
}

TEST_F(StoreBackendTest, ASilentLeaseEndsAfterItsTtlAndCannotBeRenewed) {
  auto a = backend(), watcher = backend();
  a->open_lease(300ms);
  a->on_lease_end("gone", "a");
  for (int i = 0; i < 3; ++i) {  // renewed: alive past its ttl
    std::this_thread::sleep_for(150ms);
    a->keep_alive(1s);
  }
  EXPECT_TRUE(watcher->read("gone", 0).empty());
  auto gone = await_lines(*watcher, "gone", 1);  // then silent
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_TRUE(gone[0].starts_with("a no keep-alive for ")) << gone[0];
  EXPECT_THROW(a->keep_alive(1s), LeaseEnded);
}

TEST_F(StoreBackendTest, InterruptEndsABlockedWaitAtOnce) {
  auto a = backend();
  auto w = std::async(std::launch::async, [&] {
    try {
      a->wait("never", 0, kGuard);
    } catch (const ddp::Error&) {
      return true;
    }
    return false;
  });
  std::this_thread::sleep_for(50ms);
  auto t0 = Clock::now();
  a->interrupt();
  ASSERT_EQ(w.wait_for(kGuard), std::future_status::ready);
  EXPECT_TRUE(w.get());
  EXPECT_LT(Clock::now() - t0, 5s);  // not the wait's 20 s
}

TEST_F(StoreBackendTest, AnUnreachableStoreFailsWithinTheConnectTimeout) {
  StoreBackendOptions o;
  o.host = "127.0.0.1";
  o.port = server->port();
  server->stop();
  o.run_id = "x";
  o.connect_timeout = 300ms;
  auto t0 = Clock::now();
  try {
    StoreBackend b(o);
    FAIL() << "connected to a stopped server";
  } catch (const ddp::NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - t0, kGuard);
}

}  // namespace
