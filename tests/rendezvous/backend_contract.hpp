// The contract of src/rendezvous/backend.hpp as a GoogleTest typed suite: any Backend must
// pass it. Instantiate it with a traits type per backend (one server per test suite):
//
//   struct MyTraits {
//     static void start();  // once per suite, before its first test: start the server
//     static void stop();   // once per suite, after its last test
//     // A backend for `run_id` whose every call ends within `op_timeout`.
//     static std::unique_ptr<ddprun::rdzv::Backend> make(const std::string& run_id,
//                                                        std::chrono::milliseconds op_timeout);
//     static std::chrono::milliseconds lease_ttl();        // a short ttl the backend keeps to
//     static std::chrono::milliseconds lease_end_slack();  // how late after it an end may show
//     // Optional, for a store that ends leases on its own schedule (etcd): how late a busy
//     // one may be, past the slack (reported with store_log(run), the store's own words and
//     // what it holds of the run).
//     static std::chrono::milliseconds lease_end_limit();
//     static std::string store_log(const std::string& run_id);
//     // Optional: whether the store still holds a lease of the run that should have ended
//     // (etcd can fail to revoke an expired lease: etcd-io/etcd#10686); such a test stops
//     // there, reported, as the store's failure and not the backend's.
//     static bool store_kept_a_lease(const std::string& run_id);
//     static void freeze();     // the server stops answering (connections hang) ...
//     static void thaw();       // ... and answers again, its data intact
//     static void take_down();  // the server refuses connections (its process gone) ...
//     static void bring_up();   // ... and serves again (data may be lost: runs are unique)
//     static constexpr bool kForks = true;  // false: an in-process backend, whose node cannot
//                                           // be a process of its own (that test is skipped)
//   };
//   INSTANTIATE_TYPED_TEST_SUITE_P(Mine, BackendContract, ::testing::Types<MyTraits>);
//
// The lease tests watch a node's end from another node that holds a lease of its own, as
// every node of a rendezvous does. They fork: the server must not run on threads of the test process (the child
// of a multi-threaded process may only exec). Every time limit scales with
// DDP_TEST_TIMEOUT_SCALE (a float, default 1).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ddp/error.hpp"
#include "rendezvous/backend.hpp"

namespace ddprun_contract {

using ddprun::rdzv::Backend;
using ddprun::rdzv::Token;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

inline milliseconds scale(milliseconds d) {
  const char* s = std::getenv("DDP_TEST_TIMEOUT_SCALE");
  double f = s && *s ? std::atof(s) : 1.0;
  if (!(f > 0)) f = 1.0;
  return milliseconds(static_cast<int64_t>(std::llround(static_cast<double>(d.count()) * f)));
}

inline milliseconds since(Clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - t);
}

// Lines of `log` that start with `prefix`.
inline size_t count_prefixed(const std::vector<std::string>& lines, const std::string& prefix) {
  return static_cast<size_t>(std::count_if(lines.begin(), lines.end(), [&](const std::string& l) { return l.rfind(prefix, 0) == 0; }));
}

