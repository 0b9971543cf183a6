#include "rendezvous/joiner.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "rendezvous/dynamic.hpp"

namespace ddprun::rdzv::detail {

State decode(const Snapshot& s, const std::string& backend_name) {
  return s.state ? decode_state(*s.state, backend_name) : State{};
}

void backoff(int attempt) {
  static thread_local std::mt19937_64 rng(static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ULL ^
                                          static_cast<uint64_t>(Clock::now().time_since_epoch().count()));
  auto cap = std::min<int64_t>(32, int64_t{1} << std::min(attempt, 5));
  std::uniform_int_distribution<int64_t> us(0, cap * 1000);
  std::this_thread::sleep_for(std::chrono::microseconds(us(rng)));
}

Joiner::Joiner(const DynamicConfig& c, Backend& main, NodeEvents& events, const std::atomic<bool>& cancel)
    : c_(c), backend_name_(main.describe()), main_(main), events_(events), cancel_(cancel) {}

State Joiner::join(const NodeDesc& me, Clock::time_point deadline, std::vector<NodeDesc> remaining,
                   std::set<std::string> counted_lost) {
  me_ = me;
  remaining_ = std::move(remaining);
  seen_open_ = false;
  timed_out_in_.reset();
  met_.clear();
  lost_at_start_ = std::move(counted_lost);
  lost_checked_ = SIZE_MAX;  // the first step checks: a loss read since restart_refused counts too
  replacing_ = false;
  join_started_ = Clock::now();
  // (A short join_timeout, as tests give, hears sooner.)
  say_forming_every_ = std::clamp<Clock::duration>(c_.join_timeout / 4, 1s, 30s);
  say_forming_at_ = join_started_ + say_forming_every_;
  Seen seen;
  int conflicts = 0;
  while (!step(seen, deadline, conflicts)) {
  }
  return seen.state ? std::move(*seen.state) : decode(*seen.snap, backend_name_);
}

// This node's request is pending behind `ahead` older ones. The node of the oldest writes
// the state now (and applies every pending request, this one too); the others wait for
// that write, the k-th in line at most k x 2 ms (capped), before writing it themselves: a
// node that is slow or gone never holds the others up for long, and N joiners arriving at
// once make a few writes instead of N that collide (each lost compare-and-set sends the
// whole state twice and gets it back once). Meanwhile the state is asked every 2 ms whether
// it changed (a few bytes, not the state). True: it changed (seen is reset: decide again);
// false: write now.
bool Joiner::defer_to_older(size_t ahead, Seen& seen, Clock::time_point deadline) {
  constexpr auto kStep = 2ms, kMax = 30ms;
  if (!cheap_probe_) return false;
  const auto until = std::min<Clock::time_point>(
      deadline, Clock::now() + std::min<Clock::duration>(kStep * static_cast<int64_t>(ahead), kMax));
  for (auto now = Clock::now(); now < until && !cancel_; now = Clock::now()) {
    std::this_thread::sleep_for(std::min<Clock::duration>(kStep, until - now));
    auto changed = main_.changed(seen.snap->token);
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
// line ends the round; a second is ignored). Not a round that is ending anyway (a member
// left it, or was lost): the node that just left it, rejoining, would ask at every restart.
void Joiner::announce_waiting(const State& t) {
  if (!t.complete || t.ending_round == t.round || !State::contains(t.wait_list, c_.me.id) ||
      announced_round_ == t.round)
    return;
  announced_round_ = t.round;
  main_.append("events", round_event(t.round, "join", c_.me.id, c_.me.describe()));
}

// While no round forms, a line after 30 s (a quarter of a shorter join_timeout), then at
// doubling intervals (at most 5 min apart): who joined, who is missing, how long this node
// waits yet. Before, a node whose peers never came (not started, or refused on their own
// hosts for another --nnodes or a taken --node-rank) said nothing until join_timeout, 600 s
// by default.
void Joiner::say_forming(const State& t, Clock::time_point now, Clock::time_point deadline) {
  // (Not just before the deadline: the join's own error says it all then.)
  if (t.complete || now < say_forming_at_ || deadline - now < say_forming_every_ / 2) return;
  say_forming_every_ = std::min<Clock::duration>(2 * say_forming_every_, 300s);
  say_forming_at_ = now + say_forming_every_;
  const auto& j = c_.job;
  const std::vector<NodeDesc> came = joined(t);
  // Enough came: the round forms when the last call ends (last_call_timeout), not at
  // join_timeout, which the line would name (a re-forming job's nodes said "waits 45 s more").
  if (came.size() >= static_cast<size_t>(j.min_nodes)) return;
  const std::vector<int> ranks = c_.me.rank >= 0 ? missing_ranks(came) : std::vector<int>{};
  const std::string missing =
      ranks.empty() ? "" : fmt::format("; missing: node rank{} {}", ranks.size() == 1 ? "" : "s",
                                       list_some(ranks, [](int r) { return std::to_string(r); }));
  spdlog::warn("rendezvous: no round of job '{}' formed in {}: {} of the {} node{} needed (--nnodes {}:{}) joined ({})"
               "{}; this node waits {} more ({}); a node started with other --nnodes or --max-restarts{} "
               "is refused, and says so on its own host",
               c_.run_id, seconds_text(std::chrono::duration_cast<milliseconds>(now - join_started_)), came.size(),
               j.min_nodes, j.min_nodes == 1 ? "" : "s", j.min_nodes, j.max_nodes, describe_nodes(came), missing,
               seconds_text(std::chrono::duration_cast<milliseconds>(deadline - now)),
               replacing_ ? "--rdzv-conf replace_timeout" : "join_timeout",
               c_.me.rank >= 0 ? ", or a --node-rank already taken," : "");
}

// The node ranks (static membership) that none of `came` holds.
std::vector<int> Joiner::missing_ranks(const std::vector<NodeDesc>& came) const {
  std::vector<int> missing;
  for (int r = 0; r < c_.job.max_nodes; ++r)
    if (std::none_of(came.begin(), came.end(), [&](const NodeDesc& n) { return n.rank == r; })) missing.push_back(r);
  return missing;
}

// One line when this node starts waiting for a running round (whoever wrote it in).
void Joiner::say_waiting(const State& t) {
  const auto& j = c_.job;
  if (State::contains(t.redundancy_list, c_.me.id) && said_waiting_ != 2) {
    said_waiting_ = 2;
    spdlog::warn("rendezvous: the job '{}' is full ({} nodes running, --nnodes {}:{}): this node waits for a place",
                 c_.run_id, t.participants.size(), j.min_nodes, j.max_nodes);
  } else if (t.complete && t.ending_round != t.round && State::contains(t.wait_list, c_.me.id) &&
             said_waiting_ != 1) {
    said_waiting_ = 1;
    spdlog::info("rendezvous: round {} of job '{}' is running without this node: it restarts with this node within "
                 "--monitor-interval",
                 t.round, c_.run_id);
  }
}

// This node is a member of the complete round `t`, but a member already left it (ran its
// workers, failed and left, or was lost) before this node looked: the round is over, and
// its members as still listed are not the round that formed. This node leaves it too,
// without starting it, and joins the next with the others.
// Its rank 0's part is done all the same (the first member still listed: either the rank 0
// that formed, or that one left and did it): the round before is forgotten.
void Joiner::leave_ended(const State& t) {
  spdlog::debug("rendezvous: round {} ended before this node saw it complete: joining the next", t.round);
  if (t.rank_of(c_.me.id) == 0) forget_round(main_, t.round - 1);
  main_.append("requests", leave_request(c_.me.id, t.round, t.ending_counted));
}

// This node's join timed out while it is listed: it asks to be taken off (a request, then
// it steps as any node whose request is pending), so that nodes timing out together leave
// the state in a few writes, as they joined it. One by one, each lost compare-and-set sent
// and got back the whole state: 1024 nodes took minutes to write themselves out of theirs.
// Its error counts every node it saw join (joined()), those that left before it too.
void Joiner::withdraw(const State& t) {
  timed_out_in_ = t;
  main_.append("requests", withdraw_request(c_.me.id));
}

void Joiner::failed(JoinAction a, const State& now) {
  const State& s = a == JoinAction::kErrorTimeout && timed_out_in_ ? *timed_out_in_ : now;
  const auto& j = c_.job;
  if (a == JoinAction::kErrorClosed && said_waiting_ && s.closed_reason.empty())
    throw NotNeeded(fmt::format("rendezvous: the job '{}' succeeded while this node waited for a place in it: "
                                "nothing for this node to do",
                                c_.run_id));
  if (a == JoinAction::kErrorClosed && (seen_open_ || !remaining_.empty()))  // it ended meanwhile
    throw ddp::Error(fmt::format("rendezvous: the job '{}' ended while this node joined {}: {}", c_.run_id,
                                 remaining_.empty() ? "it" : "its next round",
                                 s.closed_reason.empty() ? "it succeeded" : s.closed_reason));
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
  const std::vector<NodeDesc> came = joined(s);
  if (a == JoinAction::kErrorTimeout && replacing_)  // the job is over: TooFewNodes closes it
    throw TooFewNodes(fmt::format("rendezvous: no node came to take the places of those lost from job '{}' within "
                                  "--rdzv-conf replace_timeout {}: {}; joined: {}",
                                  c_.run_id, seconds_text(c_.replace_timeout), too_few_text(came.size(), j),
                                  describe_nodes(came)));
  if (c_.me.rank >= 0 && !s.complete) {
    const std::vector<int> missing = missing_ranks(came);
    throw ddp::TimeoutError(fmt::format("rendezvous: node rank{} {} never joined job '{}' within {}",
                                        missing.size() == 1 ? "" : "s",
                                        list_some(missing, [](int r) { return std::to_string(r); }), c_.run_id,
                                        timeout));
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
      c_.run_id, backend_name_, timeout, came.size(), j.min_nodes, j.min_nodes == 1 ? "" : "s", j.min_nodes,
      j.max_nodes, came.empty() ? "" : ": ", describe_nodes(came)));
}

// Who joined the round that did not form, as far as this node saw: every participant of
// every state it read, those whose joins timed out before its own included (they left the
// state, but they came: naming them as missing sent users after the wrong nodes). Not a
// node lost meanwhile: it is gone, and named as missing.
std::vector<NodeDesc> Joiner::joined(const State& s) const {
  const auto& lost = events_.lost();
  std::vector<NodeDesc> out;
  for (auto& [id, n] : met_)
    if (!lost.count(id)) out.push_back(n);
  for (auto& n : s.participants)
    if (!met_.count(n.id) && !lost.count(n.id)) out.push_back(n);
  return out;
}

// The state as this node reads it at each step. After a wait it is loaded again only if it
// changed (a thousand waiting nodes would each fetch and decode the whole state at every
// wake-up).
const State& Joiner::read_state(Seen& seen) {
  if (seen.recheck && seen.snap && main_.changed(seen.snap->token).value_or(true)) seen.reset();
  seen.recheck = false;
  if (!seen.snap) {
    seen.snap = main_.load();
    seen.state.reset();
  }
  if (!seen.state) {
    seen.state = decode(*seen.snap, backend_name_);
    if (!seen.state->complete)
      for (auto& n : seen.state->participants) met_.try_emplace(n.id, n);
  }
  return *seen.state;
}

// The join and leave requests appended after those `t` applied. nullopt: a newer state
// applied them (and its round's rank 0 dropped them); `seen` is reset, to read that state.
std::optional<std::vector<std::string>> Joiner::pending_requests(const State& t, Seen& seen,
                                                                 Clock::time_point deadline) {
  try {
    return main_.read("requests", static_cast<size_t>(t.requests_seen), t.requests_at);
  } catch (const LogTrimmed& e) {
    if (Clock::now() >= deadline)
      throw ddp::StoreError(fmt::format("rendezvous: the state at {} applied requests up to line {}, but the "
                                        "requests log holds none before line {}",
                                        backend_name_, t.requests_seen, e.first()));
    seen.reset();
    return std::nullopt;
  }
}

// This node's own request is among `pending`: it applies them all to `t`, unless the nodes
// of older requests should write (defer_to_older: nullopt, decide again).
std::optional<Absorbed> Joiner::apply_pending(State& t, const std::vector<std::string>& pending, Seen& seen,
                                              Clock::time_point deadline) {
  size_t ahead = 0;  // pending requests older than this node's
  while (ahead < pending.size() && pending[ahead].find(c_.me.id) == std::string::npos) ++ahead;
  if (ahead > 0 && defer_to_older(ahead, seen, deadline)) return std::nullopt;
  Absorbed ab = absorb(t, pending, events_.lost());
  t.requests_at = main_.position("requests", static_cast<size_t>(t.requests_seen));
  return ab;
}

// One read-decide-write step. Returns true (with the state in seen) when this node is a
// member of a complete round. Every write also applies the requests other nodes appended.
bool Joiner::step(Seen& seen, Clock::time_point& deadline, int& conflicts) {
  if (cancel_) throw ddp::Error("rendezvous: joining the next round was cancelled (this node is stopping)");
  check_not_lost();
  const State& s = read_state(seen);
  seen_open_ |= !s.closed;
  // This step decides on `s` itself until something changes it, then on a copy: a waiting
  // node steps at each wake-up, and a state of a thousand members is 150 kB of them.
  std::optional<State> copy;
  auto edit = [&]() -> State& {
    if (!copy) copy.emplace(s);
    return *copy;
  };
  auto cur = [&]() -> const State& { return copy ? *copy : s; };
  // A member of a complete round that no member has left yet takes it as it formed, lost
  // members and all: its watcher ends it at once, and the restart rules apply as to any
  // loss (its remnant would be a smaller world; skipping it, a wait for nodes that are
  // gone). The others, joining the next round, remove them. Lost nodes on the wait and
  // redundancy lists go all the same: the round's end (this node's own leave, pending,
  // may end it in this step) must not open the next round with them.
  const auto& lost = events_.lost();
  const bool formed = s.complete && s.ending_round != s.round && s.has_participant(c_.me.id);
  bool changed = lists_lost(s, lost, !formed) && remove_lost(edit(), lost, !formed), wake = changed;
  // This node writes the pending requests in only while one of its own is among them: then
  // a thousand joiners need a few writes, and a node that is in waits instead of writing
  // the others' requests again and again.
  const auto pending = pending_requests(cur(), seen, deadline);
  if (!pending) return false;
  check_enough_left(cur(), *pending, deadline);
  const bool mine = std::any_of(pending->begin(), pending->end(), [&](const std::string& l) {
    return l.find(c_.me.id) != std::string::npos;
  });
  if (mine) {
    const auto ab = apply_pending(edit(), *pending, seen, deadline);
    if (!ab) return false;
    changed |= ab->changed;
    wake |= ab->wake;
  }
  const auto now = Clock::now();
  const State& v = cur();  // what this step decides on
  if (!v.last_call) lc_round_ = -1;  // (fewer than MIN again: MIN reached once more starts a new last call)
  if (v.last_call && !v.complete && v.has_participant(c_.me.id) && lc_round_ != v.round) {
    lc_round_ = v.round;  // MIN nodes are in: this node times the last call from now
    lc_deadline_ = now + c_.last_call_timeout;
  }
  if (replacing_ && lc_round_ == v.round) {  // MIN nodes are in again: the usual rules from here
    replacing_ = false;                      // (replace_timeout must not cut the last call short)
    deadline = std::max(deadline, now + c_.join_timeout);
  }
  JoinContext ctx{me_, c_.job, now >= deadline, lc_round_ == v.round && now >= lc_deadline_};
  say_waiting(v);
  say_forming(v, now, deadline);
  JoinAction a = mine ? JoinAction::kWait : decide_join(v, ctx);
  if (a == JoinAction::kFinish && v.ending_round == v.round) {
    leave_ended(v);
    seen.reset();
    return false;
  }
  if (a == JoinAction::kRemoveMe && !timed_out_in_) {
    withdraw(v);
    seen.reset();
    return false;
  }
  switch (a) {
    case JoinAction::kFinish:
    case JoinAction::kWait:
      break;
    case JoinAction::kErrorClosed:
    case JoinAction::kErrorTimeout:
    case JoinAction::kErrorMismatch:
    case JoinAction::kErrorRankTaken:
      failed(a, v);
    default:
      wake |= apply_join(edit(), a, ctx);
      changed = true;
  }
  // A write (only of a copy) forgets `s`; from here on cur() is what was decided.
  if (changed && !write(seen, s, *copy, a, mine, wake, conflicts)) return false;
  const State& t = cur();
  say_waiting(t);
  announce_waiting(t);
  if (a == JoinAction::kFinish) {
    said_waiting_ = 0;
    spdlog::debug("rendezvous: round {} is complete with {} nodes", t.round, t.participants.size());
    return true;
  }
  test_pause("join-wait");  // (others may complete the round with this node meanwhile)
  wait(seen, t, now, deadline);
  return false;
}

// Writes `t` over `s` (what seen holds). False: decide again (on what was written, or on
// the winner's state when the compare-and-set was lost); true: this node waits on `t`.
bool Joiner::write(Seen& seen, const State& s, const State& t, JoinAction a, bool mine, bool wake, int& conflicts) {
  auto r = main_.compare_and_set(encode_state(t), seen.snap->token);
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
  if (wake) main_.append("events", "state");  // waiting nodes look at the state again
  // Nodes this write put on the wait list ask the running round to restart with them (a
  // round that is ending needs no asking).
  for (auto& n : t.wait_list)
    if (t.complete && t.ending_round != t.round && !State::contains(s.wait_list, n.id))
      main_.append("events", round_event(t.round, "join", n.id, n.describe()));
  if (a == JoinAction::kRemoveMe) failed(JoinAction::kErrorTimeout, s);  // as it was, with this node
  return !mine && a == JoinAction::kWait;
}

// This node's lease ended (it was frozen, or cut off, for the keep-alive window): the others
// go on without it, and remove it from every list. It stops (before, it wrote itself back in
// at every step, removed again by its own next step: a loop of writes until join_timeout,
// during which a round could complete with it). Its own lost line says so, or, when a
// round's rank 0 dropped that line before this node read it (it names no list any more),
// the lease itself.
void Joiner::check_not_lost() {
  if (events_.lost().count(c_.me.id)) {
    for (auto& l : events_.lines())
      if (l.starts_with("lost ")) {
        Event e = parse_event(l);
        if (e.node == c_.me.id) declared_lost(e.text);
      }
    declared_lost("");
  }
  try {
    if (lease_check_) lease_check_();
  } catch (const LeaseEnded& e) {
    declared_lost(e.what());
  }
}

void Joiner::declared_lost(const std::string& why) {
  throw ddp::Error(fmt::format("rendezvous: this node was declared lost by {} while it joined the next round of job "
                               "'{}'{}: the other nodes go on without it",
                               backend_name_, c_.run_id, why.empty() ? "" : " (" + why + ")"));
}

// After a round ended, the members that remain form the next one (restart_refused counted
// them). A loss among them, or among the nodes that came since (listed, or with a join
// request pending), that leaves fewer than MIN stops the job at once, as the same loss in
// the running round would have, instead of a wait until join_timeout for nodes that are
// gone. Judged at the join's first step (a loss read after restart_refused counted the
// members) and whenever a lost line comes; only a loss makes the count smaller. (A node itself
// declared lost stopped before this: it must not close the job the others re-form.)
void Joiner::check_enough_left(const State& s, const std::vector<std::string>& pending,
                               Clock::time_point& deadline) {
  const auto& lost = events_.lost();
  // (Counted by every loss read: the set keeps the latest LostIds::kKept, so its size stops
  // growing; a review found a loss past the 1024th went unjudged until join_timeout.)
  if (remaining_.empty() || events_.lost_seen() == lost_checked_) return;
  lost_checked_ = events_.lost_seen();
  std::set<std::string> live;
  std::vector<NodeDesc> gone, gone_before;  // lost since the join began; before it
  auto count = [&](const NodeDesc& n) {
    auto& to = lost_at_start_.count(n.id) ? gone_before : gone;
    if (!lost.count(n.id)) live.insert(n.id);
    else if (!State::contains(to, n.id)) to.push_back(n);
  };
  for (auto& n : remaining_) count(n);
  for (auto* list : {&s.participants, &s.wait_list, &s.redundancy_list})
    for (auto& n : *list) count(n);
  for (auto& r : pending)
    if (auto n = joining_node(r)) count(*n);
  if (live.size() >= static_cast<size_t>(c_.job.min_nodes)) return;
  if (gone.empty()) gone = std::move(gone_before);
  if (c_.replace_timeout > milliseconds(0)) return wait_for_replacements(gone, live.size(), deadline);
  throw TooFewNodes(fmt::format("rendezvous: {} {} {} lost while the next round of job '{}' formed; {}{}",
                                gone.size() == 1 ? "node" : "nodes", describe_nodes(gone),
                                gone.size() == 1 ? "was" : "were", c_.run_id, too_few_text(live.size(), c_.job),
                                kReplaceHint));
}

// --rdzv-conf replace_timeout: fewer than MIN remain, and the join waits that long for nodes
// to take the places of those lost or stopped (a scheduler that restarts a lost node, or
// its user: the torchrun way to survive a lost node of a fixed-size job, which waits out
// join_timeout). Said once, and again for each loss while it waits; the wait is the one
// the first loss set.
void Joiner::wait_for_replacements(const std::vector<NodeDesc>& gone, size_t live, Clock::time_point& deadline) {
  if (!replacing_) deadline = Clock::now() + c_.replace_timeout;
  replacing_ = true;
  spdlog::warn("rendezvous: {}for the next round of job '{}' {}; this node waits {} (--rdzv-conf replace_timeout) "
               "for nodes to take their places: ddprun with the same flags, on another host or again where a node "
               "stopped",
               gone.empty() ? "" : fmt::format("{} {} lost; ", gone.size() == 1 ? "node" : "nodes", describe_nodes(gone)),
               c_.run_id, too_few_text(live, c_.job),
               seconds_text(std::chrono::duration_cast<milliseconds>(deadline - Clock::now())));
}

// Waiting: for the state to change, the last call to run out, or the deadline. What
// changes the state or the nodes appends an event that ends the wait (a write's "state", a
// lease's "lost"); the slice is for what appends none: a writer gone between its write and
// its line, or this node's own lease ending while it cannot reach the store. One keep-alive
// interval, as often as the lease is renewed (at least a second): a thousand nodes that each
// woke every second to ask whether the state changed were a third of the store's requests
// while a round of them formed. cancel() ends the wait at once (the store's host's too:
// woken, its connection kept).
void Joiner::wait(Seen& seen, const State& t, Clock::time_point now, Clock::time_point deadline) {
  const Clock::duration slice = std::max<Clock::duration>(1s, c_.keep_alive_interval);
  auto limit = std::min(deadline, now + slice);
  if (lc_round_ == t.round && t.last_call && !t.complete) limit = std::min(limit, lc_deadline_);
  const size_t events_before = events_.count();
  events_.wait(limit);
  // New events (the writer's "state" line, a lost node, ...): load the state again at
  // once. None: the wait ran out; whether the state changed is a cheaper question.
  if (events_.count() != events_before) seen.reset();
  else seen.recheck = true;
}

}  // namespace ddprun::rdzv::detail
