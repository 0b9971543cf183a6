// The dynamic rendezvous's state: who takes part in which round, who waits, how many
// restarts were used, whether the job is over. One value in the backend, replaced by
// compare-and-set (torch's _RendezvousState, as plain text with a version line instead of
// a pickle).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::rdzv {

// One node (one ddprun agent). `id` is unique even for two containers with the same
// hostname and pid: "<addr>_<pid>_<random>".
struct NodeDesc {
  std::string id;
  std::string addr;         // --local-addr, else the hostname: sorts the node ranks
  std::string host;         // hostname, for messages
  std::string master_addr;  // where other nodes reach this node (MASTER_ADDR when it is rank 0)
  int master_port = 0;      // the worker store it listens on while it joins, for when it is rank 0; 0: none
  int nproc = 1;            // workers on this node
  int rank = -1;            // a fixed node rank (static: --node-rank); -1: ranked by the order below

  // Node ranks follow the fixed ranks, else (addr, id): deterministic, by address first
  // (torch sorts by address and pid; the random id keeps equal addresses and pids apart).
  bool operator<(const NodeDesc& o) const {
    if (rank != o.rank) return rank < o.rank;
    return addr != o.addr ? addr < o.addr : id < o.id;
  }
  std::string describe() const;  // "host (addr, id)"; "host (node rank R, id)" with a fixed rank
};

// What every node of the job must agree on; the first node to write the state sets it.
struct JobSettings {
  int min_nodes = 1, max_nodes = 1, max_restarts = 0;
  bool operator==(const JobSettings&) const = default;
};

struct State {
  static constexpr int kFormat = 1;

  int64_t seq = 0;            // +1 on every write
  int64_t round = 0;
  bool complete = false;      // the round's members are fixed and ranked
  bool last_call = false;     // MIN nodes are in: last_call_timeout runs (each node times it)
  bool closed = false;        // the job is over: nobody joins any more
  std::string closed_reason;  // "" when the job succeeded
  int restarts = 0;           // counted restarts used so far (failures, lost nodes)
  std::optional<JobSettings> job;
  std::vector<NodeDesc> participants;  // this round's; sorted = node ranks once complete
  std::vector<NodeDesc> wait_list;     // want the next round (a running round restarts for them)
  std::vector<NodeDesc> redundancy_list;  // arrived while the round was full (MAX nodes)
  // How the round that is ending ended: set by the first node that leaves it, used when the
  // last one leaves (a counted restart or not).
  int64_t ending_round = -1;
  bool ending_counted = false;
  int64_t requests_seen = 0;  // lines of the "requests" log applied so far (machine.hpp)
  // Where line requests_seen of the log begins, as the backend counts (Backend::position;
  // the store: its byte offset), so that a reader fetches only the requests after it; -1
  // when unknown (a state written before it was recorded: read from the first line).
  int64_t requests_at = -1;

  int rank_of(const std::string& id) const;  // -1 if not a participant
  bool has_participant(const std::string& id) const { return rank_of(id) >= 0; }
  static bool contains(const std::vector<NodeDesc>& list, const std::string& id);
};

// "ddprun-rdzv 1\n" + a line per field and per node (state.cpp says which).
std::string encode_state(const State& s);

// Throws ddp::Error naming `where` (the backend) for anything that is not ddprun's state:
// a torchrun agent's (base64 pickles), a newer format, corruption.
State decode_state(const std::string& value, const std::string& where);

// A node as five space-separated fields (id addr host master nproc; master is
// "<master_addr>/<master_port>" when the port is known), for requests;
// decode_node puts the fields after them into `rest`. False for anything else. (A fixed
// rank travels after the fields the request itself adds: machine.cpp.)
std::string encode_node(const NodeDesc& n);
bool decode_node(std::string_view text, NodeDesc& n, std::vector<std::string>& rest);

}  // namespace ddprun::rdzv
