// Every rank's stack, as ddprun reads it back and shows it (launcher/stacks.hpp): parsing
// faulthandler's text, the innermost frames, rank ranges, grouping, the odd ones out.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "launcher/stack_dump.hpp"
#include "launcher/stacks.hpp"

namespace {

using ddprun::RankStack;
using Kind = RankStack::Kind;
using namespace std::chrono_literals;

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
  EXPECT_EQ(starting.signature(), "<no Python frame: its Python starts or exits>");  // as a cold worker's
}

// A rank inside `import torch`: the import system's frames between the importing line and
// the module's code are left out, so the innermost frames are the modules' own lines.
TEST(LauncherStacks, ImportSystemFramesAreLeftOut) {
  RankStack importing = stack(0, Kind::kStack,
                              "Current thread 0x00007f28b501b040 (most recent call first):\n"
                              "  File \"/usr/lib/python3/dist-packages/torch/__init__.py\", line 229 in <module>\n"
                              "  File \"<frozen importlib._bootstrap>\", line 241 in _call_with_frames_removed\n"
                              "  File \"<frozen importlib._bootstrap_external>\", line 940 in exec_module\n"
                              "  File \"<frozen importlib._bootstrap>\", line 690 in _load_unlocked\n"
                              "  File \"<frozen importlib._bootstrap>\", line 1149 in _find_and_load_unlocked\n"
                              "  File \"<frozen importlib._bootstrap>\", line 1178 in _find_and_load\n"
                              "  File \"/job/train.py\", line 1 in <module>\n");
  EXPECT_EQ(importing.signature(), "<module> (__init__.py:229) <- <module> (train.py:1)");
}

TEST(LauncherStacks, InnermostFramesWithoutFolders) {
  auto threads = ddprun::parse_faulthandler(kAllReduce);
  EXPECT_EQ(ddprun::innermost(threads.back(), 2), "all_reduce (distributed_c10d.py:1536) <- step (train.py:20) <- ...");
  EXPECT_EQ(ddprun::innermost(threads.back()),
            "all_reduce (distributed_c10d.py:1536) <- step (train.py:20) <- main (train.py:40) <- <module> "
            "(train.py:44)");
}

TEST(LauncherStacks, InnermostFramesReachTheJobsOwnCode) {
  // A rank waiting on a DataLoader's workers: the library's frames first, then the script's.
  const std::string text =
      "Current thread 0x00007f6455bc4b80 (most recent call first):\n"
      "  File \"/usr/lib/python3.11/selectors.py\", line 415 in select\n"
      "  File \"/usr/lib/python3.11/multiprocessing/connection.py\", line 930 in wait\n"
      "  File \"/usr/lib/python3.11/multiprocessing/connection.py\", line 423 in _poll\n"
      "  File \"/usr/lib/python3.11/multiprocessing/connection.py\", line 256 in poll\n"
      "  File \"/home/me/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py\", line 1120 in _try_get\n"
      "  File \"/job/dl.py\", line 10 in epoch\n"
      "  File \"/job/dl.py\", line 20 in <module>\n";
  auto threads = ddprun::parse_faulthandler(text);
  EXPECT_EQ(ddprun::innermost(threads.back(), 4),
            "select (selectors.py:415) <- wait (connection.py:930) <- _poll (connection.py:423) <- poll "
            "(connection.py:256) <- ... <- epoch (dl.py:10) <- ...");
  EXPECT_EQ(ddprun::innermost(threads.back(), 5),
            "select (selectors.py:415) <- wait (connection.py:930) <- _poll (connection.py:423) <- poll "
            "(connection.py:256) <- _try_get (dataloader.py:1120) <- epoch (dl.py:10) <- ...");
  EXPECT_EQ(ddprun::innermost(threads.back(), 6).find("<- ... <-"), std::string::npos);  // the script's shown
  // One of the job's frames among those shown: as before.
  auto all_reduce = ddprun::parse_faulthandler(kAllReduce);
  EXPECT_EQ(ddprun::innermost(all_reduce.back(), 2), "all_reduce (distributed_c10d.py:1536) <- step (train.py:20) <- ...");
}

