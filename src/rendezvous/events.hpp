// What ends a running round, as every node reads it: the round's log ("round/<R>"), one
// line per event, "<kind> <node id> <text>". The first line that counts decides for
// everyone, so every node draws the same conclusion (restart counted or not, done).
//
//   master <id> <addr> <port>   rank 0's worker store for the round (not an end)
//   fail <id> <text>            a worker failed on that node (counted restart)
//   leave <id> <text>           that node is stopping (a signal): it leaves (counted)
//   lost <id> <why>             that node's lease ended: it died or fell silent (counted)
//   join <id> <host>            a node waits to join: restart into a bigger round
//   done <id>                   every node's workers succeeded: the job is over
//
// "lost"/"leave" lines of nodes that already passed the exit barrier (their workers
// succeeded) do not count, nor lines about nodes that are not members of the round.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "rendezvous/state.hpp"

namespace ddprun::rdzv {

struct RoundEnd {
  enum class Kind {
    kDone,         // every node's workers succeeded
    kFailed,       // a worker failed on `node`
    kLeft,         // `node` stopped (a signal)
    kLost,         // `node` died or fell silent
    kScaleUp,      // `node` waits to join
    kPartitioned,  // this node lost contact with the backend
    kStoreLost,    // the rendezvous backend went away
    kClosed,       // the rendezvous was closed
  };
  Kind kind = Kind::kDone;
  std::string node;  // the node the event is about (its id)
  std::string text;  // what happened, for people

  // A failure: uses one of --max-restarts.
  bool counted() const { return kind == Kind::kFailed || kind == Kind::kLeft || kind == Kind::kLost; }
  std::string describe() const;
};

struct LogLine {
  std::string kind, node, text;
};
LogLine parse_line(const std::string& line);
std::string make_line(const std::string& kind, const std::string& node, const std::string& text);

// The first event of `lines` that ends the round, if any.
std::optional<RoundEnd> interpret_round(const std::vector<std::string>& lines, const std::vector<NodeDesc>& members,
                                        const std::set<std::string>& exited);

// The "master" line's address and port, if the log has it.
bool find_master(const std::vector<std::string>& lines, std::string& addr, int& port);

}  // namespace ddprun::rdzv
