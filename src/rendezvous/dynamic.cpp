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
#include "store/server.hpp"

// Logs in the backend (backend.hpp), per run:
//   events      what happens to the job (events.hpp); waiting nodes and watchers read it
//   requests    joins and leaves waiting to be applied to the state (machine.hpp)
//   exit/<R>    who passed round R's exit barrier, and lease lines (see arrive_exit)
//   left        who left the finished job (the store's host waits for everyone)
// Counters: exit/<R>/n, the members that passed round R's exit barrier; progress/<R>, the
// job-wide progress count (--hang-timeout).

namespace ddprun::rdzv {

namespace {

using namespace std::chrono_literals;

std::string exit_log(int64_t r) { return fmt::format("exit/{}", r); }

std::string seconds_text(milliseconds d) { return ddp::format_duration(d); }

// "--nnodes 2" (a fixed count) or "--nnodes 1:4".
std::string nnodes_flag(const JobSettings& j) {
  return j.min_nodes == j.max_nodes ? fmt::format("--nnodes {}", j.max_nodes)
                                    : fmt::format("--nnodes {}:{}", j.min_nodes, j.max_nodes);
}

std::string describe_nodes(const std::vector<NodeDesc>& nodes) {
  std::vector<std::string> names;
  for (auto& n : nodes) names.push_back(n.describe());
  return fmt::format("{}", fmt::join(names, ", "));
}

// Test-only fault injection (the issue 19 tests kill a node between two of its writes):
// DDPRUN_TEST_FAULT=<point> makes this process die with SIGKILL right after that point.
void fault_point(const char* point) {
  static const char* fault = std::getenv("DDPRUN_TEST_FAULT");
  if (fault && std::strcmp(fault, point) == 0) ::raise(SIGKILL);
}

milliseconds until(std::chrono::steady_clock::time_point t) {
  return std::max(0ms, std::chrono::duration_cast<milliseconds>(t - std::chrono::steady_clock::now()));
}

}  // namespace

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

void DynamicRendezvous::read_events() { take_events(main_->read("events", events_log_.count())); }

// Until something happens to the job (the state changed for waiting nodes, a node was
// lost, ...), or `t`.
void DynamicRendezvous::wait_events(Clock::time_point t) {
  take_events(main_->wait("events", events_log_.count(), until(t)));
}

void DynamicRendezvous::take_events(const std::vector<std::string>& more) {
  for (auto& l : more)
    if (l.starts_with("lost ")) lost_.insert(parse_event(l).node);  // only lost lines need parsing here
  events_log_.add(more);
}

void DynamicRendezvous::bump_epoch() { main_->append("events", "state"); }

void DynamicRendezvous::backoff(int attempt) {
  // Jittered exponential backoff after a lost compare-and-set: the writers thin out.
  static thread_local std::mt19937_64 rng(std::random_device{}() ^ static_cast<uint64_t>(::getpid()));
  auto cap = std::min<int64_t>(32, int64_t{1} << std::min(attempt, 5));
  std::uniform_int_distribution<int64_t> us(0, cap * 1000);
  std::this_thread::sleep_for(std::chrono::microseconds(us(rng)));
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
bool DynamicRendezvous::join_step(std::optional<Snapshot>& snap, Clock::time_point deadline, int& conflicts) {
  if (cancel_) throw ddp::Error("rendezvous: joining the next round was cancelled (this node is stopping)");
  if (!snap) snap = main_->load();
  State s = decode(*snap);
  State t = s;
  bool changed = remove_lost(t, lost_), wake = changed;
  // Requests not applied yet. This node writes them all in only while one of its own is
  // among them: then a thousand joiners need a few writes, and a node that is in waits
  // instead of writing the others' requests again and again.
  auto pending = main_->read("requests", static_cast<size_t>(t.requests_seen));
  const bool mine = std::any_of(pending.begin(), pending.end(), [&](const std::string& l) {
    return l.find(c_.me.id) != std::string::npos;
  });
  if (mine) {
    Absorbed ab = absorb(t, pending, lost_);
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
    snap = r.current;
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
  wait_events(limit);
  snap.reset();
  return false;
}

State DynamicRendezvous::join(Clock::time_point deadline) {
  std::optional<Snapshot> snap;
  int conflicts = 0;
  while (!join_step(snap, deadline, conflicts)) {
  }
  return decode(*snap);
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
    main_->append("requests", join_request(c_.me, c_.job));
    State s = join(deadline);
    round_ = s.round;
    events_log_.keep_from(round_);
    members_ = s.participants;
    RoundPlan p;
    p.round = s.round;
    p.group_rank = s.rank_of(c_.me.id);
    p.group_world_size = static_cast<int>(s.participants.size());
    p.restart_count = s.restarts;
    p.members = s.participants;
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
    if (p.group_rank == 0) forget_round(p.round - 1);
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
                                          members_.front().describe(), p.round, seconds_text(c_.join_timeout)));
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
RoundReader DynamicRendezvous::reader_for(int64_t r, const std::vector<NodeDesc>& members) {
  RoundReader reader;
  reader.feed(events_log_.lines());  // lost lines before the round
  reader.start(r, members);
  reader.feed(events_log_.lines());
  if (reader.needs_exited()) reader.set_exited(exited_before_lost(r));
  return reader;
}

// ------------------------------------------------------------------ a running round

void DynamicRendezvous::ask_dump(const std::string& what) {
  int64_t r;
  {
    std::lock_guard lk(mu_);
    r = watched_round_;
  }
  if (r < 0) return;  // between rounds: no workers anywhere to ask
  std::lock_guard lk(post_mu_);
  if (!post_) post_ = main_->clone();
  post_->append("events", round_event(r, "dump", c_.me.id, what));
}

int64_t DynamicRendezvous::add_progress(int64_t delta) {
  int64_t r;
  {
    std::lock_guard lk(mu_);
    r = watched_round_;
  }
  if (r < 0) return -1;
  std::lock_guard lk(post_mu_);
  if (!post_) post_ = main_->clone();
  return post_->add(fmt::format("progress/{}", r), delta);
}

std::vector<std::string> DynamicRendezvous::take_dump_requests() {
  std::lock_guard lk(mu_);
  return std::exchange(dump_requests_, {});
}

// Round r's dump lines from other nodes among `lines`: handed to the caller (notify_fd).
void DynamicRendezvous::note_dumps(int64_t r, const std::vector<std::string>& lines) {
  std::vector<std::string> asked;
  for (auto& l : lines) {
    if (l.find(" dump ") == std::string::npos) continue;
    Event e = parse_event(l);
    if (e.kind == "dump" && e.round == r && e.node != c_.me.id) asked.push_back(e.text);
  }
  if (asked.empty()) return;
  {
    std::lock_guard lk(mu_);
    dump_requests_.insert(dump_requests_.end(), asked.begin(), asked.end());
  }
  uint64_t one = 1;
  ssize_t n = ::write(efd_, &one, sizeof one);
  (void)n;
}

std::optional<RoundEnd> DynamicRendezvous::round_end() {
  uint64_t v;
  while (::read(efd_, &v, sizeof v) == sizeof v) {
  }
  std::lock_guard lk(mu_);
  if (node_problem_) return node_problem_;
  return end_;
}

void DynamicRendezvous::end_round(RoundEnd::Kind kind, const std::string& text) {
  int64_t r;
  {
    std::lock_guard lk(mu_);
    r = watched_round_;
  }
  if (r < 0) return;  // between rounds: there is no round to end
  const char* word = kind == RoundEnd::Kind::kFailed ? "fail" : "leave";
  try {
    std::lock_guard lk(post_mu_);
    if (!post_) post_ = main_->clone();
    post_->append("events", round_event(r, word, c_.me.id, text));
  } catch (const std::exception& e) {
    spdlog::error("rendezvous: cannot tell the other nodes ({}): {}", word, e.what());
  }
}

// The member whose arrival completes the count writes "done" (one line: no herd of
// watchers woken for every arrival).
void DynamicRendezvous::arrive_exit() {
  main_->append(exit_log(round_), c_.me.id);
  fault_point("exit-appended");
  const int64_t n = main_->add(exit_log(round_) + "/n", 1);
  fault_point("exit-counted");
  spdlog::debug("rendezvous: round {}: exit barrier, {} of {} arrived", round_, n, members_.size());
  if (n == static_cast<int64_t>(members_.size())) {
    main_->append("events", round_event(round_, "done", c_.me.id, ""));
    wrote_done_ = true;
  }
}

RoundEnd DynamicRendezvous::wait_end() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return node_problem_ || end_ || stop_; });
  spdlog::debug("rendezvous: round {} ended: {}", round_,
                node_problem_ ? node_problem_->describe() : end_ ? end_->describe() : "stopping");
  if (node_problem_) return *node_problem_;
  if (end_) return *end_;
  return RoundEnd{RoundEnd::Kind::kClosed, "", "stopping"};
}

