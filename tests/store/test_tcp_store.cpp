// ddp::TcpStore against ddp::detail::StoreServer, both wire generations, plus raw-socket
// tests of the server's protocol handling.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <functional>
#include <future>
#include <ostream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "store/socket_util.hpp"
#include "store_test_util.hpp"

namespace ddp {
// Readable parameter values in test names and ctest output.
void PrintTo(WireGeneration g, std::ostream* os) { *os << (g == WireGeneration::kV1 ? "gen1" : "gen2"); }
}  // namespace ddp

using namespace store_test;
using ddp::WireGeneration;
using proto::Op;

namespace {

class StoreGen : public ::testing::TestWithParam<WireGeneration> {
 protected:
  void SetUp() override { server = start_server(); }
  std::unique_ptr<ddp::TcpStore> client(std::chrono::milliseconds timeout = hang_guard()) {
    return std::make_unique<ddp::TcpStore>(client_options(server->port(), GetParam(), timeout));
  }
  proto::Generation gen() const { return to_proto(GetParam()); }
  std::unique_ptr<ddp::detail::StoreServer> server;
};

std::string gen_name(const ::testing::TestParamInfo<WireGeneration>& i) {
  return i.param == WireGeneration::kV1 ? "Gen1" : "Gen2";
}

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace

TEST_P(StoreGen, AllBasicOperations) {
  auto s = client();
  const std::string bin("a\0b\xff", 4);
  s->set("k", bin);
  EXPECT_EQ(s->get("k"), bin);
  s->set("k", "");
  EXPECT_EQ(s->get("k"), "");
  EXPECT_EQ(s->add("n", 5), 5);
  EXPECT_EQ(s->add("n", -7), -2);
  EXPECT_EQ(s->get("n"), "-2");
  EXPECT_EQ(s->compare_set("c", "exp", "des"), "exp");  // missing, non-empty expected
  EXPECT_FALSE(s->check({"c"}));
  EXPECT_EQ(s->compare_set("c", "", "des"), "des");  // missing, empty expected: sets
  EXPECT_EQ(s->compare_set("c", "nope", "x"), "des");
  EXPECT_EQ(s->compare_set("c", "des", "x"), "x");
  EXPECT_TRUE(s->check({"k", "n", "c"}));
  EXPECT_FALSE(s->check({"k", "missing"}));
  EXPECT_EQ(s->num_keys(), 3);
  EXPECT_TRUE(s->delete_key("c"));
  EXPECT_FALSE(s->delete_key("c"));
  EXPECT_EQ(s->num_keys(), 2);
  s->wait({"k", "n"});  // present: returns at once
  // Another client sees the same data.
  auto t = client();
  EXPECT_EQ(t->get("n"), "-2");
}

TEST_P(StoreGen, AddOnANonIntegerDisconnectsOnlyThatClient) {
  auto s = client();
  s->set("text", "abc");
  EXPECT_THROW(s->add("text", 1), ddp::NetworkError);
  // The client reconnects on its next call.
  EXPECT_EQ(s->add("num", 1), 1);
}

// torch 1.13's server wraps (measured: 9223372036854775807 + 1 gave -9223372036854775808); ours too.
TEST_P(StoreGen, AddPastTheLargestCounterWraps) {
  auto s = client();
  s->set("big", "9223372036854775807");
  EXPECT_EQ(s->add("big", 1), INT64_MIN);
  EXPECT_EQ(s->get("big"), "-9223372036854775808");
  EXPECT_EQ(s->add("big", -1), INT64_MAX);
}

TEST_P(StoreGen, WaitIsWokenByEveryOpThatCreatesTheKey) {
  auto s = client();
  auto other = client();
  // Raw APPEND/MULTI_SET in generation 1 use torch 2.1's numbering (the only release that
  // has them), which the server learns from a 2.1-only request (an empty MULTI_SET).
  const bool v1 = gen() == proto::Generation::kV1;
  RawConn raw(server->port(), v1 ? proto::Generation::kV1Torch21 : gen());
  if (v1) raw.send_request(request(Op::kMultiSet));
  const std::vector<std::string> ops = {"SET", "ADD", "COMPARE_SET", "APPEND", "MULTI_SET"};
  for (auto& op : ops) {
    SCOPED_TRACE(op);
    const std::string key = "woken/" + op;
    auto fut = std::async(std::launch::async, [&] {
      std::this_thread::sleep_for(30ms);
      if (op == "SET") other->set(key, "v");
      if (op == "ADD") other->add(key, 1);
      if (op == "COMPARE_SET") other->compare_set(key, "", "v");
      // Raw requests: the C++ client offers these on generation 2 only, the server on both.
      if (op == "APPEND") raw.send_request(request(Op::kAppend, {key}, {"v"}));
      if (op == "MULTI_SET") raw.send_request(request(Op::kMultiSet, {"other", key}, {"1", "2"}));
    });
    // Woken, not timed out: the wake-up comes ~30 ms in; the bound is far from that and
    // far below the wait's own timeout.
    auto t0 = std::chrono::steady_clock::now();
    s->wait({key}, scaled(60s));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, scaled(10s));
    fut.get();
    EXPECT_TRUE(s->check({key}));
  }
}

TEST_P(StoreGen, WaitTimesOutNamingAddressKeysAndTimeThenTheClientStillWorks) {
  auto s = client();
  auto other = client();
  s->set("present", "p");
  auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    s->wait({"present", "absent"}, 200ms);
    FAIL() << "no timeout";
  } catch (const ddp::TimeoutError& e) {
    msg = e.what();
  }
  auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, 200ms);
  EXPECT_LT(waited, scaled(10s));  // at the timeout, not much later: far from the 200 ms
  EXPECT_NE(msg.find(fmt::format("127.0.0.1:{}", server->port())), std::string::npos) << msg;
  EXPECT_NE(msg.find("'absent'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("timed out after"), std::string::npos) << msg;
  EXPECT_NE(msg.find("200 ms"), std::string::npos) << msg;
  if (GetParam() == WireGeneration::kV2) {
    EXPECT_NE(msg.find("still missing: 'absent'"), std::string::npos) << msg;
  }
  // The key appears after the timeout: the server must not leave a stray byte in the
  // stream this client reads (gen 1 reconnects, gen 2 cancelled the wait). Once `other`
  // reads the key back, the server has handled the SET and sent any stray byte.
  other->set("absent", "a");
  EXPECT_EQ(other->get("absent"), "a");
  EXPECT_EQ(s->get("present"), "p");
  EXPECT_EQ(s->add("cnt", 2), 2);
  EXPECT_EQ(s->get("absent"), "a");
}

TEST_P(StoreGen, GetWaitsForTheKeyAndTimesOut) {
  auto patient = client();  // waits for the late key as long as a hang guard allows
  auto s = client(300ms);
  auto other = client();
  auto fut = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(50ms);
    other->set("late", "value");
  });
  EXPECT_EQ(patient->get("late"), "value");
  fut.get();
  auto msg = what_of([&] { s->get("never"); });
  EXPECT_NE(msg.find("'never'"), std::string::npos) << msg;
  EXPECT_THROW(s->get("never"), ddp::TimeoutError);
}

