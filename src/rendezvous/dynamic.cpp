#include "rendezvous/dynamic.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "rendezvous/dynamic_util.hpp"
#include "store/server.hpp"

// Logs in the backend (backend.hpp), per run:
//   events      what happens to the job (events.hpp); waiting nodes and watchers read it
//   requests    joins and leaves waiting to be applied to the state (machine.hpp)
//   (each round's rank 0 drops the lines of both that nobody needs any more: trim_logs)
//   exit/<R>    who passed round R's exit barrier, and lease lines (see arrive_exit)
//   left        who left the finished job (the store's host waits for everyone)
//   dumps/<R>   the answers to round R's stack dumps (dump_gather.hpp)
// Counters: exit/<R>/n, the members that passed round R's exit barrier; progress/<R>, the
// job-wide progress count (--hang-timeout).

namespace ddprun::rdzv {

using namespace detail;

DynamicRendezvous::DynamicRendezvous(DynamicConfig c, std::unique_ptr<Backend> main, std::unique_ptr<Backend> events,
                                     std::unique_ptr<Backend> lease)
    : c_(std::move(c)),
      backend_name_(main->describe()),
      main_(std::move(main)),
      events_(*main_),
      joiner_(c_, *main_, events_, cancel_),
      gatherer_(std::make_unique<DumpGatherer>(signal_)) {
  // The lease: when this node dies or falls silent, "lost <id>" is written into the events.
  keeper_ = std::make_unique<LeaseKeeper>(
      std::move(lease),
      LeaseKeeper::Settings{c_.me.id, backend_name_, c_.keep_alive_interval, c_.keep_alive_max_attempt,
                            c_.worker_store.has_value()},
      signal_);
  joiner_.set_lease_check([k = keeper_.get()] { k->check_alive(); });
  try {
    events_.read();
    watcher_ = std::make_unique<RoundWatcher>(
        std::move(events), RoundWatcher::Names{c_.me.id, backend_name_, c_.store_lost_hint, c_.worker_store.has_value(),
                                               [k = keeper_.get()] { return k->overdue(); }},
        signal_);
  } catch (...) {
    signal_.stop();  // the keeper's thread ends as the members go
    throw;
  }
}

DynamicRendezvous::~DynamicRendezvous() {
  signal_.stop();
  gatherer_.reset();
  watcher_.reset();
  keeper_.reset();  // (and the lease closed)
  worker_store_.reset();
}

RoundPlan DynamicRendezvous::next_round() {
  const auto deadline = Clock::now() + c_.join_timeout;
  std::vector<NodeDesc> remaining;  // the last round's members that form the next one with this node
  // restart_refused counted the members not lost as of the events read so far; one lost
  // since is the join's to judge, as a loss during the join.
  auto counted_lost = events_.lost();
  if (round_ >= 0) {
    // Leaving: how the round ended is its first event that counts, the same for all.
    worker_store_.reset();
    signal_.watch(-1, nullptr);
    events_.read();
    auto end = reader_for(round_, members_).end();
    main_->append("requests", leave_request(c_.me.id, round_, end ? end->counted() : true));
    remaining = remaining_members(counted_lost);
  }
  const size_t events_mark = events_.count();  // every line of the round to come lies after it
  NodeDesc me = c_.me;
  auto store = listen_for_workers();
  if (store) me.master_port = store->port();
  main_->append("requests", join_request(me, c_.job));
  State s;
  try {
    s = joiner_.join(me, deadline, std::move(remaining), std::move(counted_lost));
  } catch (const TooFewNodes& e) {
    try {
      close_rendezvous(e.what());  // the job is over: a node that comes later is told why at once
    } catch (const std::exception& c) {
      spdlog::debug("rendezvous: closing: {}", c.what());
    }
    throw;
  }
  round_ = s.round;
  events_.keep_from(round_);
  members_ = std::make_shared<const std::vector<NodeDesc>>(s.participants);
  RoundPlan p = plan_of(s);
  keeper_->register_exit(round_);
  signal_.watch(round_, members_);
  use_worker_store(p, s.participants.front(), std::move(store));
  if (p.group_rank == 0) {
    forget_round(*main_, p.round - 1);
    trim_logs(s, events_mark);
  }
  p.members = std::move(s.participants);  // s is done with
  spdlog::info("rendezvous: round {} of job '{}': node rank {} of {} ({}), ranks {}..{} of {}, restarts so far {}",
               p.round, c_.run_id, p.group_rank, p.group_world_size, describe_nodes(p.members), p.rank_base,
               p.rank_base + c_.me.nproc - 1, p.world_size, p.restart_count);
  return p;
}

// This node's part in the complete round `s`.
RoundPlan DynamicRendezvous::plan_of(const State& s) const {
  RoundPlan p;
  p.round = s.round;
  p.group_rank = s.rank_of(c_.me.id);
  p.group_world_size = static_cast<int>(s.participants.size());
  p.restart_count = s.restarts;
  p.world_size = 0;
  for (int i = 0; i < p.group_world_size; ++i) {
    int n = s.participants[static_cast<size_t>(i)].nproc;
    if (i < p.group_rank) p.rank_base += n;
    p.world_size += n;
  }
  return p;
}

namespace detail {

void forget_round(Backend& b, int64_t r) {
  if (r < 0) return;
  try {
    b.drop_log(exit_log(r));
    b.drop_counter(exit_log(r) + "/n");
    b.drop_counter(fmt::format("progress/{}", r));
    // The stacks answered in a round live a round longer: a node that failed or hung in
    // round r waits for the others' answers while the next round forms (prejoin), and
    // none after that can form before it has read them.
    if (r > 0) b.drop_log(dumps_log(r - 1));
  } catch (const std::exception& e) {
    spdlog::debug("rendezvous: removing round {}'s exit log: {}", r, e.what());
  }
}

}  // namespace detail

// Round s.round is complete: its rank 0 drops the log lines that no reader needs any more
// (docs/design.md, "State that does not grow"): the requests the state applied, and the
// events before this node asked to join the round (every line of the round comes later).
// Not those events while the state or a pending request names a node lost among them: its
// lost line must stay for whoever reads it next (a later round's rank 0 drops them). As the
// join stands this never happens (docs/design.md, "State that does not grow"): a check
// against a later change to its order.
void DynamicRendezvous::trim_logs(const State& s, size_t events_mark) {
  try {
    if (!main_->trim_log("requests", static_cast<size_t>(s.requests_seen))) return;  // the backend keeps every line
    if (!events_.lost().empty() &&
        names_any(s, main_->read("requests", static_cast<size_t>(s.requests_seen), s.requests_at), events_.lost()))
      return;
    main_->trim_log("events", events_mark);
  } catch (const std::exception& e) {
    spdlog::debug("rendezvous: dropping log lines before round {}: {}", s.round, e.what());
  }
}

// Each round's rank 0 hosts the round's worker store, on a fresh port every round (no worker
// ever reads an earlier round's keys). Every node listens on one before it asks to join and
// names its port in the request, so that the complete state says where rank 0's is: nobody
// waits for rank 0 to learn that it is rank 0 and publish its port (workers that connect
// first wait in the listen backlog for a moment). Static jobs use node 0's store instead.
std::unique_ptr<ddp::detail::StoreServer> DynamicRendezvous::listen_for_workers() const {
  if (c_.worker_store) return nullptr;
  ddp::detail::StoreServerOptions so;
  so.host = "";
  so.port = 0;
  return std::make_unique<ddp::detail::StoreServer>(so);
}

void DynamicRendezvous::use_worker_store(RoundPlan& p, const NodeDesc& rank0,
                                         std::unique_ptr<ddp::detail::StoreServer> mine) {
  if (c_.worker_store) {
    p.master_addr = c_.worker_store->addr;
    p.master_port = c_.worker_store->port;
    return;
  }
  if (rank0.master_port <= 0)
    throw ddp::Error(fmt::format("rendezvous: node rank 0 of round {} ({}) named no worker store in its join: "
                                 "every node of a job must run the same ddprun",
                                 p.round, rank0.describe()));
  p.master_addr = rank0.master_addr;
  p.master_port = rank0.master_port;
  if (p.group_rank == 0 && c_.share_worker_store) {
    worker_store_ = std::move(mine);
    worker_store_->start();
  }  // else `mine` closes here, and the workers' rank 0 takes its port
}

// The round's events as this (caller) thread has read them.
RoundReader DynamicRendezvous::reader_for(int64_t r, const Members& members) {
  RoundReader reader;
  reader.feed(events_.lines());  // lost lines before the round
  reader.start(r, members);
  reader.feed(events_.lines());
  if (reader.needs_exited()) reader.set_exited(exited_before_lost(*main_, r));
  return reader;
}

}  // namespace ddprun::rdzv
