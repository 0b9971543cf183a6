// Every rank's stack, as ddprun reads it back and shows it (launcher/stacks.hpp): parsing
// faulthandler's text, the innermost frames, rank ranges, grouping, the odd ones out.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "launcher/stacks.hpp"

namespace {

using ddprun::RankStack;
using Kind = RankStack::Kind;

// What faulthandler.dump_traceback(all_threads=True) writes for a job stuck in all_reduce:
// a helper thread first, the main thread last.
const char* kAllReduce =
    "Thread 0x00007f6455bc4700 (most recent call first):\n"
    "  File \"/usr/lib/python3.11/threading.py\", line 324 in wait\n"
    "  File \"/usr/lib/python3.11/threading.py\", line 995 in _bootstrap\n"
    "\n"
    "Current thread 0x00007f6455bc4b80 (most recent call first):\n"
    "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line 1536 in all_reduce\n"
    "  File \"/job/train.py\", line 20 in step\n"
    "  File \"/job/train.py\", line 40 in main\n"
    "  File \"/job/train.py\", line 44 in <module>\n";

const char* kSleeping =
    "Thread 0x00007f027dbd3b80 (most recent call first):\n"
    "  File \"/job/train.py\", line 12 in stall\n"
    "  File \"/job/train.py\", line 19 in step\n";

RankStack stack(int rank, Kind kind, const std::string& text = "") {
  RankStack s;
  s.rank = s.local_rank = rank;
  s.pid = 1000 + rank;
  s.kind = kind;
  s.text = text;
  return s;
}

TEST(LauncherStacks, ParsesThreadsInnermostFirst) {
  auto threads = ddprun::parse_faulthandler(std::string("ddprun-stacks pid=12\n") + kAllReduce);
  ASSERT_EQ(threads.size(), 2u);
  EXPECT_FALSE(threads[0].current);
  EXPECT_TRUE(threads[1].current);
  ASSERT_EQ(threads[1].frames.size(), 4u);
  EXPECT_EQ(threads[1].frames[0].func, "all_reduce");
  EXPECT_EQ(threads[1].frames[0].line, 1536);
  EXPECT_EQ(threads[1].frames[0].file, "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py");
  EXPECT_EQ(threads[1].frames[3].func, "<module>");
}

TEST(LauncherStacks, ToleratesOddAndCutLines) {
  auto threads = ddprun::parse_faulthandler(
      "Thread 0x1 (most recent call first):\n  <no Python frame>\n\n"
      "Current thread 0x2 (most recent call first):\n  File \"a.py\", line ??? in f\n  File \"b.py\", li");
  ASSERT_EQ(threads.size(), 2u);
  EXPECT_TRUE(threads[0].frames.empty());
  ASSERT_EQ(threads[1].frames.size(), 1u);
  EXPECT_EQ(threads[1].frames[0].line, 0);
  EXPECT_TRUE(ddprun::parse_faulthandler("").empty());
  EXPECT_TRUE(ddprun::parse_faulthandler("  File \"x.py\", line 1 in f\n").empty());  // no thread header
}

TEST(LauncherStacks, TheWarmProcessFramesUnderAPreloadedScriptAreNotTheRanks) {
  auto threads = ddprun::parse_faulthandler(
      "Current thread 0x2 (most recent call first):\n"
      "  File \"/job/train.py\", line 7 in <module>\n"
      "  File \"/usr/share/ddprun/python/ddprun_preload.py\", line 308 in _run_script\n"
      "  File \"/usr/share/ddprun/python/ddprun_preload.py\", line 380 in <module>\n");
  ASSERT_EQ(threads.size(), 1u);
  ASSERT_EQ(threads[0].frames.size(), 1u);
  EXPECT_EQ(threads[0].frames[0].file, "/job/train.py");
  RankStack starting = stack(0, Kind::kStack,
                             "Current thread 0x2 (most recent call first):\n"
                             "  File \"/usr/share/ddprun/python/ddprun_preload.py\", line 308 in _run_script\n");
  EXPECT_EQ(starting.signature(), "<no Python frame>");  // as a cold worker's before its script runs
}

TEST(LauncherStacks, InnermostFramesWithoutFolders) {
  auto threads = ddprun::parse_faulthandler(kAllReduce);
  EXPECT_EQ(ddprun::innermost(threads.back(), 2), "all_reduce (distributed_c10d.py:1536) <- step (train.py:20) <- ...");
  EXPECT_EQ(ddprun::innermost(threads.back()),
            "all_reduce (distributed_c10d.py:1536) <- step (train.py:20) <- main (train.py:40) <- <module> "
            "(train.py:44)");
}

TEST(LauncherStacks, SignatureIsTheMainThreadOrWhyNone) {
  EXPECT_EQ(stack(0, Kind::kStack, kSleeping).signature(), "stall (train.py:12) <- step (train.py:19)");
  EXPECT_EQ(stack(0, Kind::kNoAnswer).signature(), "no answer");
  EXPECT_NE(stack(0, Kind::kNoBootstrap).signature().find("no Python stack"), std::string::npos);
  EXPECT_EQ(stack(0, Kind::kStack, "garbage\n").signature(), "(empty dump)");
  EXPECT_EQ(stack(0, Kind::kStack, "Thread 0x1 (most recent call first):\n  <no Python frame>\n").signature(),
            "<no Python frame>");
}

TEST(LauncherStacks, RankRanges) {
  EXPECT_EQ(ddprun::rank_ranges({}), "");
  EXPECT_EQ(ddprun::rank_ranges({3}), "3");
  EXPECT_EQ(ddprun::rank_ranges({3, 0, 2, 2}), "0, 2-3");
  EXPECT_EQ(ddprun::rank_ranges({0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15}), "0-6, 8-15");
}

TEST(LauncherStacks, GroupsBiggestFirstAndNamesOutliers) {
  std::vector<RankStack> s{stack(0, Kind::kStack, kAllReduce), stack(1, Kind::kStack, kAllReduce),
                           stack(2, Kind::kStack, kSleeping), stack(3, Kind::kStack, kAllReduce)};
  auto groups = ddprun::group_by_signature(s);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].second, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(groups[1].second, (std::vector<int>{2}));
  EXPECT_EQ(ddprun::outliers(s), (std::vector<int>{2}));
  const std::string where = ddprun::where_lines(s);
  EXPECT_NE(where.find("  ranks 0-1, 3: all_reduce (distributed_c10d.py:1536) <- step"), std::string::npos) << where;
  EXPECT_NE(where.find("  rank 2: stall (train.py:12)"), std::string::npos) << where;
  EXPECT_LT(where.find("ranks 0-1, 3"), where.find("rank 2:"));
}

