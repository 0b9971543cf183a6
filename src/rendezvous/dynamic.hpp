// The dynamic rendezvous (--rdzv-backend c10d, etcd): rounds of nodes formed over a Backend,
// watched while they run, re-formed when a node fails, leaves, is lost or waits to join.
//
//   next_round()    leave the previous round (if any) and join the next; blocks until it is
//                   complete (every node's join names the worker store it would host as
//                   rank 0, so the complete state says where rank 0's is)
//   notify_fd()     readable when the running round ends (round_end() says how)
//   end_round()     this node ends the round: its workers failed, or it got a signal
//   arrive_exit()   this node's workers succeeded; the round ends "done" when every member's
//                   have (or another way): notify_fd, or wait_end()
//   restart_refused()  whether another round may follow an end, and why not
//   finish()        the job is over for this node: close (if the job ended) and leave
// next_round() may run in another thread while the caller stops the old round's workers
// (end_round() and cancel() are safe then; nothing else is).
//
// Threads: the caller's (all of the above), a keeper (renews this node's lease every
// keep_alive_interval: LeaseKeeper) and a watcher (reads the running round's log:
// RoundWatcher), and for a stack dump this node asked of the others, one that gathers their
// answers until its deadline (DumpGatherer). Each uses its own Backend object; they report
// to the caller through a RoundSignal. Joining a round is a Joiner's.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/backend.hpp"
#include "rendezvous/dump_gather.hpp"
#include "rendezvous/events.hpp"
#include "rendezvous/joiner.hpp"
#include "rendezvous/lease_keeper.hpp"
#include "rendezvous/node_events.hpp"
#include "rendezvous/round_signal.hpp"
#include "rendezvous/round_watcher.hpp"
#include "rendezvous/state.hpp"

namespace ddp::detail {
class StoreServer;
}

namespace ddprun::rdzv {

struct DynamicConfig {
  std::string run_id;
  JobSettings job;
  NodeDesc me;
  milliseconds join_timeout{600000};
  milliseconds last_call_timeout{30000};
  milliseconds close_timeout{30000};
  milliseconds keep_alive_interval{5000};
  int keep_alive_max_attempt = 3;
  // A loss that leaves fewer than MIN nodes (restarts remaining): the others wait this long
  // for nodes to take the lost ones' places. Zero: the job stops at once (issue 10's rule).
  milliseconds replace_timeout{0};
  bool hosts_store = false;  // this node's ddprun hosts the rendezvous store: it stays until all left
  // Static (--node-rank): every round's workers use this store (the rendezvous's own, on
  // node 0) instead of one that each round's rank 0 hosts. me.rank is the fixed node rank.
  struct Endpoint {
    std::string addr;
    int port = 0;
  };
  std::optional<Endpoint> worker_store;
  // false (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): rank 0's node hosts no worker store; the port
  // it named, held until the round is complete, is left for its rank 0 worker to listen on.
  bool share_worker_store = true;
  std::string store_lost_hint;  // appended to "lost the rendezvous at ...": what would outlive a node
};

// This node's part in a complete round.
struct RoundPlan {
  int64_t round = 0;
  int group_rank = 0, group_world_size = 1;
  int rank_base = 0, world_size = 1;
  int restart_count = 0;  // counted restarts before this round (the job's, not this node's)
  std::string master_addr;
  int master_port = 0;
  std::vector<NodeDesc> members;  // by node rank
};

enum class FinishKind {
  kSucceeded,    // every node's workers succeeded: close the rendezvous
  kJobFailed,    // no restart may follow: close the rendezvous with the reason
  kNodeStopped,  // only this node stops (a signal, lost contact): the job goes on without it,
                 // unless this node hosts the store: then it closes the rendezvous with the reason
  kJoinFailed,   // this node's join failed (join timeout, too few nodes): nothing is closed, the
                 // others learn how their own joins end
};

class DynamicRendezvous {
 public:
  using Clock = std::chrono::steady_clock;
  // main: the caller's backend; events: the watcher's; lease: the keeper's (it opens the
  // lease). All three serve the same run.
  DynamicRendezvous(DynamicConfig c, std::unique_ptr<Backend> main, std::unique_ptr<Backend> events,
                    std::unique_ptr<Backend> lease);
  ~DynamicRendezvous();
  DynamicRendezvous(const DynamicRendezvous&) = delete;
  DynamicRendezvous& operator=(const DynamicRendezvous&) = delete;