template <class Traits>
class BackendContract : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { Traits::start(); }
  static void TearDownTestSuite() { Traits::stop(); }

  // A run id no other test (or test process) uses.
  std::string run_id(const std::string& tag = "") {
    static std::atomic<int> n{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return std::string("contract-") + info->name() + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
  }
  std::unique_ptr<Backend> make(const std::string& run, milliseconds op = scale(milliseconds(10000))) {
    return Traits::make(run, op);
  }
  // Another node of the run, with a lease of its own (as every node of a rendezvous has), to
  // watch what the node under test leaves behind.
  std::unique_ptr<Backend> observer(const std::string& run) {
    auto b = make(run);
    b->open_lease(scale(milliseconds(20000)));
    return b;
  }
  // Waits until `log` holds at least `n` lines; all of them.
  std::vector<std::string> wait_lines(Backend& b, const std::string& log, size_t n, milliseconds timeout) {
    auto end = Clock::now() + timeout;
    std::vector<std::string> all = b.read(log, 0);
    while (all.size() < n && Clock::now() < end) {
      auto left = std::chrono::duration_cast<milliseconds>(end - Clock::now());
      auto more = b.wait(log, all.size(), std::max(left, milliseconds(1)));
      all.insert(all.end(), more.begin(), more.end());
    }
    return all;
  }
  // Waits for the one lease-end line of a node whose lease started at t0, and checks when
  // it came: not before t0 + `earliest`, within ttl + the slack; a store with a
  // lease_end_limit() may be later, up to that limit (reported with its log: the store was
  // late, not the backend). nullopt: the store never ended the lease (store_kept_a_lease),
  // reported.
  std::optional<std::vector<std::string>> wait_lease_end(Backend& b, const std::string& run, Clock::time_point t0,
                                                         milliseconds earliest, milliseconds ttl) {
    const auto slack = Traits::lease_end_slack() + scale(milliseconds(1000));
    auto limit = slack;
    if constexpr (requires { Traits::lease_end_limit(); }) limit = std::max(limit, Traits::lease_end_limit());
    auto lines = wait_lines(b, "events", 1, ttl + limit + scale(milliseconds(2000)));
    auto took = since(t0);
    std::string log;
    if constexpr (requires { Traits::store_log(run); })
      if (lines.empty() || took > ttl + slack) log = Traits::store_log(run);
    if constexpr (requires { Traits::store_kept_a_lease(run); })
      if (lines.empty() && Traits::store_kept_a_lease(run)) {
        std::fprintf(stderr, "[contract] the store has not ended the lease %lld ms after its ttl (its own failure). It:\n%s\n",
                     static_cast<long long>((took - ttl).count()), log.c_str());
        return std::nullopt;
      }
    EXPECT_FALSE(lines.empty()) << "no lease-end line within " << (ttl + limit).count() << " ms. The store:\n" << log;
    EXPECT_GE(took, earliest) << "not before the ttl";
    if (!lines.empty() && took > ttl + slack && took <= ttl + limit)
      std::fprintf(stderr, "[contract] the lease ended %lld ms after the ttl (slack %lld ms): the store was late. It:\n%s\n",
                   static_cast<long long>((took - ttl).count()), static_cast<long long>(slack.count()), log.c_str());
    else
      EXPECT_LE(took, ttl + slack) << "the line of an ended lease shows within the slack" << (log.empty() ? "" : ". The store:\n") << log;
    return lines;
  }
  // Every call of a backend that cannot reach its server ends, with a ddp::Error, in time.
  void expect_bounded(Backend& b, milliseconds op, const char* when);
};

TYPED_TEST_SUITE_P(BackendContract);

// ---- the state ---------------------------------------------------------------------------

TYPED_TEST_P(BackendContract, StateStartsEmpty) {
  auto b = this->make(this->run_id());
  auto s = b->load();
  EXPECT_FALSE(s.state.has_value());
}

TYPED_TEST_P(BackendContract, CasWithEmptyTokenCreatesOnce) {
  auto b = this->make(this->run_id());
  auto r1 = b->compare_and_set("first", Token{});
  ASSERT_TRUE(r1.ok);
  EXPECT_EQ(r1.current.state, "first");
  auto s = b->load();
  EXPECT_EQ(s.state, "first");
  EXPECT_EQ(s.token, r1.current.token);
  // An empty token means "no state yet": now it is stale, and the winner comes back.
  auto r2 = b->compare_and_set("second", Token{});
  EXPECT_FALSE(r2.ok);
  EXPECT_EQ(r2.current.state, "first");
  EXPECT_EQ(r2.current.token, r1.current.token);
  EXPECT_EQ(b->load().state, "first");
}

TYPED_TEST_P(BackendContract, CasWithFreshTokenReplaces) {
  auto b = this->make(this->run_id());
  auto r1 = b->compare_and_set("v1", Token{});
  ASSERT_TRUE(r1.ok);
  auto r2 = b->compare_and_set("v2", b->load().token);
  ASSERT_TRUE(r2.ok);
  EXPECT_EQ(r2.current.state, "v2");
  EXPECT_NE(r2.current.token, r1.current.token);
  // Writing the same value again still makes a new version.
  auto r3 = b->compare_and_set("v2", r2.current.token);
  ASSERT_TRUE(r3.ok);
  EXPECT_NE(r3.current.token, r2.current.token);
  auto s = b->load();
  EXPECT_EQ(s.state, "v2");
  EXPECT_EQ(s.token, r3.current.token);
}