TEST_P(StoreGen, OneClientObjectFromManyThreads) {
  auto s = client();
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        s->add("shared", 1);
        s->set(fmt::format("t{}", t), std::to_string(i));
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(s->get("shared"), "800");
  EXPECT_EQ(s->get("t3"), "199");
}

TEST_P(StoreGen, RequestsSplitIntoOneByteSegments) {
  RawConn raw(server->port(), gen(), /*handshake=*/false);
  std::string stream;
  if (gen() == proto::Generation::kV2)
    stream += raw.encode([] {
      proto::Request r;
      r.op = Op::kValidate;
      r.u32 = proto::kValidationMagic;
      return r;
    }());
  stream += raw.encode(request(Op::kSet, {"split"}, {std::string(300, 'z')}));
  stream += raw.encode(request(Op::kGet, {"split"}));
  proto::Request add = request(Op::kAdd, {"split-n"});
  add.i64 = 41;
  stream += raw.encode(add);
  stream += raw.encode(request(Op::kWait, {"split", "split-n"}));
  raw.send_bytewise(stream);
  EXPECT_EQ(raw.recv_str(), std::string(300, 'z'));
  EXPECT_EQ(raw.recv_i64(), 41);
  EXPECT_EQ(raw.recv_u8(), proto::kWaitStopWaiting);
  auto s = client();
  EXPECT_EQ(s->get("split-n"), "41");
}

TEST_P(StoreGen, GarbageOrOversizedRequestsDisconnectOnlyThatClient) {
  auto s = client();
  RawConn waiter(server->port(), gen());
  waiter.send_request(request(Op::kWait, {"after-garbage"}));
  EXPECT_TRUE(waiter.silent_for(50ms));
  {
    RawConn bad(server->port(), gen());
    bad.send(std::string("\x66junk", 5));  // unknown opcode in both generations
    EXPECT_TRUE(bad.closed_by_peer());
  }
  {
    RawConn big(server->port(), gen());
    big.send_request(request(Op::kGet, {std::string((8 << 10) + 1, 'k')}));
    EXPECT_TRUE(big.closed_by_peer());
  }
  {
    RawConn many(server->port(), gen());
    std::string hdr;
    proto::put_u8(hdr, *proto::encode_opcode(gen(), Op::kWait));
    proto::put_u64(hdr, (128 << 10) + 1);
    many.send(hdr);
    EXPECT_TRUE(many.closed_by_peer());
  }
  {
    RawConn payload(server->port(), gen());
    std::string hdr;
    proto::put_u8(hdr, *proto::encode_opcode(gen(), Op::kSet));
    proto::put_str(hdr, "k");
    proto::put_u64(hdr, (8 << 20) + 1);  // announced, never sent
    payload.send(hdr);
    EXPECT_TRUE(payload.closed_by_peer());
  }
  if (gen() == proto::Generation::kV2) {
    RawConn revalidate(server->port(), gen());
    revalidate.send(std::string("\x00\xde\xad\xbe\xef", 5));  // a later VALIDATE, wrong magic
    EXPECT_TRUE(revalidate.closed_by_peer());
  }
  // Everyone else is unaffected, including a pending wait.
  EXPECT_EQ(s->add("still-works", 1), 1);
  s->set("after-garbage", "x");
  EXPECT_EQ(waiter.recv_u8(), proto::kWaitStopWaiting);
}

TEST_P(StoreGen, StalledClientThatNeverReadsDoesNotDelayOthers) {
  auto s = client();
  s->set("big", std::string(1 << 20, 'b'));
  ASSERT_EQ(s->get("big").size(), size_t{1} << 20);  // processed before the other connection reads it
  RawConn stalled(server->port(), gen());
  std::string burst;
  for (int i = 0; i < 32; ++i) burst += stalled.encode(request(Op::kGet, {"big"}));
  stalled.send(burst);  // 32 MiB of replies requested, none read: the server stops reading
  std::this_thread::sleep_for(100ms);
  stalled.send(burst);  // 32 more, arriving while the server does not read this client
  std::this_thread::sleep_for(50ms);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) {
    s->set("fast", std::to_string(i));
    ASSERT_EQ(s->get("fast"), std::to_string(i));
  }
  auto dt = std::chrono::steady_clock::now() - t0;
  // A few ms when nobody is held up; the bound is far from that (and below the client's
  // timeout, which a server blocked on the stalled client would reach).
  EXPECT_LT(dt, scaled(10s)) << "200 round trips took "
                    << std::chrono::duration_cast<std::chrono::milliseconds>(dt).count() << " ms";
  // The stalled client is still served in full once it reads (the server paused reading
  // from it meanwhile, with its remaining requests already in the socket).
  for (int i = 0; i < 64; ++i) ASSERT_EQ(stalled.recv_str().size(), size_t{1} << 20) << i;
  stalled.send_request(request(Op::kGetNumKeys));
  EXPECT_EQ(stalled.recv_i64(), 2);
}

TEST_P(StoreGen, SilentConnectionIsLeftAlone) {
  auto before = server->num_connections();
  RawConn silent(server->port(), gen(), /*handshake=*/false);  // a 1.13 callback connection
  auto s = client();
  s->set("x", "1");
  EXPECT_EQ(s->get("x"), "1");
  ddp::test::wait_until([&] { return server->num_connections() >= before + 2; }, hang_guard());
  EXPECT_EQ(server->num_connections(), before + 2);
  EXPECT_TRUE(silent.silent_for(200ms));  // not closed, nothing sent
}

TEST_P(StoreGen, GetOfAMissingKeyFollowsPyTorch) {
  RawConn raw(server->port(), gen());
  raw.send_request(request(Op::kGet, {"nope"}));
  if (gen() == proto::Generation::kV1) {
    EXPECT_TRUE(raw.closed_by_peer());  // torch 1.13's server drops the connection
  } else {
    EXPECT_EQ(raw.recv_str(), "");  // the libuv server answers an empty value
  }
}

TEST_P(StoreGen, CancelWaitRepliesAndForgetsTheWait) {
  RawConn raw(server->port(), gen());
  raw.send_request(request(Op::kWait, {"cw"}));
  EXPECT_TRUE(raw.silent_for(50ms));
  raw.send_request(request(Op::kCancelWait));
  EXPECT_EQ(raw.recv_u8(), proto::kWaitCanceled);
  auto s = client();
  s->set("cw", "1");
  EXPECT_TRUE(raw.silent_for(200ms));  // no STOP_WAITING for a cancelled wait
  // A wake-up that beats the cancel: STOP_WAITING, then WAIT_CANCELED. Once `s` reads the
  // key back, the SET was handled: the WAIT is answered whichever came first.
  raw.send_request(request(Op::kWait, {"cw2"}));
  s->set("cw2", "1");
  EXPECT_EQ(s->get("cw2"), "1");
  raw.send_request(request(Op::kCancelWait));
  EXPECT_EQ(raw.recv_u8(), proto::kWaitStopWaiting);
  EXPECT_EQ(raw.recv_u8(), proto::kWaitCanceled);
}

