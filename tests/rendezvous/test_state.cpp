// The state's encoding (versioned JSON; torchrun's pickles refused with a clear message) and
// the round log's reading (the first event that counts decides for every node).
#include <fmt/format.h>
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
  s.requests_seen = 9;
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
  EXPECT_EQ(t.requests_seen, 9);
  EXPECT_EQ(t.requests_at, -1);  // not known: a reader starts at the log's first line
  EXPECT_EQ(encode_state(t), v);
  // Where the next request begins: a field an older ddprun's decoder ignores.
  s.requests_at = 4321;
  v = encode_state(s);
  EXPECT_NE(v.find("\nrequests 9 4321\n"), std::string::npos) << v;
  EXPECT_EQ(decode_state(v, "x").requests_at, 4321);
  // Empty names, a closing reason with spaces and newlines.
  State e;
  e.participants = {NodeDesc{"id1", "", "", "", 1}};
  e.closed = true;
  e.closed_reason = "node x was lost:\nno keep-alive";
  State f = decode_state(encode_state(e), "x");
  EXPECT_EQ(f.participants.at(0).id, "id1");
  EXPECT_EQ(f.participants.at(0).addr, "");
  EXPECT_TRUE(f.closed);
  EXPECT_EQ(f.closed_reason, "node x was lost: no keep-alive");
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
  EXPECT_NE(error_of("ddprun-rdzv 9\nseq 1").find("format 9"), std::string::npos);
  EXPECT_NE(error_of("ddprun-rdzv 1\nseq x").find("corrupt"), std::string::npos);
  EXPECT_NE(error_of("ddprun-rdzv 1\nP a b").find("corrupt"), std::string::npos);
  EXPECT_NE(error_of("ddprun-rdzv 1\nP a b c d x").find("corrupt"), std::string::npos);
  EXPECT_NE(error_of("ddprun-rdzv x").find("format"), std::string::npos);
  // Unknown keys (a later version's) and empty lines are ignored.
  EXPECT_EQ(error_of("ddprun-rdzv 1\nfuture 7\n\nround 2\n"), "");
}

TEST(RendezvousEvents, LinesParseAndEscapeNewlines) {
  EXPECT_EQ(round_event(3, "fail", "n1", "rank 3 exited\nwith 1"), "3 fail n1 rank 3 exited with 1");
  EXPECT_EQ(round_event(0, "done", "n1", ""), "0 done n1");
  Event l = parse_event("lost n2 connection closed");
  EXPECT_EQ(l.round, -1);
  EXPECT_EQ(l.kind, "lost");
  EXPECT_EQ(l.node, "n2");
  EXPECT_EQ(l.text, "connection closed");
  Event d = parse_event("12 done n1");
  EXPECT_EQ(d.round, 12);
  EXPECT_EQ(d.kind, "done");
  EXPECT_EQ(d.node, "n1");
  EXPECT_EQ(d.text, "");
  EXPECT_EQ(parse_event("state").kind, "state");
  // An id that begins with digits is not a round number.
  EXPECT_EQ(parse_event("127.0.0.1_5_ab").kind, "127.0.0.1_5_ab");
  EXPECT_EQ(lost_event("n3"), "lost n3");
}

// The worker store a joining node listens on travels with its address, in the state and in
// its join request; a node without one (port 0) keeps the plain address.
TEST(RendezvousState, WorkerStorePortsRoundTrip) {
  State s;
  s.participants = {node("1"), node("2")};
  s.participants[0].master_port = 41234;
  s.participants[1].master_addr = "fe80::1%eth0";
  s.participants[1].master_port = 29501;
  s.wait_list = {node("3")};
  s.wait_list[0].master_addr = "";
  s.wait_list[0].master_port = 7;
  s.redundancy_list = {node("4")};  // port 0
  std::string v = encode_state(s);
  EXPECT_NE(v.find(" 10.0.0.1/41234 "), std::string::npos) << v;
  EXPECT_NE(v.find(" 10.0.0.4 "), std::string::npos) << v;
  State t = decode_state(v, "x");
  EXPECT_EQ(t.participants[0].master_addr, "10.0.0.1");
  EXPECT_EQ(t.participants[0].master_port, 41234);
  EXPECT_EQ(t.participants[1].master_addr, "fe80::1%eth0");
  EXPECT_EQ(t.participants[1].master_port, 29501);
  EXPECT_EQ(t.wait_list[0].master_addr, "");
  EXPECT_EQ(t.wait_list[0].master_port, 7);
  EXPECT_EQ(t.redundancy_list[0].master_port, 0);
  EXPECT_EQ(encode_state(t), v);
  EXPECT_NE(error_of("ddprun-rdzv 1\nP a b c 10.0.0.1/x 1\n").find("'x' is not a number"), std::string::npos);

  NodeDesc n;
  std::vector<std::string> rest;
  ASSERT_TRUE(decode_node(encode_node(s.participants[1]) + " 1 4 3", n, rest));
  EXPECT_EQ(n.master_addr, "fe80::1%eth0");
  EXPECT_EQ(n.master_port, 29501);
  EXPECT_EQ(rest, (std::vector<std::string>{"1", "4", "3"}));
  EXPECT_FALSE(decode_node("a b c 10.0.0.1/x 1", n, rest));
}