TYPED_TEST_P(BackendContract, CasWithStaleTokenLosesAndSeesTheWinner) {
  auto run = this->run_id();
  auto a = this->make(run);
  auto b = a->clone();
  ASSERT_TRUE(a->compare_and_set("base", Token{}).ok);
  auto seen = a->load();
  auto won = b->compare_and_set("from b", seen.token);
  ASSERT_TRUE(won.ok);
  auto lost = a->compare_and_set("from a", seen.token);
  EXPECT_FALSE(lost.ok);
  EXPECT_EQ(lost.current.state, "from b");
  EXPECT_EQ(lost.current.token, won.current.token);
  // With the winner's token, a's next try wins.
  auto again = a->compare_and_set("from a", lost.current.token);
  EXPECT_TRUE(again.ok);
  EXPECT_EQ(b->load().state, "from a");
}

TYPED_TEST_P(BackendContract, CasRaceHasExactlyOneWinner) {
  auto run = this->run_id();
  auto base = this->make(run);
  constexpr int kThreads = 6;
  std::vector<std::unique_ptr<Backend>> bs;
  for (int i = 0; i < kThreads; ++i) bs.push_back(base->clone());
  std::vector<ddprun::rdzv::CasResult> results(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads; ++i)
    ts.emplace_back([&, i] {
      ++ready;
      while (ready < kThreads) std::this_thread::yield();
      results[i] = bs[i]->compare_and_set("writer " + std::to_string(i), Token{});
    });
  for (auto& t : ts) t.join();
  int winners = 0;
  std::string winner;
  for (int i = 0; i < kThreads; ++i)
    if (results[i].ok) {
      ++winners;
      winner = "writer " + std::to_string(i);
    }
  ASSERT_EQ(winners, 1);
  for (const auto& r : results) EXPECT_EQ(r.current.state, winner);
}

TYPED_TEST_P(BackendContract, StateIsOpaqueBytes) {
  auto b = this->make(this->run_id());
  std::string v("a\0b\nc\xff\x01 \"quoted\" {json}", 22);
  v += std::string(200 * 1024, 'x');
  ASSERT_TRUE(b->compare_and_set(v, Token{}).ok);
  EXPECT_EQ(b->clone()->load().state, v);
}

// ---- logs --------------------------------------------------------------------------------

TYPED_TEST_P(BackendContract, LogsReadInAppendOrder) {
  auto b = this->make(this->run_id());
  EXPECT_TRUE(b->read("events", 0).empty());
  for (int i = 0; i < 5; ++i) b->append("events", "line " + std::to_string(i));
  std::vector<std::string> all{"line 0", "line 1", "line 2", "line 3", "line 4"};
  EXPECT_EQ(b->read("events", 0), all);
  EXPECT_EQ(b->read("events", 2), std::vector<std::string>(all.begin() + 2, all.end()));
  EXPECT_TRUE(b->read("events", 5).empty());
  EXPECT_TRUE(b->read("events", 50).empty());
  EXPECT_EQ(b->clone()->read("events", 0), all);
}

TYPED_TEST_P(BackendContract, LogsReadFromAnyLine) {
  auto b = this->make(this->run_id());
  auto other = b->clone();
  for (int i = 0; i < 5; ++i) other->append("log", std::to_string(i));
  EXPECT_EQ(b->read("log", 0).size(), 5u);
  for (int i = 5; i < 9; ++i) other->append("log", std::to_string(i));
  EXPECT_EQ(b->read("log", 5), (std::vector<std::string>{"5", "6", "7", "8"}));
  EXPECT_EQ(b->read("log", 2), (std::vector<std::string>{"2", "3", "4", "5", "6", "7", "8"}));
  EXPECT_EQ(b->read("log", 8), std::vector<std::string>{"8"});
  EXPECT_TRUE(b->read("log", 9).empty());
  other->append("log", "9");
  EXPECT_EQ(b->read("log", 7), (std::vector<std::string>{"7", "8", "9"}));
  EXPECT_EQ(b->wait("log", 9, milliseconds(5000)), std::vector<std::string>{"9"});
  auto fresh = b->clone();
  EXPECT_EQ(fresh->read("log", 6), (std::vector<std::string>{"6", "7", "8", "9"}));
  EXPECT_EQ(fresh->read("log", 0).size(), 10u);
}

