// How the nodes of a job meet and keep in step, as the supervisor sees it:
//   one node alone (--standalone, --nnodes 1): rendezvous.cpp, no network
//   every multi-node job: the rendezvous of src/rendezvous/ over a backend
//   (rendezvous_nodes.cpp): static (--node-rank; node 0's store; the node count and
//   ranks fixed), c10d (a store at --rdzv-endpoint), etcd. One liveness (leases), one
//   exit barrier, one failure path for all three.
//
// A job is a sequence of rounds. For each, the supervisor calls next_round(), runs the
// workers while watching notify_fd(), and when the round ends (its workers, another node,
// a signal) asks restart_refused() whether another may follow.
//
// Never blocked by the network: while workers run, the supervisor's calls return at once
// (end_round, arrive_exit, round_end); what they start goes on in the rendezvous's own
// threads, and how a round ends comes back through notify_fd. next_round() may block (the
// supervisor runs it on a thread of its own, and cancel() stops it); finish() takes a
// deadline when the node is stopping on a signal.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/options.hpp"
#include "launcher/worker.hpp"
#include "rendezvous/dynamic.hpp"
#include "rendezvous/events.hpp"

namespace ddp::detail {
class StoreServer;
}

namespace ddprun {

using rdzv::DumpAnswers;
using rdzv::FinishKind;
using rdzv::RoundEnd;
using Deadline = std::chrono::steady_clock::time_point;

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
  // other nodes in the background, before anything this node does in the rendezvous next
  // (the next round's join); never blocks, never throws.
  virtual void end_round(RoundEnd::Kind kind, const std::string& what) = 0;
  // Every worker of this node succeeded. Returns how the round ended when that is known
  // now (a single node); nullopt: the node waits, with no fixed timeout, for notify_fd
  // (every node done, or a failure or loss elsewhere). Never blocks.
  virtual std::optional<RoundEnd> arrive_exit() = 0;
  // "" when another round may follow `end`; else why not (restarts used up, too few
  // nodes, lost contact...). Called once the workers are gone; may wait for the backend
  // (bounded by its timeout).
  virtual std::string restart_refused(const RoundEnd& end) = 0;
  // While this round's workers are being stopped, asks in the background whether another
  // round may follow `end` and, if so, starts joining it (the next next_round() returns
  // it; restart_refused() then returns the answer). Until next_round() only end_round(),
  // restart_refused() and finish() may be called. A single node: nothing to do ahead.
  virtual void prejoin(const RoundEnd& end) { (void)end; }
  // Whether next_round() may wait for other nodes or the network (a single static node
  // never does: the supervisor then joins on its own thread, paying nothing for a thread).
  virtual bool joins_over_network() const { return true; }
  // Makes a next_round() in progress on another thread stop soon (it throws).
  virtual void cancel() {}
  // Asks the other nodes of the running round to show their ranks' stacks, naming the dump
  // `what` (posted: never blocks). A single node: nobody to ask.
  virtual void ask_dump(const std::string& what) { (void)what; }
  // The dumps other nodes asked for (each its `what`), once notify_fd was readable.
  virtual std::vector<std::string> dump_requests() { return {}; }
  // This node's answer to the dump `what` another node asked for (posted: never blocks).
  virtual void answer_dump(const std::string& what, const std::string& answer) {
    (void)what;
    (void)answer;
  }
  // Gathers the answers of the other `nodes` nodes to the dump `what` this node asked for,
  // in the background, until all came or `deadline`; notify_fd then wakes the caller
  // (dump_answers). Never blocks.
  virtual void gather_dump(const std::string& what, size_t nodes, Deadline deadline) {
    (void)what;
    (void)nodes;
    (void)deadline;
  }
  virtual std::vector<DumpAnswers> dump_answers() { return {}; }
  // --hang-timeout across nodes: adds delta (1: this node's ranks made progress, 0: just
  // look) to the round's job-wide progress count, in the background (never blocks; a call
  // while the last one is still out is dropped). job_progress() is the count as last
  // heard (nullopt: none yet, or a single node).
  virtual void note_progress(int64_t delta) { (void)delta; }
  struct JobProgress {
    int64_t count = 0;
    std::chrono::steady_clock::time_point read_at;  // when the rendezvous said so
  };
  virtual std::optional<JobProgress> job_progress() { return std::nullopt; }
  // The job is over for this node. Never throws. reason: why the job failed (kJobFailed),
  // or why this node stops (kNodeStopped: the store's host closes the job with it). With a
  // deadline, returns by then: a note to the others that has not gone out is given up
  // (they notice this node's absence within their keep-alive window).
  virtual void finish(FinishKind kind, const std::string& reason, std::optional<Deadline> deadline) = 0;
};

// The warning for a note given up at a finish() deadline.
std::string unsent_note();

// Hosts the store or connects to it, as the options say. hostname: this machine's.
std::unique_ptr<Rendezvous> make_rendezvous(const Options& o, const std::string& hostname);

// A multi-node job's rendezvous, static or dynamic (rendezvous_nodes.cpp).
std::unique_ptr<Rendezvous> make_node_rendezvous(const Options& o, const std::string& hostname);

// Hosts the workers' store on every interface at o.master_port (--standalone: a free port);
// a port in use is an error that names its holder and the flag the port came from.
std::unique_ptr<ddp::detail::StoreServer> host_master_store(const Options& o);

}  // namespace ddprun
