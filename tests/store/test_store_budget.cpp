// Hostile clients against the store server's memory budget (StoreServerOptions::max_*):
// replies larger than the budget, and pending waits, watches and lease-end lines past their
// caps, are refused (the connection alone is closed, with a warning naming the client)
// before anything is built; the server's memory stays bounded.
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "server_watch.hpp"
#include "store_test_util.hpp"

using namespace store_test;
using proto::Generation;
using proto::Op;

namespace {

constexpr size_t kMiB = size_t{1} << 20;


// "127.0.0.1:PORT" of a client socket, as the server's log names it.
std::string local_address(const RawConn& c) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(c.fd(), reinterpret_cast<sockaddr*>(&a), &len);
  return fmt::format("127.0.0.1:{}", ntohs(a.sin_port));
}


// Caps the address space at the current size plus `extra` while it lives, so that a server
// that does build a huge reply fails with bad_alloc instead of taking the machine's memory.
class AddressSpaceGuard {
 public:
  explicit AddressSpaceGuard(size_t extra) {
    getrlimit(RLIMIT_AS, &saved_);
    rlimit r = saved_;
    r.rlim_cur = std::min<rlim_t>(saved_.rlim_max, status_kib("VmSize") * 1024 + extra);
    setrlimit(RLIMIT_AS, &r);
  }
  ~AddressSpaceGuard() { setrlimit(RLIMIT_AS, &saved_); }

 private:
  rlimit saved_{};
};

std::string multi_get_of(Generation g, const std::string& key, size_t times) {
  std::string req;
  proto::put_u8(req, *proto::encode_opcode(g, Op::kMultiGet));
  proto::put_u64(req, times);
  for (size_t i = 0; i < times; ++i) proto::put_str(req, key);
  return req;
}

// The connection is refused: closed by the server, and a warning names the client, the
// request and the option.
void expect_refused(RawConn& c, LogCapture& log, const std::string& op, const std::string& option) {
  const std::string who = local_address(c);
  EXPECT_TRUE(c.closed_by_peer()) << op << " was not refused";
  EXPECT_TRUE(log.has_line_with({"refused " + op + " from " + who, option})) << log.all();
}


proto::Request with_i64(proto::Request r, int64_t v) {
  r.i64 = v;
  return r;
}

}  // namespace

// The case: a 2 MB MULTI_GET naming one 8 MiB value 128 Ki times asks for a 1 TiB
// reply. With the default budget it is refused at once and nothing is built.
TEST(StoreBudget, HostileMultiGetIsRefusedUnbuiltAndRssStaysBounded) {
  AddressSpaceGuard guard(size_t{4} << 30);
  LogCapture log;
  auto server = start_server();
  RawConn setter(server->port(), Generation::kV2), hostile(server->port(), Generation::kV2);
  setter.send_request(request(Op::kSet, {"/big"}, {std::string(8 * kMiB, 'b')}));
  setter.send_request(request(Op::kGetNumKeys));
  ASSERT_EQ(setter.recv_i64(), 1);
  const std::string req = multi_get_of(Generation::kV2, "/big", 128 << 10);
  ASSERT_TRUE(reset_peak_rss());
  const size_t before_kib = status_kib("VmHWM");
  hostile.send(req);
  expect_refused(hostile, log, "MULTI_GET", "max_reply_bytes");
  EXPECT_TRUE(log.has_line_with({"1099512676352 bytes"})) << log.all();  // 128 Ki x (8 + 8 MiB)
  const size_t grew_mib = (status_kib("VmHWM") - before_kib) / 1024;
  EXPECT_LT(grew_mib, 64u) << "the server's peak RSS grew by " << grew_mib << " MiB";
  // Everyone else is served as before.
  setter.send_request(request(Op::kMultiGet, {"/big", "/big"}));
  EXPECT_EQ(setter.recv_str().size(), 8 * kMiB);
  EXPECT_EQ(setter.recv_str().size(), 8 * kMiB);
}