std::string DynamicRendezvous::restart_refused(const RoundEnd& end) {
  using K = RoundEnd::Kind;
  if (end.kind == K::kDone) return "";
  if (end.node_only() || end.kind == K::kClosed) return end.text;
  if (end.kind == K::kLost && end.node == c_.me.id)
    return fmt::format("this node was declared lost by the rendezvous ({})", end.text);
  State s;
  try {
    s = decode(main_->load());
    read_events();
  } catch (const std::exception& e) {
    return fmt::format("{}; and the rendezvous cannot be read: {}", end.describe(), e.what());
  }
  if (s.closed) return s.closed_reason.empty() ? "the job finished" : s.closed_reason;
  if (!end.counted()) return "";
  if (s.restarts >= c_.job.max_restarts)
    return fmt::format("{}; no restart left ({} of --max-restarts {} used)", end.text, s.restarts, c_.job.max_restarts);
  // Who can take part in the next round: this round's members that are not gone or
  // stopping, and whoever waits.
  std::set<std::string> out = lost_;
  for (auto& l : events_log_.lines()) {
    Event e = parse_event(l);
    if (e.round == round_ && e.kind == "leave") out.insert(e.node);
  }
  int available = static_cast<int>(s.wait_list.size() + s.redundancy_list.size());
  for (auto& m : members_) available += out.count(m.id) ? 0 : 1;
  if (available < c_.job.min_nodes)
    return fmt::format("{}; only {} node{} remain{}, fewer than the {} the job needs ({})", end.text, available,
                       available == 1 ? "" : "s", available == 1 ? "s" : "", c_.job.min_nodes, nnodes_flag(c_.job));
  return "";
}