TEST(LauncherStacks, NoMajorityNamesNobody) {
  std::vector<RankStack> s{stack(0, Kind::kStack, kAllReduce), stack(1, Kind::kStack, kSleeping)};
  EXPECT_TRUE(ddprun::outliers(s).empty());
  EXPECT_TRUE(ddprun::outliers({}).empty());
  // A rank that did not answer differs from the majority like any other.
  std::vector<RankStack> t{stack(0, Kind::kStack, kAllReduce), stack(1, Kind::kStack, kAllReduce),
                           stack(2, Kind::kNoAnswer)};
  EXPECT_EQ(ddprun::outliers(t), (std::vector<int>{2}));
}

TEST(LauncherStacks, FullDumpPrefixesEveryLine) {
  RankStack quiet = stack(1, Kind::kNoAnswer);
  quiet.native = "1 thread: 1x S futex_wait_queue";
  std::vector<RankStack> s{stack(0, Kind::kStack, kSleeping), quiet, stack(2, Kind::kIncomplete, "Thread 0x1 (mo")};
  const std::string out = ddprun::full_dump(s, {"[rank0]:", "[rank1]:", "[rank2]:"});
  EXPECT_NE(out.find("[rank0]:  File \"/job/train.py\", line 12 in stall\n"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank1]:no answer (pid 1001): 1 thread: 1x S futex_wait_queue\n"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank2]:(the dump was still being written at the deadline)\n"), std::string::npos) << out;
  for (size_t at = 0; at < out.size(); at = out.find('\n', at) + 1) EXPECT_EQ(out[at], '[') << out.substr(at);
}

}  // namespace