  RoundPlan next_round();
  int notify_fd() const { return signal_.fd(); }
  std::optional<RoundEnd> round_end();
  // The caller starts the round next_round() joined. A join that ran ahead on another
  // thread (while the caller still stopped the last round's workers, reading notify_fd for
  // that round) may have let the caller drain the new round's end: notify_fd is readable
  // again when the round already ended, or this node was cut off.
  void start_round() { signal_.rearm(); }
  // Set once this node is cut off from the backend (partitioned, the store lost), however
  // it learnt it; any thread may ask (notify_fd is left alone).
  std::optional<RoundEnd> cut_off() const { return signal_.cut_off(); }
  void end_round(RoundEnd::Kind kind, const std::string& text);
  void arrive_exit();
  RoundEnd wait_end();  // blocks until the running round ends (however it does)
  std::string restart_refused(const RoundEnd& end);
  void finish(FinishKind kind, std::string reason);
  // Makes a next_round() in progress in another thread stop (it throws) within a second.
  void cancel();
  // Asks every other node of the running round to show its ranks' stacks (`what` names the
  // dump: every node's output carries it). Blocks on the backend like end_round.
  void ask_dump(const std::string& what);
  // The dumps other nodes asked for since the last call (each `what`); notify_fd wakes
  // the caller when one comes.
  std::vector<std::string> take_dump_requests();
  // This node's answer to the dump `what` another node asked for (the text is the caller's;
  // no newline), into the round it was asked in, also once this node has left it (the
  // node that asked waits there). Blocks on the backend like end_round.
  void answer_dump(const std::string& what, const std::string& answer);
  // Gathers the answers of the other `nodes` nodes to the dump `what` that this node asked
  // for, on a thread of its own, until every one came or `deadline`; then notify_fd wakes
  // the caller (take_dump_answers). Never blocks.
  void gather_dump(const std::string& what, size_t nodes, Clock::time_point deadline);
  std::vector<DumpAnswers> take_dump_answers() { return signal_.take_answers(); }
  // Adds delta to the running round's job-wide progress count (--hang-timeout: a node whose
  // own ranks are silent still sees the others' progress) and returns it. Blocks on the
  // backend like end_round; -1 between rounds.
  int64_t add_progress(int64_t delta);

  const DynamicConfig& config() const { return c_; }
  std::string backend_name() const { return backend_name_; }

 private:
  using Members = detail::Members;

  RoundPlan plan_of(const State& s) const;
  std::unique_ptr<ddp::detail::StoreServer> listen_for_workers() const;
  void use_worker_store(RoundPlan& p, const NodeDesc& rank0, std::unique_ptr<ddp::detail::StoreServer> mine);
  void trim_logs(const State& s, size_t events_mark);
  RoundReader reader_for(int64_t round, const Members& members);
  std::vector<NodeDesc> remaining_members(std::set<std::string> lost) const;
  template <class F>
  auto post(F f);  // f(backend) on end_round's backend, which works while next_round runs
  void close_rendezvous(const std::string& reason);
  void wait_for_everyone_to_leave(const std::vector<NodeDesc>& nodes);

  DynamicConfig c_;
  std::string backend_name_;
  std::unique_ptr<Backend> main_;
  detail::RoundSignal signal_;
  detail::NodeEvents events_;  // the caller's view of the events
  std::atomic<bool> cancel_{false};
  detail::Joiner joiner_;
  std::unique_ptr<detail::LeaseKeeper> keeper_;
  std::unique_ptr<detail::RoundWatcher> watcher_;
  std::unique_ptr<detail::DumpGatherer> gatherer_;
  std::unique_ptr<Backend> post_;  // end_round's: callable while next_round runs elsewhere
  std::mutex post_mu_;

  // Caller thread.
  int64_t round_ = -1;  // the round this node is in (-1: none yet)
  Members members_ = std::make_shared<const std::vector<NodeDesc>>();
  std::unique_ptr<ddp::detail::StoreServer> worker_store_;
  bool wrote_done_ = false;  // this node's arrival completed the exit barrier
};

}  // namespace ddprun::rdzv