TEST(LauncherStacks, SignatureIsTheMainThreadOrWhyNone) {
  EXPECT_EQ(stack(0, Kind::kStack, kSleeping).signature(), "stall (train.py:12) <- step (train.py:19)");
  EXPECT_EQ(stack(0, Kind::kNoAnswer).signature(), "no answer");
  EXPECT_NE(stack(0, Kind::kNoBootstrap).signature().find("no stack (no ddprun bootstrap or libddp"), std::string::npos);
  EXPECT_EQ(stack(0, Kind::kStack, "garbage\n").signature(), "(empty dump)");
  EXPECT_EQ(stack(0, Kind::kStack, "Thread 0x1 (most recent call first):\n  <no Python frame>\n").signature(),
            "<no Python frame: its Python starts or exits>");
  // A rank in the bootstrap's excepthook is failing: not "where it is" in the script.
  EXPECT_EQ(stack(0, Kind::kStack,
                  "Current thread 0x1 (most recent call first):\n"
                  "  File \"/usr/share/ddprun/python/sitecustomize.py\", line 83 in excepthook\n")
                .signature(),
            "failing: an uncaught exception (its traceback is in its output)");
  // Over 100 threads: the dump ends with "..." before the main thread (the oldest); the last
  // thread shown is a helper, not where the rank is.
  EXPECT_EQ(stack(0, Kind::kStack,
                  "Thread 0x2 (most recent call first):\n  File \"w.py\", line 4 in worker_thread\n...\n")
                .signature(),
            "(main thread not in the dump: faulthandler shows 100 threads at most)");
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

// A rank's forked processes: a where line of their own under the rank's group, grouped by
// pid; their dumps only in the full dump asked with them (the saved file).
TEST(LauncherStacks, ForkedProcessesHaveTheirWhereLineAndTheirDumpInTheFile) {
  std::vector<RankStack> s{stack(0, Kind::kStack, kAllReduce), stack(1, Kind::kStack, kAllReduce),
                           stack(2, Kind::kStack, kSleeping)};
  for (pid_t pid : {311, 312, 315}) {
    RankStack c = stack(1, Kind::kStack, pid == 315 ? kAllReduce : kSleeping);
    c.pid = pid;
    s[1].forked.push_back(c);
  }
  EXPECT_EQ(ddprun::where_lines(s),
            "  ranks 0-1: all_reduce (distributed_c10d.py:1536) <- step (train.py:20) <- main (train.py:40) <- "
            "<module> (train.py:44)\n"
            "    rank 1's forked processes: pids 311-312: stall (train.py:12) <- step (train.py:19); "
            "pid 315: all_reduce (distributed_c10d.py:1536) <- step (train.py:20) <- main (train.py:40) <- "
            "<module> (train.py:44)\n"
            "  rank 2: stall (train.py:12) <- step (train.py:19)\n");
  const std::vector<std::string> prefixes{"[rank0]:", "[rank1]:", "[rank2]:"};
  EXPECT_EQ(ddprun::full_dump(s, prefixes).find("forked"), std::string::npos);
  const std::string file = ddprun::full_dump(s, prefixes, true);
  EXPECT_NE(file.find("[rank1]:Process 311, forked by this rank:\n[rank1]:Thread 0x00007f027dbd3b80"), std::string::npos)
      << file;
  EXPECT_NE(file.find("[rank1]:Process 315, forked by this rank:\n"), std::string::npos) << file;
  EXPECT_EQ(ddprun::standing_out(s), "rank 2 not where the others are");  // (the forked are not counted)
  // More than are asked: the line says how many were left out.
  s[1].forked_not_asked = 24;
  EXPECT_NE(ddprun::where_lines(s).find("<module> (train.py:44); 24 more not asked (at most 16 a rank are asked)\n"),
            std::string::npos) << ddprun::where_lines(s);
  s[1].forked.clear();
  EXPECT_NE(ddprun::where_lines(s).find("\n    rank 1's forked processes: 24 more not asked"), std::string::npos)
      << ddprun::where_lines(s);
}

TEST(LauncherStacks, StandingOutNamesTheOddRanksOrWhyNone) {
  std::vector<RankStack> s{stack(0, Kind::kStack, kAllReduce), stack(1, Kind::kStack, kAllReduce),
                           stack(2, Kind::kStack, kSleeping)};
  EXPECT_EQ(ddprun::standing_out(s), "rank 2 not where the others are");
  s.pop_back();
  EXPECT_EQ(ddprun::standing_out(s), "every rank is at the same place");
  s.push_back(stack(2, Kind::kStack, kSleeping));
  s.push_back(stack(3, Kind::kNoAnswer));
  EXPECT_EQ(ddprun::standing_out(s),
            "no rank stands out by majority, but rank 2 is not in a torch.distributed call (ranks 0-1 are)");
  // Two ranks, one in all_reduce: the other is named (the usual small debugging job).
  std::vector<RankStack> two{stack(0, Kind::kStack, kAllReduce), stack(1, Kind::kStack, kSleeping)};
  EXPECT_EQ(ddprun::standing_out(two),
            "no rank stands out by majority, but rank 1 is not in a torch.distributed call (rank 0 is)");
  // None in torch.distributed, or none elsewhere with a Python stack: nothing to add.
  two[0] = stack(0, Kind::kNoAnswer);
  EXPECT_EQ(ddprun::standing_out(two), "no rank stands out (no majority)");
}

// faulthandler at a fatal signal, after an on-demand dump in the same file: the crash's
// thread, innermost first, if it is of the signal the rank died of; the main thread's when
// the crashing one ran no Python; a recursion's frames once, with faulthandler's cut said.
TEST(LauncherStacks, CrashStackIsTheCrashingThreadsOfTheLastCrash) {
  const std::string earlier = "ddprun-stacks pid=7\nThread 0x1 (most recent call first):\n"
                              "  File \"/j/train.py\", line 9 in old\n";
  const std::string crash = "Fatal Python error: Segmentation fault\n\n"
                            "Thread 0x2 (most recent call first):\n  File \"/j/load.py\", line 4 in fetch\n\n"
                            "Current thread 0x3 (most recent call first):\n"
                            "  File \"/usr/lib/python3.11/ctypes/__init__.py\", line 519 in string_at\n"
                            "  File \"/j/train.py\", line 3 in bad_layer\n\n"
                            "Thread 0x1 (most recent call first):\n  File \"/j/train.py\", line 12 in <module>\n\n"
                            "Extension modules: numpy.core._multiarray_umath (total: 1)\n";
  const std::string head = "Python stack at the crash (most recent call first; every thread: /r/stacks):";
  EXPECT_EQ(ddprun::crash_stack(earlier + crash, "Segmentation fault", "/r/stacks"),
            head + "\n  File \"/usr/lib/python3.11/ctypes/__init__.py\", line 519 in string_at\n"
                   "  File \"/j/train.py\", line 3 in bad_layer");
  EXPECT_EQ(ddprun::crash_stack(earlier, "Segmentation fault", "/r/stacks"), "");
  EXPECT_EQ(ddprun::crash_stack("", "Segmentation fault", "/r/stacks"), "");
  // Died of another signal (SIGABRT after Python's end): that crash is not this death's.
  EXPECT_EQ(ddprun::crash_stack(earlier + crash, ddprun::fatal_signal_name(SIGABRT), "/r/stacks"), "");
  EXPECT_EQ(ddprun::fatal_signal_name(SIGSEGV), "Segmentation fault");
  EXPECT_EQ(ddprun::fatal_signal_name(SIGKILL), "");
  EXPECT_EQ(ddprun::crash_stack(crash, "Segmentation fault", "/r/stacks", 1),
            head + "\n  File \"/usr/lib/python3.11/ctypes/__init__.py\", line 519 in string_at\n  ... (1 more frame)");
  const std::string native = "Fatal Python error: Aborted\n\nCurrent thread 0x4 (most recent call first):\n"
                             "  <no Python frame>\n\nThread 0x1 (most recent call first):\n"
                             "  File \"/j/train.py\", line 20 in step\n";
  EXPECT_EQ(ddprun::crash_stack(native, "Aborted", "/r/stacks"),
            "Python stack at the crash: the crashing thread ran no Python; the main thread's (most recent call "
            "first; every thread: /r/stacks):\n  File \"/j/train.py\", line 20 in step");
  std::string deep = "Fatal Python error: Segmentation fault\n\nCurrent thread 0x3 (most recent call first):\n";
  for (int i = 0; i < 100; ++i) deep += "  File \"/j/train.py\", line 21 in deep\n";
  EXPECT_EQ(ddprun::crash_stack(deep + "  ...\n", "Segmentation fault", "/r/stacks"),
            head + "\n  File \"/j/train.py\", line 21 in deep\n  [Previous line repeated 99 more times]\n"
                   "  ... (and more: faulthandler writes 100 frames at most)");
  // Cut by the depth too (one line: the repeat line is not written, its frames are counted).
  EXPECT_EQ(ddprun::crash_stack(deep + "  ...\n", "Segmentation fault", "/r/stacks", 1),
            head + "\n  File \"/j/train.py\", line 21 in deep\n  ... (99 more frames)\n"
                   "  ... (and more: faulthandler writes 100 frames at most)");
  // A free-threaded Python writes the crashing thread alone, as "Stack".
  EXPECT_EQ(ddprun::crash_stack("Fatal Python error: Segmentation fault\n\n<Cannot show all threads while the GIL is "
                                "disabled>\nStack (most recent call first):\n  File \"/j/train.py\", line 3 in bad\n",
                                "Segmentation fault", "/r/stacks"),
            head + "\n  File \"/j/train.py\", line 3 in bad");
  // More than 100 threads ("..."): the last one written is not the main thread.
  EXPECT_EQ(ddprun::crash_stack("Fatal Python error: Aborted\n\nCurrent thread 0x4 (most recent call first):\n"
                                "  <no Python frame>\n...\nThread 0x9 (most recent call first):\n"
                                "  File \"/j/load.py\", line 4 in fetch\n",
                                "Aborted", "/r/stacks"),
            "");
}

// The failure view: a rank caught exiting or not answering that then exited 0 by itself is
// named so (often the one the others waited for); not one that ddprun's stop signal ended,
// nor one caught in its own code, nor one that failed.
TEST(LauncherStacks, RanksThatExited0ByThemselvesAreNamedSo) {
  const char* exiting = "Thread 0x00007f027dbd3b80 (most recent call first):\n  <no Python frame>\n";
  const char* shutting = "Thread 0x00007f027dbd3b80 (most recent call first):\n"
                         "  File \"/usr/lib/python3.11/threading.py\", line 1583 in _shutdown\n";
  std::vector<RankStack> s{stack(1, Kind::kStack, exiting), stack(2, Kind::kNoAnswer),
                           stack(3, Kind::kStack, shutting), stack(4, Kind::kNoAnswer),
                           stack(5, Kind::kStack, kSleeping), stack(6, Kind::kStack, exiting),
                           stack(7, Kind::kExited)};  // gone between the ask and its answer (CI saw it)
  ASSERT_EQ(s[0].signature(), ddprun::kNoPythonFrame);
  std::vector<ddprun::WorkerResult> w(7);
  using S = ddprun::WorkerResult::State;
  for (int i = 0; i < 7; ++i) {
    w[i].rank = i + 1;
    w[i].pid = 1001 + i;
    w[i].state = S::kSucceeded;
  }
  w[3].stopped_by_ddprun = true;  // rank 4: exited 0 on ddprun's SIGTERM (a checkpointing handler)
  w[5].state = S::kFailed;        // rank 6: failed
  w[5].exit_code = 1;
  ASSERT_TRUE(ddprun::name_exited_by_themselves(s, w));
  const std::string by_itself = "not running: exited with code 0 (by itself, as the others failed)";
  for (int i : {0, 1, 2, 6}) {
    EXPECT_EQ(s[i].kind, Kind::kExited) << i;
    EXPECT_EQ(s[i].signature(), by_itself) << i;
  }
  EXPECT_EQ(s[3].kind, Kind::kNoAnswer);
  EXPECT_EQ(s[4].signature(), "stall (train.py:12) <- step (train.py:19)");
  EXPECT_EQ(s[5].signature(), ddprun::kNoPythonFrame);
  EXPECT_FALSE(ddprun::name_exited_by_themselves(s, {}));
}

// A node's answer to a dump asked on another node: one line, every field back as it was,
// each rank's signature as the answering node saw it.
TEST(NodeStacks, AnAnswerIsOneLineThatReadsBackWhole) {
  RankStack quiet = stack(3, Kind::kNoAnswer);
  quiet.native = "1 thread: 1x S futex_wait_queue";
  ddprun::NodeStacks n{1, "hostb", 2, 3, {stack(2, Kind::kStack, kAllReduce), quiet}};
  n.ranks[1].local_rank = 1;
  const std::string line = ddprun::encode_node_stacks(n);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  auto back = ddprun::decode_node_stacks(line);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->node, 1);
  EXPECT_EQ(back->host, "hostb");
  EXPECT_EQ(back->first_rank, 2);
  EXPECT_EQ(back->nranks, 3);
  ASSERT_EQ(back->ranks.size(), 2u);
  EXPECT_EQ(back->ranks[0].rank, 2);
  EXPECT_EQ(back->ranks[0].pid, 1002);
  EXPECT_EQ(back->ranks[0].kind, Kind::kStack);
  EXPECT_EQ(back->ranks[0].text, kAllReduce);
  EXPECT_EQ(back->ranks[0].signature(), n.ranks[0].signature());
  EXPECT_EQ(back->ranks[1].local_rank, 1);
  EXPECT_EQ(back->ranks[1].kind, Kind::kNoAnswer);
  EXPECT_EQ(back->ranks[1].native, quiet.native);
  EXPECT_EQ(back->ranks[1].signature(), "no answer");
}