TYPED_TEST_P(BackendContract, WaitSkipsToTheLineAskedFor) {
  auto run = this->run_id();
  auto waiter = this->make(run);
  auto writer = waiter->clone();
  std::thread t([&] {
    for (int i = 0; i < 4; ++i) {
      std::this_thread::sleep_for(milliseconds(50));
      writer->append("log", std::to_string(i));
    }
  });
  auto got = waiter->wait("log", 3, scale(milliseconds(10000)));
  t.join();
  EXPECT_EQ(got, std::vector<std::string>{"3"}) << "earlier lines wake it, but it returns from line 3";
}

TYPED_TEST_P(BackendContract, LogsAreSeparate) {
  auto b = this->make(this->run_id());
  const std::vector<std::string> names{"a", "a/b", "a b", "a/", "b", "%2F", "ä"};
  for (const auto& n : names) b->append(n, "in " + n);
  for (const auto& n : names) EXPECT_EQ(b->read(n, 0), std::vector<std::string>{"in " + n}) << n;
}

TYPED_TEST_P(BackendContract, LinesKeepTheirText) {
  auto b = this->make(this->run_id());
  const std::vector<std::string> lines{"", " ", "two  spaces ", "ünïcødé ✓", "{\"json\": [1, 2]}", std::string(5000, 'y')};
  for (const auto& l : lines) b->append("log", l);
  EXPECT_EQ(b->read("log", 0), lines);
}

TYPED_TEST_P(BackendContract, WaitReturnsWhatIsThereAtOnce) {
  auto b = this->make(this->run_id());
  b->append("log", "x");
  b->append("log", "y");
  auto t0 = Clock::now();
  EXPECT_EQ(b->wait("log", 0, milliseconds(20000)), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(b->wait("log", 1, milliseconds(20000)), (std::vector<std::string>{"y"}));
  EXPECT_LT(since(t0), scale(milliseconds(2000)));
}

TYPED_TEST_P(BackendContract, WaitTimesOutEmpty) {
  auto b = this->make(this->run_id());
  b->append("log", "x");
  auto t0 = Clock::now();
  EXPECT_TRUE(b->wait("log", 1, milliseconds(400)).empty());
  auto took = since(t0);
  EXPECT_GE(took, milliseconds(390));
  EXPECT_LT(took, milliseconds(400) + scale(milliseconds(1500)));
  EXPECT_TRUE(b->wait("empty log", 0, milliseconds(100)).empty());
}

TYPED_TEST_P(BackendContract, WaitWakesOnAnAppendFromAnotherClone) {
  auto run = this->run_id();
  auto waiter = this->make(run);
  auto writer = waiter->clone();
  writer->append("log", "old");
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(300));
    writer->append("log", "new");
  });
  auto t0 = Clock::now();
  auto got = waiter->wait("log", 1, scale(milliseconds(20000)));
  auto took = since(t0);
  t.join();
  EXPECT_EQ(got, std::vector<std::string>{"new"});
  EXPECT_GE(took, milliseconds(250));
  EXPECT_LT(took, scale(milliseconds(3000))) << "woken by the append, not by the timeout";
}

TYPED_TEST_P(BackendContract, ConcurrentAppendersSeeOneOrder) {
  auto run = this->run_id();
  auto base = this->make(run);
  constexpr int kThreads = 4, kEach = 15;
  std::vector<std::thread> ts;
  for (int w = 0; w < kThreads; ++w)
    ts.emplace_back([&, w, b = base->clone()] {
      for (int i = 0; i < kEach; ++i) {
        std::string line = "w";
        line += std::to_string(w);
        line += ' ';
        line += std::to_string(i);
        b->append("log", line);
      }
    });
  for (auto& t : ts) t.join();
  auto a = base->clone()->read("log", 0);
  auto b = base->clone()->read("log", 0);
  ASSERT_EQ(a.size(), size_t(kThreads * kEach));
  EXPECT_EQ(a, b);
  std::map<int, int> next;
  for (const auto& line : a) {
    int w = line[1] - '0', i = std::stoi(line.substr(3));
    EXPECT_EQ(i, next[w]++) << "each writer's lines in its own order";
  }
  // Reading from the middle agrees with the whole.
  EXPECT_EQ(base->read("log", 37), std::vector<std::string>(a.begin() + 37, a.end()));
}

// ---- counters ----------------------------------------------------------------------------

