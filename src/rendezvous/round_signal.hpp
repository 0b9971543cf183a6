// What the dynamic rendezvous's three threads share (dynamic.hpp): the round the caller is
// in, how that round ended or why this node is cut off, the stack dumps other nodes
// asked for, and the answers to this node's. The watcher and the keeper report here; fd() wakes the caller.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/events.hpp"

namespace ddprun::rdzv::detail {

using Members = std::shared_ptr<const std::vector<NodeDesc>>;  // shared, not copied, by every reader

class RoundSignal {
 public:
  RoundSignal();
  ~RoundSignal();
  RoundSignal(const RoundSignal&) = delete;
  RoundSignal& operator=(const RoundSignal&) = delete;

  int fd() const { return efd_; }  // readable when an end, a cut-off, a dump request or answers came

  // The caller's side.
  void watch(int64_t round, Members members);  // round -1: between rounds (joining)
  int64_t watched() const;
  std::optional<RoundEnd> take();  // round_end(): the cut-off, else the round's end
  // The caller starts the watched round: fd() is readable again when what it must act on
  // came already (the round's end, a cut-off, dumps asked), even if a take() meanwhile,
  // for the round before, drained it.
  void rearm();
  RoundEnd wait();                 // blocks until there is one (or stop())
  std::optional<RoundEnd> cut_off() const;  // this node cut off (partitioned, the store lost): how
  std::vector<std::string> take_dumps();
  // The round a dump was asked in (-1: not one of the last few asked): its answer goes
  // there, even once this node has left that round (the asker waits in it).
  int64_t dump_round(const std::string& what) const;
  std::vector<DumpAnswers> take_answers();
  void stop();

  // The watcher's and keeper's side. A round's end counts only for the watched round, and
  // only the first; round -1 is this node cut off (it ends every round).
  void notify_end(int64_t round, const RoundEnd& end);
  void add_dumps(int64_t round, const std::vector<std::string>& asked);  // asked in `round`
  void add_answers(DumpAnswers got);  // a gather's (dump_gather.hpp)
  // Waits while round `r` needs no reading (none watched: this node joins one; or it ended
  // with every worker finished, or the job closed); then what is watched now. nullopt:
  // stopping. A round that ended otherwise is still read, for the dumps other nodes ask in
  // it while they stop, until this node leaves it.
  struct Watch {
    int64_t round = -1;
    Members members;
  };
  std::optional<Watch> await(int64_t r);
  bool idle(int64_t r) const;
  bool ended(int64_t r) const;  // round r is watched and its end known
  // Sleeps for d, or until stop(); true when stopping.
  bool sleep(std::chrono::milliseconds d);
  bool stopped() const;
  // Sleeps until stop().
  void until_stopped();

 private:
  bool quiet(int64_t r) const {  // mu_ held
    using K = RoundEnd::Kind;
    return round_ == r && (r < 0 || (end_ && (end_->kind == K::kDone || end_->kind == K::kClosed)));
  }
  void wake();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t round_ = -1;
  Members members_;
  std::optional<RoundEnd> end_;      // the watched round's end, once seen
  std::optional<RoundEnd> problem_;  // partitioned / store lost: ends every round
  std::vector<std::string> dumps_;   // dumps other nodes asked for, not yet taken
  std::deque<std::pair<std::string, int64_t>> asked_in_;  // the last few asked, and their rounds
  std::vector<DumpAnswers> answers_;  // answers to this node's dumps, not yet taken
  bool stop_ = false;
  int efd_ = -1;
};

}  // namespace ddprun::rdzv::detail