TEST_P(StoreGen, MultiKeyWaitNeedsEveryKey) {
  RawConn raw(server->port(), gen());
  auto s = client();
  s->set("mk1", "1");
  raw.send_request(request(Op::kWait, {"mk1", "mk2", "mk3", "mk2"}));
  s->set("mk2", "2");
  EXPECT_TRUE(raw.silent_for(100ms));
  s->add("mk3", 1);
  EXPECT_EQ(raw.recv_u8(), proto::kWaitStopWaiting);
  EXPECT_TRUE(raw.silent_for(50ms));  // exactly one reply
}

INSTANTIATE_TEST_SUITE_P(Both, StoreGen,
                         ::testing::Values(WireGeneration::kV1, WireGeneration::kV2), gen_name);

// ---------------------------------------------------------------------------------------
// Deadlines

// milliseconds::max() is no deadline (before: now + max overflowed and every call failed at
// once: "no reply to ADD within 9.22e+15 s", libddp's init with that group timeout).
TEST(StoreDeadlines, TheLongestTimeoutsMeanNoDeadline) {
  auto server = start_server();
  auto o = client_options(server->port(), WireGeneration::kV2, std::chrono::milliseconds::max());
  o.connect_timeout = std::chrono::milliseconds::max();
  ddp::TcpStore s(o);
  EXPECT_EQ(s.add("n", 2), 2);
  s.set("k", "v");
  EXPECT_EQ(s.get("k"), "v");
  s.wait({"k"});
  std::thread([&] {
    std::this_thread::sleep_for(50ms);
    ddp::TcpStore(client_options(server->port(), WireGeneration::kV2)).set("later", "1");
  }).join();
  EXPECT_EQ(s.get("later"), "1");
}

// A client (connect_timeout 60 s) that was connected to a server that has stopped since.
std::unique_ptr<ddp::TcpStore> client_of_a_stopped_server() {
  auto server = start_server();
  auto o = client_options(server->port(), WireGeneration::kV2);
  o.connect_timeout = 60s;
  auto s = std::make_unique<ddp::TcpStore>(o);
  s->set("k", "v");
  server->stop();
  return s;
}

// A StoreCallDeadline bounds a thread's calls, reconnecting included: a notice to a store
// that is gone gives up by it, not after the client's connect_timeout.
TEST(StoreDeadlines, AScopedDeadlineBoundsReconnecting) {
  auto client = client_of_a_stopped_server();
  ddp::TcpStore& s = *client;
  const auto t0 = std::chrono::steady_clock::now();
  {
    ddp::detail::StoreCallDeadline bounded(300ms);
    // The first call may fail on the dead connection itself; the second connects again.
    // (A SET, which has no reply, may go to the dead socket unseen.)
    for (int call = 0; call < 2; ++call) EXPECT_THROW(s.add("n", 1), ddp::Error);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, scaled(5s));
  EXPECT_EQ(ddp::detail::StoreCallDeadline::current(), std::chrono::steady_clock::time_point::max());
}

// interrupt() from another thread ends a call that is reconnecting to a store that is gone
// (the attempts and the pauses between them), not only one waiting on a connection: a
// watcher thread reconnecting to a silent store host held ddprun's exit until its
// connect_timeout (join_timeout, 600 s), deaf to signals.
TEST(StoreDeadlines, InterruptEndsReconnecting) {
  auto client = client_of_a_stopped_server();
  ddp::TcpStore& s = *client;
  std::string what;
  std::thread caller([&] {
    for (int call = 0; call < 2; ++call) {  // the first may fail on the dead connection itself
      try {
        s.add("n", 1);
      } catch (const ddp::Error& e) {
        what = e.what();
      }
    }
  });
  std::this_thread::sleep_for(500ms);  // reconnecting by now (refused, with pauses up to 1 s)
  const auto t0 = std::chrono::steady_clock::now();
  s.interrupt();
  caller.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, scaled(1s));
  EXPECT_NE(what.find("the connection was shut down"), std::string::npos) << what;
}

// A listener on loopback that accepts (the kernel's queue) and never answers, and a lazy
// client's options for it (connect_timeout 60 s).
struct SilentServer {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ddp::TcpStoreOptions client;
  SilentServer() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd, 8), 0);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    client = client_options(ntohs(a.sin_port), WireGeneration::kV2);
    client.lazy = true;
    client.connect_timeout = 60s;
  }
  ~SilentServer() { ::close(fd); }
};

// The handshake's own grace (up to 5 s for a server that accepted and says nothing) is
// bounded by the scope too (it was not: 5.01 s for a 2 s notice).
TEST(StoreDeadlines, AScopedDeadlineBoundsTheHandshake) {
  const SilentServer silent;
  ddp::TcpStore s(silent.client);
  const auto t0 = std::chrono::steady_clock::now();
  {
    ddp::detail::StoreCallDeadline bounded(300ms);
    EXPECT_THROW(s.set("k", "v"), ddp::Error);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, scaled(2s));
}

// interrupt() also ends a handshake with a server that accepted and says nothing (its
// wait polls the interrupt too: an interrupt() just before the socket became the
// connection's had nothing to shut down, and the handshake waited out connect_timeout).
TEST(StoreDeadlines, InterruptEndsAHandshakeThatGetsNoReply) {
  const SilentServer silent;
  ddp::TcpStore s(silent.client);
  std::string what;
  std::thread caller([&] {
    try {
      s.add("k", 1);
    } catch (const ddp::Error& e) {
      what = e.what();
    }
  });
  std::this_thread::sleep_for(300ms);
  const auto t0 = std::chrono::steady_clock::now();
  s.interrupt();
  caller.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, scaled(1s));
  EXPECT_NE(what.find("the connection was shut down"), std::string::npos) << what;
}

// ---------------------------------------------------------------------------------------
// Generation 1 specifics

TEST(StoreGen1, StrayStopWaitingAfterAClientGaveUp) {
  // torch 1.13 sends no cancel; the pending wait is answered when the key appears.
  auto server = start_server();
  RawConn raw(server->port(), proto::Generation::kV1);
  raw.send_request(request(Op::kWait, {"stray"}));
  EXPECT_TRUE(raw.silent_for(100ms));  // the client "times out" here
  ddp::TcpStore s(client_options(server->port(), WireGeneration::kV1));
  s.set("stray", "1");
  EXPECT_EQ(raw.recv_u8(), proto::kWaitStopWaiting);
}

