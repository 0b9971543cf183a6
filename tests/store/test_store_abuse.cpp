// Single clients sending legal requests that once stalled the store server's one thread for
// everyone (work proportional to what the connection, or other connections, hold) or made it
// hold unbounded memory (output for clients that never read). The timed tests bound a whole
// pipelined exchange; the server before the fixes needed 4x that bound or more.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include "server_watch.hpp"
#include "store_test_util.hpp"

using namespace store_test;
using proto::Generation;
using proto::Op;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kMiB = size_t{1} << 20;
// How long a quiet connection is watched before the test says nothing came.
constexpr auto kQuiet = 300ms;

// What a pipelined exchange got back within its bound.
struct Exchange {
  std::string replies;  // the bytes received, in order
  size_t sent = 0;      // requests sent
  size_t answered = 0;  // whole replies among them
  double seconds = 0;   // until the last reply (or the bound)
  std::string summary(size_t n, std::chrono::milliseconds bound) const {
    return fmt::format("{} of {} replies in {:.2f} s (bound {:.1f} s)", answered, n, seconds,
                       static_cast<double>(bound.count()) / 1000);
  }
};

// Sends n requests on c (unit(i): the bytes of the i-th, whose reply is reply_bytes long),
// pipelined with at most `window` of them unanswered, and reads the replies until all have
// arrived, the connection closed, or `bound` has passed. The window keeps a slow server's
// backlog short, so that it stops soon after the test has given up on it.
template <class Unit>
Exchange pipeline(RawConn& c, size_t n, Unit unit, size_t reply_bytes, size_t window,
                  std::chrono::milliseconds bound) {
  const auto start = Clock::now(), deadline = start + bound;
  const size_t want = n * reply_bytes;
  Exchange x;
  x.replies.reserve(want);
  std::string out;
  size_t out_off = 0, sent = 0;
  bool open = true;
  while (open && x.replies.size() < want) {
    x.answered = x.replies.size() / reply_bytes;
    while (sent < n && sent - x.answered < window) out += unit(sent++);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    pollfd p{c.fd(), static_cast<short>(POLLIN | (out_off < out.size() ? POLLOUT : 0)), 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[65536];
      ssize_t got = ::recv(c.fd(), buf, std::min(sizeof buf, want - x.replies.size()), MSG_DONTWAIT);
      if (got > 0) x.replies.append(buf, static_cast<size_t>(got));
      else if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) open = false;
    }
    if (open && (p.revents & POLLOUT)) {
      ssize_t put = ::send(c.fd(), out.data() + out_off, out.size() - out_off, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (put > 0) out_off += static_cast<size_t>(put);
      else if (put < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) open = false;
    }
    if (out_off == out.size()) {
      out.clear();
      out_off = 0;
    }
  }
  x.sent = sent;
  x.answered = x.replies.size() / reply_bytes;
  x.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return x;
}

// The i-th i64 reply of an exchange.
int64_t i64_at(const std::string& replies, size_t i) {
  int64_t v;
  std::memcpy(&v, replies.data() + 8 * i, 8);
  return v;
}