// Every reply whose size depends on the data is measured before it is built; a reply of
// exactly the budget is served, one byte more is refused.
TEST(StoreBudget, EveryVariableReplyIsMeasuredAgainstTheBudget) {
  ddp::detail::StoreServerOptions o;
  o.max_reply_bytes = 64 << 10;
  LogCapture log;
  auto server = start_server(o);
  const uint16_t port = server->port();
  RawConn c(port, Generation::kV2);
  c.send_request(request(Op::kSet, {"/v"}, {std::string(1016, 'v')}));  // 1 KiB with its length
  std::vector<std::string> keys64(64, "/v");
  c.send_request(request(Op::kMultiGet, keys64));  // exactly 64 KiB
  for (int i = 0; i < 64; ++i) ASSERT_EQ(c.recv_str().size(), 1016u) << i;

  auto refused = [&](const proto::Request& r) {
    RawConn h(port, Generation::kV2);
    h.send_request(r);
    expect_refused(h, log, proto::op_name(r.op), "max_reply_bytes");
  };
  keys64.push_back("/v");
  refused(request(Op::kMultiGet, keys64));
  const std::string over(64 << 10, 'x');  // with its length prefix, 8 bytes over
  c.send_request(request(Op::kAppend, {"/appended"}, {over.substr(0, 32 << 10)}));
  c.send_request(request(Op::kAppend, {"/appended"}, {over.substr(32 << 10)}));
  sync(c);
  refused(request(Op::kGet, {"/appended"}));
  refused(request(Op::kCompareSet, {"/appended"}, {"", "y"}));
  c.send_request(request(Op::kQueuePush, {"/q"}, {over}));
  sync(c);
  refused(request(Op::kQueuePop, {"/q"}));
  for (int i = 0; i < 64; ++i) c.send_request(request(Op::kSet, {fmt::format("/{:01020}", i)}, {"k"}));
  sync(c);  // 64 keys of 1021 bytes: LIST's reply is over 64 KiB
  refused(request(Op::kList));
  // The refusals took nothing away and the first client is still served.
  c.send_request(request(Op::kQueueLen, {"/q"}));
  EXPECT_EQ(c.recv_i64(), 1);
  c.send_request(request(Op::kGet, {"/v"}));
  EXPECT_EQ(c.recv_str().size(), 1016u);
}

TEST(StoreBudget, PendingWaitsPastTheCapAreRefused) {
  ddp::detail::StoreServerOptions o;
  o.max_pending_waits = 3;
  LogCapture log;
  auto server = start_server(o);
  const uint16_t port = server->port();
  RawConn c(port, Generation::kV2), other(port, Generation::kV2);
  other.send_request(request(Op::kSet, {"/here"}, {"1"}));
  other.send_request(request(Op::kGetNumKeys));
  ASSERT_EQ(other.recv_i64(), 1);
  // A WAIT, a BARRIER arrival and a WAIT_GROWS: three pending.
  c.send_request(request(Op::kWait, {"/w1"}));
  c.send_request(with_i64(request(Op::kBarrier, {"/b"}), 5));
  c.send_request(with_i64(request(Op::kWaitGrows, {"/g"}), 0));
  c.send_request(request(Op::kWait, {"/here"}));  // answered at once: never pending
  EXPECT_EQ(c.recv_u8(), proto::kWaitStopWaiting);
  other.send_request(request(Op::kSet, {"/w1"}, {"x"}));  // one completes: room for another
  EXPECT_EQ(c.recv_u8(), proto::kWaitStopWaiting);
  c.send_request(request(Op::kWait, {"/w2"}));
  EXPECT_TRUE(c.silent_for(50ms));
  c.send_request(with_i64(request(Op::kBarrier, {"/b"}), 5));  // a fourth: refused
  expect_refused(c, log, "BARRIER", "max_pending_waits");
  // The refused arrival was not counted; the first one stays counted, as in torch.
  other.send_request(request(Op::kGet, {"/b"}));
  EXPECT_EQ(other.recv_str(), "1");

  // Generation 1 (torch 1.13 leaves a timed-out WAIT registered): the same cap.
  RawConn g1(port, Generation::kV1);
  for (int i = 0; i < 3; ++i) g1.send_request(request(Op::kWait, {"/never"}));
  EXPECT_TRUE(g1.silent_for(50ms));
  g1.send_request(request(Op::kWait, {"/never"}));
  expect_refused(g1, log, "WAIT", "max_pending_waits");
}

