// The dynamic rendezvous's decisions, as pure functions of the state (torch's
// _RendezvousJoinOp/_RendezvousExitOp/..., with ddprun's changes: liveness comes from the
// backend's leases, not from heartbeats in the state; the last call is timed by each node
// on its own clock; restarts are counted once per round, for the whole job).
//
// The loop that runs them (read, decide, apply, compare-and-set, wait) is in dynamic.cpp.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "rendezvous/state.hpp"

namespace ddprun::rdzv {

enum class JoinAction {
  kFinish,                // this node is in a complete round
  kWait,                  // nothing to do until the state changes or a timer runs out
  kAddToParticipants,
  kAddToWaitList,         // a round runs without this node: ask it to restart (scale up)
  kAddToRedundancyList,   // the running round is full: wait for a place
  kMarkComplete,
  kRemoveMe,              // the join timed out: leave every list (then fail)
  kErrorClosed,
  kErrorTimeout,
  kErrorMismatch,         // this node's --nnodes/--max-restarts differ from the job's
  kErrorRankTaken,        // another node holds this node's fixed rank (--node-rank)
};
const char* to_string(JoinAction a);

struct JoinContext {
  const NodeDesc& me;
  JobSettings job;
  bool timed_out = false;          // join_timeout ran out
  bool last_call_expired = false;  // this node's last_call_timeout for this round ran out
};

JoinAction decide_join(const State& s, const JoinContext& c);

// The listed node, other than `me`, that holds me's fixed rank (nullptr: none, or no fixed rank).
const NodeDesc* rank_holder(const State& s, const NodeDesc& me);

// Applies a mutating action (not kFinish/kWait/kError*). Returns true when the change
// matters to nodes waiting for it (round completed, last call started, a round opened):
// the caller then wakes them.
bool apply_join(State& s, JoinAction a, const JoinContext& c);

// This node leaves the round it ran in (before it joins the next). `counted` says whether
// the round ended by a failure (a counted restart) or not (a node waiting to join). The
// last node to leave opens the next round. Returns true when something changed.
bool leave_round(State& s, const std::string& id, int64_t round, bool counted);

// Drops lost nodes (their lease ended) from every list (participants = false: not from the
// round's participants). A complete round left empty opens the next (counted: it ended by
// losing nodes). Returns true when something changed.
bool remove_lost(State& s, const std::set<std::string>& lost, bool participants = true);
// Whether remove_lost would change `s`, without touching it (a caller need not copy a state
// it would only read).
bool lists_lost(const State& s, const std::set<std::string>& lost, bool participants = true);

// The job is over; nobody joins any more. reason "" means it succeeded.
void close_state(State& s, const std::string& reason);

// Requests: a node that wants to join (or leave a round) appends a line to the "requests"
// log, and whoever writes the state next applies every request it has not seen yet. A
// thousand nodes joining at once then need a few writes of the state, not a thousand that
// collide (each loser of a compare-and-set finds itself already in).
std::string join_request(const NodeDesc& n, const JobSettings& job);
std::string leave_request(const std::string& id, int64_t round, bool counted);
// A node whose join timed out (kRemoveMe): off every list, unless a complete round has it
// as a member (then it takes part after all). Nodes that time out together leave the
// state in a few writes, as they joined it.
std::string withdraw_request(const std::string& id);

struct Absorbed {
  bool changed = false;  // the state must be written
  bool wake = false;     // and waiting nodes told (see apply_join)
};
// Applies `requests` (the log's lines from s.requests_seen on) in order: a join puts the
// node where decide_join would (unless it is lost, already listed, or its settings differ:
// it then finds out itself); a leave is leave_round; a withdrawal is kRemoveMe.
Absorbed absorb(State& s, const std::vector<std::string>& requests, const std::set<std::string>& lost);

// The node a join request names (nullopt: not a join request, or malformed).
std::optional<NodeDesc> joining_node(const std::string& request);

// Whether the state's lists or a request in `pending` (not applied yet) name one of `ids`.
// A round's rank 0 keeps the events that say a node was lost while this is so for it: the
// lost line must stay for whoever reads the state or the request next.
bool names_any(const State& s, const std::vector<std::string>& pending, const std::set<std::string>& ids);

}  // namespace ddprun::rdzv