// A byte that c must receive within a few seconds, or -1 (no hang guard's wait for a test
// that already failed).
int recv_byte(RawConn& c, std::chrono::milliseconds timeout = scaled(5s)) {
  auto b = c.recv(1, timeout);
  return b ? static_cast<uint8_t>((*b)[0]) : -1;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// ON_LEASE_END with an empty value drops the lines registered for one key.

// A connection holding 65535 lease-end lines pipelines 900000 drops of a key it has none
// for: all answered within the bound (each drop scanned every line: about a minute in all).
TEST(StoreAbuse, DroppingLeaseEndLinesDoesNotScanTheConnectionsOtherLines) {
  auto server = start_server();
  RawConn c(server->port(), Generation::kV2);
  constexpr size_t kLines = 65535, kDrops = 900000;
  auto reg = pipeline(
      c, kLines, [&](size_t i) { return c.encode(request(Op::kOnLeaseEnd, {fmt::format("a{}", i)}, {"x"})); }, 1,
      kLines, hang_guard());
  ASSERT_EQ(reg.answered, kLines) << reg.summary(kLines, hang_guard());
  const std::string drop = c.encode(request(Op::kOnLeaseEnd, {"zz"}, {""}));
  const auto bound = scaled(6s);
  auto x = pipeline(c, kDrops, [&](size_t) { return drop; }, 1, 4096, bound);
  EXPECT_EQ(x.answered, kDrops) << x.summary(kDrops, bound);
  EXPECT_EQ(x.replies.find_first_not_of('\0'), std::string::npos);
}

// Lines for k1, k2, k1, then k1's dropped: when the connection closes only k2's line is
// written (and a line registered after a drop of its key is written as usual).
TEST(StoreAbuse, DroppingLeaseEndLinesDropsThatKeysLinesOnly) {
  auto server = start_server();
  RawConn reader(server->port(), Generation::kV2);
  {
    RawConn c(server->port(), Generation::kV2);
    const std::vector<std::pair<std::string, std::string>> steps = {
        {"k1", "one "}, {"k2", "two "}, {"k1", "three "}, {"k1", ""},
        {"k3", "four "}, {"k3", ""}, {"k3", "five "}};
    for (auto& [key, value] : steps) {
      c.send_request(request(Op::kOnLeaseEnd, {key}, {value}));
      EXPECT_EQ(c.recv_u8(), 0) << key << " '" << value << "'";
    }
  }
  reader.send_request(request(Op::kWait, {"k2", "k3"}));
  EXPECT_EQ(reader.recv_u8(), proto::kWaitStopWaiting);
  reader.send_request(request(Op::kGet, {"k2"}));
  EXPECT_EQ(reader.recv_str(), "two connection closed\n");
  reader.send_request(request(Op::kGet, {"k3"}));
  EXPECT_EQ(reader.recv_str(), "five connection closed\n");
  reader.send_request(request(Op::kCheck, {"k1"}));
  EXPECT_EQ(reader.recv_u8(), proto::kCheckNotReady);
}

// ---------------------------------------------------------------------------------------
// CANCEL_WAIT drops the connection's own waits.

// 16 connections each WAIT naming "x" 131072 times (legal: 128 Ki keys per request);
// another pipelines 100000 (WAIT ["x"], CANCEL_WAIT) pairs, all answered within the bound
// (each cancel filtered all 2 Mi registrations on "x": about 55 s in all). A SET of "x" then
// releases the 16, and the canceller hears nothing more.
TEST(StoreAbuse, CancelWaitDoesNotScanOtherConnectionsWaiters) {
  auto server = start_server();
  const uint16_t port = server->port();
  constexpr size_t kHolders = 16, kPairs = 100000;
  std::vector<std::unique_ptr<RawConn>> holders;
  for (size_t i = 0; i < kHolders; ++i) holders.push_back(std::make_unique<RawConn>(port, Generation::kV2));
  const std::string wait_x = holders[0]->encode(request(Op::kWait, std::vector<std::string>(size_t{128} << 10, "x")));
  for (auto& h : holders) h->send(wait_x);
  for (auto& h : holders) ASSERT_NO_FATAL_FAILURE(sync(*h));  // their WAITs are registered
  RawConn canceller(port, Generation::kV2);
  const std::string pair =
      canceller.encode(request(Op::kWait, {"x"})) + canceller.encode(request(Op::kCancelWait));
  const auto bound = scaled(6s);
  auto x = pipeline(canceller, kPairs, [&](size_t) { return pair; }, 1, 1024, bound);
  EXPECT_EQ(x.answered, kPairs) << x.summary(kPairs, bound);
  if (x.sent > x.answered) x.replies += canceller.recv(x.sent - x.answered).value_or("");  // late ones
  EXPECT_EQ(x.replies.find_first_not_of(static_cast<char>(proto::kWaitCanceled)), std::string::npos);

  RawConn setter(port, Generation::kV2);
  setter.send_request(request(Op::kSet, {"x"}, {"1"}));
  for (size_t i = 0; i < kHolders; ++i) EXPECT_EQ(recv_byte(*holders[i]), proto::kWaitStopWaiting) << i;
  EXPECT_TRUE(canceller.silent_for(kQuiet));
}

// A WAIT on ["a", "b", "a"] is released once both are set; a cancelled WAIT is never
// answered; cancelling one connection's WAIT leaves another's on the same key.
TEST(StoreAbuse, CancelWaitAndMultiKeyWaitsKeepTheirMeaning) {
  auto server = start_server();
  const uint16_t port = server->port();
  RawConn w(port, Generation::kV2), setter(port, Generation::kV2);
  w.send_request(request(Op::kWait, {"a", "b", "a"}));
  sync(w);
  setter.send_request(request(Op::kSet, {"a"}, {"1"}));
  sync(setter);
  EXPECT_TRUE(w.silent_for(kQuiet)) << "released with b missing";
  setter.send_request(request(Op::kSet, {"b"}, {"1"}));
  EXPECT_EQ(recv_byte(w), proto::kWaitStopWaiting);

  w.send_request(request(Op::kWait, {"c"}));
  w.send_request(request(Op::kCancelWait));
  EXPECT_EQ(recv_byte(w), proto::kWaitCanceled);
  setter.send_request(request(Op::kSet, {"c"}, {"1"}));
  sync(setter);
  EXPECT_TRUE(w.silent_for(kQuiet)) << "a cancelled WAIT was answered";

  RawConn d1(port, Generation::kV2), d2(port, Generation::kV2);
  for (RawConn* d : {&d1, &d2}) {
    d->send_request(request(Op::kWait, {"d"}));
    sync(*d);
  }
  d1.send_request(request(Op::kCancelWait));
  EXPECT_EQ(recv_byte(d1), proto::kWaitCanceled);
  setter.send_request(request(Op::kSet, {"d"}, {"1"}));
  EXPECT_EQ(recv_byte(d2), proto::kWaitStopWaiting);
  EXPECT_TRUE(d1.silent_for(kQuiet));
}

// ---------------------------------------------------------------------------------------
// TRIM_LOG drops a log's first lines.

// A 64 MiB log of 2-byte lines, then 20000 pipelined TRIM_LOGs each dropping one more line:
// all answered (the first line still held) within the bound (each moved the rest of the
// log: about a minute in all).
TEST(StoreAbuse, TrimLogDoesNotMoveTheRestOfTheLog) {
  auto server = start_server();
  RawConn c(server->port(), Generation::kV2);
  {
    std::string chunk;
    chunk.reserve(8 * kMiB);
    while (chunk.size() < 8 * kMiB) chunk += "a\n";
    for (int i = 0; i < 8; ++i) c.send_request(request(Op::kAppend, {"log"}, {chunk}));
  }
  sync(c);
  constexpr size_t kTrims = 20000;
  const auto bound = scaled(6s);
  auto x = pipeline(
      c, kTrims, [&](size_t i) { return c.encode(request(Op::kTrimLog, {"log"}, {}, static_cast<int64_t>(i + 1))); }, 8,
      64, bound);
  EXPECT_EQ(x.answered, kTrims) << x.summary(kTrims, bound);
  for (size_t i = 0; i < x.answered; ++i)
    if (i64_at(x.replies, i) != static_cast<int64_t>(i + 1)) {
      ADD_FAILURE() << "TRIM_LOG to line " << i + 1 << " replied " << i64_at(x.replies, i);
      break;
    }
}

// Lines l0..l9 trimmed to line 4 and then 7: LOG_FROM, GET, MULTI_GET, GET_FROM (offsets
// from the log's first byte ever) and WAIT_GROWS see what is held; COMPARE_SET against the
// value GET returns succeeds, and a write but APPEND starts the offsets again at 0.
TEST(StoreAbuse, ATrimmedLogIsReadWaitedOnAndReplacedAsBefore) {
  auto server = start_server();
  RawConn c(server->port(), Generation::kV2), w(server->port(), Generation::kV2);
  for (int i = 0; i < 10; ++i) c.send_request(request(Op::kAppend, {"log"}, {fmt::format("l{}\n", i)}));
  c.send_request(request(Op::kTrimLog, {"log"}, {}, 4));
  EXPECT_EQ(c.recv_i64(), 4);
  c.send_request(request(Op::kTrimLog, {"log"}, {}, 7));
  EXPECT_EQ(c.recv_i64(), 7);
  auto log_from = [&](int64_t offset, int64_t bytes, int64_t lines, const std::string& tail) {
    c.send_request(request(Op::kLogFrom, {"log"}, {}, offset));
    EXPECT_EQ(c.recv_i64(), bytes) << "LOG_FROM " << offset;
    EXPECT_EQ(c.recv_i64(), lines) << "LOG_FROM " << offset;
    EXPECT_EQ(c.recv_str(), tail) << "LOG_FROM " << offset;
  };
  auto get_from = [&](int64_t offset) {
    c.send_request(request(Op::kGetFrom, {"log"}, {}, offset));
    return c.recv_str();
  };
  log_from(0, 21, 7, "l7\nl8\nl9\n");
  log_from(24, 21, 7, "l8\nl9\n");
  c.send_request(request(Op::kGet, {"log"}));
  EXPECT_EQ(c.recv_str(), "l7\nl8\nl9\n");
  c.send_request(request(Op::kMultiGet, {"log", "log"}));
  EXPECT_EQ(c.recv_str(), "l7\nl8\nl9\n");
  EXPECT_EQ(c.recv_str(), "l7\nl8\nl9\n");
  EXPECT_EQ(get_from(24), "l8\nl9\n");
  EXPECT_EQ(get_from(29), "\n");
  EXPECT_EQ(get_from(30), "");

  w.send_request(request(Op::kWaitGrows, {"log"}, {}, 30));  // 30 bytes ever appended
  sync(w);
  EXPECT_TRUE(w.silent_for(kQuiet)) << "WAIT_GROWS released before the log grew";
  c.send_request(request(Op::kAppend, {"log"}, {"l10\n"}));
  EXPECT_EQ(recv_byte(w), proto::kWaitStopWaiting);
  EXPECT_EQ(get_from(30), "l10\n");

  c.send_request(request(Op::kGet, {"log"}));
  const std::string held = c.recv_str();
  EXPECT_EQ(held, "l7\nl8\nl9\nl10\n");
  c.send_request(request(Op::kCompareSet, {"log"}, {held, "swapped"}));
  EXPECT_EQ(c.recv_str(), "swapped");
  log_from(0, 0, 0, "swapped");
  c.send_request(request(Op::kSet, {"log"}, {"new"}));
  EXPECT_EQ(get_from(1), "ew");
  log_from(0, 0, 0, "new");
  w.send_request(request(Op::kWaitGrows, {"log"}, {}, 3));
  sync(w);
  EXPECT_TRUE(w.silent_for(kQuiet)) << "WAIT_GROWS still counted the replaced log's bytes";
  c.send_request(request(Op::kAppend, {"log"}, {"!"}));
  EXPECT_EQ(recv_byte(w), proto::kWaitStopWaiting);
}

// ---------------------------------------------------------------------------------------
// Output queued for clients that never read, summed over connections.

// 4 generation-1 connections WATCH_KEY "w" and never read while a writer SETs a 1 MiB value
// 200 times (each event carries the old and the new value: 400 MiB per watcher). Past
// max_total_pending_output_bytes (64 MiB here) they are closed with a warning naming the
// option, the peak RSS grows by far less than their 4 x 400 MiB, and a fifth watcher that
// reads all along stays connected and gets every event.
TEST(StoreAbuse, WatchersThatNeverReadAreClosedPastTheTotalOutputCap) {
  ddp::detail::StoreServerOptions o;
  o.max_total_pending_output_bytes = 64 * kMiB;
  LogCapture log;
  auto server = start_server(o);
  const uint16_t port = server->port();
  ASSERT_TRUE(reset_peak_rss());
  const size_t before_kib = status_kib("VmHWM");
  auto watcher = [&] {
    auto w = std::make_unique<RawConn>(port, Generation::kV1);
    w->send_request(request(Op::kWatchKey, {"w"}));
    EXPECT_EQ(w->recv_u8(), proto::kWatchRegistered);
    return w;
  };
  std::vector<std::unique_ptr<RawConn>> silent;
  for (int i = 0; i < 4; ++i) silent.push_back(watcher());
  auto reader = watcher();
  RawConn writer(port, Generation::kV2);
  constexpr int kSets = 200;
  std::string previous;
  for (int i = 0; i < kSets && !HasFailure(); ++i) {
    std::string value(kMiB, static_cast<char>('a' + i % 26));
    value.replace(0, 8, fmt::format("{:08}", i));
    writer.send_request(request(Op::kSet, {"w"}, {value}));
    // The reader takes each event before the next SET: it never has output queued behind.
    EXPECT_EQ(reader->recv_u8(), i == 0 ? proto::kWatchCreated : proto::kWatchUpdated) << i;
    EXPECT_EQ(reader->recv_str(), "w") << i;
    EXPECT_TRUE(reader->recv_str() == previous) << "event " << i << ": wrong old value";
    EXPECT_TRUE(reader->recv_str() == value) << "event " << i << ": wrong new value";
    previous = std::move(value);
  }
  const bool closed = ddp::test::wait_until([&] { return server->num_connections() <= 2; }, scaled(5s));
  EXPECT_TRUE(closed) << server->num_connections() << " connections left of 6; expected the reader and the writer";
  const size_t grew_mib = (status_kib("VmHWM") - before_kib) / 1024;
  EXPECT_LT(grew_mib, 400u) << "the peak RSS grew by " << grew_mib << " MiB";
  EXPECT_TRUE(log.has_line_with({"max_total_pending_output_bytes"}, closed ? hang_guard() : 0ms)) << log.all();
  if (closed) {  // drained, each reaches its end
    for (size_t i = 0; i < silent.size(); ++i) EXPECT_TRUE(silent[i]->closed_by_peer(scaled(10s))) << i;
  }
  reader->send_request(request(Op::kGetNumKeys));  // still served
  EXPECT_EQ(reader->recv_i64(), 1);
}

// ---------------------------------------------------------------------------------------
// QUEUE_PUSH wakes one waiter of its key.

// A WAIT_GROWS on a 3-byte value waits for more than 10 bytes: a QUEUE_PUSH to the same key
// does not make the value longer and must not release it; an APPEND past 10 bytes does.
TEST(StoreAbuse, QueuePushDoesNotReleaseAWaitGrowsWhoseValueDidNotGrow) {
  auto server = start_server();
  RawConn a(server->port(), Generation::kV2), b(server->port(), Generation::kV2);
  b.send_request(request(Op::kAppend, {"g"}, {"abc"}));
  sync(b);
  a.send_request(request(Op::kWaitGrows, {"g"}, {}, 10));
  sync(a);
  b.send_request(request(Op::kQueuePush, {"g"}, {"item"}));
  sync(b);
  ASSERT_TRUE(a.silent_for(kQuiet)) << "QUEUE_PUSH released a WAIT_GROWS on a value still 3 bytes long";
  b.send_request(request(Op::kAppend, {"g"}, {"defghijk"}));  // 11 bytes
  EXPECT_EQ(recv_byte(a), proto::kWaitStopWaiting);
  b.send_request(request(Op::kQueuePop, {"g"}));  // the item is still queued
  EXPECT_EQ(b.recv_i64(), 1);
  EXPECT_EQ(b.recv_str(), "item");
}
