#include "rendezvous/dynamic.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "store/server.hpp"

namespace ddprun::rdzv {

namespace {

using namespace std::chrono_literals;

std::string round_log(int64_t r) { return fmt::format("round/{}", r); }
std::string exit_log(int64_t r) { return fmt::format("exit/{}", r); }

std::string first_word(const std::string& line) { return line.substr(0, line.find(' ')); }

std::set<std::string> first_words(const std::vector<std::string>& lines) {
  std::set<std::string> out;
  for (auto& l : lines) out.insert(first_word(l));
  return out;
}

std::string seconds_text(milliseconds d) { return ddp::format_duration(d); }

std::string describe_nodes(const std::vector<NodeDesc>& nodes) {
  std::vector<std::string> names;
  for (auto& n : nodes) names.push_back(n.describe());
  return fmt::format("{}", fmt::join(names, ", "));
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

// The lease: when this node dies or falls silent, the others read its id in "gone" (and
// a line in "epoch" wakes whoever waits for the state to change).
void DynamicRendezvous::open() {
  {
    std::lock_guard lk(lease_mu_);
    lease_->open_lease(c_.keep_alive_interval * c_.keep_alive_max_attempt);
    lease_->on_lease_end("gone", c_.me.id);
    lease_->on_lease_end("epoch", "gone " + c_.me.id);
  }
  epoch_seen_ = main_->read("epoch", 0).size();
  refresh_lost();
  keeper_ = std::thread([this] { keeper_loop(); });
  watcher_ = std::thread([this] { watcher_loop(); });
}

// ------------------------------------------------------------------ joining

State DynamicRendezvous::decode(const Snapshot& s) const {
  return s.state ? decode_state(*s.state, backend_name_) : State{};
}

void DynamicRendezvous::refresh_lost() {
  auto lines = main_->read("gone", gone_seen_);
  gone_seen_ += lines.size();
  for (auto& l : lines) lost_.insert(first_word(l));
}

void DynamicRendezvous::bump_epoch() { main_->append("epoch", "changed"); }

// Until the state changes in a way that matters to waiting nodes, or `until`.
void DynamicRendezvous::wait_epoch(Clock::time_point until) {
  auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
  auto more = main_->wait("epoch", epoch_seen_, std::max(left, 0ms));
  epoch_seen_ += more.size();
  if (!more.empty()) refresh_lost();
}

void DynamicRendezvous::backoff(int attempt) {
  // Jittered exponential backoff after a lost compare-and-set: the winners thin out.
  static thread_local std::mt19937_64 rng(std::random_device{}() ^ static_cast<uint64_t>(::getpid()));
  auto cap = std::min<int64_t>(64, int64_t{1} << std::min(attempt, 6));
  std::uniform_int_distribution<int64_t> us(0, cap * 1000);
  std::this_thread::sleep_for(std::chrono::microseconds(us(rng)));
}

// Registers, before this node becomes a member of round r, the line its lease writes into
// r's log if it dies: the round's members learn at once that it is gone.
void DynamicRendezvous::register_round(int64_t r) {
  if (registered_round_ == r) return;
  std::lock_guard lk(lease_mu_);
  lease_->on_lease_end(round_log(r), make_line("lost", c_.me.id, ""));
  registered_round_ = r;
}

void DynamicRendezvous::join_failed(JoinAction a, const State& s) {
  const auto& j = c_.job;
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
  const std::string timeout = fmt::format("join_timeout {} (--rdzv-conf join_timeout=SECONDS)",
                                          seconds_text(c_.join_timeout));
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
// member of a complete round.
bool DynamicRendezvous::join_step(std::optional<Snapshot>& snap, Clock::time_point deadline) {
  static thread_local int conflicts = 0;
  if (!snap) snap = main_->load();
  State s = decode(*snap);
  if (remove_lost(s, lost_)) {
    auto r = main_->compare_and_set(encode_state(s), snap->token);
    if (r.ok) bump_epoch();
    else backoff(++conflicts);
    snap = r.current;
    return false;
  }
  const auto now = Clock::now();
  if (s.last_call && !s.complete && s.has_participant(c_.me.id) && lc_round_ != s.round) {
    lc_round_ = s.round;  // MIN nodes are in: this node times the last call from now
    lc_deadline_ = now + c_.last_call_timeout;
  }
  JoinContext ctx{c_.me, c_.job, now >= deadline, lc_round_ == s.round && now >= lc_deadline_};
  JoinAction a = decide_join(s, ctx);
  switch (a) {
    case JoinAction::kFinish:
      conflicts = 0;
      return true;
    case JoinAction::kErrorClosed:
    case JoinAction::kErrorTimeout:
    case JoinAction::kErrorMismatch:
      join_failed(a, s);
    case JoinAction::kWait: {
      auto until = std::min(deadline, now + 1s);
      if (lc_round_ == s.round && s.last_call && !s.complete) until = std::min(until, lc_deadline_);
      wait_epoch(until);
      snap.reset();
      return false;
    }
    default:
      break;
  }
  if (a == JoinAction::kAddToParticipants) register_round(s.round);
  State t = s;
  const bool wake = apply_join(t, a, ctx);
  auto r = main_->compare_and_set(encode_state(t), snap->token);
  snap = r.current;
  if (!r.ok) {
    backoff(++conflicts);
    return false;
  }
  conflicts = 0;
  spdlog::debug("rendezvous: round {}: {}", s.round, to_string(a));
  if (wake) bump_epoch();
  if (a == JoinAction::kAddToWaitList) {
    spdlog::info("rendezvous: round {} of job '{}' is running without this node: asking it to restart with it",
                 s.round, c_.run_id);
    main_->append(round_log(s.round), make_line("join", c_.me.id, c_.me.describe()));
  }
  if (a == JoinAction::kAddToRedundancyList)
    spdlog::warn("rendezvous: the job '{}' is full ({} nodes running, --nnodes {}:{}): this node waits for a place",
                 c_.run_id, s.participants.size(), c_.job.min_nodes, c_.job.max_nodes);
  if (a == JoinAction::kRemoveMe) join_failed(JoinAction::kErrorTimeout, s);  // who was there, this node too
  return false;
}

State DynamicRendezvous::join() {
  const auto deadline = Clock::now() + c_.join_timeout;
  std::optional<Snapshot> snap;
  while (!join_step(snap, deadline)) {
  }
  return decode(*snap);
}

// Leaves the round this node ran in; the last to leave opens the next round.
void DynamicRendezvous::leave_current() {
  worker_store_.reset();
  {
    std::lock_guard lk(mu_);
    watched_round_ = -1;
    end_.reset();
  }
  // How the round ended: its log's first line that counts, the same for every node.
  auto lines = main_->read(round_log(round_), 0);
  auto exited = first_words(main_->read(exit_log(round_), 0));
  auto end = interpret_round(lines, members_, exited);
  const bool counted = end ? end->counted() : true;
  std::optional<Snapshot> snap;
  for (int attempt = 0;; ++attempt) {
    if (!snap) snap = main_->load();
    State s = decode(*snap);
    State t = s;
    if (!leave_round(t, c_.me.id, round_, counted)) break;
    auto r = main_->compare_and_set(encode_state(t), snap->token);
    if (r.ok) {
      if (t.round != s.round) bump_epoch();
      break;
    }
    snap = r.current;
    backoff(attempt);
  }
}

RoundPlan DynamicRendezvous::next_round() {
  for (;;) {
    if (round_ >= 0) leave_current();
    State s = join();
    round_ = s.round;
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
    spdlog::info("rendezvous: round {} of job '{}': node rank {} of {} ({}), ranks {}..{} of {}, restarts so far {}",
                 p.round, c_.run_id, p.group_rank, p.group_world_size, describe_nodes(p.members), p.rank_base,
                 p.rank_base + c_.me.nproc - 1, p.world_size, p.restart_count);
    return p;
  }
}

// Rank 0 hosts the round's worker store (a fresh port every round: no worker ever reads an
// earlier round's keys) and writes where it is into the round's log; the others read it.
void DynamicRendezvous::publish_or_fetch_master(RoundPlan& p) {
  const std::string log = round_log(p.round);
  if (p.group_rank == 0) {
    ddp::detail::StoreServerOptions so;
    so.host = "";
    so.port = 0;
    so.backlog = std::max(2048, p.world_size * 2);
    worker_store_ = std::make_unique<ddp::detail::StoreServer>(so);
    worker_store_->start();
    p.master_addr = c_.me.master_addr;
    p.master_port = worker_store_->port();
    main_->append(log, make_line("master", c_.me.id, fmt::format("{} {}", p.master_addr, p.master_port)));
    return;
  }
  const auto deadline = Clock::now() + c_.join_timeout;
  std::vector<std::string> lines;
  for (;;) {
    auto more = main_->wait(log, lines.size(), std::min<milliseconds>(1s, std::chrono::duration_cast<milliseconds>(
                                                                             deadline - Clock::now())));
    lines.insert(lines.end(), more.begin(), more.end());
    if (find_master(lines, p.master_addr, p.master_port)) return;
    if (auto end = interpret_round(lines, members_, {})) throw *end;
    if (Clock::now() >= deadline)
      throw ddp::TimeoutError(fmt::format("rendezvous: node rank 0 ({}) did not publish round {}'s worker store "
                                          "within {}",
                                          members_.front().describe(), p.round, seconds_text(c_.join_timeout)));
  }
}

// ------------------------------------------------------------------ a running round

std::optional<RoundEnd> DynamicRendezvous::round_end() {
  uint64_t v;
  while (::read(efd_, &v, sizeof v) == sizeof v) {
  }
  std::lock_guard lk(mu_);
  if (node_problem_) return node_problem_;
  return end_;
}

void DynamicRendezvous::end_round(RoundEnd::Kind kind, const std::string& text) {
  if (round_ < 0) return;
  const char* word = kind == RoundEnd::Kind::kFailed ? "fail" : "leave";
  try {
    main_->append(round_log(round_), make_line(word, c_.me.id, text));
  } catch (const std::exception& e) {
    spdlog::error("rendezvous: cannot tell the other nodes ({}): {}", word, e.what());
  }
}

// The last member to arrive writes "done" into the round's log (a member that arrives at
// the same time may write it too: harmless). Everyone learns of it through the watcher.
void DynamicRendezvous::arrive_exit() {
  main_->append(exit_log(round_), c_.me.id);
  auto exited = first_words(main_->read(exit_log(round_), 0));
  size_t in = 0;
  for (auto& m : members_) in += exited.count(m.id);
  if (in == members_.size()) main_->append(round_log(round_), make_line("done", c_.me.id, ""));
}

RoundEnd DynamicRendezvous::wait_end() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return node_problem_ || end_ || stop_; });
  if (node_problem_) return *node_problem_;
  if (end_) return *end_;
  return RoundEnd{RoundEnd::Kind::kClosed, "", "stopping"};
}

std::string DynamicRendezvous::restart_refused(const RoundEnd& end) {
  using K = RoundEnd::Kind;
  if (end.kind == K::kDone) return "";
  if (end.kind == K::kPartitioned || end.kind == K::kStoreLost || end.kind == K::kClosed) return end.text;
  if (end.kind == K::kLost && end.node == c_.me.id)
    return fmt::format("this node was declared lost by the rendezvous ({})", end.text);
  State s;
  try {
    s = decode(main_->load());
    refresh_lost();
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
  try {
    for (auto& l : main_->read(round_log(round_), 0)) {
      LogLine ll = parse_line(l);
      if (ll.kind == "leave" || ll.kind == "lost") out.insert(ll.node);
    }
  } catch (const std::exception&) {
  }
  int available = static_cast<int>(s.wait_list.size() + s.redundancy_list.size());
  for (auto& m : members_) available += out.count(m.id) ? 0 : 1;
  if (available < c_.job.min_nodes)
    return fmt::format("{}; only {} node{} remain{}, fewer than the {} the job needs (--nnodes {}:{})", end.text,
                       available, available == 1 ? "" : "s", available == 1 ? "s" : "", c_.job.min_nodes,
                       c_.job.min_nodes, c_.job.max_nodes);
  return "";
}

// ------------------------------------------------------------------ the end

void DynamicRendezvous::close_rendezvous(const std::string& reason) {
  const auto deadline = Clock::now() + c_.close_timeout;
  std::optional<Snapshot> snap;
  for (int attempt = 0; Clock::now() < deadline; ++attempt) {
    if (!snap) snap = main_->load();
    State s = decode(*snap);
    if (s.closed) return;
    close_state(s, reason);
    auto r = main_->compare_and_set(encode_state(s), snap->token);
    if (r.ok) {
      bump_epoch();
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
    refresh_lost();
    auto ids = std::set<std::string>(left.begin(), left.end());
    size_t missing = 0;
    for (auto& n : nodes)
      if (!ids.count(n.id) && !lost_.count(n.id)) ++missing;
    if (missing == 0) return;
    auto now = Clock::now();
    if (now >= deadline) {
      spdlog::warn("rendezvous: {} node(s) did not leave within close_timeout {}; stopping the store", missing,
                   seconds_text(c_.close_timeout));
      return;
    }
    auto more = main_->wait("left", left.size(),
                            std::min<milliseconds>(250ms, std::chrono::duration_cast<milliseconds>(deadline - now)));
    left.insert(left.end(), more.begin(), more.end());
  }
}

void DynamicRendezvous::finish(FinishKind kind, const std::string& reason) {
  worker_store_.reset();
  try {
    if (kind == FinishKind::kSucceeded) close_rendezvous("");
    if (kind == FinishKind::kJobFailed) close_rendezvous(reason.empty() ? "the job failed" : reason);
    main_->append("left", c_.me.id);
    if (c_.hosts_store) {
      State s = decode(main_->load());
      std::vector<NodeDesc> nodes = members_;
      for (auto* list : {&s.participants, &s.wait_list, &s.redundancy_list})
        for (auto& n : *list)
          if (n.id != c_.me.id && !State::contains(nodes, n.id)) nodes.push_back(n);
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
    auto now = Clock::now();
    auto left = std::chrono::duration_cast<milliseconds>(ttl - (now - last_ok));
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

// Reads the running round's log as it grows; the first line that ends the round wakes the
// caller through notify_fd.
void DynamicRendezvous::watcher_loop() {
  int64_t r = -1;
  std::vector<std::string> lines;
  std::vector<NodeDesc> members;
  std::set<std::string> exited;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      if (stop_) return;
      if (watched_round_ != r) {
        r = watched_round_;
        members = watched_members_;
        lines.clear();
        exited.clear();
      }
      if (r < 0) {
        cv_.wait(lk, [&] { return stop_ || watched_round_ != r; });
        continue;
      }
    }
    try {
      auto more = events_->wait(round_log(r), lines.size(), 1s);
      if (more.empty()) continue;
      lines.insert(lines.end(), more.begin(), more.end());
      bool departures = std::any_of(more.begin(), more.end(), [](const std::string& l) {
        auto k = first_word(l);
        return k == "lost" || k == "leave";
      });
      if (departures) exited = first_words(events_->read(exit_log(r), 0));
      if (auto end = interpret_round(lines, members, exited)) notify_end(r, *end);
    } catch (const std::exception& e) {
      {
        std::lock_guard lk(mu_);
        if (stop_) return;
      }
      notify_end(-1, RoundEnd{RoundEnd::Kind::kStoreLost, "",
                              fmt::format("lost the rendezvous at {}: {}{}", backend_name_, e.what(),
                                          c_.hosts_store ? ""
                                                         : " (a c10d store lives in the ddprun of one node: when that "
                                                           "node stops, so does the job; a ddp-store-server of its own, "
                                                           "or etcd, outlives any node)")});
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_; });
      return;
    }
  }
}

}  // namespace ddprun::rdzv
