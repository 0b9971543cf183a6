#include "rendezvous/dynamic.hpp"

#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <random>
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
// Counters: exit/<R>/n, the members that passed round R's exit barrier; progress/<R>, the
// job-wide progress count (--hang-timeout).

namespace ddprun::rdzv {

using namespace detail;

DynamicRendezvous::DynamicRendezvous(DynamicConfig c, std::unique_ptr<Backend> main, std::unique_ptr<Backend> events,
                                     std::unique_ptr<Backend> lease)
    : c_(std::move(c)), main_(std::move(main)), events_(std::move(events)), lease_(std::move(lease)) {
  backend_name_ = main_->describe();
  efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd_ < 0) throw ddp::SystemError("eventfd", errno);
  open();
}

DynamicRendezvous::~DynamicRendezvous() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (events_) events_->interrupt();
  if (watcher_.joinable()) watcher_.join();
  if (keeper_.joinable()) keeper_.join();
  try {
    std::lock_guard lk(lease_mu_);
    lease_->close();
  } catch (const std::exception& e) {
    spdlog::debug("rendezvous: closing the lease: {}", e.what());
  }
  worker_store_.reset();
  if (efd_ >= 0) ::close(efd_);
}

// The lease: when this node dies or falls silent, "lost <id>" is written into the events.
void DynamicRendezvous::open() {
  {
    std::lock_guard lk(lease_mu_);
    lease_->open_lease(c_.keep_alive_interval * c_.keep_alive_max_attempt);
    lease_->on_lease_end("events", lost_event(c_.me.id));
  }
  read_events();
  keeper_ = std::thread([this] { keeper_loop(); });
  watcher_ = std::thread([this] { watcher_loop(); });
}

// ------------------------------------------------------------------ joining

State DynamicRendezvous::decode(const Snapshot& s) const {
  return s.state ? decode_state(*s.state, backend_name_) : State{};
}

void DynamicRendezvous::read_events() { fetch_events(false, {}); }

// Until something happens to the job (the state changed for waiting nodes, a node was
// lost, ...), or `t`.
void DynamicRendezvous::wait_events(Clock::time_point t) { fetch_events(true, t); }

void DynamicRendezvous::fetch_events(bool wait, Clock::time_point t) {
  for (;;) {
    size_t skip = 0;
    auto more = next_events(*main_, events_log_, wait, until(t), skip);
    if (!skip) return take_events(more);
    events_log_.skip_to(skip);  // behind a trim: on from the first line held
  }
}

void DynamicRendezvous::take_events(const std::vector<std::string>& more) {
  for (auto& l : more)
    if (l.starts_with("lost ")) lost_.insert(parse_event(l).node);  // only lost lines need parsing here
  events_log_.add(more);
}

void DynamicRendezvous::bump_epoch() { main_->append("events", "state"); }

void DynamicRendezvous::backoff(int attempt) {
  // Jittered exponential backoff after a lost compare-and-set: the writers thin out.
  static thread_local std::mt19937_64 rng(static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ULL ^
                                          static_cast<uint64_t>(Clock::now().time_since_epoch().count()));
  auto cap = std::min<int64_t>(32, int64_t{1} << std::min(attempt, 5));
  std::uniform_int_distribution<int64_t> us(0, cap * 1000);
  std::this_thread::sleep_for(std::chrono::microseconds(us(rng)));
}

// This node's request is pending behind `ahead` older ones. The node of the oldest writes
// the state now (and applies every pending request, this one too); the others wait for
// that write, the k-th in line at most k x 2 ms (capped), before writing it themselves: a
// node that is slow or gone never holds the others up for long, and N joiners arriving at
// once make a few writes instead of N that collide (each lost compare-and-set sends the
// whole state twice and gets it back once). Meanwhile the state is asked every 2 ms whether
// it changed (a few bytes, not the state). True: it changed (seen is reset: decide again);
// false: write now.
bool DynamicRendezvous::defer_to_older(size_t ahead, Seen& seen, Clock::time_point deadline) {
  constexpr auto kStep = 2ms, kMax = 30ms;
  if (!cheap_probe_) return false;
  const auto until = std::min<Clock::time_point>(
      deadline, Clock::now() + std::min<Clock::duration>(kStep * static_cast<int64_t>(ahead), kMax));
  for (auto now = Clock::now(); now < until && !cancel_; now = Clock::now()) {
    std::this_thread::sleep_for(std::min<Clock::duration>(kStep, until - now));
    auto changed = main_->changed(seen.snap->token);
    if (!changed) {  // a backend that cannot tell cheaply: write now, as before, from now on
      cheap_probe_ = false;
      return false;
    }
    if (*changed) {
      seen.reset();
      return true;
    }
  }
  return false;
}

