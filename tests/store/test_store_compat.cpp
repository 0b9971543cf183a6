// The store server against torch 2.x clients, byte for byte (see docs/store.md): BARRIER
// (generation 2, opcode 18), torch 2.1's generation-1 numbering, and requests and replies
// as large as PyTorch's per-field limits allow.
#include <gtest/gtest.h>

#include "store_test_util.hpp"

namespace {

using namespace store_test;
using proto::Generation;
using proto::Op;

// "Not answered": nothing arrived within this. It only ever asserts an absence, so a slow
// machine cannot make it fail; it is not scaled.
constexpr auto kQuiet = 100ms;

// ---------------------------------------------------------------------------------------
// BARRIER: u8 0x12, str key, i64 world size; reply u8 0x00 (STOP_WAITING), now or later.

proto::Request barrier(const std::string& key, int64_t world_size) {
  return request(Op::kBarrier, {key}, {}, world_size);
}

// The value at `key`, read on a generation-2 connection (GET answers "" for a missing key).
std::string value_of(RawConn& c, const std::string& key) {
  c.send_request(request(Op::kGet, {key}));
  return c.recv_str();
}

// A BARRIER arrival that is not released: a GET sent behind it on the same connection is
// answered first (so the arrival was handled and not answered) and returns the count.
std::string arrive_and_wait(RawConn& c, const std::string& key, int64_t world_size) {
  c.send_request(barrier(key, world_size));
  return value_of(c, key);
}

TEST(StoreCompatBarrier, LastArrivalReleasesEveryoneAndTheCountGoesOn) {
  auto server = start_server();
  const uint16_t port = server->port();
  RawConn a(port, Generation::kV2), b(port, Generation::kV2), c(port, Generation::kV2);
  RawConn waiter(port, Generation::kV2), other(port, Generation::kV2);

  // A plain WAIT registered before the first arrival: torch wakes it at the last arrival
  // only, although the first one creates the key.
  waiter.send_request(request(Op::kWait, {"/bar"}));
  EXPECT_EQ(value_of(waiter, "/bar"), "");  // the WAIT is registered
  EXPECT_EQ(arrive_and_wait(a, "/bar", 3), "1");
  EXPECT_EQ(arrive_and_wait(b, "/bar", 3), "2");
  EXPECT_TRUE(a.silent_for(kQuiet));
  EXPECT_TRUE(b.silent_for(0ms));
  EXPECT_TRUE(waiter.silent_for(0ms));

  c.send_request(barrier("/bar", 3));
  EXPECT_EQ(c.recv_u8(), proto::kWaitStopWaiting);
  EXPECT_EQ(a.recv_u8(), proto::kWaitStopWaiting);
  EXPECT_EQ(b.recv_u8(), proto::kWaitStopWaiting);
  EXPECT_EQ(waiter.recv_u8(), proto::kWaitStopWaiting);
  EXPECT_EQ(value_of(other, "/bar"), "3");
  for (RawConn* r : {&a, &b, &c, &waiter}) EXPECT_TRUE(r->silent_for(0ms));  // one byte each

  // The counter is never reset: a second round on the same key counts 4, 5, 6.
  EXPECT_EQ(arrive_and_wait(a, "/bar", 6), "4");
  EXPECT_EQ(arrive_and_wait(b, "/bar", 6), "5");
  EXPECT_TRUE(a.silent_for(kQuiet));
  EXPECT_TRUE(b.silent_for(0ms));
  c.send_request(barrier("/bar", 6));
  EXPECT_EQ(c.recv_u8(), proto::kWaitStopWaiting);
  EXPECT_EQ(a.recv_u8(), proto::kWaitStopWaiting);
  EXPECT_EQ(b.recv_u8(), proto::kWaitStopWaiting);
  EXPECT_EQ(value_of(other, "/bar"), "6");
}

TEST(StoreCompatBarrier, WorldSizeReachedOrNotPositiveReleasesAtOnce) {
  auto server = start_server();
  RawConn a(server->port(), Generation::kV2);
  a.send_request(barrier("/one", 1));
  EXPECT_EQ(a.recv_u8(), proto::kWaitStopWaiting);
  a.send_request(barrier("/zero", 0));
  EXPECT_EQ(a.recv_u8(), proto::kWaitStopWaiting);
  a.send_request(barrier("/zero", -5));
  EXPECT_EQ(a.recv_u8(), proto::kWaitStopWaiting);
  EXPECT_EQ(value_of(a, "/zero"), "2");
  // An existing counter counts: "  7" (stoll-like) + 1 reaches 8.
  a.send_request(request(Op::kSet, {"/pre"}, {"  7"}));
  a.send_request(barrier("/pre", 8));
  EXPECT_EQ(a.recv_u8(), proto::kWaitStopWaiting);
  EXPECT_EQ(value_of(a, "/pre"), "8");
}

TEST(StoreCompatBarrier, CancelWaitStopsWaitingButTheArrivalStaysCounted) {
  auto server = start_server();
  const uint16_t port = server->port();
  RawConn a(port, Generation::kV2), b(port, Generation::kV2), c(port, Generation::kV2);
  EXPECT_EQ(arrive_and_wait(a, "/cb", 3), "1");
  EXPECT_TRUE(a.silent_for(kQuiet));
  a.send_request(request(Op::kCancelWait));  // the torch client timed out
  EXPECT_EQ(a.recv_u8(), proto::kWaitCanceled);
  EXPECT_TRUE(a.silent_for(0ms));
  EXPECT_EQ(arrive_and_wait(b, "/cb", 3), "2");  // as in torch: a's arrival still counts
  c.send_request(barrier("/cb", 3));
  EXPECT_EQ(c.recv_u8(), proto::kWaitStopWaiting);
  EXPECT_EQ(b.recv_u8(), proto::kWaitStopWaiting);
  EXPECT_TRUE(a.silent_for(kQuiet));  // no longer waiting

  // A release that raced the cancel: STOP_WAITING, then WAIT_CANCELED.
  a.send_request(barrier("/race", 2));
  b.send_request(barrier("/race", 2));
  EXPECT_EQ(b.recv_u8(), proto::kWaitStopWaiting);
  a.send_request(request(Op::kCancelWait));
  EXPECT_EQ(a.recv_u8(), proto::kWaitStopWaiting);
  EXPECT_EQ(a.recv_u8(), proto::kWaitCanceled);

  // A closed connection's arrival stays counted and its wait is forgotten.
  {
    RawConn gone(port, Generation::kV2);
    EXPECT_EQ(arrive_and_wait(gone, "/gone", 2), "1");
  }
  EXPECT_TRUE(ddp::test::wait_until([&] { return server->num_connections() <= 3; }, hang_guard()));
  c.send_request(barrier("/gone", 2));
  EXPECT_EQ(c.recv_u8(), proto::kWaitStopWaiting);
}

TEST(StoreCompatBarrier, AWriteOfTheKeyReleasesItsWaitersAsInTorch) {
  // torch's set/add/append/compare_set wake the key's waiters on every write; BARRIER's
  // waiters are the only ones that wait on a key that exists.
  auto server = start_server();
  RawConn a(server->port(), Generation::kV2), b(server->port(), Generation::kV2);
  EXPECT_EQ(arrive_and_wait(a, "/w", 3), "1");
  EXPECT_EQ(arrive_and_wait(b, "/w", 3), "2");
  RawConn setter(server->port(), Generation::kV2);
  setter.send_request(request(Op::kAdd, {"/w"}, {}, 10));
  EXPECT_EQ(setter.recv_i64(), 12);
  EXPECT_EQ(a.recv_u8(), proto::kWaitStopWaiting);
  EXPECT_EQ(b.recv_u8(), proto::kWaitStopWaiting);
}

TEST(StoreCompatBarrier, NonIntegerValueClosesOnlyThatConnection) {
  auto server = start_server();
  RawConn a(server->port(), Generation::kV2), other(server->port(), Generation::kV2);
  EXPECT_EQ(arrive_and_wait(other, "/other", 2), "1");  // a barrier elsewhere, waiting
  other.send_request(request(Op::kSet, {"/text"}, {"abc"}));
  EXPECT_EQ(value_of(other, "/text"), "abc");
  a.send_request(barrier("/text", 2));  // std::stoll("abc") throws in torch's server
  EXPECT_TRUE(a.closed_by_peer());
  RawConn b(server->port(), Generation::kV2);
  EXPECT_EQ(value_of(b, "/text"), "abc");  // unchanged
  b.send_request(barrier("/other", 2));
  EXPECT_EQ(b.recv_u8(), proto::kWaitStopWaiting);
  EXPECT_EQ(other.recv_u8(), proto::kWaitStopWaiting);
}

// ---------------------------------------------------------------------------------------
// Generation 1: torch 2.1's numbering (no WATCH_KEY) told apart from torch 1.13's.

TEST(StoreCompatGen1, Torch21NumberingOnOneConnection) {
  auto server = start_server();
  RawConn t(server->port(), Generation::kV1Torch21);  // encodes with 2.1's opcodes
  t.send_request(request(Op::kAdd, {"init/"}, {}, 1));  // what a 2.1 worker sends first
  EXPECT_EQ(t.recv_i64(), 1);
  t.send_request(request(Op::kSet, {"/a"}, {"1"}));
  t.send_request(request(Op::kDeleteKey, {"/a"}));  // 7: 2.1's DELETE_KEY, not WATCH_KEY
  EXPECT_EQ(t.recv_i64(), 1);
  t.send_request(request(Op::kDeleteKey, {"/a"}));
  EXPECT_EQ(t.recv_i64(), 0);
  t.send_request(request(Op::kAppend, {"/b"}, {"x"}));  // 8: APPEND, once 2.1 is known
  t.send_request(request(Op::kAppend, {"/b"}, {"y"}));
  t.send_request(request(Op::kMultiSet, {"/c", "/d"}, {"3", std::string("\0", 1)}));  // 10
  t.send_request(request(Op::kMultiGet, {"/b", "/c", "/d"}));                        // 9
  EXPECT_EQ(t.recv_str(), "xy");
  EXPECT_EQ(t.recv_str(), "3");
  EXPECT_EQ(t.recv_str(), std::string("\0", 1));
  t.send_request(request(Op::kGetNumKeys));
  EXPECT_EQ(t.recv_i64(), 4);
  // A WAIT that times out on the client, which then sends CANCEL_WAIT = 11.
  t.send_request(request(Op::kWait, {"/never"}));
  EXPECT_TRUE(t.silent_for(kQuiet));
  t.send_request(request(Op::kCancelWait));
  EXPECT_EQ(t.recv_u8(), proto::kWaitCanceled);
  RawConn other(server->port(), Generation::kV1Torch21);
  other.send_request(request(Op::kSet, {"/never"}, {"now"}));
  other.send_request(request(Op::kGetNumKeys));
  EXPECT_EQ(other.recv_i64(), 5);
  EXPECT_TRUE(t.silent_for(kQuiet));  // the wait is gone
  t.send_request(request(Op::kGet, {"/never"}));
  EXPECT_EQ(t.recv_str(), "now");
}

TEST(StoreCompatGen1, Torch21TimedOutWaitIsTheFirstEvidence) {
  // The most common 2.1-only request: CANCEL_WAIT after a wait timed out. Read with 1.13's
  // numbering it would be a MULTI_SET waiting for a count that never comes (a hang).
  auto server = start_server();
  RawConn t(server->port(), Generation::kV1Torch21);
  t.send_request(request(Op::kWait, {"/k"}));
  EXPECT_TRUE(t.silent_for(kQuiet));
  t.send_request(request(Op::kCancelWait));
  EXPECT_EQ(t.recv_u8(), proto::kWaitCanceled);
  t.send_request(request(Op::kAppend, {"/k"}, {"v"}));  // 8 is APPEND from now on
  t.send_request(request(Op::kGet, {"/k"}));
  EXPECT_EQ(t.recv_str(), "v");
  // A wake-up that raced the cancel: 0x00 then 0x01, as with 1.13 numbering.
  RawConn u(server->port(), Generation::kV1Torch21);
  u.send_request(request(Op::kMultiGet, {"/k"}));  // 9 first: 2.1
  EXPECT_EQ(u.recv_str(), "v");
  u.send_request(request(Op::kWait, {"/k2"}));
  t.send_request(request(Op::kSet, {"/k2"}, {"1"}));
  t.send_request(request(Op::kGet, {"/k2"}));
  EXPECT_EQ(t.recv_str(), "1");
  u.send_request(request(Op::kCancelWait));
  EXPECT_EQ(u.recv_u8(), proto::kWaitStopWaiting);
  EXPECT_EQ(u.recv_u8(), proto::kWaitCanceled);
}

TEST(StoreCompatGen1, Torch113MainAndCallbackConnections) {
  auto server = start_server();
  // The callback connection: WATCH_KEY first, more WATCH_KEYs later.
  RawConn cb(server->port(), Generation::kV1);
  cb.send_request(request(Op::kWatchKey, {"/w1"}));
  EXPECT_EQ(cb.recv_u8(), proto::kWatchRegistered);
  cb.send_request(request(Op::kWatchKey, {"/w2"}));
  EXPECT_EQ(cb.recv_u8(), proto::kWatchRegistered);
  // The main connection: 1.13's DELETE_KEY is 8.
  RawConn m(server->port(), Generation::kV1);
  m.send_request(request(Op::kSet, {"/w2"}, {"v"}));
  EXPECT_EQ(cb.recv_u8(), proto::kWatchCreated);
  EXPECT_EQ(cb.recv_str(), "/w2");
  EXPECT_EQ(cb.recv_str(), "");
  EXPECT_EQ(cb.recv_str(), "v");
  m.send_request(request(Op::kDeleteKey, {"/w2"}));
  EXPECT_EQ(m.recv_i64(), 1);
  EXPECT_EQ(cb.recv_u8(), proto::kWatchDeleted);
  EXPECT_EQ(cb.recv_str(), "/w2");
  EXPECT_EQ(cb.recv_str(), "v");
  EXPECT_EQ(cb.recv_str(), "");
  m.send_request(request(Op::kAdd, {"/n"}, {}, 2));
  EXPECT_EQ(m.recv_i64(), 2);
  m.send_request(request(Op::kDeleteKey, {"/n"}));
  EXPECT_EQ(m.recv_i64(), 1);
  m.send_request(request(Op::kGetNumKeys));
  EXPECT_EQ(m.recv_i64(), 0);
}

// ---------------------------------------------------------------------------------------
// Sizes: whatever PyTorch's per-field limits allow (key 8 KiB, value 8 MiB, 128 Ki keys).

constexpr size_t kMaxValue = size_t{8} << 20;

std::string big_key(size_t i) { return "/big" + std::to_string(i); }

// A recognisable 8 MiB value: its first and last bytes name it.
std::string big_value(size_t i) {
  std::string v(kMaxValue, static_cast<char>('a' + i % 26));
  v.front() = static_cast<char>(i);
  v.back() = static_cast<char>(i + 1);
  return v;
}

void expect_big_value(const std::string& v, size_t i) {
  ASSERT_EQ(v.size(), kMaxValue) << i;
  EXPECT_EQ(v.front(), static_cast<char>(i)) << i;
  EXPECT_EQ(v[kMaxValue / 2], static_cast<char>('a' + i % 26)) << i;
  EXPECT_EQ(v.back(), static_cast<char>(i + 1)) << i;
}

TEST(StoreCompatLimits, LargeMultiSetAndMultiGetAsTorchAllows) {
  // The cap on output queued for a connection (max_pending_output_bytes, 512 MiB by
  // default) lowered to 16 MiB: a reply larger than the cap then moves 40 MiB, not 520.
  ddp::detail::StoreServerOptions o;
  o.max_pending_output_bytes = size_t{16} << 20;
  auto server = start_server(o);
  RawConn c(server->port(), Generation::kV2);
  // MULTI_SET of 3 x 8 MiB (24 MiB in one request, more than one payload of torch's limit).
  constexpr size_t kSet = 3;
  {
    std::string req;
    req.reserve(kSet * (kMaxValue + 64) + 16);
    proto::put_u8(req, *proto::encode_opcode(Generation::kV2, Op::kMultiSet));
    proto::put_u64(req, kSet);
    for (size_t i = 0; i < kSet; ++i) {
      proto::put_str(req, big_key(i));
      proto::put_str(req, big_value(i));
    }
    c.send(req);
  }
  c.send_request(request(Op::kGetNumKeys));
  EXPECT_EQ(c.recv_i64(), static_cast<int64_t>(kSet));
  // MULTI_GET of 5 x 8 MiB (40 MiB in one reply, some keys twice), more than
  // max_pending_output_bytes: a reply being written is never cut off.
  constexpr size_t kGet = 5;
  std::vector<std::string> keys;
  for (size_t i = 0; i < kGet; ++i) keys.push_back(big_key(i % kSet));
  c.send_request(request(Op::kMultiGet, keys));
  for (size_t i = 0; i < kGet; ++i) {
    auto v = c.recv_str();
    expect_big_value(v, i % kSet);
    if (HasFailure()) return;
  }
  c.send_request(request(Op::kGetNumKeys));
  EXPECT_EQ(c.recv_i64(), static_cast<int64_t>(kSet));
}

TEST(StoreCompatLimits, OutputCapSparesAReaderButNotAClientThatNeverReads) {
  ddp::detail::StoreServerOptions o;
  o.max_pending_output_bytes = 1 << 20;
  auto server = start_server(o);
  const uint16_t port = server->port();
  RawConn c(port, Generation::kV2);
  const std::string mib(1 << 20, 'm');
  for (const char* k : {"/m1", "/m2", "/m3", "/m4"}) c.send_request(request(Op::kSet, {k}, {mib}));
  // One 4 MiB reply to a client that reads it: over the cap, but nothing is queued behind.
  c.send_request(request(Op::kMultiGet, {"/m1", "/m2", "/m3", "/m4"}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(c.recv_str().size(), mib.size());
  c.send_request(request(Op::kGetNumKeys));
  EXPECT_EQ(c.recv_i64(), 4);

  // A torch 1.13 callback connection that never reads its watch events: they pile up
  // behind what the kernel took, and past the cap the connection is closed.
  RawConn watcher(port, Generation::kV1);
  watcher.send_request(request(Op::kWatchKey, {"/watched"}));
  EXPECT_EQ(watcher.recv_u8(), proto::kWatchRegistered);
  RawConn setter(port, Generation::kV1);
  for (int i = 0; i < 64; ++i) setter.send_request(request(Op::kSet, {"/watched"}, {mib}));
  setter.send_request(request(Op::kGetNumKeys));
  EXPECT_EQ(setter.recv_i64(), 5);
  EXPECT_TRUE(watcher.closed_by_peer());
  c.send_request(request(Op::kGetNumKeys));  // everyone else is unaffected
  EXPECT_EQ(c.recv_i64(), 5);
}

// ---------------------------------------------------------------------------------------
// Deliberate differences from PyTorch (docs/store.md).

TEST(StoreCompatDifferences, CompareSetThatSetsNothingWakesNoOne) {
  // torch's libuv server wakes the key's waiters even when COMPARE_SET of a missing key
  // with a non-empty expected value sets nothing (their GET then returns ""); ours does not.
  auto server = start_server();
  RawConn waiter(server->port(), Generation::kV2), c(server->port(), Generation::kV2);
  waiter.send_request(request(Op::kWait, {"/cs"}));
  EXPECT_EQ(value_of(waiter, "/cs"), "");  // the WAIT is registered
  c.send_request(request(Op::kCompareSet, {"/cs"}, {"expected", "desired"}));
  EXPECT_EQ(c.recv_str(), "expected");
  EXPECT_TRUE(waiter.silent_for(kQuiet));
  c.send_request(request(Op::kCompareSet, {"/cs"}, {"", "desired"}));
  EXPECT_EQ(c.recv_str(), "desired");
  EXPECT_EQ(waiter.recv_u8(), proto::kWaitStopWaiting);
}

}  // namespace