TEST(StoreBudget, WatchesPastTheCapAreRefused) {
  ddp::detail::StoreServerOptions o;
  o.max_watches = 2;
  LogCapture log;
  auto server = start_server(o);
  RawConn watcher(server->port(), Generation::kV1);  // a torch 1.13 callback connection
  for (const char* k : {"/k1", "/k2", "/k1"}) {     // watching a key again costs nothing
    watcher.send_request(request(Op::kWatchKey, {k}));
    EXPECT_EQ(watcher.recv_u8(), proto::kWatchRegistered) << k;
  }
  watcher.send_request(request(Op::kWatchKey, {"/k3"}));
  expect_refused(watcher, log, "WATCH_KEY", "max_watches");
}

TEST(StoreBudget, LeaseEndLinesPastTheCapAreRefusedAndTheOthersWritten) {
  ddp::detail::StoreServerOptions o;
  o.max_lease_lines = 2;
  LogCapture log;
  auto server = start_server(o);
  const uint16_t port = server->port();
  RawConn reader(port, Generation::kV2);
  {
    RawConn c(port, Generation::kV2);
    for (const char* line : {"a ", "b "}) {
      c.send_request(request(Op::kOnLeaseEnd, {"/log"}, {line}));
      EXPECT_EQ(c.recv_u8(), 0) << line;
    }
    c.send_request(request(Op::kOnLeaseEnd, {"/log"}, {"c "}));
    expect_refused(c, log, "ON_LEASE_END", "max_lease_lines");
  }
  reader.send_request(request(Op::kWait, {"/log"}));
  EXPECT_EQ(reader.recv_u8(), proto::kWaitStopWaiting);
  reader.send_request(request(Op::kGet, {"/log"}));
  EXPECT_EQ(reader.recv_str(), "a connection closed\nb connection closed\n");
}

// What a connection holds (registrations and unsent replies) has a budget of its own,
// which a reply within max_reply_bytes can still exceed.
TEST(StoreBudget, ConnectionBudgetCountsRegistrationsAndReplies) {
  ddp::detail::StoreServerOptions o;
  o.max_connection_bytes = 40 << 10;
  LogCapture log;
  auto server = start_server(o);
  const uint16_t port = server->port();
  const std::string key8k(8100, 'k');  // a WAIT on it holds about 8 KiB
  RawConn w(port, Generation::kV2);
  for (int i = 0; i < 4; ++i) w.send_request(request(Op::kWait, {key8k + std::to_string(i)}));
  EXPECT_TRUE(w.silent_for(50ms));
  w.send_request(request(Op::kWait, {key8k + "4"}));  // 5 x 8 KiB and more > 40 KiB
  expect_refused(w, log, "WAIT", "max_connection_bytes");

  RawConn c(port, Generation::kV2);
  c.send_request(request(Op::kSet, {"/v"}, {std::string(16 << 10, 'v')}));
  sync(c);
  c.send_request(request(Op::kMultiGet, {"/v"}));  // 16 KiB: within the budget
  EXPECT_EQ(c.recv_str().size(), size_t{16} << 10);
  for (int i = 0; i < 3; ++i) c.send_request(request(Op::kWait, {key8k + std::to_string(i)}));
  c.send_request(request(Op::kMultiGet, {"/v"}));  // 3 x 8 KiB held + 16 KiB > 40 KiB
  expect_refused(c, log, "MULTI_GET", "max_connection_bytes");
}

// ddp::TcpStore sees a refusal as its connection closing during that request, and its next
// call connects again.
TEST(StoreBudget, DdpClientSeesTheRefusalAsANetworkErrorNamingTheRequest) {
  ddp::detail::StoreServerOptions o;
  o.max_reply_bytes = 4 << 10;
  LogCapture log;
  auto server = start_server(o);
  ddp::TcpStore store(client_options(server->port(), ddp::WireGeneration::kV2));
  store.set("/v", std::string(3 << 10, 'v'));
  EXPECT_EQ(store.multi_get({"/v"}).at(0).size(), size_t{3} << 10);
  try {
    store.multi_get({"/v", "/v"});
    ADD_FAILURE() << "a reply over the budget was not refused";
  } catch (const ddp::NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("MULTI_GET '/v', '/v'"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(log.has_line_with({"refused MULTI_GET from 127.0.0.1:", "max_reply_bytes"})) << log.all();
  EXPECT_EQ(store.get("/v").size(), size_t{3} << 10);
}