TEST(StoreGen1, Torch21OpcodesAppendMultiGetMultiSet) {
  // torch 2.1's numbering (APPEND=8 MULTI_GET=9 MULTI_SET=10), known to the server once a
  // 2.1-only opcode arrived (MULTI_SET here; before that, 8 is 1.13's DELETE_KEY).
  auto server = start_server();
  RawConn raw(server->port(), proto::Generation::kV1Torch21);
  raw.send_request(request(Op::kMultiSet, {"m1", "m2"}, {"x", "y"}));
  raw.send_request(request(Op::kAppend, {"ap"}, {"ab"}));
  raw.send_request(request(Op::kAppend, {"ap"}, {"cd"}));
  raw.send_request(request(Op::kMultiGet, {"ap", "m2", "m1"}));
  EXPECT_EQ(raw.recv_str(), "abcd");
  EXPECT_EQ(raw.recv_str(), "y");
  EXPECT_EQ(raw.recv_str(), "x");
}

TEST(StoreGen1, WatchKeyReportsChanges) {
  auto server = start_server();
  RawConn watch(server->port(), proto::Generation::kV1);
  watch.send_request(request(Op::kWatchKey, {"wk"}));
  EXPECT_EQ(watch.recv_u8(), proto::kWatchRegistered);
  ddp::TcpStore s(client_options(server->port(), WireGeneration::kV1));
  auto expect_update = [&](uint8_t type, const std::string& old_v, const std::string& new_v) {
    EXPECT_EQ(watch.recv_u8(), type);
    EXPECT_EQ(watch.recv_str(), "wk");
    EXPECT_EQ(watch.recv_str(), old_v);
    EXPECT_EQ(watch.recv_str(), new_v);
  };
  s.set("wk", "a");
  expect_update(proto::kWatchCreated, "", "a");
  s.set("wk", "b");
  expect_update(proto::kWatchUpdated, "a", "b");
  s.compare_set("wk", "b", "7");
  expect_update(proto::kWatchUpdated, "b", "7");
  s.add("wk", 1);
  expect_update(proto::kWatchUpdated, "7", "8");
  s.delete_key("wk");
  expect_update(proto::kWatchDeleted, "8", "");
  s.set("other", "x");
  EXPECT_TRUE(watch.silent_for(50ms));
}

TEST(StoreGen1, Generation2ExtrasThrowStoreErrorOnTheClient) {
  auto server = start_server();
  ddp::TcpStore s(client_options(server->port(), WireGeneration::kV1));
  std::string v;
  EXPECT_THROW(s.append("a", "b"), ddp::StoreError);
  EXPECT_THROW(s.queue_pop("q", v), ddp::StoreError);
  EXPECT_THROW(s.list_keys(), ddp::StoreError);
  EXPECT_THROW(s.ping(), ddp::StoreError);
  EXPECT_EQ(s.add("ok", 1), 1);
}

// ---------------------------------------------------------------------------------------
// Generation 2 specifics

TEST(StoreGen2, ExtrasAppendMultiListPing) {
  auto server = start_server();
  ddp::TcpStore s(client_options(server->port(), WireGeneration::kV2));
  s.ping();
  s.append("ap", "ab");
  s.append("ap", "cd");
  EXPECT_EQ(s.get("ap"), "abcd");
  s.multi_set({"m1", "m2"}, {"x", std::string("\0y", 2)});
  EXPECT_EQ(s.multi_get({"m2", "m1", "missing"}),
            (std::vector<std::string>{std::string("\0y", 2), "x", ""}));
  auto keys = s.list_keys();
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"ap", "m1", "m2"}));
  EXPECT_EQ(s.num_keys(), 3);
  EXPECT_THROW(s.multi_set({"a"}, {}), ddp::StoreError);
}

// wake(): a wait_grows in progress in another thread, or the next one, ends as at its
// timeout, and the connection stays in order (a stopping rendezvous node's join ends at
// once, and the node still closes the job on the same connection).
TEST(StoreGen2, WakeEndsAWaitGrowsAndKeepsTheConnection) {
  using namespace std::chrono_literals;
  using Clock = std::chrono::steady_clock;
  auto server = start_server();
  ddp::TcpStore s(client_options(server->port(), WireGeneration::kV2));
  auto t0 = Clock::now();
  auto waiting = std::async(std::launch::async, [&] { return s.wait_grows("log", 0, 10s); });
  std::this_thread::sleep_for(100ms);
  s.wake();
  ASSERT_EQ(waiting.wait_for(5s), std::future_status::ready);
  EXPECT_FALSE(waiting.get());
  EXPECT_LT(Clock::now() - t0, 2s);
  s.wake();  // before the wait: it returns at once; the one after waits out its timeout
  t0 = Clock::now();
  EXPECT_FALSE(s.wait_grows("log", 0, 10s));
  EXPECT_LT(Clock::now() - t0, 2s);
  t0 = Clock::now();
  EXPECT_FALSE(s.wait_grows("log", 0, 300ms));
  EXPECT_GE(Clock::now() - t0, 300ms);
  s.append("log", "x\n");  // replies in step: no stray answer to a cancelled wait
  EXPECT_TRUE(s.wait_grows("log", 0, 10s));
  EXPECT_EQ(s.get("log"), "x\n");
  s.wake();  // other calls pass over it
  EXPECT_EQ(s.get("log"), "x\n");
  EXPECT_EQ(server->num_connections(), 1u);
}

// ddprun's GET_FROM: an appended log read from where the reader is, never waiting.
TEST(StoreGen2, GetFromReadsTheValueFromAnOffset) {
  auto server = start_server();
  ddp::TcpStore s(client_options(server->port(), WireGeneration::kV2));
  EXPECT_EQ(s.get_from("log", 0), "");  // missing: at once, no wait
  s.append("log", "one\n");
  s.append("log", "two\n");
  EXPECT_EQ(s.get_from("log", 0), "one\ntwo\n");
  EXPECT_EQ(s.get_from("log", 4), "two\n");
  EXPECT_EQ(s.get_from("log", 8), "");
  EXPECT_EQ(s.get_from("log", 800), "");
  EXPECT_EQ(s.get_from("log", -5), "one\ntwo\n");
  ddp::TcpStore v1(client_options(server->port(), WireGeneration::kV1));
  EXPECT_THROW(v1.get_from("log", 0), ddp::StoreError);
}