// ------------------------------------------------------------------ the end

void DynamicRendezvous::cancel() {
  cancel_ = true;
  main_->interrupt();  // a wait in progress returns now; this node is stopping
}

// One node closes (a thousand loading the state to find it closed would be the job's
// slowest step); the "closed" event tells the others without that.
void DynamicRendezvous::close_rendezvous(const std::string& reason) {
  read_events();
  for (auto& l : events_log_.lines())
    if (l.starts_with("closed")) return;
  const auto deadline = Clock::now() + c_.close_timeout;
  std::optional<Snapshot> snap;
  for (int attempt = 0; Clock::now() < deadline; ++attempt) {
    if (!snap) snap = main_->load();
    State s = decode(*snap);
    if (s.closed) return;
    close_state(s, reason);
    auto r = main_->compare_and_set(encode_state(s), snap->token);
    if (r.ok) {
      main_->append("events", "closed");
      return;
    }
    snap = r.current;
    backoff(attempt);
  }
  spdlog::warn("rendezvous: could not close the rendezvous within close_timeout {}", seconds_text(c_.close_timeout));
}

// The node hosting the store keeps it up until every node it knows of has left (or is
// gone), so that nobody loses the store while reading how the job ended.
void DynamicRendezvous::wait_for_everyone_to_leave(const std::vector<NodeDesc>& nodes) {
  const auto deadline = Clock::now() + c_.close_timeout;
  std::vector<std::string> left;
  for (;;) {
    read_events();
    std::set<std::string> ids(left.begin(), left.end());
    size_t missing = 0;
    for (auto& n : nodes)
      if (!ids.count(n.id) && !lost_.count(n.id)) ++missing;
    if (missing == 0) return;
    if (Clock::now() >= deadline) {
      spdlog::warn("rendezvous: {} node(s) did not leave within close_timeout {}; stopping the store", missing,
                   seconds_text(c_.close_timeout));
      return;
    }
    auto more = main_->wait("left", left.size(), std::min<milliseconds>(250ms, until(deadline)));
    left.insert(left.end(), more.begin(), more.end());
  }
}

void DynamicRendezvous::finish(FinishKind kind, const std::string& reason) {
  worker_store_.reset();
  if (cancel_) return;  // stopping in a hurry: the lease's end tells the others
  {
    // Cut off from the backend (partitioned, or it is gone): every call would wait out
    // read_timeout. The lease's end tells the others.
    std::lock_guard lk(mu_);
    if (node_problem_) return;
  }
  try {
    if (kind == FinishKind::kSucceeded && wrote_done_) close_rendezvous("");
    if (kind == FinishKind::kJobFailed) close_rendezvous(reason.empty() ? "the job failed" : reason);
    spdlog::debug("rendezvous: closed");
    // "left" before the lease goes: the last lease to go may take the run's keys with it
    // (etcd), and nothing may be written after that.
    main_->append("left", c_.me.id);
    spdlog::debug("rendezvous: left");
    if (kind != FinishKind::kNodeStopped) {
      // Leaving a finished job in good order: no "lost" line for anyone to read.
      std::lock_guard lk(lease_mu_);
      spdlog::debug("rendezvous: releasing");
      lease_->release();
    }
    if (c_.hosts_store) {
      State s = decode(main_->load());
      std::vector<NodeDesc> nodes = members_;
      for (auto* list : {&s.participants, &s.wait_list, &s.redundancy_list})
        for (auto& n : *list)
          if (!State::contains(nodes, n.id)) nodes.push_back(n);
      std::erase_if(nodes, [&](const NodeDesc& n) { return n.id == c_.me.id; });
      wait_for_everyone_to_leave(nodes);
    }
  } catch (const std::exception& e) {
    spdlog::debug("rendezvous: leaving: {}", e.what());
  }
}

