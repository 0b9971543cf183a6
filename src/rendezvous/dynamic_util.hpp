// Helpers shared by the dynamic rendezvous's parts (dynamic.hpp). Internal to src/rendezvous/.
#pragma once

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ddp/error.hpp"
#include "rendezvous/backend.hpp"
#include "rendezvous/events.hpp"
#include "rendezvous/state.hpp"

namespace ddprun::rdzv::detail {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

inline std::string exit_log(int64_t r) { return fmt::format("exit/{}", r); }

inline std::string seconds_text(milliseconds d) { return ddp::format_duration(d); }

// "--nnodes 2" (a fixed count) or "--nnodes 1:4".
inline std::string nnodes_flag(const JobSettings& j) {
  return j.min_nodes == j.max_nodes ? fmt::format("--nnodes {}", j.max_nodes)
                                    : fmt::format("--nnodes {}:{}", j.min_nodes, j.max_nodes);
}

// "only 1 node remains, fewer than the 2 the job needs (--nnodes 2:3)"
inline std::string too_few_text(size_t available, const JobSettings& j) {
  return fmt::format("only {} node{} remain{}, fewer than the {} the job needs ({})", available,
                     available == 1 ? "" : "s", available == 1 ? "s" : "", j.min_nodes, nnodes_flag(j));
}

// What the others do without a node cut off from the rendezvous (`others`: who they are),
// as that node's own line says it.
inline std::string without_this_node(bool fixed, const char* others) {
  return fixed ? std::string("a static job cannot go on without a node: it stops, unless one with this --node-rank "
                             "takes its place within --rdzv-conf replace_timeout")
               : fmt::format("{} go on without this one as far as --nnodes MIN and --max-restarts allow", others);
}

// What a refusal for too few nodes adds: the way to wait for newcomers instead.
inline constexpr const char* kReplaceHint =
    " (--rdzv-conf replace_timeout=SECONDS would wait for nodes to take their places)";

// The first `most` items, then how many more: an error about a thousand nodes stays a
// line to read (it listed every node: 25 kB).
template <class T, class Text>
std::string list_some(const std::vector<T>& items, Text text, size_t most = 16) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < most; ++i) {
    if (i > 0) out += ", ";
    out += text(items[i]);
  }
  if (items.size() > most) out += fmt::format(" and {} more", items.size() - most);
  return out;
}

inline std::string describe_nodes(const std::vector<NodeDesc>& nodes) {
  return list_some(nodes, [](const NodeDesc& n) { return n.describe(); });
}

// Test-only fault injection (the issue 19 tests kill a node between two of its writes):
// DDPRUN_TEST_FAULT=<point> makes this process die with SIGKILL right after that point.
inline void fault_point(const char* point) {
  static const char* fault = std::getenv("DDPRUN_TEST_FAULT");
  if (fault && std::strcmp(fault, point) == 0) ::raise(SIGKILL);
}

// Test-only: DDPRUN_TEST_PAUSE=<point> makes the thread that passes that point sleep 300 ms
// there, holding a race's window open (read at every pass: the points are rare).
inline void test_pause(const char* point) {
  const char* pause = std::getenv("DDPRUN_TEST_PAUSE");
  if (pause && std::strcmp(pause, point) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
}

// The events after those `tail` has read: waiting up to `timeout` for one (wait), or not
// (read). A tail that fell behind a trim skips to the first line held: what was dropped
// was of rounds before every reader's (docs/design.md, "State that does not grow").
inline std::vector<std::string> next_events(Backend& b, const EventsTail& tail, bool wait, milliseconds timeout,
                                            size_t& skip_to) {
  try {
    return wait ? b.wait("events", tail.count(), timeout) : b.read("events", tail.count());
  } catch (const LogTrimmed& e) {
    if (e.first() <= tail.count()) throw;
    skip_to = e.first();
    return {};
  }
}

// Who passed round r's exit barrier before being lost (their lost lines do not count).
inline std::set<std::string> exited_before_lost(Backend& b, int64_t r) {
  std::set<std::string> exited, lost;
  for (auto& l : b.read(exit_log(r), 0)) {
    Event e = parse_event(l);
    if (e.kind == "lost") lost.insert(e.node);
    else if (!lost.count(e.kind)) exited.insert(e.kind);  // an exit line is the node's id alone
  }
  return exited;
}

// Round r is over for every member of the round after it: that round's rank 0 removes r's
// exit log and counts (dynamic.cpp), so that a long job's rendezvous holds a few rounds, not
// all of them.
void forget_round(Backend& b, int64_t r);

// Jittered exponential backoff after a lost compare-and-set: the writers thin out.
void backoff(int attempt);

inline milliseconds until(std::chrono::steady_clock::time_point t) {
  return std::max(0ms, std::chrono::duration_cast<milliseconds>(t - std::chrono::steady_clock::now()));
}

}  // namespace ddprun::rdzv::detail