TYPED_TEST_P(BackendContract, CountersAdd) {
  auto b = this->make(this->run_id());
  EXPECT_EQ(b->add("c", 0), 0);
  EXPECT_EQ(b->add("c", 5), 5);
  EXPECT_EQ(b->add("c", -2), 3);
  EXPECT_EQ(b->clone()->add("c", 1), 4);
  EXPECT_EQ(b->add("other", 1), 1);
}

TYPED_TEST_P(BackendContract, ConcurrentAddsGiveDistinctValues) {
  auto base = this->make(this->run_id());
  constexpr int kThreads = 4, kEach = 15;
  std::vector<std::vector<int64_t>> got(kThreads);
  std::vector<std::thread> ts;
  for (int w = 0; w < kThreads; ++w)
    ts.emplace_back([&, w, b = base->clone()] {
      for (int i = 0; i < kEach; ++i) got[w].push_back(b->add("n", 1));
    });
  for (auto& t : ts) t.join();
  std::set<int64_t> all;
  for (const auto& g : got) all.insert(g.begin(), g.end());
  EXPECT_EQ(all.size(), size_t(kThreads * kEach));
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kEach);
  EXPECT_EQ(base->add("n", 0), kThreads * kEach);
}

TYPED_TEST_P(BackendContract, RunsAreSeparate) {
  auto a = this->make(this->run_id("a"));
  auto b = this->make(this->run_id("b"));
  ASSERT_TRUE(a->compare_and_set("state of a", Token{}).ok);
  a->append("log", "line of a");
  a->add("c", 7);
  EXPECT_FALSE(b->load().state.has_value());
  EXPECT_TRUE(b->read("log", 0).empty());
  EXPECT_EQ(b->add("c", 0), 0);
}

// ---- the lease ---------------------------------------------------------------------------

TYPED_TEST_P(BackendContract, LeaseLinesOnClose) {
  auto run = this->run_id();
  auto node = this->make(run);
  auto other = this->observer(run);
  node->open_lease(TypeParam::lease_ttl());
  node->on_lease_end("events", "lost node-1");
  node->on_lease_end("other", "lost node-1 too");
  node->on_lease_end("events", "second line");
  other->append("events", "before");
  EXPECT_EQ(other->read("events", 0), std::vector<std::string>{"before"}) << "nothing appended while the lease lives";
  node->close();
  auto lines = this->wait_lines(*other, "events", 3, scale(milliseconds(5000)));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "before");
  EXPECT_EQ(lines[1].rfind("lost node-1 ", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2].rfind("second line ", 0), 0u) << lines[2];
  EXPECT_GT(lines[1].size(), std::string("lost node-1 ").size()) << "followed by why";
  auto o = this->wait_lines(*other, "other", 1, scale(milliseconds(5000)));
  ASSERT_EQ(o.size(), 1u);
  EXPECT_EQ(o[0].rfind("lost node-1 too ", 0), 0u);
  // Exactly once, also after the ttl has passed.
  std::this_thread::sleep_for(TypeParam::lease_ttl() + TypeParam::lease_end_slack());
  EXPECT_EQ(other->read("events", 0).size(), 3u);
  EXPECT_EQ(other->read("other", 0).size(), 1u);
  EXPECT_THROW(node->keep_alive(milliseconds(2000)), ddp::Error) << "the lease has ended";
}

// Issue 19: a finished round's log, counter and lease-end registration go, so that a long
// job's state does not grow with its age; a dropped log starts empty when written again.
TYPED_TEST_P(BackendContract, FinishedRoundsAreDropped) {
  auto run = this->run_id();
  auto node = this->make(run);
  auto other = this->observer(run);
  node->open_lease(TypeParam::lease_ttl());
  node->on_lease_end("exit/1", "lost n");
  node->on_lease_end("exit/2", "lost n");
  node->drop_lease_end("exit/1");
  node->drop_lease_end("never-registered");
  other->append("exit/1", "n");
  EXPECT_EQ(other->add("exit/1/n", 1), 1);
  EXPECT_EQ(node->read("exit/1", 0), std::vector<std::string>{"n"});  // the reader's position, too
  other->drop_log("exit/1");
  other->drop_counter("exit/1/n");
  other->drop_log("no-such-log");
  EXPECT_TRUE(other->read("exit/1", 0).empty());
  EXPECT_TRUE(node->read("exit/1", 0).empty());
  EXPECT_EQ(other->add("exit/1/n", 1), 1);
  other->append("exit/1", "again");
  EXPECT_EQ(node->read("exit/1", 0), std::vector<std::string>{"again"});
  node->close();
  auto two = this->wait_lines(*other, "exit/2", 1, scale(milliseconds(5000)));
  ASSERT_EQ(two.size(), 1u);
  EXPECT_EQ(two[0].rfind("lost n ", 0), 0u) << two[0];
  std::this_thread::sleep_for(TypeParam::lease_end_slack());
  EXPECT_EQ(other->read("exit/1", 0), std::vector<std::string>{"again"}) << "the dropped registration wrote nothing";
}

