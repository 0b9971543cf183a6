// The dynamic rendezvous's keeper (dynamic.hpp): this node's lease on the backend, renewed
// every keep_alive_interval by a thread of its own. When the node dies or falls silent for
// the lease's ttl, the backend writes "lost <id>" into the events (and into the exit log of
// the round this node is in). A lease that ended, or that no renewal reached for the whole
// window, is reported to the RoundSignal as this node cut off.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "rendezvous/backend.hpp"
#include "rendezvous/round_signal.hpp"

namespace ddprun::rdzv::detail {

class LeaseKeeper {
 public:
  struct Settings {
    std::string me;  // this node's id
    std::string backend;  // describe() of the backend
    milliseconds interval{5000};
    int max_attempt = 3;
    bool fixed = false;  // static membership: nobody goes on without this node
  };
  // Opens the lease (its lost line registered on "events") and starts renewing it.
  LeaseKeeper(std::unique_ptr<Backend> lease, Settings s, RoundSignal& signal);
  // Stops the thread (call signal.stop() first) and closes the lease.
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // If this node dies after its workers succeeded in `round`, its lost line lands in that
  // round's exit log after its exit: the others can tell. One registration at a time: the
  // previous round's is dropped.
  void register_exit(int64_t round);
  // Leaves in good order: the lease ends without its lines written.
  void release();
  // Throws LeaseEnded when this node's lease has ended (it was frozen or cut off for the
  // window: for the others it is gone). A renewal sent within the last half window says it
  // stands (the backend ends a lease only after a whole window without one); else this
  // renews it now (not while the thread's renewals get no answer: a call here would wait as
  // long). Another error leaves the judgement to the keeper's thread.
  void check_alive();
  // No renewal got through for the lease's whole ttl (the backend may have ended it).
  bool overdue() const;

 private:
  void loop();
  // What the others do once this node is cut off: as far as this node can tell, the backend
  // may be the one that went silent (the store's host stopped or cut off from all).
  std::string going_on_without_this_node() const;
  milliseconds ttl() const { return s_.interval * s_.max_attempt; }
  std::chrono::steady_clock::duration since_renewal() const;  // since the last renewal that got through was sent

  std::unique_ptr<Backend> lease_;
  std::mutex mu_;  // lease_: the thread renews it, the caller registers and releases
  Settings s_;
  RoundSignal& signal_;
  int64_t exit_registered_ = -1;  // the round whose exit log holds this node's lease line
  std::atomic<std::chrono::steady_clock::rep> renewed_at_;  // when the last renewal that got through was sent
  std::atomic<bool> ended_{false};      // the lease was found ended (by the thread or check_alive)
  std::atomic<bool> failing_{false};    // the thread's last renewal got no answer
  std::thread thread_;
};

}  // namespace ddprun::rdzv::detail