TEST(RendezvousEvents, TheFirstEventThatCountsDecides) {
  using K = RoundEnd::Kind;
  RoundReader r;
  r.start(0, {node("1"), node("2")});
  EXPECT_FALSE(r.feed({"0 dump 1 a 5", "state"}).has_value());
  auto e = r.feed({"1 fail 1 of another round", "0 fail 2 rank 3 exited with 1", "0 fail 1 later"});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind, K::kFailed);
  EXPECT_EQ(e->node, "2");
  EXPECT_TRUE(e->counted());
  EXPECT_NE(e->text.find("rank 3 exited with 1"), std::string::npos) << e->text;
  RoundReader up;
  up.start(4, {node("1"), node("2")});
  auto s = up.feed({"4 join 9 host9", "4 fail 2 x"});
  ASSERT_TRUE(s);
  EXPECT_EQ(s->kind, K::kScaleUp);
  EXPECT_FALSE(s->counted());
}

// The job closed while a round runs (its store's host stopped as it joined that round,
// which it never started) ends the round for every member, with the closer's reason; a
// round already done stays done.
TEST(RendezvousEvents, AClosedLineEndsARunningRound) {
  using K = RoundEnd::Kind;
  RoundReader r;
  r.start(1, {node("1"), node("2"), node("3")});
  auto e = r.feed({"1 dump 2 a", closed_event("1", "node 1, which hosts the store, stopped")});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind, K::kClosed);
  EXPECT_EQ(e->node, "1");
  EXPECT_EQ(e->text, "node 1, which hosts the store, stopped");
  EXPECT_FALSE(e->counted());
  RoundReader bare;
  bare.start(1, {node("1")});
  ASSERT_TRUE(bare.feed({closed_event("1", "")}));
  EXPECT_EQ(bare.end()->text, "the job was closed");
  RoundReader done;
  done.start(2, {node("1"), node("2")});
  ASSERT_TRUE(done.feed({"2 done 2", closed_event("2", "")}));
  EXPECT_EQ(done.end()->kind, K::kDone);
  EXPECT_EQ(closed_event("1", "a\nb"), "closed 1 a b");
}

// A node whose lease ended, frozen past the window, may ask to join when it runs again: it
// is gone for the others, and its asking restarts nobody's round (before: every round it
// asked, in a loop, while it did not know it was lost).
TEST(RendezvousEvents, ALostNodeAskingToJoinEndsNoRound) {
  RoundReader r;
  r.feed({"lost 9 no keep-alive for 1.5 s"});
  r.start(4, {node("1"), node("2")});
  EXPECT_FALSE(r.feed({"4 join 9 host9"}).has_value());
  auto s = r.feed({"4 join 8 host8"});
  ASSERT_TRUE(s);
  EXPECT_EQ(s->node, "8");
}

TEST(RendezvousEvents, LostLinesCountForMembersThatHadNotFinished) {
  using K = RoundEnd::Kind;
  // A lease line from a node that is not a member is not an end.
  RoundReader a;
  a.start(0, {node("1"), node("2")});
  EXPECT_FALSE(a.feed({"lost 7 connection closed"}).has_value());
  EXPECT_FALSE(a.needs_exited());
  // A member's: judged once it is known who passed the exit barrier.
  EXPECT_FALSE(a.feed({"lost 1 connection closed"}).has_value());
  ASSERT_TRUE(a.needs_exited());
  a.set_exited({"1"});  // node 1's workers had succeeded, then it went: not a failure
  EXPECT_FALSE(a.end().has_value());
  auto done = a.feed({"0 done 2"});
  ASSERT_TRUE(done);
  EXPECT_EQ(done->kind, K::kDone);
  RoundReader b;
  b.start(0, {node("1"), node("2")});
  b.feed({"lost 1 no keep-alive for 15 s"});
  b.set_exited({});
  ASSERT_TRUE(b.end());
  EXPECT_EQ(b.end()->kind, K::kLost);
  EXPECT_NE(b.end()->text.find("no keep-alive for 15 s"), std::string::npos) << b.end()->text;
}

