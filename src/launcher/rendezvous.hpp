// How the nodes of a job meet and keep in step, as the supervisor sees it. Two kinds:
//   static   (--rdzv-backend static, --standalone): node 0 hosts the store, --node-rank
//            orders the nodes, every node restarts together (rendezvous.cpp)
//   dynamic  (--rdzv-backend c10d): rounds over a backend; nodes come and go
//            (rendezvous_dynamic.cpp over src/rendezvous/)
//
// A job is a sequence of rounds (static: attempts). For each, the supervisor calls
// next_round(), runs the workers while watching notify_fd(), and when the round ends
// (its workers, another node, a signal) asks restart_refused() whether another may follow.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "launcher/options.hpp"
#include "launcher/worker.hpp"
#include "rendezvous/dynamic.hpp"
#include "rendezvous/events.hpp"

namespace ddprun {

using rdzv::FinishKind;
using rdzv::RoundEnd;

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  // Joins the next round (the first call: the first); blocks until it starts.
  virtual JobPlan next_round() = 0;
  // Readable when the running round ends elsewhere (-1: a single static node, never).
  virtual int notify_fd() = 0;
  // Called when notify_fd is readable: how the round ended (nullopt: a stale wake-up).
  virtual std::optional<RoundEnd> round_end() = 0;
  // This node ends the round: kFailed (a worker failed) or kLeft (a signal). Tells the
  // other nodes; never throws.
  virtual void end_round(RoundEnd::Kind kind, const std::string& what) = 0;
  // Every worker of this node succeeded. Returns how the round ended when that is known
  // now (static rendezvous waits here for every node); nullopt: wait for notify_fd.
  virtual std::optional<RoundEnd> arrive_exit() = 0;
  // "" when another round may follow `end`; else why not (restarts used up, too few
  // nodes, lost contact...).
  virtual std::string restart_refused(const RoundEnd& end) = 0;
  // Starts joining the next round now, while this round's workers are being stopped (the
  // next next_round() returns it). Only after restart_refused() said yes; until next_round()
  // only end_round() and finish() may be called. Static rendezvous: nothing to do ahead.
  virtual void prejoin() {}
  // The job is over for this node. Never throws.
  virtual void finish(FinishKind kind, const std::string& reason) = 0;
};

// Hosts the store or connects to it, as the options say. hostname: this machine's.
std::unique_ptr<Rendezvous> make_rendezvous(const Options& o, const std::string& hostname);

// The dynamic rendezvous (rendezvous_dynamic.cpp).
std::unique_ptr<Rendezvous> make_dynamic_rendezvous(const Options& o, const std::string& hostname);

}  // namespace ddprun