// A node on the wait list of a running round asks that round to restart with it, itself:
// whoever wrote it onto the list also does, but may die before it does (the first "join"
// line ends the round; a second is ignored).
void DynamicRendezvous::announce_waiting(const State& t) {
  if (!t.complete || !State::contains(t.wait_list, c_.me.id) || announced_round_ == t.round) return;
  announced_round_ = t.round;
  main_->append("events", round_event(t.round, "join", c_.me.id, c_.me.describe()));
}

// One line when this node starts waiting for a running round (whoever wrote it in).
void DynamicRendezvous::say_waiting(const State& t) {
  const auto& j = c_.job;
  if (State::contains(t.redundancy_list, c_.me.id) && said_waiting_ != 2) {
    said_waiting_ = 2;
    spdlog::warn("rendezvous: the job '{}' is full ({} nodes running, --nnodes {}:{}): this node waits for a place",
                 c_.run_id, t.participants.size(), j.min_nodes, j.max_nodes);
  } else if (t.complete && State::contains(t.wait_list, c_.me.id) && said_waiting_ != 1) {
    said_waiting_ = 1;
    spdlog::info("rendezvous: round {} of job '{}' is running without this node: it restarts with this node within "
                 "--monitor-interval",
                 t.round, c_.run_id);
  }
}

void DynamicRendezvous::join_failed(JoinAction a, const State& s) {
  const auto& j = c_.job;
  if (a == JoinAction::kErrorClosed && said_waiting_ && s.closed_reason.empty())
    throw NotNeeded(fmt::format("rendezvous: the job '{}' succeeded while this node waited for a place in it: "
                                "nothing for this node to do",
                                c_.run_id));
  if (a == JoinAction::kErrorClosed)
    throw ddp::Error(fmt::format(
        "rendezvous '{}' at {} is closed ({}): nobody joins a finished job; give a new job its own --rdzv-id",
        c_.run_id, backend_name_,
        s.closed_reason.empty() ? "its job succeeded" : "its job failed: " + s.closed_reason));
  if (a == JoinAction::kErrorMismatch)
    throw ddp::UsageError(fmt::format(
        "rendezvous: this node has --nnodes {}:{} --max-restarts {}, but the job '{}' at {} has --nnodes {}:{} "
        "--max-restarts {}: every node must be given the same values",
        j.min_nodes, j.max_nodes, j.max_restarts, c_.run_id, backend_name_, s.job->min_nodes, s.job->max_nodes,
        s.job->max_restarts));
  if (a == JoinAction::kErrorRankTaken)
    throw ddp::UsageError(fmt::format("rendezvous: --node-rank {} is taken by two nodes ({} and {}): give each node "
                                      "its own rank",
                                      c_.me.rank, rank_holder(s, c_.me)->describe(), c_.me.describe()));
  const std::string timeout = fmt::format("join_timeout {} (--rdzv-conf join_timeout=SECONDS)",
                                          seconds_text(c_.join_timeout));
  if (c_.me.rank >= 0 && !s.complete) {
    std::vector<int> missing;
    for (int r = 0; r < j.max_nodes; ++r)
      if (std::none_of(s.participants.begin(), s.participants.end(), [&](const NodeDesc& n) { return n.rank == r; }))
        missing.push_back(r);
    throw ddp::TimeoutError(fmt::format("rendezvous: node rank{} {} never joined job '{}' within {}",
                                        missing.size() == 1 ? "" : "s", fmt::join(missing, ", "), c_.run_id, timeout));
  }
  if (s.complete && static_cast<int>(s.participants.size()) >= j.max_nodes)
    throw ddp::TimeoutError(fmt::format(
        "rendezvous: the job '{}' is full: its {} nodes (the maximum, --nnodes {}:{}) are running ({}); this node "
        "waited {} for a place and gives up; the running job is not affected",
        c_.run_id, s.participants.size(), j.min_nodes, j.max_nodes, describe_nodes(s.participants), timeout));
  if (s.complete)
    throw ddp::TimeoutError(fmt::format(
        "rendezvous: the running round of job '{}' did not restart to take this node in within {} (members: {})",
        c_.run_id, timeout, describe_nodes(s.participants)));
  throw ddp::TimeoutError(fmt::format(
      "rendezvous: no round of job '{}' formed at {} within {}: {} of the {} node{} needed (--nnodes {}:{}) joined{}{}",
      c_.run_id, backend_name_, timeout, s.participants.size(), j.min_nodes, j.min_nodes == 1 ? "" : "s",
      j.min_nodes, j.max_nodes, s.participants.empty() ? "" : ": ", describe_nodes(s.participants)));
}

