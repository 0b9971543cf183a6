// The state's encoding (versioned JSON; torchrun's pickles refused with a clear message) and
// the round log's reading (the first event that counts decides for every node).
#include <gtest/gtest.h>

#include "ddp/error.hpp"
#include "rendezvous/events.hpp"
#include "rendezvous/state.hpp"

namespace {

using namespace ddprun::rdzv;

NodeDesc node(const std::string& id, int nproc = 2) {
  NodeDesc n;
  n.id = id;
  n.addr = "addr-" + id;
  n.host = "host-" + id;
  n.master_addr = "10.0.0." + id;
  n.nproc = nproc;
  return n;
}

std::string error_of(const std::string& value) {
  try {
    decode_state(value, "the c10d store at h:1");
  } catch (const ddp::Error& e) {
    return e.what();
  }
  return "";
}

TEST(RendezvousState, RoundTrips) {
  State s;
  s.seq = 7;
  s.round = 3;
  s.complete = true;
  s.restarts = 2;
  s.job = JobSettings{1, 4, 3};
  s.participants = {node("1"), node("2", 8)};
  s.wait_list = {node("3")};
  s.redundancy_list = {node("4")};
  s.ending_round = 3;
  s.ending_counted = true;
  std::string v = encode_state(s);
  EXPECT_TRUE(v.starts_with("ddprun-rdzv 1\n")) << v;
  State t = decode_state(v, "x");
  EXPECT_EQ(t.seq, 7);
  EXPECT_EQ(t.round, 3);
  EXPECT_TRUE(t.complete);
  EXPECT_EQ(t.restarts, 2);
  ASSERT_TRUE(t.job);
  EXPECT_EQ(*t.job, (JobSettings{1, 4, 3}));
  ASSERT_EQ(t.participants.size(), 2u);
  EXPECT_EQ(t.participants[1].nproc, 8);
  EXPECT_EQ(t.participants[1].master_addr, "10.0.0.2");
  EXPECT_EQ(t.wait_list[0].id, "3");
  EXPECT_EQ(t.redundancy_list[0].id, "4");
  EXPECT_EQ(t.ending_round, 3);
  EXPECT_TRUE(t.ending_counted);
  EXPECT_EQ(encode_state(t), v);
}

TEST(RendezvousState, ATorchrunAgentsStateIsRefusedByName) {
  // base64 pickles (protocols 2..5) and torchrun's "no state yet" sentinel.
  for (const char* v : {"Y2FuaW1hZGFt", "gASVxAEAAAAAAACMOHRvcmNo", "gAWVxAEAAAAAAAC", "gAJjdG9yY2g", "gANjdG9y"}) {
    std::string e = error_of(v);
    EXPECT_NE(e.find("torchrun agent"), std::string::npos) << v << ": " << e;
    EXPECT_NE(e.find("the c10d store at h:1"), std::string::npos) << e;
  }
}

TEST(RendezvousState, OtherValuesAreRefusedWithoutCrashing) {
  EXPECT_NE(error_of("hello").find("not a rendezvous state"), std::string::npos);
  EXPECT_NE(error_of("ddprun-rdzv 9\n{}").find("format 9"), std::string::npos);
  EXPECT_NE(error_of("ddprun-rdzv 1\n{\"seq\": ").find("corrupt"), std::string::npos);
  EXPECT_NE(error_of("ddprun-rdzv 1\n{\"seq\": \"x\"}").find("corrupt"), std::string::npos);
  EXPECT_NE(error_of("ddprun-rdzv x").find("format"), std::string::npos);
}

TEST(RendezvousEvents, LinesParseAndEscapeNewlines) {
  EXPECT_EQ(make_line("fail", "n1", "rank 3 exited\nwith 1"), "fail n1 rank 3 exited with 1");
  LogLine l = parse_line("lost n2 connection closed");
  EXPECT_EQ(l.kind, "lost");
  EXPECT_EQ(l.node, "n2");
  EXPECT_EQ(l.text, "connection closed");
  LogLine d = parse_line("done n1");
  EXPECT_EQ(d.kind, "done");
  EXPECT_EQ(d.node, "n1");
  EXPECT_EQ(d.text, "");
  std::string addr;
  int port = 0;
  EXPECT_TRUE(find_master({"join x y", "master n1 fe80::1 29501"}, addr, port));
  EXPECT_EQ(addr, "fe80::1");
  EXPECT_EQ(port, 29501);
  EXPECT_FALSE(find_master({"master n1 nowhere"}, addr, port));
}

TEST(RendezvousEvents, TheFirstLineThatCountsDecides) {
  std::vector<NodeDesc> members{node("1"), node("2")};
  using K = RoundEnd::Kind;
  EXPECT_FALSE(interpret_round({"master 1 10.0.0.1 5"}, members, {}).has_value());
  auto e = interpret_round({"master 1 a 5", "fail 2 rank 3 exited with 1", "lost 1 connection closed"}, members, {});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind, K::kFailed);
  EXPECT_EQ(e->node, "2");
  EXPECT_TRUE(e->counted());
  EXPECT_NE(e->text.find("rank 3 exited with 1"), std::string::npos) << e->text;
  auto up = interpret_round({"join 9 host9", "fail 2 x"}, members, {});
  ASSERT_TRUE(up);
  EXPECT_EQ(up->kind, K::kScaleUp);
  EXPECT_FALSE(up->counted());
}

TEST(RendezvousEvents, LinesAboutStrangersOrNodesThatFinishedDoNotCount) {
  std::vector<NodeDesc> members{node("1"), node("2")};
  using K = RoundEnd::Kind;
  // A lease line from a node that was never a member (it registered for this round, lost
  // the race to join it) is not an end.
  EXPECT_FALSE(interpret_round({"lost 7 connection closed", "fail 8 x"}, members, {}).has_value());
  // Node 1's workers succeeded and it then went away: not a failure of the round.
  EXPECT_FALSE(interpret_round({"lost 1 connection closed"}, members, {"1"}).has_value());
  auto done = interpret_round({"lost 1 connection closed", "done 2"}, members, {"1"});
  ASSERT_TRUE(done);
  EXPECT_EQ(done->kind, K::kDone);
  auto left = interpret_round({"leave 2 ddprun on h received SIGTERM"}, members, {"1"});
  ASSERT_TRUE(left);
  EXPECT_EQ(left->kind, K::kLeft);
  EXPECT_TRUE(left->counted());
}

}  // namespace
