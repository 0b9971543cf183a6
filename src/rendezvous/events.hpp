// What happens to the job, as every node reads it: one append-only log ("events"), one line
// per event. Every node sees the same lines in the same order, and the first line that ends
// a round decides for everyone (restart counted or not, done).
//
//   state                        the state changed in a way waiting nodes care about
//   lost <node> <why>            that node's lease ended: it died or fell silent
//   <R> fail <node> <text>       a worker failed on that node (counted restart)
//   <R> leave <node> <text>      that node is stopping (a signal) (counted)
//   <R> join <node> <text>       a node waits to join: restart into a bigger round
//   <R> done <node>              every member's workers succeeded: the job is over
//   <R> dump <node> <what>       that node asks every node to show its ranks' stacks (no end)
//   closed <node> <reason>       that node closed the job (no round follows): ends any round
//
// "lost" lines name no round: the lease line is registered once, when the node starts, and
// applies to whichever round the node is then a member of. They do not count for a node
// whose workers already succeeded in that round (it passed the exit barrier, then went).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
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
  // This node alone is cut off (the others may go on): it stops, and says why once at the end.
  bool node_only() const { return kind == Kind::kPartitioned || kind == Kind::kStoreLost; }
  std::string describe() const;
};

// The other nodes' answers to a stack dump this node asked for (gather_dump): each node's
// answer as it wrote it (answer_dump), those that came by the deadline.
struct DumpAnswers {
  std::string what;                  // the dump, as ask_dump named it
  std::vector<std::string> answers;  // one per node that answered
  size_t asked = 0;                  // how many nodes were asked
  std::chrono::milliseconds took{0};  // from the ask to the last answer (or the deadline)
};

struct Event {
  int64_t round = -1;  // -1: not about one round (state, lost, closed)
  std::string kind, node, text;
};
Event parse_event(const std::string& line);
std::string round_event(int64_t round, const std::string& kind, const std::string& node, const std::string& text);
std::string lost_event(const std::string& node);  // the lease line (the backend adds why)
// The job's end: "closed <node> <reason>" (written once, by the node that closed it).
std::string closed_event(const std::string& node, const std::string& reason);

// The nodes seen lost, the latest kKept of them. A lost node matters while something may
// still name it (a round's member list, a pending join); one lost a thousand losses ago is
// long gone (a node thawed that late finds its own lease ended). Keeping every one grew an
// agent by about 2 KB for each node that came and went (a job on preemptible nodes).
class LostIds {
 public:
  static constexpr size_t kKept = 1024;
  // Adds id; returns the id it forgot to keep within kKept, if any.
  std::optional<std::string> insert(const std::string& id);
  bool count(const std::string& id) const { return set_.count(id) > 0; }
  const std::set<std::string>& set() const { return set_; }
  // How many were ever added: grows with every new loss, when the set's size no longer does.
  size_t inserted() const { return inserted_; }

 private:
  size_t inserted_ = 0;
  std::set<std::string> set_;
  std::deque<std::string> order_;  // oldest first
};

// The "events" log as one process needs it: how many lines it has read (where the next read
// starts) and only the lines that can still matter: lost and closed lines, and the lines of
// rounds from keep_from() on ("state" wake-ups and older rounds are dropped; lost lines
// beyond the latest LostIds::kKept too). So what a process holds does not grow with the
// job's age.
class EventsTail {
 public:
  size_t count() const { return count_; }
  void add(const std::vector<std::string>& lines);
  void keep_from(int64_t round);
  // The log's lines before `line` were dropped (Backend::trim_log) before this tail read
  // them: the next read starts at `line`.
  void skip_to(size_t line) { count_ = std::max(count_, line); }
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  size_t count_ = 0;
  int64_t keep_from_ = -1;
  size_t lost_lines_ = 0;  // of lines_
  std::vector<std::string> lines_;
};

// Reads events for one round as they come. Lines of other rounds are skipped; "lost" lines
// are remembered across rounds (a member lost before its round began still ends it); a
// "closed" line ends any round.
class RoundReader {
 public:
  // Starts reading round `round` with these members; earlier lost lines still count.
  void start(int64_t round, std::vector<NodeDesc> members);
  // The same, sharing the list (a thousand members are not copied for every reader).
  void start(int64_t round, std::shared_ptr<const std::vector<NodeDesc>> members);
  // Feeds new lines; returns the round's end once there is one (then always the same).
  std::optional<RoundEnd> feed(const std::vector<std::string>& lines);
  // Nodes that passed this round's exit barrier: their lost/leave lines do not count.
  // While a member's lost/leave line waits for this (needs_exited), the round's end is not
  // judged: call it, and the end is judged again.
  void set_exited(std::set<std::string> exited);
  bool needs_exited() const { return needs_exited_; }
  std::optional<RoundEnd> reevaluate();
  const std::optional<RoundEnd>& end() const { return end_; }
  const std::set<std::string>& lost() const { return lost_.set(); }

 private:
  std::optional<RoundEnd> judge(const Event& e) const;
  bool member(const std::string& id) const;
  std::string who(const std::string& id) const;

  int64_t round_ = -1;
  std::shared_ptr<const std::vector<NodeDesc>> members_ = std::make_shared<const std::vector<NodeDesc>>();
  std::vector<Event> events_;  // this round's, and lost lines
  LostIds lost_;
  std::set<std::string> exited_;
  std::map<std::string, std::string> lost_why_;  // what each lost line said (of those in lost_)
  std::optional<RoundEnd> end_;
  bool needs_exited_ = false;
};

}  // namespace ddprun::rdzv