// ddprun's TRIM_LOG and LOG_FROM: a log's first lines go, offsets and line numbers stay.
TEST(StoreGen2, TrimLogDropsWholeLinesAndKeepsOffsets) {
  auto server = start_server();
  ddp::TcpStore s(client_options(server->port(), WireGeneration::kV2));
  EXPECT_TRUE(s.serves_log_trim());
  EXPECT_EQ(s.trim_log("log", 5), 0);  // missing: nothing to drop
  s.append("log", "zero\none\ntwo\nthr");  // the last line is not complete yet
  EXPECT_EQ(s.trim_log("log", 2), 2);
  EXPECT_EQ(s.get("log"), "two\nthr");  // what the value holds
  EXPECT_EQ(s.get_from("log", 9), "two\nthr");  // offsets count from the first byte ever
  EXPECT_EQ(s.get_from("log", 13), "thr");
  auto c = s.log_from("log", 0);  // below what is held: from the first byte held, saying where
  EXPECT_EQ(c.trimmed_bytes, 9);
  EXPECT_EQ(c.trimmed_lines, 2);
  EXPECT_EQ(c.bytes, "two\nthr");
  EXPECT_EQ(s.log_from("log", 13).bytes, "thr");
  EXPECT_EQ(s.trim_log("log", 1), 2) << "never fewer lines than before";
  EXPECT_EQ(s.trim_log("log", 100), 3) << "an unfinished line stays";
  EXPECT_EQ(s.get("log"), "thr");
  EXPECT_FALSE(s.wait_grows("log", 16, std::chrono::milliseconds(50))) << "sizes count the dropped bytes";
  s.append("log", "ee\n");
  EXPECT_TRUE(s.wait_grows("log", 16, hang_guard()));
  EXPECT_EQ(s.get_from("log", 13), "three\n");
  EXPECT_TRUE(s.delete_key("log"));  // a new value starts at offset 0
  s.append("log", "new\n");
  c = s.log_from("log", 0);
  EXPECT_EQ(c.trimmed_bytes, 0);
  EXPECT_EQ(c.bytes, "new\n");
  s.trim_log("log", 1);
  s.set("log", "set\n");  // so does a SET
  EXPECT_EQ(s.log_from("log", 0).trimmed_lines, 0);
  EXPECT_EQ(s.get_from("log", 0), "set\n");
}

// A server without log trimming (ddprun's before it): the feature question reads as offset
// 0 of a missing key, and TRIM_LOG closes the connection, as any unknown request does.
TEST(StoreGen2, AServerWithoutLogTrimSaysSoWithoutClosing) {
  ddp::detail::StoreServerOptions o;
  o.log_trim = false;
  auto server = start_server(o);
  ddp::TcpStore s(client_options(server->port(), WireGeneration::kV2));
  EXPECT_FALSE(s.serves_log_trim());
  s.append("log", "a\n");
  EXPECT_EQ(s.get_from("log", 0), "a\n") << "the question left the connection working";
  EXPECT_THROW(s.trim_log("log", 1), ddp::NetworkError);
}

TEST(StoreGen2, Queues) {
  auto server = start_server();
  ddp::TcpStore s(client_options(server->port(), WireGeneration::kV2));
  std::string v = "untouched";
  EXPECT_EQ(s.queue_len("q"), 0);
  EXPECT_FALSE(s.queue_pop("q", v));
  EXPECT_EQ(v, "untouched");
  EXPECT_FALSE(s.check({"q"}));
  s.queue_push("q", "one");
  s.queue_push("q", std::string("t\0o", 3));
  EXPECT_EQ(s.queue_len("q"), 2);
  EXPECT_TRUE(s.check({"q"}));  // a non-empty queue counts as set
  s.wait({"q"}, hang_guard());
  EXPECT_TRUE(s.queue_pop("q", v));
  EXPECT_EQ(v, "one");
  EXPECT_TRUE(s.queue_pop("q", v));
  EXPECT_EQ(v, std::string("t\0o", 3));
  EXPECT_FALSE(s.queue_pop("q", v));
  EXPECT_FALSE(s.check({"q"}));
  EXPECT_EQ(s.num_keys(), 0);  // queues are not keys
  EXPECT_TRUE(s.list_keys().empty());
}

TEST(StoreGen2, BlockingPopQueuePushWakesOneWaiter) {
  auto server = start_server();
  ddp::TcpStore s(client_options(server->port(), WireGeneration::kV2));
  RawConn a(server->port(), proto::Generation::kV2), b(server->port(), proto::Generation::kV2);
  // Both WAITs are handled before the push: a GET behind each is answered ("", no key).
  for (RawConn* w : {&a, &b}) {
    w->send_request(request(Op::kWait, {"jobs"}));
    w->send_request(request(Op::kGet, {"jobs"}));
    EXPECT_EQ(w->recv_str(), "");
  }
  s.queue_push("jobs", "j1");
  // Exactly one waiter wakes.
  pollfd fds[2] = {{a.fd(), POLLIN, 0}, {b.fd(), POLLIN, 0}};
  ASSERT_GT(::poll(fds, 2, static_cast<int>(hang_guard().count())), 0) << "no waiter woke";
  RawConn* first = fds[0].revents ? &a : &b;
  RawConn* second = fds[0].revents ? &b : &a;
  first->recv_u8();
  EXPECT_TRUE(second->silent_for(150ms));
  first->send_request(request(Op::kQueuePop, {"jobs"}));
  EXPECT_EQ(first->recv_i64(), 1);
  EXPECT_EQ(first->recv_str(), "j1");
  s.queue_push("jobs", "j2");
  EXPECT_EQ(second->recv_u8(), proto::kWaitStopWaiting);
  second->send_request(request(Op::kQueueLen, {"jobs"}));
  EXPECT_EQ(second->recv_i64(), 1);
}