// Issue 19: a log's first lines go once nobody needs them (trim_log); the others keep their
// numbers for every reader: one that read them all, one that fell behind (LogTrimmed names
// the first line held), one that read nothing yet.
TYPED_TEST_P(BackendContract, TrimmedLinesGoAndTheRestKeepTheirNumbers) {
  using ddprun::rdzv::LogTrimmed;
  auto b = this->make(this->run_id());
  auto behind = b->clone(), fresh = b->clone();
  EXPECT_TRUE(b->trim_log("log", 3)) << "a missing log: nothing to drop";
  for (int i = 0; i < 2; ++i) b->append("log", std::to_string(i));
  ASSERT_EQ(behind->read("log", 0).size(), 2u);
  for (int i = 2; i < 6; ++i) b->append("log", std::to_string(i));
  ASSERT_EQ(b->read("log", 0).size(), 6u);
  ASSERT_TRUE(b->trim_log("log", 4));
  const std::vector<std::string> held{"4", "5"};
  EXPECT_EQ(b->read("log", 4), held);
  EXPECT_EQ(b->read("log", 5), std::vector<std::string>{"5"});
  auto first_held = [](auto&& call) -> size_t {
    try {
      call();
    } catch (const LogTrimmed& e) {
      return e.first();
    }
    return 0;
  };
  EXPECT_EQ(first_held([&] { b->read("log", 2); }), 4u);
  EXPECT_EQ(first_held([&] { behind->read("log", 2); }), 4u) << "a reader that fell behind";
  EXPECT_EQ(behind->read("log", 4), held);
  EXPECT_EQ(first_held([&] { fresh->wait("log", 0, milliseconds(5000)); }), 4u) << "a reader that read nothing";
  EXPECT_EQ(fresh->read("log", 4), held);
  EXPECT_EQ(first_held([&] { b->clone()->read("log", 0); }), 4u);
  EXPECT_EQ(b->clone()->read("log", 5), std::vector<std::string>{"5"});
  b->append("log", "6");
  EXPECT_EQ(fresh->wait("log", 6, scale(milliseconds(5000))), std::vector<std::string>{"6"});
  EXPECT_TRUE(b->trim_log("log", 2)) << "fewer than before: nothing changes";
  EXPECT_EQ(first_held([&] { b->read("log", 3); }), 4u);
  EXPECT_TRUE(b->trim_log("log", 100)) << "more than the log has: all of it";
  EXPECT_TRUE(b->read("log", 7).empty());
  b->append("log", "7");
  EXPECT_EQ(fresh->read("log", 7), std::vector<std::string>{"7"});
  EXPECT_EQ(first_held([&] { b->clone()->read("log", 0); }), 7u);
  b->drop_log("log");  // a dropped log starts again at line 0
  b->append("log", "again");
  EXPECT_EQ(b->clone()->read("log", 0), std::vector<std::string>{"again"});
}

TYPED_TEST_P(BackendContract, KeepAliveHoldsTheLease) {
  auto run = this->run_id();
  auto node = this->make(run);
  auto other = this->observer(run);
  const auto ttl = TypeParam::lease_ttl();
  node->open_lease(ttl);
  node->on_lease_end("events", "lost");
  auto end = Clock::now() + 2 * ttl + TypeParam::lease_end_slack();
  while (Clock::now() < end) {
    node->keep_alive(scale(milliseconds(5000)));
    std::this_thread::sleep_for(ttl / 4);
  }
  EXPECT_TRUE(other->read("events", 0).empty()) << "a renewed lease has not ended";
  node->close();
  EXPECT_EQ(this->wait_lines(*other, "events", 1, scale(milliseconds(5000))).size(), 1u);
}