// Issue 19: the member that completes the exit count may die before it writes "done" (or
// between its exit line and its count): its lost line wakes every reader, and a round whose
// every member passed the exit barrier is done, read from the exit log alone.
TEST(RendezvousEvents, EveryMemberExitedIsDoneWithoutTheDoneLine) {
  using K = RoundEnd::Kind;
  RoundReader r;
  r.start(3, {node("1"), node("2")});
  EXPECT_FALSE(r.feed({"lost 2 connection closed"}).has_value());
  ASSERT_TRUE(r.needs_exited());
  r.set_exited({"1", "2"});
  ASSERT_TRUE(r.end());
  EXPECT_EQ(r.end()->kind, K::kDone);
  // One member still working: its partner's loss after exiting ends nothing.
  RoundReader w;
  w.start(3, {node("1"), node("2")});
  w.feed({"lost 2 connection closed"});
  w.set_exited({"2"});
  EXPECT_FALSE(w.end().has_value());
}

// What a process keeps of the events log does not grow with the job's age: the count read,
// lost and closed lines, and the lines of the rounds it may still judge.
TEST(RendezvousEvents, TheTailKeepsOnlyWhatStillMatters) {
  EventsTail t;
  t.add({"state", "0 dump 1 a 5", "0 fail 1 x", "lost 2 connection closed", "state"});
  t.keep_from(1);
  t.add({"0 leave 1 late", "1 dump 1 a 6", "state", "closed"});
  EXPECT_EQ(t.count(), 9u);
  EXPECT_EQ(t.lines(), (std::vector<std::string>{"lost 2 connection closed", "1 dump 1 a 6", "closed"}));
  for (int r = 2; r < 1000; ++r) {
    t.add({"state", std::to_string(r) + " dump 1 a 7", std::to_string(r) + " fail 1 y"});
    t.keep_from(r);
  }
  EXPECT_EQ(t.count(), 9u + 998 * 3);
  EXPECT_EQ(t.lines().size(), 4u);  // lost, closed, and round 999's two lines
}

// Nor with the nodes that came and went (a job on preemptible nodes): the latest
// LostIds::kKept lost nodes are remembered, and still count; older ones are forgotten (QA:
// an agent grew by about 2 KB for each node that joined and was lost).
TEST(RendezvousEvents, LostNodesAreRememberedUpToABound) {
  const size_t kept = LostIds::kKept, total = kept + 500;
  EventsTail t;
  RoundReader r;
  for (size_t i = 0; i < total; ++i) {
    const std::string line = fmt::format("lost n{} connection closed", i);
    t.add({line});
    r.feed({line});
  }
  EXPECT_EQ(t.count(), total);
  EXPECT_EQ(t.lines().size(), kept);
  EXPECT_EQ(t.lines().front(), fmt::format("lost n{} connection closed", total - kept));
  EXPECT_EQ(r.lost().size(), kept);
  EXPECT_FALSE(r.lost().count("n0"));
  // What judges "a loss since the last look" (Joiner::check_enough_left) counts every loss,
  // also once the set stops growing.
  LostIds ids;
  for (size_t i = 0; i < total; ++i) ids.insert(fmt::format("n{}", i));
  ids.insert("n1523");  // (again: no new loss)
  EXPECT_EQ(ids.set().size(), kept);
  EXPECT_EQ(ids.inserted(), total);
  // A recent one still ends a round it is a member of, and still restarts no round by joining.
  r.start(7, {node("a"), node(fmt::format("n{}", total - 1))});
  ASSERT_TRUE(r.end());
  EXPECT_EQ(r.end()->kind, RoundEnd::Kind::kLost);
  EXPECT_EQ(r.end()->text.find("connection closed") != std::string::npos, true) << r.end()->text;
  RoundReader j;
  j.feed({fmt::format("lost n{} connection closed", total - 1)});
  j.start(8, {node("a")});
  j.feed({fmt::format("8 join n{} wants in", total - 1)});
  EXPECT_FALSE(j.end().has_value());
}

TEST(RendezvousEvents, AMemberLostBeforeItsRoundBeganEndsItAtOnce) {
  RoundReader r;
  r.feed({"lost 2 connection closed"});  // read while no round was watched
  r.start(5, {node("1"), node("2")});
  ASSERT_TRUE(r.end());
  EXPECT_EQ(r.end()->kind, RoundEnd::Kind::kLost);
  EXPECT_EQ(r.end()->node, "2");
}

}  // namespace
