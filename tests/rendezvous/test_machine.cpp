// The dynamic rendezvous's decisions as pure functions of the state, case by case (after
// torch's dynamic_rendezvous_test.py: join, last call, wait and redundancy lists, leaving,
// lost nodes, close).
#include <gtest/gtest.h>

#include "rendezvous/machine.hpp"

namespace {

using namespace ddprun::rdzv;
using A = JoinAction;

NodeDesc node(const std::string& addr, const std::string& id, int nproc = 1) {
  NodeDesc n;
  n.addr = addr;
  n.id = id;
  n.host = addr;
  n.master_addr = addr;
  n.nproc = nproc;
  return n;
}

const JobSettings kJob{2, 3, 1};  // --nnodes 2:3 --max-restarts 1

struct Machine : ::testing::Test {
  NodeDesc a = node("10.0.0.1", "a"), b = node("10.0.0.2", "b"), c = node("10.0.0.3", "c"), d = node("10.0.0.4", "d");

  JoinContext ctx(const NodeDesc& me, bool timed_out = false, bool last_call_expired = false) {
    return JoinContext{me, kJob, timed_out, last_call_expired};
  }
  // Joins `me` the way the loop does: decide, apply, until it no longer changes the state.
  void join(State& s, const NodeDesc& me) {
    A act = decide_join(s, ctx(me));
    ASSERT_TRUE(act == A::kAddToParticipants || act == A::kAddToWaitList || act == A::kAddToRedundancyList)
        << to_string(act);
    apply_join(s, act, ctx(me));
  }
  State running(std::initializer_list<NodeDesc> members) {
    State s;
    for (auto& m : members) join(s, m);
    if (!s.complete) apply_join(s, A::kMarkComplete, ctx(*members.begin()));
    return s;
  }
};

TEST_F(Machine, FirstNodeJoinsAndSetsTheJobSettings) {
  State s;
  EXPECT_EQ(decide_join(s, ctx(a)), A::kAddToParticipants);
  EXPECT_FALSE(apply_join(s, A::kAddToParticipants, ctx(a)));  // nothing for others to wake up for
  ASSERT_TRUE(s.job.has_value());
  EXPECT_EQ(*s.job, kJob);
  EXPECT_EQ(s.seq, 1);
  EXPECT_FALSE(s.last_call);
  EXPECT_EQ(decide_join(s, ctx(a)), A::kWait);  // one of MIN 2: waits
}

TEST_F(Machine, ReachingMinStartsTheLastCallAndWakesTheOthers) {
  State s;
  join(s, a);
  EXPECT_TRUE(apply_join(s, decide_join(s, ctx(b)), ctx(b)));
  EXPECT_TRUE(s.last_call);
  EXPECT_FALSE(s.complete);
  EXPECT_EQ(decide_join(s, ctx(a)), A::kWait);  // the last call has not run out
  EXPECT_EQ(decide_join(s, ctx(a, false, true)), A::kMarkComplete);
}

TEST_F(Machine, ReachingMaxCompletesAtOnceWithSortedRanks) {
  State s;
  join(s, c);
  join(s, a);
  EXPECT_TRUE(apply_join(s, decide_join(s, ctx(b)), ctx(b)));
  EXPECT_TRUE(s.complete);
  EXPECT_FALSE(s.last_call);
  EXPECT_EQ(s.rank_of("a"), 0);
  EXPECT_EQ(s.rank_of("b"), 1);
  EXPECT_EQ(s.rank_of("c"), 2);
  EXPECT_EQ(decide_join(s, ctx(b)), A::kFinish);
}

TEST_F(Machine, RanksSortByAddressThenId) {
  // IP strings sort as strings (as torch's), and equal addresses by the id.
  State s;
  NodeDesc x = node("10.0.0.10", "x"), y = node("10.0.0.2", "y2"), z = node("10.0.0.2", "y1");
  join(s, x);
  join(s, y);
  join(s, z);
  ASSERT_TRUE(s.complete);
  EXPECT_EQ(s.participants[0].id, "x");
  EXPECT_EQ(s.participants[1].id, "y1");
  EXPECT_EQ(s.participants[2].id, "y2");
}

TEST_F(Machine, MarkCompleteNeedsMinAndTheLastCall) {
  State s;
  join(s, a);
  // Alone, even with an expired timer: MIN is 2.
  EXPECT_EQ(decide_join(s, ctx(a, false, true)), A::kWait);
}

TEST_F(Machine, ANodeArrivingWhileARoundRunsGoesToTheWaitList) {
  State s = running({a, b});
  EXPECT_EQ(decide_join(s, ctx(c)), A::kAddToWaitList);
  EXPECT_FALSE(apply_join(s, A::kAddToWaitList, ctx(c)));  // the round's log tells the members
  EXPECT_TRUE(State::contains(s.wait_list, "c"));
  EXPECT_EQ(decide_join(s, ctx(c)), A::kWait);
}

TEST_F(Machine, ANodeArrivingWhileTheJobIsFullIsRedundantAndWaits) {
  State s = running({a, b, c});
  EXPECT_EQ(decide_join(s, ctx(d)), A::kAddToRedundancyList);
  apply_join(s, A::kAddToRedundancyList, ctx(d));
  EXPECT_EQ(decide_join(s, ctx(d)), A::kWait);
  // It times out alone: it leaves its list, the running round is untouched.
  EXPECT_EQ(decide_join(s, ctx(d, true)), A::kRemoveMe);
  apply_join(s, A::kRemoveMe, ctx(d));
  EXPECT_FALSE(State::contains(s.redundancy_list, "d"));
  EXPECT_TRUE(s.complete);
  EXPECT_FALSE(s.closed);
  EXPECT_EQ(decide_join(s, ctx(d, true)), A::kErrorTimeout);
}

TEST_F(Machine, ARedundantNodeMovesToTheWaitListWhenAPlaceFrees) {
  State s = running({a, b, c});
  apply_join(s, A::kAddToRedundancyList, ctx(d));
  remove_lost(s, {"c"});  // c is lost: two members left
  EXPECT_EQ(decide_join(s, ctx(d)), A::kAddToWaitList);
  apply_join(s, A::kAddToWaitList, ctx(d));
  EXPECT_FALSE(State::contains(s.redundancy_list, "d"));
  EXPECT_TRUE(State::contains(s.wait_list, "d"));
}

TEST_F(Machine, LeavingTheRoundOpensTheNextWhenTheLastMemberLeaves) {
  State s = running({a, b});
  s.wait_list.push_back(c);
  EXPECT_TRUE(leave_round(s, "a", 0, /*counted=*/false));
  EXPECT_EQ(s.round, 0);  // b is still in round 0
  EXPECT_EQ(s.ending_round, 0);
  // A node that left waits for the round it left to end (it is in no list yet).
  EXPECT_EQ(decide_join(s, ctx(a)), A::kAddToWaitList);
  apply_join(s, A::kAddToWaitList, ctx(a));
  EXPECT_TRUE(leave_round(s, "b", 0, false));
  EXPECT_EQ(s.round, 1);
  EXPECT_EQ(s.restarts, 0);  // a scale-up is not a restart
  // The next round opens with the nodes that waited for it: c, a (MIN 2: the last call runs).
  ASSERT_EQ(s.participants.size(), 2u);
  EXPECT_EQ(s.participants[0].id, "c");
  EXPECT_EQ(s.participants[1].id, "a");
  EXPECT_TRUE(s.wait_list.empty());
  EXPECT_TRUE(s.last_call);
  EXPECT_FALSE(s.complete);
  EXPECT_EQ(decide_join(s, ctx(b)), A::kAddToParticipants);
  // Leaving twice, or a round that is over, changes nothing.
  EXPECT_FALSE(leave_round(s, "b", 0, false));
}

TEST_F(Machine, RequestsAppliedByWhoeverWritesNext) {
  State s;
  std::vector<std::string> reqs = {join_request(a, kJob), join_request(b, kJob), "garbage",
                                   join_request(node("10.0.0.9", "x"), JobSettings{2, 4, 1}),  // other settings
                                   join_request(c, kJob), join_request(d, kJob)};
  Absorbed ab = absorb(s, reqs, {"d"});  // d is lost already
  EXPECT_TRUE(ab.changed);
  EXPECT_TRUE(ab.wake);  // the round completed (MAX 3)
  EXPECT_EQ(s.requests_seen, 6);
  ASSERT_EQ(s.participants.size(), 3u);
  EXPECT_TRUE(s.complete);
  EXPECT_EQ(s.rank_of("a"), 0);
  EXPECT_EQ(s.rank_of("c"), 2);
  // A repeated request changes nothing; a leave request opens the next round when the
  // last member leaves; then the requests of the round's members put them back in.
  Absorbed again = absorb(s, {join_request(a, kJob)}, {});
  EXPECT_TRUE(again.changed);  // only requests_seen moved
  EXPECT_FALSE(again.wake);
  absorb(s, {leave_request("a", 0, true), leave_request("b", 0, true), join_request(a, kJob)}, {});
  EXPECT_EQ(s.round, 0);
  EXPECT_TRUE(State::contains(s.wait_list, "a"));  // c still runs round 0
  Absorbed last = absorb(s, {leave_request("c", 0, false), join_request(b, kJob), join_request(c, kJob)}, {});
  EXPECT_TRUE(last.wake);
  EXPECT_EQ(s.round, 1);
  EXPECT_EQ(s.restarts, 1);  // the first leaver said: counted
  EXPECT_TRUE(s.complete);
  EXPECT_EQ(s.participants.size(), 3u);
}

// A node whose join timed out asks to be taken off; whoever writes next applies it: off a
// forming round (its last call stops below MIN) and off the wait and redundancy lists. A
// member of a complete round stays: it takes part after all.
TEST_F(Machine, AWithdrawalTakesATimedOutNodeOffItsListUnlessItsRoundIsComplete) {
  State s;
  join(s, a);
  join(s, b);
  ASSERT_TRUE(s.last_call);  // MIN 2
  Absorbed ab = absorb(s, {withdraw_request("b"), withdraw_request("nobody")}, {});
  EXPECT_TRUE(ab.changed);
  EXPECT_FALSE(ab.wake);
  EXPECT_FALSE(s.has_participant("b"));
  EXPECT_TRUE(s.has_participant("a"));
  EXPECT_FALSE(s.last_call);
  State r = running({a, b, c});
  apply_join(r, A::kAddToRedundancyList, ctx(d));
  absorb(r, {withdraw_request("d"), withdraw_request("a")}, {});
  EXPECT_FALSE(State::contains(r.redundancy_list, "d"));
  EXPECT_TRUE(r.has_participant("a"));
  EXPECT_EQ(decide_join(r, ctx(a, true)), A::kFinish);
}

TEST_F(Machine, TheFirstLeaverDecidesWhetherTheRestartCounts) {
  State s = running({a, b});
  leave_round(s, "a", 0, /*counted=*/true);
  leave_round(s, "b", 0, /*counted=*/false);  // b read the same first line; the first one's view stands
  EXPECT_EQ(s.round, 1);
  EXPECT_EQ(s.restarts, 1);
}

// lists_lost says beforehand what remove_lost will say, on every list, without a change.
TEST_F(Machine, ListsLostAgreesWithRemoveLost) {
  State s = running({a, b});
  s.redundancy_list.push_back(c);
  const std::string before = encode_state(s);
  for (const std::set<std::string>& lost : {std::set<std::string>{}, {"x"}, {"b"}, {"c"}, {"a", "x"}}) {
    State t = s;
    EXPECT_EQ(lists_lost(s, lost), remove_lost(t, lost)) << lost.size();
    EXPECT_EQ(encode_state(s), before);
  }
}

TEST_F(Machine, ALostMemberIsDroppedAndAnEmptyRoundOpensTheNextCounted) {
  State s = running({a, b});
  s.wait_list.push_back(c);
  EXPECT_TRUE(remove_lost(s, {"b", "c"}));
  EXPECT_EQ(s.participants.size(), 1u);
  EXPECT_TRUE(s.wait_list.empty());
  EXPECT_TRUE(s.complete);  // a still has to leave
  leave_round(s, "a", 0, /*counted=*/false);  // the loss already decided: counted
  EXPECT_EQ(s.round, 1);
  EXPECT_EQ(s.restarts, 1);
  EXPECT_FALSE(remove_lost(s, {"b"}));  // already gone: no change, no write
}

TEST_F(Machine, EveryMemberLostOpensTheNextRound) {
  State s = running({a, b});
  remove_lost(s, {"a", "b"});
  EXPECT_EQ(s.round, 1);
  EXPECT_EQ(s.restarts, 1);
  EXPECT_FALSE(s.complete);
}

TEST_F(Machine, LosingAMemberBeforeCompletionStopsTheLastCall) {
  State s;
  join(s, a);
  join(s, b);
  ASSERT_TRUE(s.last_call);
  remove_lost(s, {"b"});
  EXPECT_FALSE(s.last_call);
  EXPECT_EQ(decide_join(s, ctx(a, false, true)), A::kWait);
}

TEST_F(Machine, ClosedAndMismatchedAndTimedOut) {
  State s;
  join(s, a);
  JoinContext other{b, JobSettings{2, 4, 1}, false, false};
  EXPECT_EQ(decide_join(s, other), A::kErrorMismatch);
  EXPECT_EQ(decide_join(s, ctx(a, true)), A::kRemoveMe);
  EXPECT_EQ(decide_join(s, ctx(b, true)), A::kErrorTimeout);
  close_state(s, "");
  EXPECT_EQ(decide_join(s, ctx(b)), A::kErrorClosed);
  EXPECT_EQ(decide_join(s, ctx(a)), A::kErrorClosed);
}

TEST_F(Machine, ApplyingWaitOrFinishChangesNothing) {
  State s = running({a, b});
  State before = s;
  apply_join(s, A::kFinish, ctx(a));
  apply_join(s, A::kWait, ctx(a));
  EXPECT_EQ(s.seq, before.seq);
}

// A round's rank 0 keeps the events that say a node was lost while the state (any of its
// lists) or a request not applied yet still names that node (DynamicRendezvous::trim_logs).
TEST_F(Machine, TheTrimGuardSeesALostNodeInEveryListAndInPendingRequests) {
  State s = running({a, b});
  EXPECT_FALSE(names_any(s, {}, {}));
  EXPECT_FALSE(names_any(s, {join_request(c, kJob)}, {"d"}));
  EXPECT_TRUE(names_any(s, {}, {"b"})) << "a participant";
  join(s, c);  // the running round's wait list
  ASSERT_TRUE(State::contains(s.wait_list, "c"));
  EXPECT_TRUE(names_any(s, {}, {"c"})) << "the wait list";
  State full = running({a, b, c});
  join(full, d);  // the job is full (3): the redundancy list
  ASSERT_TRUE(State::contains(full.redundancy_list, "d"));
  EXPECT_TRUE(names_any(full, {}, {"x", "d"})) << "the redundancy list";
  EXPECT_FALSE(names_any(full, {}, {"x"}));
  State t = running({a, b});
  EXPECT_TRUE(names_any(t, {join_request(d, kJob)}, {"d"})) << "a pending join";
  EXPECT_TRUE(names_any(t, {leave_request("d", 0, true)}, {"d"})) << "a pending leave";
  EXPECT_FALSE(names_any(t, {join_request(c, kJob), leave_request("a", 0, true)}, {"d"}));
}

}  // namespace