TYPED_TEST_P(BackendContract, LeaseEndsWithoutKeepAlive) {
  auto run = this->run_id();
  auto node = this->make(run);
  auto other = this->make(run);
  const auto ttl = TypeParam::lease_ttl();
  auto t0 = Clock::now();  // the lease cannot end before t0 + ttl
  node->open_lease(ttl);
  node->on_lease_end("events", "silent node");
  auto ended = this->wait_lease_end(*other, run, t0, ttl, ttl);
  if (!ended) GTEST_SKIP() << "the store never ended the lease: its own failure (reported above)";
  const auto& lines = *ended;
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind("silent node ", 0), 0u) << lines[0];
  EXPECT_THROW(node->keep_alive(milliseconds(3000)), ddprun::rdzv::LeaseEnded) << "certainly over, and says so";
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(other->read("events", 0).size(), 1u) << "exactly once";
}

TYPED_TEST_P(BackendContract, ReleaseAppendsNothing) {
  auto run = this->run_id();
  auto node = this->make(run);
  auto other = this->observer(run);
  node->open_lease(TypeParam::lease_ttl());
  node->on_lease_end("events", "lost node-1");
  node->on_lease_end("exit/0", "lost node-1");
  node->release();
  // Not at once, and not after the ttl either: a released lease never ends "lost".
  std::this_thread::sleep_for(TypeParam::lease_ttl() + TypeParam::lease_end_slack());
  EXPECT_TRUE(other->read("events", 0).empty());
  EXPECT_TRUE(other->read("exit/0", 0).empty());
  EXPECT_THROW(node->keep_alive(milliseconds(2000)), ddp::Error) << "the lease has ended";
  other->append("events", "still usable");
  EXPECT_EQ(other->read("events", 0), std::vector<std::string>{"still usable"});
}

TYPED_TEST_P(BackendContract, InterruptEndsAWaitAndLaterCalls) {
  auto run = this->run_id();
  auto waiter = this->make(run);
  auto writer = waiter->clone();
  writer->append("log", "x");
  std::atomic<bool> returned{false};
  Clock::time_point t0;
  std::thread t([&] {
    try {
      waiter->wait("log", 1, scale(milliseconds(20000)));
    } catch (const ddp::Error&) {
    }
    returned = true;
  });
  std::this_thread::sleep_for(milliseconds(300));  // well inside the wait
  t0 = Clock::now();
  waiter->interrupt();
  t.join();
  EXPECT_TRUE(returned);
  EXPECT_LT(since(t0), scale(milliseconds(2000))) << "woken by interrupt(), not by the timeout";
  EXPECT_THROW(waiter->wait("log", 1, milliseconds(5000)), ddp::Error) << "later calls fail";
  EXPECT_EQ(writer->read("log", 0), std::vector<std::string>{"x"}) << "other objects are not interrupted";
  EXPECT_EQ(writer->clone()->read("log", 0).size(), 1u);
}

TYPED_TEST_P(BackendContract, LeaseEndsWhenTheProcessDies) {
  if constexpr (!TypeParam::kForks) GTEST_SKIP() << "an in-process backend: no node of its own to kill";
  auto run = this->run_id();
  const auto ttl = TypeParam::lease_ttl();
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const auto t0 = Clock::now();  // the child's lease starts after this
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    try {
      auto node = TypeParam::make(run, scale(milliseconds(10000)));
      node->open_lease(ttl);
      node->on_lease_end("events", "killed node");
      char c = 'r';
      if (::write(ready[1], &c, 1) != 1) ::_exit(3);
      ::pause();
    } catch (...) {
    }
    ::_exit(2);
  }
  ::close(ready[1]);
  char c = 0;
  bool got = ::read(ready[0], &c, 1) == 1;
  ::close(ready[0]);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ASSERT_TRUE(got) << "the child could not open its lease";
  auto other = this->make(run);
  // A store may end it at once (the connection closed), or when the ttl has passed.
  auto ended = this->wait_lease_end(*other, run, t0, milliseconds(0), ttl);
  if (!ended) GTEST_SKIP() << "the store never ended the lease: its own failure (reported above)";
  const auto& lines = *ended;
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind("killed node ", 0), 0u) << lines[0];
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(other->read("events", 0).size(), 1u) << "exactly once";
}