// A dump too long for its share is cut at a line, with a note; its signature (the main
// thread, written last) is still the whole dump's. Bytes that are not UTF-8 do not throw.
TEST(NodeStacks, ALongDumpIsCutButItsSignatureIsWhole) {
  std::string text = "Thread 0x00007f6455bc4701 (most recent call first):\n  File \"/job/\xff\xfe.py\", line 1 in odd\n\n";
  for (int i = 0; i < 400; ++i)
    text += "Thread 0x00007f6455bc4700 (most recent call first):\n  File \"/x/helper.py\", line 1 in spin\n\n";
  text += kAllReduce;
  ddprun::NodeStacks n{0, "hosta", 0, 1, {stack(0, Kind::kStack, text)}};
  const std::string line = ddprun::encode_node_stacks(n, 8192);
  EXPECT_LT(line.size(), 8192u + 1024u);
  auto back = ddprun::decode_node_stacks(line);
  ASSERT_TRUE(back);
  const std::string& cut = back->ranks[0].text;
  EXPECT_NE(cut.find("(cut here: "), std::string::npos) << cut.substr(cut.size() - 200);
  EXPECT_NE(cut.find("bytes more; the whole dump is in the stacks file on hosta)\n"), std::string::npos);
  EXPECT_EQ(back->ranks[0].signature(), n.ranks[0].signature());
  EXPECT_NE(cut.find("/job/\xef\xbf\xbd\xef\xbf\xbd.py"), std::string::npos) << cut.substr(0, 200);  // U+FFFD twice
}