namespace {

// Static (--node-rank): the fixed ranks order the round whatever the addresses, a second
// node with a taken rank is refused, and the rank travels through requests and the state.
TEST(MachineFixedRanks, RanksOrderTheRoundATakenRankIsRefusedAndBothRoundTrip) {
  const JobSettings job{2, 2, 0};
  NodeDesc x = node("10.0.0.9", "x"), y = node("10.0.0.1", "y"), y2 = node("10.0.0.2", "y2");
  x.rank = 0;
  y.rank = 1;
  y2.rank = 1;
  State s;
  for (auto* n : {&y, &x}) {
    JoinContext c{*n, job, false, false};
    ASSERT_EQ(decide_join(s, c), A::kAddToParticipants);
    apply_join(s, A::kAddToParticipants, c);
  }
  ASSERT_TRUE(s.complete);
  EXPECT_EQ(s.rank_of("x"), 0);  // by rank, not by address
  EXPECT_EQ(s.rank_of("y"), 1);
  JoinContext other{y2, job, false, false};
  EXPECT_EQ(decide_join(s, other), A::kErrorRankTaken);
  ASSERT_NE(rank_holder(s, y2), nullptr);
  EXPECT_EQ(rank_holder(s, y2)->id, "y");
  EXPECT_EQ(rank_holder(s, y), nullptr);  // its own rank is not taken from itself

  State back = decode_state(encode_state(s), "test");
  ASSERT_EQ(back.participants.size(), 2u);
  EXPECT_EQ(back.participants[0].rank, 0);
  EXPECT_EQ(back.participants[1].rank, 1);

  // A join request carries the rank; absorbing one for a taken rank changes nothing.
  State fresh;
  Absorbed a = absorb(fresh, {join_request(y, job), join_request(y2, job), join_request(x, job)}, {});
  EXPECT_TRUE(a.changed);
  ASSERT_EQ(fresh.participants.size(), 2u);
  EXPECT_EQ(fresh.participants[0].id, "x");
  EXPECT_EQ(fresh.participants[1].id, "y");
  EXPECT_EQ(fresh.participants[1].rank, 1);
}

}  // namespace
