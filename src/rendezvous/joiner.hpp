// How a node joins the next round of the dynamic rendezvous (dynamic.hpp): read the state,
// decide (machine.hpp), write it with a compare-and-set, and wait for the others, until
// this node is a member of a complete round. Every write also applies the join and leave
// requests other nodes appended ("requests"); docs/design.md, "Joining at scale".
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ddp/error.hpp"
#include "rendezvous/machine.hpp"
#include "rendezvous/node_events.hpp"
#include "rendezvous/state.hpp"

namespace ddprun::rdzv {
struct DynamicConfig;
}

namespace ddprun::rdzv::detail {

State decode(const Snapshot& s, const std::string& backend_name);

// join()'s error when nodes were lost while the next round formed and fewer than MIN
// remain to form it: the job stops, as the same loss in a running round would stop it.
class TooFewNodes : public ddp::Error {
 public:
  using ddp::Error::Error;
};

class Joiner {
 public:
  // All are the caller's: its backend, its view of the events, and its cancel flag (the
  // join throws within a second of it).
  Joiner(const DynamicConfig& c, Backend& main, NodeEvents& events, const std::atomic<bool>& cancel);

  // The state of the complete round this node is a member of; throws when it cannot be
  // (join timeout, the job closed, a mismatch of settings). me: this node as its join
  // request names it (with the worker store it listens on), as it writes itself in.
  // remaining: after a round ended, its members that form the next (this node among them);
  // join throws TooFewNodes when losses leave fewer than MIN of them and of the nodes that
  // joined since (with replace_timeout: when no node came to take their places within it).
  // Empty: this node's first round, which waits for nodes to come.
  // counted_lost: the nodes known lost when `remaining` was counted (restart_refused); a
  // loss since is named as one while the next round formed.
  State join(const NodeDesc& me, Clock::time_point deadline, std::vector<NodeDesc> remaining,
             std::set<std::string> counted_lost);
  // Called at every step: throws LeaseEnded when this node's lease ended (LeaseKeeper::check_alive).
  void set_lease_check(std::function<void()> check) { lease_check_ = std::move(check); }

 private:
  // What this node last read of the state: the snapshot, decoded once; `recheck`: it has
  // waited since, and asks the backend whether the state changed before loading it.
  struct Seen {
    std::optional<Snapshot> snap;
    std::optional<State> state;
    bool recheck = false;
    void reset() {
      snap.reset();
      state.reset();
      recheck = false;
    }
  };
  bool step(Seen& seen, Clock::time_point& deadline, int& conflicts);
  const State& read_state(Seen& seen);
  std::optional<std::vector<std::string>> pending_requests(const State& t, Seen& seen, Clock::time_point deadline);
  std::optional<Absorbed> apply_pending(State& t, const std::vector<std::string>& pending, Seen& seen,
                                        Clock::time_point deadline);
  bool write(Seen& seen, const State& s, const State& t, JoinAction a, bool mine, bool wake, int& conflicts);
  bool defer_to_older(size_t ahead, Seen& seen, Clock::time_point deadline);
  void say_waiting(const State& t);
  void say_forming(const State& t, Clock::time_point now, Clock::time_point deadline);
  std::vector<int> missing_ranks(const std::vector<NodeDesc>& came) const;
  void announce_waiting(const State& t);
  void leave_ended(const State& t);
  void withdraw(const State& t);
  [[noreturn]] void failed(JoinAction a, const State& now);
  std::vector<NodeDesc> joined(const State& s) const;
  void check_not_lost();
  [[noreturn]] void declared_lost(const std::string& why);
  void wait(Seen& seen, const State& t, Clock::time_point now, Clock::time_point deadline);
  void check_enough_left(const State& s, const std::vector<std::string>& pending, Clock::time_point& deadline);
  void wait_for_replacements(const std::vector<NodeDesc>& gone, size_t live, Clock::time_point& deadline);

  const DynamicConfig& c_;
  NodeDesc me_;  // join()'s
  const std::string backend_name_;
  Backend& main_;
  NodeEvents& events_;
  const std::atomic<bool>& cancel_;
  int64_t lc_round_ = -1;  // the round whose last call this node times
  Clock::time_point lc_deadline_{};
  int said_waiting_ = 0;  // 1: said this node waits on the wait list, 2: on the redundancy list
  Clock::time_point join_started_{}, say_forming_at_{};  // say_forming's
  Clock::duration say_forming_every_{};
  bool seen_open_ = false;  // this join read the state before the job was closed
  std::optional<State> timed_out_in_;  // the state when this join timed out listed: asked off
  std::map<std::string, NodeDesc> met_;  // participants of the forming rounds this join read
  int64_t announced_round_ = -1;  // the running round this node asked to restart with it
  bool cheap_probe_ = true;  // the backend tells whether the state changed without a load
  std::function<void()> lease_check_;
  std::vector<NodeDesc> remaining_;      // join()'s
  std::set<std::string> lost_at_start_;  // the nodes known lost when the join began (counted_lost)
  size_t lost_checked_ = 0;              // events_.lost_seen() at the last check_enough_left (none yet: SIZE_MAX)
  bool replacing_ = false;               // fewer than MIN remain: the join waits replace_timeout for newcomers
};

}  // namespace ddprun::rdzv::detail