TEST(NodeStacks, WhatIsNotAnAnswerIsNone) {
  for (const char* bad : {"", "{", "[]", "{\"node\": 1}",
                          "{\"node\": 0, \"host\": \"a\", \"first_rank\": 0, \"nranks\": 1, \"ranks\": [{\"rank\": 0}]}",
                          "{\"node\":0,\"host\":\"a\",\"first_rank\":0,\"nranks\":1,\"ranks\":[{\"rank\":0,\"local_rank\":0,\"pid\":1,"
                          "\"kind\":9,\"signature\":\"\",\"text\":\"\",\"native\":\"\"}]}",
                          "{\"node\":0,\"host\":\"a\",\"first_rank\":0,\"nranks\":2147483647,\"ranks\":[]}",
                          "{\"node\":0,\"host\":\"a\",\"first_rank\":-4,\"nranks\":1,\"ranks\":[]}"})
    EXPECT_FALSE(ddprun::decode_node_stacks(bad)) << bad;
  EXPECT_TRUE(ddprun::decode_node_stacks("{\"node\":0,\"host\":\"a\",\"first_rank\":8,\"nranks\":8,\"ranks\":[]}"));
}

// The node that asked, with the answers of some nodes: its own ranks had exited, node 1's
// answered (rank 3 elsewhere), node 2 did not answer. Every rank of the job is accounted for.
TEST(NodeStacks, TheJobWideViewAccountsForEveryRank) {
  ddprun::Options o;
  o.nproc_per_node = 2;
  o.stack_dumps = false;  // (no bootstrap needed: no worker is signalled here)
  ddprun::StackDumps dumps(o, "hosta");
  const std::string what = "dump 1 asked on node 0 (hosta)";
  EXPECT_EQ(dumps.on_demand({}, "/nonexistent", what, "SIGQUIT"), "");  // no worker running here
  ddprun::JobPlan plan;
  plan.group_rank = 0;
  plan.group_world_size = 3;
  plan.rank_base = 0;
  plan.world_size = 6;
  ddprun::NodeStacks b{1, "hostb", 2, 2, {stack(2, Kind::kStack, kAllReduce), stack(3, Kind::kStack, kSleeping)}};
  const std::string out =
      dumps.job_wide(ddprun::rdzv::DumpAnswers{what, {ddprun::encode_node_stacks(b), "not an answer"}, 2, 3000ms},
                     plan, "/nonexistent");
  EXPECT_EQ(out,
            "[ddprun] where each rank of the job is (main thread, innermost frame first):\n"
            "  ranks 0-1: not running on its node\n"
            "  ranks 4-5: no answer from its node\n"
            "  rank 2: all_reduce (distributed_c10d.py:1536) <- step (train.py:20) <- main (train.py:40) <- "
            "<module> (train.py:44)\n"
            "  rank 3: stall (train.py:12) <- step (train.py:19)\n"
            "  no rank stands out by majority, but rank 3 is not in a torch.distributed call (rank 2 is)\n");
  // Its stacks were shown: a second view of the same dump is empty.
  EXPECT_EQ(dumps.job_wide(ddprun::rdzv::DumpAnswers{what, {}, 2, 0ms}, plan, "/nonexistent"), "");
}

