// The dynamic rendezvous, continued (dynamic.cpp: forming rounds): a running round (its
// end, the notes this node sends, the exit barrier, whether another may follow), and the
// job's end.
#include "rendezvous/dynamic.hpp"

#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "rendezvous/dynamic_util.hpp"
#include "store/server.hpp"  // worker_store_

namespace ddprun::rdzv {

using namespace detail;

// ------------------------------------------------------------------ a running round

// end_round's backend is its own: end_round may run while next_round (or its cancel) uses
// main_ in another thread.
template <class F>
auto DynamicRendezvous::post(F f) {
  std::lock_guard lk(post_mu_);
  if (!post_) post_ = main_->clone();
  return f(*post_);
}

void DynamicRendezvous::ask_dump(const std::string& what) {
  const int64_t r = signal_.watched();
  if (r < 0) return;  // between rounds: no workers anywhere to ask
  post([&](Backend& b) { b.append("events", round_event(r, "dump", c_.me.id, what)); });
}

int64_t DynamicRendezvous::add_progress(int64_t delta) {
  const int64_t r = signal_.watched();
  if (r < 0) return -1;
  return post([&](Backend& b) { return b.add(fmt::format("progress/{}", r), delta); });
}

void DynamicRendezvous::answer_dump(const std::string& what, const std::string& answer) {
  int64_t r = signal_.dump_round(what);
  if (r < 0) r = signal_.watched();  // (not seen asked: the running round's)
  if (r < 0) return;
  post([&](Backend& b) { b.append(dumps_log(r), dump_answer_line(what, answer)); });
}

void DynamicRendezvous::gather_dump(const std::string& what, size_t nodes, Clock::time_point deadline) {
  const int64_t r = signal_.watched();
  if (r < 0 || nodes == 0) return;
  // (The time it took counts from the ask, not from the gather's thread, which under load
  // started late: "within 1.98 s" of a 2 s window.)
  const auto t0 = Clock::now();
  gatherer_->start(main_->clone(), r, what, nodes, t0, deadline);
}

std::vector<std::string> DynamicRendezvous::take_dump_requests() { return signal_.take_dumps(); }

std::optional<RoundEnd> DynamicRendezvous::round_end() { return signal_.take(); }

void DynamicRendezvous::end_round(RoundEnd::Kind kind, const std::string& text) {
  const int64_t r = signal_.watched();
  if (r < 0) return;  // between rounds: there is no round to end
  const char* word = kind == RoundEnd::Kind::kFailed ? "fail" : "leave";
  try {
    post([&](Backend& b) { b.append("events", round_event(r, word, c_.me.id, text)); });
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
  RoundEnd end = signal_.wait();
  spdlog::debug("rendezvous: round {} ended: {}", round_, end.describe());
  return end;
}

std::string DynamicRendezvous::restart_refused(const RoundEnd& end) {
  using K = RoundEnd::Kind;
  if (end.kind == K::kDone) return "";
  if (end.node_only() || end.kind == K::kClosed) return end.text;
  if (end.kind == K::kLost && end.node == c_.me.id)
    return fmt::format("this node was declared lost by the rendezvous ({})", end.text);
  State s;
  try {
    s = decode(main_->load(), backend_name_);
    events_.read();
  } catch (const std::exception& e) {
    return fmt::format("{}; and the rendezvous cannot be read: {}", end.describe(), e.what());
  }
  if (s.closed) return s.closed_reason.empty() ? "the job finished" : s.closed_reason;
  if (!end.counted()) return "";
  if (s.restarts >= c_.job.max_restarts)
    return fmt::format("{}; no restart left ({} of --max-restarts {} used)", end.text, s.restarts, c_.job.max_restarts);
  // Who can take part in the next round: this round's members that are not gone or
  // stopping, and whoever waits.
  const size_t available = s.wait_list.size() + s.redundancy_list.size() + remaining_members(events_.lost()).size();
  // (With replace_timeout the next round's join waits for newcomers, and says so.)
  if (available < static_cast<size_t>(c_.job.min_nodes) && c_.replace_timeout == milliseconds(0))
    return fmt::format("{}; {}{}", end.text, too_few_text(available, c_.job), kReplaceHint);
  return "";
}

// The members of this node's round that take part in the next, as far as the events read
// so far tell: not stopping (a signal: "leave"), and not among `lost`.
std::vector<NodeDesc> DynamicRendezvous::remaining_members(std::set<std::string> out) const {
  for (auto& l : events_.lines()) {
    Event e = parse_event(l);
    if (e.round == round_ && e.kind == "leave") out.insert(e.node);
  }
  std::vector<NodeDesc> left;
  for (auto& m : *members_)
    if (!out.count(m.id)) left.push_back(m);
  return left;
}

// ------------------------------------------------------------------ the end

void DynamicRendezvous::cancel() {
  cancel_ = true;
  // A wait in progress returns now; this node is stopping. The store's host keeps its
  // connection (woken, not interrupted): it still closes the job and waits for the others
  // to leave (finish), so that they read why instead of a lost store.
  if (c_.hosts_store)
    main_->wake();
  else
    main_->interrupt();
}

// One node closes (a thousand loading the state to find it closed would be the job's
// slowest step); the "closed" event tells the others without that.
void DynamicRendezvous::close_rendezvous(const std::string& reason) {
  events_.read();
  for (auto& l : events_.lines())
    if (l.starts_with("closed")) return;
  const auto deadline = Clock::now() + c_.close_timeout;
  std::optional<Snapshot> snap;
  for (int attempt = 0; Clock::now() < deadline; ++attempt) {
    if (!snap) snap = main_->load();
    State s = decode(*snap, backend_name_);
    if (s.closed) return;
    close_state(s, reason);
    auto r = main_->compare_and_set(encode_state(s), snap->token);
    if (r.ok) {
      main_->append("events", closed_event(c_.me.id, reason));
      return;
    }
    snap = r.current;
    backoff(attempt);
  }
  spdlog::warn("rendezvous: could not close the rendezvous within close_timeout {}", seconds_text(c_.close_timeout));
}

// The node hosting the store keeps it up until every node it knows of has left (or is
// gone), so that nobody loses the store while reading how the job ended. It gives up on
// the rest close_timeout after the last node left, not after its own end: a thousand nodes
// whose joins timed out together take longer than that to write themselves out of the
// state one by one, and each must still read why its join failed.
void DynamicRendezvous::wait_for_everyone_to_leave(const std::vector<NodeDesc>& nodes) {
  auto deadline = Clock::now() + c_.close_timeout;
  size_t was_missing = nodes.size();
  std::vector<std::string> left;
  for (;;) {
    events_.read();
    std::set<std::string> ids(left.begin(), left.end());
    size_t missing = 0;
    for (auto& n : nodes)
      if (!ids.count(n.id) && !events_.lost().count(n.id)) ++missing;
    if (missing == 0) return;
    if (missing < was_missing) deadline = Clock::now() + c_.close_timeout;
    was_missing = missing;
    if (Clock::now() >= deadline) {
      spdlog::warn("rendezvous: {} node(s) did not leave within close_timeout {} of the last that did; stopping the "
                   "store",
                   missing, seconds_text(c_.close_timeout));
      return;
    }
    // A "left" line ends the wait at once; a node lost instead (killed, or gone after its
    // join failed: it writes no "left") is seen in the events at the next slice.
    auto more = main_->wait("left", left.size(), std::min<milliseconds>(50ms, until(deadline)));
    left.insert(left.end(), more.begin(), more.end());
  }
}

void DynamicRendezvous::finish(FinishKind kind, std::string reason) {
  worker_store_.reset();
  // Stopping in a hurry: the lease's end tells the others. The store's host says goodbye
  // all the same (cancel), once: not for the cancelled join's own failure (kJoinFailed).
  if (cancel_ && (!c_.hosts_store || kind == FinishKind::kJoinFailed)) return;
  // Cut off from the backend (partitioned, or it is gone): every call would wait out
  // read_timeout. The lease's end tells the others.
  if (signal_.cut_off()) return;
  // The store goes with this process: the others cannot go on without it (they would wait
  // in their next join while this node waits for them to leave), so the job fails here.
  if (kind == FinishKind::kNodeStopped && c_.hosts_store) {
    kind = FinishKind::kJobFailed;
    reason = fmt::format("node {}, which hosts the store, stopped{}: the job cannot go on without its store",
                         c_.me.describe(), reason.empty() ? "" : " (" + reason + ")");
  }
  try {
    if (kind == FinishKind::kSucceeded && wrote_done_) close_rendezvous("");
    if (kind == FinishKind::kJobFailed) close_rendezvous(reason.empty() ? "the job failed" : reason);
    spdlog::debug("rendezvous: closed");
    // "left" before the lease goes: the last lease to go may take the run's keys with it
    // (etcd), and nothing may be written after that.
    main_->append("left", c_.me.id);
    spdlog::debug("rendezvous: left");
    if (kind != FinishKind::kNodeStopped && kind != FinishKind::kJoinFailed)
      keeper_->release();  // in good order: no "lost" line to read
    if (c_.hosts_store) {
      State s = decode(main_->load(), backend_name_);
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

}  // namespace ddprun::rdzv