namespace {

// A listening socket on 127.0.0.1 and a free port, for fake servers.
int listen_loopback(uint16_t& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::listen(fd, 4);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

// Reads exactly n bytes; false on EOF or error.
bool read_n(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// A fake generation-2 server for one client: answers the handshake, then waits for
// CANCEL_WAIT and answers it with `cancel_reply`.
class FakeServer {
 public:
  explicit FakeServer(std::string cancel_reply) : reply_(std::move(cancel_reply)) {
    lfd_ = listen_loopback(port_);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeServer() {
    thread_.join();
    ::close(lfd_);
  }
  uint16_t port() const { return port_; }
  bool saw_cancel() const { return saw_cancel_; }

 private:
  void serve() {
    int fd = ::accept(lfd_, nullptr, nullptr);
    if (fd < 0) return;
    uint8_t validate[5];
    uint8_t ping[5];
    if (read_n(fd, validate, 5) && read_n(fd, ping, 5)) {
      ::send(fd, ping + 1, 4, MSG_NOSIGNAL);
      uint8_t op;
      uint64_t n, len;
      if (read_n(fd, &op, 1) && read_n(fd, &n, 8) && read_n(fd, &len, 8)) {
        std::string key(len, '\0');
        uint8_t cancel = 0xff;
        if (read_n(fd, key.data(), len) && read_n(fd, &cancel, 1) && cancel == 12) {
          saw_cancel_ = true;
          ::send(fd, reply_.data(), reply_.size(), MSG_NOSIGNAL);
        }
      }
    }
    char drain;
    while (::recv(fd, &drain, 1, 0) > 0) {
    }
    ::close(fd);
  }
  std::string reply_;
  int lfd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> saw_cancel_{false};
  std::thread thread_;
};

}  // namespace

TEST(StoreGen2, ClientToleratesAStopWaitingThatRacedItsCancel) {
  {
    FakeServer fake(std::string("\x00\x01", 2));  // the key appeared just before the cancel
    ddp::TcpStore s(client_options(fake.port(), WireGeneration::kV2));
    EXPECT_NO_THROW(s.wait({"k"}, 100ms));
    EXPECT_TRUE(fake.saw_cancel());
  }
  {
    FakeServer fake(std::string("\x01", 1));  // a plain cancel
    ddp::TcpStore s(client_options(fake.port(), WireGeneration::kV2));
    EXPECT_THROW(s.wait({"k"}, 100ms), ddp::TimeoutError);
    EXPECT_TRUE(fake.saw_cancel());
  }
}

// MASTER_PORT pointing at a web server: it answers the handshake with "HTTP/1.1 400 ...".
// The client says it is not a store and shows those bytes (before: "handshake PING returned
// 1347703880 instead of ...", "HTTP" read as a number).
TEST(StoreGen2, AnotherServersReplyIsNamedAsNotAStore) {
  uint16_t port = 0;
  int lfd = listen_loopback(port);
  std::thread server([&] {
    int fd = ::accept(lfd, nullptr, nullptr);
    uint8_t first[10];
    if (fd >= 0 && read_n(fd, first, sizeof first)) {
      const std::string reply = "HTTP/1.1 400 Bad Request\r\n\r\n";
      ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
    }
    if (fd >= 0) ::close(fd);
  });
  auto o = client_options(port, WireGeneration::kV2);
  o.connect_timeout = 2s;
  try {
    ddp::TcpStore s(o);
    ADD_FAILURE() << "connected to a web server";
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("answered the handshake's PING with 'HTTP' instead of the nonce"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a store (another server's reply)"), std::string::npos) << e.what();
  }
  server.join();
  ::close(lfd);
}

// A generation-2 server from before PING existed (torch 2.2/2.3): it closes the connection
// on PING. The client must connect again with VALIDATE alone and then work.
TEST(StoreGen2, ServerWithoutPingGetsValidateAlone) {
  uint16_t port = 0;
  int lfd = listen_loopback(port);
  std::vector<int> opcodes_after_validate;
  std::thread server([&] {
    for (int conn = 0; conn < 3; ++conn) {
      int fd = ::accept(lfd, nullptr, nullptr);
      uint8_t validate[5], op = 0xff;
      if (!read_n(fd, validate, 5) || validate[0] != 0) {  // not VALIDATE first: closed, as torch does
        opcodes_after_validate.push_back(-1);
        ::close(fd);
        continue;
      }
      if (!read_n(fd, &op, 1)) {
        ::close(fd);
        return;
      }
      opcodes_after_validate.push_back(op);
      if (op == 13) {  // "Client sent invalid command": close
        ::close(fd);
        continue;
      }
      uint64_t n = 0, klen = 0;  // CHECK: u64 count, then the key
      std::string key;
      if (op == 5 && read_n(fd, &n, 8) && read_n(fd, &klen, 8)) {
        key.resize(klen);
        read_n(fd, key.data(), klen);
        uint8_t not_ready = 1;
        ::send(fd, &not_ready, 1, MSG_NOSIGNAL);
      }
      char drain;
      while (::recv(fd, &drain, 1, 0) > 0) {
      }
      ::close(fd);
    }
  });
  {
    ddp::TcpStore s(client_options(port, WireGeneration::kV2));
    EXPECT_FALSE(s.check({"k"}));
  }
  server.join();
  ::close(lfd);
  // PING refused; the generation-1 question (CHECK first, no VALIDATE) closed, so not a
  // generation-1 server; then VALIDATE alone and the CHECK.
  EXPECT_EQ(opcodes_after_validate, (std::vector<int>{13, -1, 5}));
}

// A generation-1 server (torch 1.13 .. 2.1) resets the connection on the handshake, as one
// without PING does, but answers a generation-1 CHECK on a new connection, and resets a
// second handshake too: kAuto then speaks generation 1 on the CHECK's connection, and kV2
// fails at once saying what the server is. Neither sends VALIDATE alone, which would leave
// a generation-1 daemon waiting for the rest of a SET (and every other client with it).
TEST(StoreGen2, AGeneration1ServerIsFoundAndNeverSentValidateAlone) {
  for (auto gen : {WireGeneration::kAuto, WireGeneration::kV2}) {
    uint16_t port = 0;
    int lfd = listen_loopback(port);
    std::vector<std::string> seen;
    auto reset_handshake = [&] {  // "SET" with VALIDATE's magic as the key's length: reset
      int fd = ::accept(lfd, nullptr, nullptr);
      uint8_t op = 0xff;
      seen.push_back(read_n(fd, &op, 1) && op == 0 ? "handshake" : fmt::format("op {}", op));
      ::close(fd);
    };
    std::thread server([&] {
      reset_handshake();
      int fd = ::accept(lfd, nullptr, nullptr);
      uint8_t op = 0xff;
      uint64_t n = 99;  // generation-1 CHECK (4): u64 count, then the keys
      if (!read_n(fd, &op, 1) || op != 4 || !read_n(fd, &n, 8)) return ::close(fd), void();
      seen.push_back(fmt::format("check {}", n));
      for (uint8_t ready = 0;; ready = n == 0 ? 0 : 1) {  // READY for no keys, NOT_READY after
        ::send(fd, &ready, 1, MSG_NOSIGNAL);
        if (seen.size() == 2) reset_handshake();  // the client asks once more before it believes it
        uint64_t klen = 0;
        std::string key;
        if (!read_n(fd, &op, 1) || op != 4 || !read_n(fd, &n, 8) || !read_n(fd, &klen, 8)) break;
        key.resize(klen);
        if (!read_n(fd, key.data(), klen)) break;
        seen.push_back("check " + key);
      }
      ::close(fd);
    });
    if (gen == WireGeneration::kAuto) {
      try {
        ddp::TcpStore s(client_options(port, gen));
        EXPECT_FALSE(s.check({"k"}));
        EXPECT_EQ(s.generation(), WireGeneration::kV1);
        EXPECT_THROW(s.append("k", "v"), ddp::StoreError);  // no generation-1 APPEND
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
      }
    } else {
      try {
        ddp::TcpStore s(client_options(port, gen));
        ADD_FAILURE() << "generation 2 against a generation-1 server";
      } catch (const ddp::StoreError& e) {
        EXPECT_NE(std::string(e.what()).find("speaks only wire generation 1"), std::string::npos) << e.what();
      }
    }
    ::shutdown(lfd, SHUT_RDWR);
    server.join();
    ::close(lfd);
    if (gen == WireGeneration::kAuto)
      EXPECT_EQ(seen, (std::vector<std::string>{"handshake", "check 0", "handshake", "check k"}));
    else
      EXPECT_EQ(seen, (std::vector<std::string>{"handshake", "check 0", "handshake"}));
  }
}

// ddprun's own server answers generation-1 requests too (torch 1.13's clients), so a
// handshake closed once (a relay or proxy that accepted before it could reach the server)
// followed by an answered generation-1 CHECK is not yet generation 1: the second handshake
// is answered, and the client speaks generation 2 on it (kV2 and kAuto alike).
TEST(StoreGen2, AHandshakeClosedOnceIsNotTakenForGeneration1) {
  for (auto gen : {WireGeneration::kAuto, WireGeneration::kV2}) {
    uint16_t port = 0;
    int lfd = listen_loopback(port);
    std::vector<std::string> seen;
    std::thread server([&] {
      int fd = ::accept(lfd, nullptr, nullptr);  // the relay, not through yet: closed
      ::close(fd);
      int check = ::accept(lfd, nullptr, nullptr);
      uint8_t op = 0xff;
      uint64_t n = 99;
      if (read_n(check, &op, 1) && op == 4 && read_n(check, &n, 8)) {
        seen.push_back(fmt::format("check {}", n));
        uint8_t ready = 0;
        ::send(check, &ready, 1, MSG_NOSIGNAL);
      }
      fd = ::accept(lfd, nullptr, nullptr);
      uint8_t validate[5], ping[5];
      if (read_n(fd, validate, 5) && read_n(fd, ping, 5) && validate[0] == 0 && ping[0] == 13) {
        seen.push_back("handshake");
        ::send(fd, ping + 1, 4, MSG_NOSIGNAL);  // the pid echoed
      }
      read_n(fd, &op, 1);  // until the client closes
      ::close(fd);
      ::close(check);
    });
    try {
      ddp::TcpStore s(client_options(port, gen));
      EXPECT_EQ(s.generation(), WireGeneration::kV2);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
    ::shutdown(lfd, SHUT_RDWR);  // (a client that never makes the third connection)
    server.join();
    ::close(lfd);
    EXPECT_EQ(seen, (std::vector<std::string>{"check 0", "handshake"}));
  }
}

// A server that closes the connection on WAIT_GROWS (one of ddprun's extensions) is either
// not ddprun's (PyTorch's TCPStore drops a client that sends an opcode it does not know) or
// dying. The client tells them apart by a second connection: a live server accepts it and
// stays silent; a dying one (SIGKILL: the kernel closes its sockets one by one) may still
// complete it from its backlog, and resets it at once.
TEST(StoreGen2, AClosedExtensionCallTellsAForeignServerFromAStoppedOne) {
  for (bool dying : {false, true}) {
    uint16_t port = 0;
    int lfd = listen_loopback(port);
    std::thread server([&] {
      int fd = ::accept(lfd, nullptr, nullptr);
      uint8_t validate[5], ping[5], op = 0;
      if (read_n(fd, validate, 5) && read_n(fd, ping, 5)) ::send(fd, ping + 1, 4, MSG_NOSIGNAL);
      read_n(fd, &op, 1);  // WAIT_GROWS: an opcode this server does not serve
      ::close(fd);
      int probe = ::accept(lfd, nullptr, nullptr);
      if (!dying) {
        char drain;
        while (::recv(probe, &drain, 1, 0) > 0) {
        }
      }
      ::close(probe);
    });
    std::string what;
    {
      ddp::TcpStore s(client_options(port, WireGeneration::kV2));
      try {
        s.wait_grows("log", 0, 2s);
      } catch (const ddp::NetworkError& e) {
        what = e.what();
      }
    }
    server.join();
    ::close(lfd);
    if (dying) {
      EXPECT_NE(what.find("accepts no connection any more: it stopped"), std::string::npos) << what;
    } else {
      EXPECT_NE(what.find("does not serve ddprun's WAIT_GROWS: is it PyTorch's TCPStore"), std::string::npos) << what;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Server lifecycle and the client's connection handling

// A client that breaks the protocol (a torch client's store.set of 16 MiB: over the 8 MiB
// limit of torch 2.x's libuv server, which ours keeps) is disconnected with a warning that
// names it and the limit: the torch client itself only says "Broken pipe". The first five
// only, so that a stray client cannot flood the log.
TEST(StoreServer, AClientThatBreaksTheProtocolIsNamedInAWarning) {
  std::ostringstream said;
  const auto before = spdlog::default_logger();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(said)));
  {
    auto server = start_server();
    for (int i = 0; i < 7; ++i) {
      RawConn c(server->port(), proto::Generation::kV1);
      proto::Request r;
      r.op = Op::kSet;
      r.keys = {"k"};
      r.values = {"x"};
      std::string bytes = c.encode(r);
      const uint64_t len = uint64_t{16} << 20;  // the value's length, without its bytes
      bytes.resize(bytes.size() - 9);
      bytes.append(reinterpret_cast<const char*>(&len), 8);
      c.send(bytes);
      EXPECT_TRUE(c.closed_by_peer());
    }
  }
  spdlog::set_default_logger(before);
  const std::string text = said.str();
  EXPECT_NE(text.find("store server: disconnected the client at 127.0.0.1:"), std::string::npos) << text;
  EXPECT_NE(text.find("for breaking the protocol: SET: value of 16777216 bytes exceeds the limit of 8388608"),
            std::string::npos)
      << text;
  size_t lines = 0;
  for (size_t at = 0; (at = text.find("for breaking the protocol", at)) != std::string::npos; ++at) ++lines;
  EXPECT_EQ(lines, 5u) << text;
  EXPECT_NE(text.find("(further ones are logged at debug level)"), std::string::npos) << text;
}

TEST(StoreServer, PortZeroPicksAFreePort) {
  auto a = start_server();
  auto b = start_server();
  EXPECT_NE(a->port(), 0);
  EXPECT_NE(b->port(), 0);
  EXPECT_NE(a->port(), b->port());
}

// The listener asks for the kernel's maximum backlog (or more, when configured so): a burst
// of connects beyond the accept queue would wait 1 s for SYN retransmits.
TEST(StoreServer, ListensWithTheKernelsMaximumBacklog) {
  int kernel = SOMAXCONN;
  if (std::FILE* f = std::fopen("/proc/sys/net/core/somaxconn", "r")) {
    if (std::fscanf(f, "%d", &kernel) != 1) kernel = SOMAXCONN;
    std::fclose(f);
  }
  EXPECT_EQ(ddp::detail::listen_backlog(0), kernel);
  EXPECT_EQ(ddp::detail::listen_backlog(16), kernel);  // a smaller one is raised
  EXPECT_EQ(ddp::detail::listen_backlog(kernel + 1000), kernel + 1000);  // a larger one wins
  ddp::detail::StoreServerOptions o;
  o.backlog = 16;
  auto server = start_server(o);
  // ss reports a listening socket's backlog as its Send-Q.
  std::FILE* ss = ::popen(fmt::format("ss -Hltn 'sport = :{}' 2>/dev/null", server->port()).c_str(), "r");
  ASSERT_NE(ss, nullptr);
  char state[32] = {}, line[512] = {};
  long recv_q = -1, send_q = -1;
  bool parsed = std::fgets(line, sizeof line, ss) != nullptr &&
                std::sscanf(line, "%31s %ld %ld", state, &recv_q, &send_q) == 3;
  int rc = ::pclose(ss);
  if (!parsed && rc != 0) GTEST_SKIP() << "no ss (iproute2) to read the listener's backlog";
  ASSERT_TRUE(parsed) << "ss printed: " << line;
  EXPECT_EQ(send_q, kernel) << line;
}

TEST(StoreServer, AddressInUseIsASystemErrorWithThatCode) {
  ddp::detail::StoreServerOptions o;
  o.host = "";  // wildcard, dual stack
  ddp::detail::StoreServer a(o);
  o.port = a.port();
  for (std::string host : {"", "0.0.0.0", "127.0.0.1"}) {
    o.host = host;
    try {
      ddp::detail::StoreServer b(o);
      FAIL() << "second bind to port " << o.port << " on '" << host << "' succeeded";
    } catch (const ddp::SystemError& e) {
      EXPECT_EQ(e.code(), EADDRINUSE) << e.what();
      EXPECT_NE(std::string(e.what()).find(fmt::format("bind {}:{}", host, o.port)),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(StoreServer, AHostThatDoesNotResolveIsNamedOnce) {
  ddp::detail::StoreServerOptions o;
  o.host = "no-such-host.invalid";
  try {
    ddp::detail::StoreServer s(o);
    FAIL() << "bound to a host that does not resolve";
  } catch (const ddp::NetworkError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("bind no-such-host.invalid:0: cannot resolve no-such-host.invalid: ", 0), 0u) << what;
    EXPECT_EQ(what.find("Cannot assign"), std::string::npos) << "no errno text of an unrelated errno: " << what;
  }
}

TEST(StoreServer, WildcardListensOnIPv4AndIPv6) {
  ddp::detail::StoreServerOptions o;
  o.host = "::";
  ddp::detail::StoreServer server(o);
  server.start();
  ddp::TcpStore v4(client_options(server.port(), WireGeneration::kV2));
  v4.set("a", "1");
  int probe = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 lo{};
  lo.sin6_family = AF_INET6;
  lo.sin6_addr = in6addr_loopback;
  bool have_v6 = probe >= 0 && ::bind(probe, reinterpret_cast<sockaddr*>(&lo), sizeof lo) == 0;
  if (probe >= 0) ::close(probe);
  if (!have_v6) GTEST_SKIP() << "no IPv6 loopback on this machine";
  auto opts = client_options(server.port(), WireGeneration::kV2);
  opts.host = "::1";
  ddp::TcpStore v6(opts);
  EXPECT_EQ(v6.get("a"), "1");
}

TEST(StoreServer, StopIsIdempotentAndDropsClients) {
  auto server = start_server();
  ddp::TcpStore s(client_options(server->port(), WireGeneration::kV2, 1s));
  s.set("a", "1");
  server->stop();
  server->stop();
  EXPECT_EQ(server->num_connections(), 0u);
  EXPECT_THROW(s.add("a", 1), ddp::NetworkError);
}

TEST(StoreServer, ConnectGivesUpNamingAddressTimeAndReason) {
  uint16_t port;
  {
    auto s = start_server();
    port = s->port();
  }  // nothing listens there now
  auto o = client_options(port, WireGeneration::kV2);
  o.connect_timeout = 300ms;
  auto t0 = std::chrono::steady_clock::now();
  try {
    ddp::TcpStore s(o);
    FAIL() << "connected to a closed port";
  } catch (const ddp::NetworkError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(fmt::format("127.0.0.1:{}", port)), std::string::npos) << m;
    EXPECT_NE(m.find("gave up after"), std::string::npos) << m;
    EXPECT_NE(m.find("Connection refused"), std::string::npos) << m;
  }
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 300ms);
}

// TcpStore(options, retrying): told of every failed attempt, with the time tried so far
// and the attempt's error; one that throws stops the connecting with its own error.
TEST(StoreServer, ConnectTellsItsRetriesAndARetryThatThrowsStopsIt) {
  uint16_t port;
  {
    auto s = start_server();
    port = s->port();
  }
  auto o = client_options(port, WireGeneration::kV2);
  o.connect_timeout = 300ms;
  std::vector<std::pair<std::chrono::milliseconds, std::string>> told;
  EXPECT_THROW(ddp::TcpStore(o, [&](auto tried, const std::string& why) { told.emplace_back(tried, why); }),
               ddp::NetworkError);
  ASSERT_GE(told.size(), 2u);
  for (size_t i = 0; i < told.size(); ++i) {
    EXPECT_EQ(told[i].second, "Connection refused");
    if (i) {
      EXPECT_GE(told[i].first, told[i - 1].first);
    }
  }
  EXPECT_LT(told.back().first, 300ms);
  o.connect_timeout = scaled(30s);
  auto t0 = std::chrono::steady_clock::now();
  int calls = 0;
  try {
    ddp::TcpStore s(o, [&](auto, const std::string&) {
      if (++calls == 3) throw std::runtime_error("enough");
    });
    FAIL() << "connected to a closed port";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "enough");
  }
  EXPECT_EQ(calls, 3);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, scaled(5s));
}

TEST(StoreServer, ClientRetriesUntilTheServerAppears) {
  uint16_t port;
  {
    auto s = start_server();
    port = s->port();
  }
  auto fut = std::async(std::launch::async, [port] {
    std::this_thread::sleep_for(200ms);
    ddp::detail::StoreServerOptions o;
    o.host = "127.0.0.1";
    o.port = port;
    auto s = std::make_unique<ddp::detail::StoreServer>(o);
    s->start();
    return s;
  });
  ddp::TcpStore c(client_options(port, WireGeneration::kV2));
  c.set("late-server", "ok");
  auto server = fut.get();
  EXPECT_EQ(c.get("late-server"), "ok");
}

// A client that retries a port of the ephemeral range while nobody listens there can be
// connected to itself (the kernel picked that very port as its own): that is no server,
// and closing it with a reset leaves the port free for the server that comes.
TEST(StoreServer, ASocketConnectedToItselfIsNoServerAndLeavesThePortFree) {
  uint16_t port;
  {
    auto s = start_server();
    port = s->port();
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << "a simultaneous open with itself";
  EXPECT_TRUE(ddp::detail::self_connected(fd));
  ddp::detail::close_with_reset(fd);
  ddp::detail::StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  ddp::detail::StoreServer server(o);  // no TIME_WAIT holds the port
  server.start();
  int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
  EXPECT_FALSE(ddp::detail::self_connected(c));
  ::close(c);
}