// One read-decide-write step. Returns true (with the state in snap) when this node is a
// member of a complete round. Every write also applies the requests other nodes appended.
bool DynamicRendezvous::join_step(Seen& seen, Clock::time_point deadline, int& conflicts) {
  if (cancel_) throw ddp::Error("rendezvous: joining the next round was cancelled (this node is stopping)");
  // After a wait: the state is loaded again only if it changed (a thousand waiting nodes
  // would each fetch and decode the whole state at every wake-up).
  if (seen.recheck && seen.snap && main_->changed(seen.snap->token).value_or(true)) seen.reset();
  seen.recheck = false;
  if (!seen.snap) {
    seen.snap = main_->load();
    seen.state.reset();
  }
  if (!seen.state) seen.state = decode(*seen.snap);
  const auto& snap = seen.snap;
  const State& s = *seen.state;
  State t = s;
  bool changed = remove_lost(t, lost_), wake = changed;
  // Requests not applied yet. This node writes them all in only while one of its own is
  // among them: then a thousand joiners need a few writes, and a node that is in waits
  // instead of writing the others' requests again and again.
  std::vector<std::string> pending;
  try {
    pending = main_->read("requests", static_cast<size_t>(t.requests_seen), t.requests_at);
  } catch (const LogTrimmed& e) {
    // A newer state applied those requests (and its round's rank 0 dropped them): read it.
    if (Clock::now() >= deadline)
      throw ddp::StoreError(fmt::format("rendezvous: the state at {} applied requests up to line {}, but the "
                                        "requests log holds none before line {}",
                                        backend_name_, t.requests_seen, e.first()));
    seen.reset();
    return false;
  }
  const bool mine = std::any_of(pending.begin(), pending.end(), [&](const std::string& l) {
    return l.find(c_.me.id) != std::string::npos;
  });
  if (mine) {
    size_t ahead = 0;  // pending requests older than this node's
    while (ahead < pending.size() && pending[ahead].find(c_.me.id) == std::string::npos) ++ahead;
    if (ahead > 0 && defer_to_older(ahead, seen, deadline)) return false;
    Absorbed ab = absorb(t, pending, lost_);
    t.requests_at = main_->position("requests", static_cast<size_t>(t.requests_seen));
    changed |= ab.changed;
    wake |= ab.wake;
  }
  const auto now = Clock::now();
  if (t.last_call && !t.complete && t.has_participant(c_.me.id) && lc_round_ != t.round) {
    lc_round_ = t.round;  // MIN nodes are in: this node times the last call from now
    lc_deadline_ = now + c_.last_call_timeout;
  }
  JoinContext ctx{c_.me, c_.job, now >= deadline, lc_round_ == t.round && now >= lc_deadline_};
  say_waiting(t);
  JoinAction a = mine ? JoinAction::kWait : decide_join(t, ctx);
  switch (a) {
    case JoinAction::kFinish:
    case JoinAction::kWait:
      break;
    case JoinAction::kErrorClosed:
    case JoinAction::kErrorTimeout:
    case JoinAction::kErrorMismatch:
    case JoinAction::kErrorRankTaken:
      join_failed(a, t);
    default:
      wake |= apply_join(t, a, ctx);
      changed = true;
  }
  if (changed) {
    auto r = main_->compare_and_set(encode_state(t), snap->token);
    seen.snap = std::move(r.current);
    struct Forget {  // what was written (or the winner's) is decoded next step; `s` lives until then
      Seen& v;
      ~Forget() { v.state.reset(); }
    } forget{seen};
    if (!r.ok) {
      backoff(++conflicts);
      return false;
    }
    spdlog::debug("rendezvous: round {}: {}{} (after {} lost compare-and-set{})", t.round,
                  mine ? "applied requests, " : "", to_string(a), conflicts, conflicts == 1 ? "" : "s");
    conflicts = 0;
    if (wake) bump_epoch();
    // Nodes this write put on the wait list ask the running round to restart with them.
    for (auto& n : t.wait_list)
      if (t.complete && !State::contains(s.wait_list, n.id))
        main_->append("events", round_event(t.round, "join", n.id, n.describe()));
    if (a == JoinAction::kRemoveMe) join_failed(JoinAction::kErrorTimeout, s);  // as it was, with this node
    if (mine || a != JoinAction::kWait) return false;  // decide again on what was written
  }
  say_waiting(t);
  announce_waiting(t);
  if (a == JoinAction::kFinish) {
    said_waiting_ = 0;
    spdlog::debug("rendezvous: round {} is complete with {} nodes", t.round, t.participants.size());
    return true;
  }
  // Waiting: for the state to change, the last call to run out, or the deadline.
  auto limit = std::min(deadline, now + 1s);
  if (lc_round_ == t.round && t.last_call && !t.complete) limit = std::min(limit, lc_deadline_);
  const size_t events_before = events_log_.count();
  wait_events(limit);
  // New events (the writer's "state" line, a lost node, ...): load the state again at
  // once. None: the wait ran out; whether the state changed is a cheaper question.
  if (events_log_.count() != events_before) seen.reset();
  else seen.recheck = true;
  return false;
}

