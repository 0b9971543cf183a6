// Every rank's stack: what a worker's dump looks like once read back, and how ddprun shows
// many of them (docs/stacks.md). Pure text work, no processes: the unit tests cover it.
//
// A Python worker started by ddprun carries a bootstrap (share/ddprun/python/
// sitecustomize.py) that registers faulthandler on kWorkerSignal, all threads, writing to a
// file of its own; stack_dump.hpp asks the workers and reads those files back.
#pragma once

#include <sys/types.h>

#include <csignal>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddprun {

// What ddprun sends a worker that announced its bootstrap. SIGURG: its default action is
// to ignore it (a worker without the bootstrap never dies of it), and no torchrun user or
// scheduler sends it for anything else.
inline constexpr int kWorkerSignal = SIGURG;

// The first line the bootstrap writes into its file: "ddprun-stacks pid=<pid>\n".
inline constexpr const char* kAnnounce = "ddprun-stacks pid=";
// Where a rank is that fails on an uncaught exception (its traceback tells where, in its output).
inline constexpr const char* kFailingOnAnException = "failing: an uncaught exception (its traceback is in its output)";
inline constexpr const char* kNoPythonFrame = "<no Python frame: its Python starts or exits>";

struct Frame {
  std::string file, func;
  int line = 0;
};

struct ThreadStack {
  std::string header;         // "Thread 0x7f.. (most recent call first):"
  std::vector<Frame> frames;  // innermost first, as faulthandler writes them
  bool current = false;       // "Current thread": the one that ran the handler
  bool cut = false;           // its "  ..." line: deeper than faulthandler writes (100 frames)
};

// A C++ worker's answer (libddp, src/collectives/native_stack.cpp: a "Native thread <tid>
// (most recent call first):" line, then glibc's "path(symbol+0x1f)[0x7f..]" lines) made
// readable: one "  <demangled function> (<library>)" line per frame ("??" when the symbol is
// not exported). Other text is returned as it is.
std::string readable_native(const std::string& text);

// faulthandler's all-threads text, split into threads (also readable_native's). Lines it does not know (a
// "<no Python frame>" line, a cut-off tail) are skipped. The main thread is the last one.
std::vector<ThreadStack> parse_faulthandler(const std::string& text);

// The stack of the crash in a bootstrap's file (faulthandler at a fatal signal: "Fatal Python
// error: <fatal>" then every thread), the last one there, if it is of that signal
// (faulthandler's name for it, "Segmentation fault"): the crashing thread's frames as
// faulthandler writes them, innermost first, a frame repeated in a row written once (as
// Python's tracebacks do), `depth` lines at most, under a heading that names `file`; the
// main thread's when the crashing one ran no Python (a native library's thread). "" when
// the file holds no such crash.
std::string crash_stack(const std::string& text, const std::string& fatal, const std::string& file, size_t depth = 30);

// faulthandler's name of a fatal signal it dumps at ("Segmentation fault"); "" for others.
std::string fatal_signal_name(int sig);

// "all_reduce (distributed_c10d.py:1536) <- step (job.py:20)": the innermost `depth`
// frames of the thread, file names without folders; "" when it has none.
std::string innermost(const ThreadStack& t, size_t depth = 4);

constexpr size_t kMostForked = 16;  // the forked processes asked per rank: a DataLoader's workers, say

// One rank's answer to a stack request.

struct RankStack {
  int rank = 0, local_rank = 0;
  pid_t pid = -1;
  enum class Kind { kStack, kIncomplete, kNoAnswer, kNoBootstrap, kExited } kind = Kind::kNoAnswer;
  std::string text;    // faulthandler's dump (kStack, kIncomplete)
  std::string native;  // the kernel's view of its threads, when there is no dump
  std::string given;   // its signature as the node that took it said (an answer from another node)
  // The answers of the processes it forked (a DataLoader's workers; on demand and at a hang,
  // on this node): each with the rank's numbers and its own pid.
  std::vector<RankStack> forked;
  size_t forked_not_asked = 0;  // past kMostForked

  // What grouping and majorities compare: the main thread's innermost frames, or why
  // there is none ("no answer", "no Python bootstrap", "exited"); `given` when set.
  std::string signature(size_t depth = 4) const;
};

// "0, 2-3, 7" (sorted, duplicates dropped).
std::string rank_ranges(std::vector<int> ranks);

// Ranks grouped by signature, the biggest group first (ties: lowest rank first).
std::vector<std::pair<std::string, std::vector<int>>> group_by_signature(const std::vector<RankStack>& stacks);

// One line per group: "  ranks 0, 2-3: <signature>".
std::string where_lines(const std::vector<RankStack>& stacks, const std::string& indent = "  ");

// The ranks whose signature differs from the biggest group's, when one group holds more
// than half of the ranks; every rank's group otherwise is a tie and nothing is singled out.
std::vector<int> outliers(const std::vector<RankStack>& stacks);

// "rank 2 not where the others are", "every rank is at the same place", or "no rank stands
// out (no majority)".
std::string standing_out(const std::vector<RankStack>& stacks);

// A node's answer to a stack dump another node asked for (docs/stacks.md, "Several nodes"):
// its ranks' stacks, as its take_stacks returned them.
struct NodeStacks {
  int node = 0;  // its node rank in the round
  std::string host;
  int first_rank = 0, nranks = 0;  // the global ranks it runs: [first_rank, first_rank + nranks)
  std::vector<RankStack> ranks;    // those that were running
};
// One line of JSON (no newline) with each rank's signature; a rank's dump longer than its
// share of `budget` bytes is cut (at a line, with a note that says so).
std::string encode_node_stacks(const NodeStacks& n, size_t budget = size_t{1} << 20);
// nullopt: not such a line.
std::optional<NodeStacks> decode_node_stacks(const std::string& line);

// The libddp collective a rank is in, or last finished (collectives/progress_record.hpp),
// as read from its record.
struct RankCollective {
  int rank = 0;
  std::string op;        // "all_reduce"
  uint64_t number = 0;   // its number on this rank (1: the first)
  bool in_flight = false;
  uint64_t bytes = 0;
  std::string backend;   // "cpu", "nccl"
  double seconds = 0;    // since it started
};

// One line per group of ranks at the same place, the biggest first, then (when one group
// holds more than half) which ranks are elsewhere:
//   "  ranks 0, 2-3: all_reduce #1543 in flight for 12.0 s (4 B, cpu)"
//   "  rank 1: all_reduce #1542 done, started 12.0 s ago"
//   "  rank 1 is at all_reduce #1542 done, the others at all_reduce #1543 in flight"
// "" when no rank has a record.
std::string collective_lines(const std::vector<RankCollective>& ranks, const std::string& indent = "  ");

// Every rank's full dump, each line behind its rank's prefix (`prefixes[i]` for
// stacks[i]), for ddprun's output on demand; with `forked`, each rank's forked processes'
// after it (for the saved files: the output has their where lines only).
std::string full_dump(const std::vector<RankStack>& stacks, const std::vector<std::string>& prefixes,
                      bool forked = false);

}  // namespace ddprun
