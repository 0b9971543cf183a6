// The dynamic rendezvous, continued (dynamic.cpp: joining): a running round (its end, the
// notes this node sends, the exit barrier, whether another may follow), the job's end, and
// the keeper and watcher threads.
#include "rendezvous/dynamic.hpp"

#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "rendezvous/dynamic_util.hpp"
#include "store/server.hpp"

namespace ddprun::rdzv {

using namespace detail;

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
  spdlog::debug("rendezvous: round {}: exit barrier, {} of {} arrived", round_, n, members_->size());
  if (n == static_cast<int64_t>(members_->size())) {
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
  for (auto& m : *members_) available += out.count(m.id) ? 0 : 1;
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
      std::vector<NodeDesc> nodes = *members_;
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
  // No round to watch (this node is joining one), or the watched one's end is known (mu_
  // held): then no wait on the events, which would wake a thousand idle watchers at every
  // line. next_round wakes this thread when it has a round; a read once a second still
  // finds a store that is gone.
  auto quiet = [&] { return watched_round_ == r && (r < 0 || end_.has_value()); };
  for (;;) {
    bool started = false, idle = false;
    {
      std::unique_lock lk(mu_);
      if (stop_) return;
      if (quiet()) {
        cv_.wait_for(lk, 1s, [&] { return stop_ || !quiet(); });
        if (stop_) return;
      }
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
        // `true` workers can be over by now), or ask for a dump (read while no round was).
        reader.feed(seen.lines());
        note_dumps(r, seen.lines());
        judge();
      }
      {
        std::lock_guard lk(mu_);
        idle = quiet();
      }
      size_t skip = 0;
      auto more = next_events(*events_, seen, !idle, 1s, skip);
      if (skip) {
        seen.skip_to(skip);  // behind a trim: on from the first line held
        continue;
      }
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