State DynamicRendezvous::join(Clock::time_point deadline) {
  Seen seen;
  int conflicts = 0;
  while (!join_step(seen, deadline, conflicts)) {
  }
  return seen.state ? std::move(*seen.state) : decode(*seen.snap);
}

RoundPlan DynamicRendezvous::next_round() {
  for (;;) {
    const auto deadline = Clock::now() + c_.join_timeout;
    if (round_ >= 0) {
      // Leaving: how the round ended is its first event that counts, the same for all.
      worker_store_.reset();
      {
        std::lock_guard lk(mu_);
        watched_round_ = -1;
        end_.reset();
      }
      read_events();
      auto end = reader_for(round_, members_).end();
      main_->append("requests", leave_request(c_.me.id, round_, end ? end->counted() : true));
    }
    const size_t events_mark = events_log_.count();  // every line of the round to come lies after it
    main_->append("requests", join_request(c_.me, c_.job));
    State s = join(deadline);
    round_ = s.round;
    events_log_.keep_from(round_);
    members_ = std::make_shared<const std::vector<NodeDesc>>(s.participants);
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
    {
      // If this node dies after its workers succeeded, its lease line lands in the exit
      // log after its exit: the others can tell (exited_before_lost).
      // One registration at a time: the last round's is dropped.
      std::lock_guard lk(lease_mu_);
      lease_->on_lease_end(exit_log(round_), lost_event(c_.me.id));
      if (exit_registered_ >= 0 && exit_registered_ != round_) lease_->drop_lease_end(exit_log(exit_registered_));
      exit_registered_ = round_;
    }
    {
      std::lock_guard lk(mu_);
      watched_round_ = round_;
      watched_members_ = members_;
      end_.reset();
    }
    cv_.notify_all();
    try {
      publish_or_fetch_master(p);
    } catch (const RoundEnd& end) {
      // The round ended before it started (rank 0 was lost): re-form, if that may be.
      std::string why = restart_refused(end);
      if (!why.empty()) throw ddp::Error(fmt::format("rendezvous: round {} ended before it started: {}", round_, why));
      spdlog::warn("rendezvous: round {} ended before it started ({}): forming the next", round_, end.describe());
      continue;
    }
    if (p.group_rank == 0) {
      forget_round(p.round - 1);
      trim_logs(s, events_mark);
    }
    p.members = std::move(s.participants);  // s is done with
    spdlog::info("rendezvous: round {} of job '{}': node rank {} of {} ({}), ranks {}..{} of {}, restarts so far {}",
                 p.round, c_.run_id, p.group_rank, p.group_world_size, describe_nodes(p.members), p.rank_base,
                 p.rank_base + c_.me.nproc - 1, p.world_size, p.restart_count);
    return p;
  }
}

