// The "events" log as the dynamic rendezvous's caller thread reads it (joining, ending,
// leaving; dynamic.hpp): the lines that still matter (EventsTail), and the nodes it has
// seen lost (the latest LostIds::kKept). The watcher reads the same log on its own backend.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "rendezvous/dynamic_util.hpp"

namespace ddprun::rdzv::detail {

class NodeEvents {
 public:
  explicit NodeEvents(Backend& b) : b_(b) {}

  // What came since the last read.
  void read() { fetch(false, {}); }
  // Until something happens to the job (the state changed for waiting nodes, a node was
  // lost, ...), or `t`.
  void wait(Clock::time_point t) { fetch(true, t); }

  const EventsTail& tail() const { return tail_; }
  const std::vector<std::string>& lines() const { return tail_.lines(); }
  size_t count() const { return tail_.count(); }
  void keep_from(int64_t round) { tail_.keep_from(round); }
  const std::set<std::string>& lost() const { return lost_.set(); }
  size_t lost_seen() const { return lost_.inserted(); }  // every loss read, the forgotten too

 private:
  void fetch(bool wait, Clock::time_point t) {
    for (;;) {
      size_t skip = 0;
      auto more = next_events(b_, tail_, wait, until(t), skip);
      if (!skip) return take(more);
      tail_.skip_to(skip);  // behind a trim: on from the first line held
    }
  }
  void take(const std::vector<std::string>& more) {
    for (auto& l : more)
      if (l.starts_with("lost ")) lost_.insert(parse_event(l).node);  // only lost lines need parsing here
    tail_.add(more);
  }

  Backend& b_;
  EventsTail tail_;
  LostIds lost_;  // the latest LostIds::kKept
};

}  // namespace ddprun::rdzv::detail