TYPED_TEST_P(BackendContract, LeaseMisuseIsAnError) {
  auto b = this->make(this->run_id());
  EXPECT_THROW(b->keep_alive(milliseconds(1000)), ddp::Error) << "no lease open";
  EXPECT_THROW(b->on_lease_end("events", "x"), ddp::Error) << "no lease open";
  auto c = b->clone();
  c->close();  // a clone without a lease closes quietly
}

// ---- every call is bounded ---------------------------------------------------------------

template <class Traits>
void BackendContract<Traits>::expect_bounded(Backend& b, milliseconds op, const char* when) {
  const auto limit = op + scale(milliseconds(1500));
  auto check = [&](const char* what, auto&& call) {
    auto t0 = Clock::now();
    try {
      call();
      ADD_FAILURE() << what << " succeeded " << when;
    } catch (const ddp::Error& e) {
      EXPECT_NE(std::string(e.what()).find(b.describe()), std::string::npos)
          << what << ": the message names the backend: " << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << " threw something else than ddp::Error: " << e.what();
    }
    EXPECT_LE(since(t0), limit) << what << " " << when;
  };
  check("load", [&] { b.load(); });
  check("compare_and_set", [&] { b.compare_and_set("x", Token{}); });
  check("append", [&] { b.append("log", "x"); });
  check("read", [&] { b.read("log", 0); });
  check("wait", [&] { b.wait("log", 0, milliseconds(200)); });
  check("add", [&] { b.add("c", 1); });
  check("keep_alive", [&] { b.keep_alive(op); });
}

TYPED_TEST_P(BackendContract, EveryCallIsBoundedWhenTheServerHangs) {
  const auto op = scale(milliseconds(1000));
  auto b = this->make(this->run_id(), op);
  b->open_lease(TypeParam::lease_ttl() * 4);
  b->append("log", "before");
  TypeParam::freeze();
  this->expect_bounded(*b, op, "while the server hangs");
  TypeParam::thaw();
  // The same object works again once the server is back.
  auto end = Clock::now() + scale(milliseconds(15000));
  std::vector<std::string> lines;
  while (Clock::now() < end) {
    try {
      lines = b->read("log", 0);
      break;
    } catch (const ddp::Error&) {
      std::this_thread::sleep_for(milliseconds(100));
    }
  }
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0], "before");
}

TYPED_TEST_P(BackendContract, EveryCallIsBoundedWhenTheServerIsDown) {
  const auto op = scale(milliseconds(1000));
  auto b = this->make(this->run_id(), op);
  b->open_lease(TypeParam::lease_ttl() * 4);
  TypeParam::take_down();
  this->expect_bounded(*b, op, "while the server is down");
  TypeParam::bring_up();
  auto end = Clock::now() + scale(milliseconds(15000));
  bool ok = false;
  while (!ok && Clock::now() < end) {
    try {
      b->append("log", "after");
      ok = true;
    } catch (const ddp::Error&) {
      std::this_thread::sleep_for(milliseconds(100));
    }
  }
  EXPECT_TRUE(ok) << "the same object works again once the server is back";
}

REGISTER_TYPED_TEST_SUITE_P(BackendContract, StateStartsEmpty, CasWithEmptyTokenCreatesOnce, CasWithFreshTokenReplaces,
                            CasWithStaleTokenLosesAndSeesTheWinner, CasRaceHasExactlyOneWinner, StateIsOpaqueBytes,
                            LogsReadInAppendOrder, LogsReadFromAnyLine, WaitSkipsToTheLineAskedFor, LogsAreSeparate, LinesKeepTheirText, WaitReturnsWhatIsThereAtOnce,
                            WaitTimesOutEmpty, WaitWakesOnAnAppendFromAnotherClone, ConcurrentAppendersSeeOneOrder,
                            CountersAdd, ConcurrentAddsGiveDistinctValues, RunsAreSeparate, LeaseLinesOnClose,
                            FinishedRoundsAreDropped, TrimmedLinesGoAndTheRestKeepTheirNumbers,
                            KeepAliveHoldsTheLease, LeaseEndsWithoutKeepAlive, LeaseEndsWhenTheProcessDies,
                            LeaseMisuseIsAnError, ReleaseAppendsNothing, InterruptEndsAWaitAndLaterCalls,
                            EveryCallIsBoundedWhenTheServerHangs,
                            EveryCallIsBoundedWhenTheServerIsDown);

}  // namespace ddprun_contract
