#include "rendezvous/machine.hpp"

#include <algorithm>
#include <sstream>

#include <fmt/format.h>

namespace ddprun::rdzv {

namespace {

bool erase_id(std::vector<NodeDesc>& list, const std::string& id) {
  return std::erase_if(list, [&](const NodeDesc& n) { return n.id == id; }) > 0;
}

// The round has fewer than MIN nodes again: its last call stops.
void after_removal(State& s) {
  if (!s.complete && (!s.job || static_cast<int>(s.participants.size()) < s.job->min_nodes)) s.last_call = false;
}

// The last member of a complete round left: the next round opens.
void mark_complete(State& s) {
  std::sort(s.participants.begin(), s.participants.end());
  s.complete = true;
  s.last_call = false;
}

// A participant joined: the last call starts at MIN, the round completes at MAX.
bool after_join(State& s) {
  const int n = static_cast<int>(s.participants.size());
  bool woke = false;
  if (s.job && n >= s.job->min_nodes && !s.last_call && !s.complete) {
    s.last_call = true;
    woke = true;
  }
  if (s.job && n >= s.job->max_nodes && !s.complete) {
    mark_complete(s);
    woke = true;
  }
  return woke;
}

// The last member of a complete round left: the next round opens, with the nodes that
// waited for it (the wait list, then the redundancy list, up to MAX). `counted` applies
// when no leaver recorded how the round ended.
void open_next_round(State& s, bool counted) {
  if (s.ending_round == s.round) counted = s.ending_counted;
  ++s.round;
  s.complete = false;
  s.last_call = false;
  if (counted) ++s.restarts;
  s.ending_round = -1;
  s.ending_counted = false;
  const int max = s.job ? s.job->max_nodes : 1;
  for (auto* list : {&s.wait_list, &s.redundancy_list}) {
    while (!list->empty() && static_cast<int>(s.participants.size()) < max) {
      s.participants.push_back(list->front());
      list->erase(list->begin());
    }
  }
  after_join(s);
}

}  // namespace

const char* to_string(JoinAction a) {
  switch (a) {
    case JoinAction::kFinish: return "finish";
    case JoinAction::kWait: return "wait";
    case JoinAction::kAddToParticipants: return "add to participants";
    case JoinAction::kAddToWaitList: return "add to wait list";
    case JoinAction::kAddToRedundancyList: return "add to redundancy list";
    case JoinAction::kMarkComplete: return "mark complete";
    case JoinAction::kRemoveMe: return "remove";
    case JoinAction::kErrorClosed: return "closed";
    case JoinAction::kErrorTimeout: return "timeout";
    case JoinAction::kErrorMismatch: return "mismatch";
    case JoinAction::kErrorRankTaken: return "rank taken";
  }
  return "?";
}

const NodeDesc* rank_holder(const State& s, const NodeDesc& me) {
  if (me.rank < 0) return nullptr;
  for (auto* list : {&s.participants, &s.wait_list, &s.redundancy_list})
    for (auto& n : *list)
      if (n.rank == me.rank && n.id != me.id) return &n;
  return nullptr;
}

JoinAction decide_join(const State& s, const JoinContext& c) {
  if (s.closed) return JoinAction::kErrorClosed;
  if (s.job && !(*s.job == c.job)) return JoinAction::kErrorMismatch;
  if (rank_holder(s, c.me)) return JoinAction::kErrorRankTaken;
  const std::string& me = c.me.id;
  const bool part = s.has_participant(me);
  const bool waiting = State::contains(s.wait_list, me), redundant = State::contains(s.redundancy_list, me);
  const int n = static_cast<int>(s.participants.size());
  if (s.complete && part) return JoinAction::kFinish;
  if (c.timed_out) return part || waiting || redundant ? JoinAction::kRemoveMe : JoinAction::kErrorTimeout;
  if (s.complete) {  // a round runs without this node
    if (waiting) return JoinAction::kWait;
    if (n < c.job.max_nodes) return JoinAction::kAddToWaitList;
    return redundant ? JoinAction::kWait : JoinAction::kAddToRedundancyList;
  }
  if (!part) {
    if (n < c.job.max_nodes) return JoinAction::kAddToParticipants;
    return redundant ? JoinAction::kWait : JoinAction::kAddToRedundancyList;
  }
  if (n >= c.job.max_nodes) return JoinAction::kMarkComplete;
  if (n >= c.job.min_nodes && s.last_call && c.last_call_expired) return JoinAction::kMarkComplete;
  return JoinAction::kWait;
}

bool apply_join(State& s, JoinAction a, const JoinContext& c) {
  const std::string& me = c.me.id;
  ++s.seq;
  switch (a) {
    case JoinAction::kAddToParticipants: {
      erase_id(s.wait_list, me);
      erase_id(s.redundancy_list, me);
      if (!s.job) s.job = c.job;
      s.participants.push_back(c.me);
      return after_join(s);
    }
    case JoinAction::kAddToWaitList:
      erase_id(s.redundancy_list, me);
      s.wait_list.push_back(c.me);
      return false;
    case JoinAction::kAddToRedundancyList:
      s.redundancy_list.push_back(c.me);
      return false;
    case JoinAction::kMarkComplete:
      mark_complete(s);
      return true;
    case JoinAction::kRemoveMe: {
      erase_id(s.wait_list, me);
      erase_id(s.redundancy_list, me);
      if (erase_id(s.participants, me)) after_removal(s);
      return false;
    }
    default:
      --s.seq;  // nothing to apply
      return false;
  }
}

bool leave_round(State& s, const std::string& id, int64_t round, bool counted) {
  if (s.round != round || !s.complete || !s.has_participant(id)) return false;
  ++s.seq;
  if (s.ending_round != round) {
    s.ending_round = round;
    s.ending_counted = counted;
  }
  erase_id(s.participants, id);
  if (s.participants.empty()) open_next_round(s, counted);
  return true;
}

namespace {
auto lost_in(const std::set<std::string>& lost) {
  return [&lost](const NodeDesc& n) { return lost.count(n.id) > 0; };
}
}  // namespace

bool lists_lost(const State& s, const std::set<std::string>& lost, bool participants) {
  if (lost.empty()) return false;
  auto gone = lost_in(lost);
  return (participants && std::ranges::any_of(s.participants, gone)) || std::ranges::any_of(s.wait_list, gone) ||
         std::ranges::any_of(s.redundancy_list, gone);
}

bool remove_lost(State& s, const std::set<std::string>& lost, bool participants) {
  if (lost.empty()) return false;
  auto gone = lost_in(lost);
  size_t w = std::erase_if(s.wait_list, gone), r = std::erase_if(s.redundancy_list, gone);
  size_t p = participants ? std::erase_if(s.participants, gone) : 0;
  if (w + r + p == 0) return false;
  ++s.seq;
  if (p > 0) {
    if (s.complete && s.ending_round != s.round) {
      s.ending_round = s.round;
      s.ending_counted = true;  // the round ended by losing a node
    }
    if (s.complete && s.participants.empty()) open_next_round(s, true);
    after_removal(s);
  }
  return true;
}

void close_state(State& s, const std::string& reason) {
  ++s.seq;
  s.closed = true;
  s.closed_reason = reason;
}

std::string join_request(const NodeDesc& n, const JobSettings& job) {
  std::string r = fmt::format("join {} {} {} {}", encode_node(n), job.min_nodes, job.max_nodes, job.max_restarts);
  return n.rank >= 0 ? fmt::format("{} {}", r, n.rank) : r;
}

std::string leave_request(const std::string& id, int64_t round, bool counted) {
  return fmt::format("leave {} {} {}", id, round, counted ? 1 : 0);
}

std::string withdraw_request(const std::string& id) { return fmt::format("withdraw {}", id); }

namespace {

bool listed(const State& s, const std::string& id) {
  return s.has_participant(id) || State::contains(s.wait_list, id) || State::contains(s.redundancy_list, id);
}

// A join request's node and settings (false: malformed; not ours to judge: the node sees
// its request ignored and joins by itself).
bool decode_join(const std::string& text, NodeDesc& n, JobSettings& job) {
  std::vector<std::string> rest;
  if (!decode_node(text, n, rest) || rest.size() < 3) return false;
  try {
    job = JobSettings{std::stoi(rest[0]), std::stoi(rest[1]), std::stoi(rest[2])};
    if (rest.size() > 3) n.rank = std::stoi(rest[3]);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

void absorb_join(State& s, const std::string& text, const std::set<std::string>& lost, Absorbed& out) {
  NodeDesc n;
  JobSettings job;
  if (!decode_join(text, n, job)) return;
  if (s.closed || lost.count(n.id) || listed(s, n.id) || (s.job && !(*s.job == job))) return;
  JoinContext c{n, job, false, false};
  JoinAction a = decide_join(s, c);
  if (a != JoinAction::kAddToParticipants && a != JoinAction::kAddToWaitList &&
      a != JoinAction::kAddToRedundancyList)
    return;
  out.wake |= apply_join(s, a, c);
  out.changed = true;
}

void absorb_withdraw(State& s, const std::string& id, Absorbed& out) {
  if (!listed(s, id) || (s.complete && s.has_participant(id))) return;
  NodeDesc n;
  n.id = id;
  apply_join(s, JoinAction::kRemoveMe, JoinContext{n, s.job.value_or(JobSettings{})});
  out.changed = true;
}

}  // namespace

Absorbed absorb(State& s, const std::vector<std::string>& requests, const std::set<std::string>& lost) {
  Absorbed out;
  for (const auto& line : requests) {
    if (line.starts_with("join ")) {
      absorb_join(s, line.substr(5), lost, out);
    } else if (line.starts_with("leave ")) {
      std::istringstream in(line.substr(6));
      std::string id;
      int64_t round = -1;
      int counted = 1;
      if (!(in >> id >> round >> counted)) continue;
      int64_t before = s.round;
      if (leave_round(s, id, round, counted != 0)) {
        out.changed = true;
        out.wake |= s.round != before;
      }
    } else if (line.starts_with("withdraw ")) {
      absorb_withdraw(s, line.substr(9), out);
    }
  }
  if (!requests.empty()) {
    s.requests_seen += static_cast<int64_t>(requests.size());
    s.requests_at = -1;  // the caller knows where the next line begins (Backend::position)
    out.changed = true;
  }
  return out;
}

std::optional<NodeDesc> joining_node(const std::string& request) {
  NodeDesc n;
  JobSettings job;
  if (!request.starts_with("join ") || !decode_join(request.substr(5), n, job)) return std::nullopt;
  return n;
}

bool names_any(const State& s, const std::vector<std::string>& pending, const std::set<std::string>& ids) {
  if (ids.empty()) return false;
  for (auto* list : {&s.participants, &s.wait_list, &s.redundancy_list})
    for (auto& n : *list)
      if (ids.count(n.id)) return true;
  for (auto& request : pending)
    for (auto& id : ids)
      if (request.find(id) != std::string::npos) return true;
  return false;
}

}  // namespace ddprun::rdzv