namespace {

ddprun::RankCollective at(int rank, uint64_t number, bool in_flight, double seconds = 1.0) {
  ddprun::RankCollective c;
  c.rank = rank;
  c.op = "all_reduce";
  c.number = number;
  c.in_flight = in_flight;
  c.bytes = 4;
  c.backend = "cpu";
  c.seconds = seconds;
  return c;
}

TEST(CollectiveLines, GroupsRanksAndNamesTheOddOne) {
  std::string t = ddprun::collective_lines({at(0, 1543, true, 2.0), at(1, 1543, true, 5.0), at(2, 1542, false),
                                            at(3, 1543, true, 1.0)});
  EXPECT_EQ(t,
            "  ranks 0-1, 3: all_reduce #1543 in flight for 5.0 s (4 B, cpu)\n"
            "  rank 2: all_reduce #1542 done, started 1.0 s ago (4 B, cpu)\n"
            "  rank 2 is at all_reduce #1542 done, the others at all_reduce #1543 in flight\n");
}

TEST(CollectiveLines, NoMajorityNamesNobodyAndNoRecordIsEmpty) {
  std::string t = ddprun::collective_lines({at(0, 7, true), at(1, 6, false)});
  EXPECT_EQ(t.find(" is at "), std::string::npos) << t;
  EXPECT_EQ(ddprun::collective_lines({}), "");
  EXPECT_EQ(ddprun::collective_lines({at(0, 7, true), at(1, 7, true)}),
            "  ranks 0-1: all_reduce #7 in flight for 1.0 s (4 B, cpu)\n");
}

TEST(NativeStacks, GlibcFramesBecomeDemangledLinesThatGroup) {
  const std::string raw =
      "Native thread 530 (most recent call first):\n"
      "/lib/x86_64-linux-gnu/libc.so.6(syscall+0x19)[0x7f9fe351f829]\n"
      "/w/lib/libddp.so.0(_ZN3ddp12ProcessGroup10all_reduceEPvmNS_5DTypeERKNS_16AllReduceOptionsE+0xf4)[0x7f9f]\n"
      "/w/bin/worker(+0x1486)[0x55de0d113486]\n";
  const std::string text = ddprun::readable_native(raw);
  EXPECT_EQ(text,
            "Native thread 530 (most recent call first):\n"
            "  syscall (libc.so.6)\n"
            "  ddp::ProcessGroup::all_reduce (libddp.so.0)\n"
            "  ?? (worker)\n");
  RankStack r;
  r.kind = RankStack::Kind::kStack;
  r.text = text;
  EXPECT_EQ(r.signature(2), "syscall (libc.so.6) <- ddp::ProcessGroup::all_reduce (libddp.so.0) <- ...");
  // With several threads, the main one (its id is the pid) is what ranks are grouped by.
  RankStack two;
  two.kind = RankStack::Kind::kStack;
  two.pid = 77;
  two.text = "Native thread 77 (most recent call first):\n  main_wait (w)\n"
             "Native thread 78 (most recent call first):\n  loader_sleep (w)\n";
  EXPECT_EQ(two.signature(), "main_wait (w)");
  EXPECT_EQ(ddprun::readable_native("Current thread 0x1 (most recent call first):\n"),
            "Current thread 0x1 (most recent call first):\n");  // a Python dump is left alone
}

}  // namespace