ddprun::JobPlan plan_of(int node, int nodes, int per_node) {
  ddprun::JobPlan plan;
  plan.group_rank = node;
  plan.group_world_size = nodes;
  plan.rank_base = node * per_node;
  plan.world_size = nodes * per_node;
  return plan;
}

// A failure on node 1 (its only rank, 1) asked the other four nodes: the summary's note
// shows every other rank of the job (rank 1 left out, not missing), names the node of the
// rank that stands out, and shows the silent node's rank as such. Nothing is printed then.
TEST(NodeStacks, AFailuresNoteShowsEveryOtherRankOfTheJob) {
  ddprun::Options o;
  o.nproc_per_node = 1;
  ddprun::StackDumps dumps(o, "hostb");
  const std::string what = "failure on node 1 (hostb)";
  ddprun::WorkerResult root;
  root.rank = 1;
  root.pid = 1001;
  EXPECT_FALSE(dumps.failure_seen());
  dumps.at_failure({}, root, "/nonexistent", what);  // no other rank on this node
  EXPECT_TRUE(dumps.failure_seen());
  auto node = [](int n, const char* host, Kind kind, const char* text) {
    return ddprun::encode_node_stacks(ddprun::NodeStacks{n, host, n, 1, {stack(n, kind, text)}});
  };
  const auto plan = plan_of(1, 5, 1);
  EXPECT_EQ(dumps.job_wide(ddprun::rdzv::DumpAnswers{what,
                                                     {node(0, "hosta", Kind::kStack, kAllReduce),
                                                      node(2, "hostc", Kind::kStack, kAllReduce),
                                                      node(3, "hostd", Kind::kStack, kSleeping)},
                                                     4, 2000ms},
                           plan, "/nonexistent"),
            "");
  EXPECT_EQ(dumps.failure_note(),
            "Where the other ranks of the job were (main thread, innermost frame first):\n"
            "  ranks 0, 2: all_reduce (distributed_c10d.py:1536) <- step (train.py:20) <- main (train.py:40) <- "
            "<module> (train.py:44)\n"
            "  rank 3: stall (train.py:12) <- step (train.py:19)\n"
            "  rank 4: no answer from its node\n"
            "  rank 3 not where the others are: on node 3 (hostd)\n");
}