// Round r is over for every member of the round after it: its rank 0 removes r's exit log
// and count, so that a long job's rendezvous holds a few rounds, not all of them.
void DynamicRendezvous::forget_round(int64_t r) {
  if (r < 0) return;
  try {
    main_->drop_log(exit_log(r));
    main_->drop_counter(exit_log(r) + "/n");
    main_->drop_counter(fmt::format("progress/{}", r));
  } catch (const std::exception& e) {
    spdlog::debug("rendezvous: removing round {}'s exit log: {}", r, e.what());
  }
}

// Round s.round is complete: its rank 0 drops the log lines that no reader needs any more
// (docs/design.md, "State that does not grow"): the requests the state applied, and the
// events before this node asked to join the round (every line of the round comes later).
// Not those events while the state or a pending request names a node lost among them: its
// lost line must stay for whoever reads it next (a later round's rank 0 drops them).
void DynamicRendezvous::trim_logs(const State& s, size_t events_mark) {
  try {
    if (!main_->trim_log("requests", static_cast<size_t>(s.requests_seen))) return;  // the backend keeps every line
    if (names_lost_node(s)) return;
    main_->trim_log("events", events_mark);
  } catch (const std::exception& e) {
    spdlog::debug("rendezvous: dropping log lines before round {}: {}", s.round, e.what());
  }
}

bool DynamicRendezvous::names_lost_node(const State& s) {
  if (lost_.empty()) return false;
  for (auto* list : {&s.participants, &s.wait_list, &s.redundancy_list})
    for (auto& n : *list)
      if (lost_.count(n.id)) return true;
  for (auto& request : main_->read("requests", static_cast<size_t>(s.requests_seen), s.requests_at))
    for (auto& id : lost_)
      if (request.find(id) != std::string::npos) return true;
  return false;
}

// Rank 0 hosts the round's worker store (a fresh port every round: no worker ever reads an
// earlier round's keys) and writes where it is into the events; the others read it.
void DynamicRendezvous::publish_or_fetch_master(RoundPlan& p) {
  if (c_.worker_store) {
    p.master_addr = c_.worker_store->addr;
    p.master_port = c_.worker_store->port;
    return;
  }
  if (p.group_rank == 0) {
    ddp::detail::StoreServerOptions so;
    so.host = "";
    so.port = 0;
    worker_store_ = std::make_unique<ddp::detail::StoreServer>(so);
    worker_store_->start();
    p.master_addr = c_.me.master_addr;
    p.master_port = worker_store_->port();
    main_->append("events", round_event(p.round, "master", c_.me.id,
                                        fmt::format("{} {}", p.master_addr, p.master_port)));
    return;
  }
  const auto deadline = Clock::now() + c_.join_timeout;
  for (;;) {
    RoundReader r = reader_for(p.round, members_);
    if (r.master(p.master_addr, p.master_port)) return;
    if (auto end = r.end()) throw *end;
    if (Clock::now() >= deadline)
      throw ddp::TimeoutError(fmt::format("rendezvous: node rank 0 ({}) did not publish round {}'s worker store "
                                          "within {}",
                                          members_->front().describe(), p.round, seconds_text(c_.join_timeout)));
    wait_events(std::min(deadline, Clock::now() + 1s));
  }
}

// Who passed round r's exit barrier before being lost (their lost lines do not count).
std::set<std::string> DynamicRendezvous::exited_before_lost(int64_t r) {
  std::set<std::string> exited, lost;
  for (auto& l : main_->read(exit_log(r), 0)) {
    Event e = parse_event(l);
    if (e.kind == "lost") lost.insert(e.node);
    else if (!lost.count(e.kind)) exited.insert(e.kind);  // an exit line is the node's id alone
  }
  return exited;
}

// The round's events as this (caller) thread has read them.
RoundReader DynamicRendezvous::reader_for(int64_t r, const Members& members) {
  RoundReader reader;
  reader.feed(events_log_.lines());  // lost lines before the round
  reader.start(r, members);
  reader.feed(events_log_.lines());
  if (reader.needs_exited()) reader.set_exited(exited_before_lost(r));
  return reader;
}

}  // namespace ddprun::rdzv