// ------------------------------------------------------------------ threads

void DynamicRendezvous::notify_end(int64_t round, const RoundEnd& end) {
  {
    std::lock_guard lk(mu_);
    if (round >= 0 && (watched_round_ != round || end_)) return;
    if (round < 0) {
      if (node_problem_) return;
      node_problem_ = end;
    } else {
      end_ = end;
    }
  }
  cv_.notify_all();
  uint64_t one = 1;
  ssize_t r = ::write(efd_, &one, sizeof one);
  (void)r;
}

// Renews the lease every keep_alive_interval. A lease that ended (the backend said so, or
// no renewal got through for the whole window) means the others go on without this node:
// it must stop.
void DynamicRendezvous::keeper_loop() {
  const auto ttl = c_.keep_alive_interval * c_.keep_alive_max_attempt;
  auto last_ok = Clock::now();
  std::unique_lock lk(mu_);
  while (!stop_) {
    lk.unlock();
    auto left = std::chrono::duration_cast<milliseconds>(ttl - (Clock::now() - last_ok));
    bool ended = false;
    std::string why;
    try {
      std::lock_guard l2(lease_mu_);
      lease_->keep_alive(std::max(left, 100ms));
      last_ok = Clock::now();
    } catch (const LeaseEnded& e) {
      ended = true;
      why = e.what();
    } catch (const std::exception& e) {
      ended = Clock::now() - last_ok >= ttl;
      why = e.what();
    }
    lk.lock();
    if (stop_) break;
    if (ended) {
      lk.unlock();
      notify_end(-1, RoundEnd{RoundEnd::Kind::kPartitioned, c_.me.id,
                              fmt::format("this node lost contact with {} for the keep-alive window ({} = "
                                          "keep_alive_interval {} x keep_alive_max_attempt {}): {}; the other nodes "
                                          "go on without it",
                                          backend_name_, seconds_text(ttl), seconds_text(c_.keep_alive_interval),
                                          c_.keep_alive_max_attempt, why)});
      return;
    }
    cv_.wait_for(lk, why.empty() ? c_.keep_alive_interval : std::min<milliseconds>(c_.keep_alive_interval, 500ms),
                 [&] { return stop_; });
  }
}

// Reads the events as they come; the first that ends the watched round wakes the caller
// through notify_fd.
void DynamicRendezvous::watcher_loop() {
  RoundReader reader;
  EventsTail seen;
  int64_t r = -1;
  // The round's end, if what was read so far says it ended: then the caller is woken.
  auto judge = [&] {
    if (reader.needs_exited()) {
      std::set<std::string> exited, lost;
      for (auto& l : events_->read(exit_log(r), 0)) {
        Event e = parse_event(l);
        if (e.kind == "lost") lost.insert(e.node);
        else if (!lost.count(e.kind)) exited.insert(e.kind);
      }
      reader.set_exited(exited);
    }
    if (auto end = reader.end()) notify_end(r, *end);
  };
  for (;;) {
    bool started = false;
    {
      std::unique_lock lk(mu_);
      if (stop_) return;
      if (watched_round_ != r) {
        r = watched_round_;
        if (r >= 0) {
          seen.keep_from(r);
          reader.start(r, watched_members_);
          started = true;
        }
      }
    }
    try {
      if (started) {
        // Events of round r that came before it was watched may already end it (a round of
        // `true` workers can be over by now).
        reader.feed(seen.lines());
        judge();
      }
      auto more = events_->wait("events", seen.count(), r < 0 ? 200ms : 1s);
      seen.add(more);
      reader.feed(more);  // before a round is watched: remembers lost lines
      if (r >= 0) {
        note_dumps(r, more);
        judge();
      }
    } catch (const std::exception& e) {
      {
        std::lock_guard lk(mu_);
        if (stop_) return;
      }
      notify_end(-1, RoundEnd{RoundEnd::Kind::kStoreLost, "",
                              fmt::format("lost the rendezvous at {}: {}{}", backend_name_, e.what(),
                                          c_.store_lost_hint)});
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_; });
      return;
    }
  }
}

}  // namespace ddprun::rdzv