// Ranks whose node did not answer never make the ranks that were seen stand out: nodes 1
// and 2 are silent; before, their two ranks were the majority and rank 0 "stood out".
TEST(NodeStacks, ASilentNodesRanksMakeNoOneStandOut) {
  ddprun::Options o;
  o.nproc_per_node = 1;
  o.stack_dumps = false;
  ddprun::StackDumps dumps(o, "hosta");
  const std::string what = "dump 1 asked on node 0 (hosta)";
  dumps.on_demand({}, "/nonexistent", what, "SIGQUIT");
  const std::string out = dumps.job_wide(ddprun::rdzv::DumpAnswers{what, {}, 2, 3000ms}, plan_of(0, 3, 1),
                                         "/nonexistent");
  EXPECT_EQ(out,
            "[ddprun] where each rank of the job is (main thread, innermost frame first):\n"
            "  ranks 1-2: no answer from its node\n"
            "  rank 0: not running on its node\n"
            "  every rank is at the same place\n");
}

// A dump's name tells every node what it is for: its kind reads back from it.
TEST(NodeStacks, ADumpsNameTellsItsKind) {
  using ddprun::DumpKind;
  EXPECT_EQ(ddprun::dump_name(DumpKind::kOnDemand, 1, "hostb", 2), "dump 2 asked on node 1 (hostb)");
  EXPECT_EQ(ddprun::dump_name(DumpKind::kHang, 0, "hosta"), "hang on node 0 (hosta)");
  EXPECT_EQ(ddprun::dump_name(DumpKind::kFailure, 3, "hostd"), "failure on node 3 (hostd)");
  for (auto kind : {DumpKind::kOnDemand, DumpKind::kHang, DumpKind::kFailure})
    EXPECT_EQ(ddprun::dump_kind(ddprun::dump_name(kind, 7, "h", 1)), kind);
  EXPECT_EQ(ddprun::dump_kind("something else"), DumpKind::kOnDemand);
}

// A node whose ranks all finished answers at once that they did; one that stops answers
// with what it took, nothing if it took none (an answer all the same: no one waits).
TEST(NodeStacks, AFinishedOrStoppingNodeAnswersAtOnce) {
  ddprun::Options o;
  o.nproc_per_node = 2;
  ddprun::StackDumps dumps(o, "hosta");
  auto finished = ddprun::decode_node_stacks(dumps.answer_finished(plan_of(1, 2, 2)));
  ASSERT_TRUE(finished);
  EXPECT_EQ(finished->first_rank, 2);
  ASSERT_EQ(finished->ranks.size(), 2u);
  EXPECT_EQ(finished->ranks[1].rank, 3);
  EXPECT_EQ(finished->ranks[1].signature(), "finished (exit code 0), its node waits for the others");
  auto stopping = ddprun::decode_node_stacks(dumps.answer_while_stopping(plan_of(1, 2, 2)));
  ASSERT_TRUE(stopping);
  EXPECT_EQ(stopping->nranks, 2);
  EXPECT_TRUE(stopping->ranks.empty());
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
