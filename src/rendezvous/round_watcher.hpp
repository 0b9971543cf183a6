// The dynamic rendezvous's watcher (dynamic.hpp): a thread that reads the events as they
// come while this node is in a round, and reports the first that ends the round, and the
// stack dumps other nodes ask for, to the RoundSignal. It uses a Backend of its own.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "rendezvous/backend.hpp"
#include "rendezvous/round_signal.hpp"

namespace ddprun::rdzv::detail {

class RoundWatcher {
 public:
  struct Names {
    std::string me;            // this node's id (its own dump requests are not for it)
    std::string backend;       // describe() of the backend, for the store-lost end
    std::string lost_hint;     // appended to "lost the rendezvous at ..."
    bool fixed = false;        // static membership: nobody goes on without this node
    // Whether this node's lease went unrenewed for its whole ttl (LeaseKeeper::overdue).
    std::function<bool()> lease_overdue;
  };
  RoundWatcher(std::unique_ptr<Backend> events, Names names, RoundSignal& signal);
  // Stops the thread: call signal.stop() first.
  ~RoundWatcher();
  RoundWatcher(const RoundWatcher&) = delete;
  RoundWatcher& operator=(const RoundWatcher&) = delete;

 private:
  void loop();
  void note_dumps(int64_t round, const std::vector<std::string>& lines);
  std::string without_address(std::string what) const;
  RoundEnd as_seen_here(RoundEnd end) const;

  std::unique_ptr<Backend> events_;
  Names names_;
  RoundSignal& signal_;
  std::thread thread_;
};

}  // namespace ddprun::rdzv::detail
