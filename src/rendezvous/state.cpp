#include "rendezvous/state.hpp"

#include <charconv>
#include <sstream>

#include <fmt/format.h>

#include "ddp/error.hpp"

namespace ddprun::rdzv {

// The encoding: a version line, then one "key value..." line per field and one line per
// node ("P", "W", "R": participant, waiting, redundant). Plain text split on spaces: every
// node reads the whole state a few times per round, and with a thousand nodes a JSON
// parser was most of the rendezvous's time. Names and addresses hold no spaces; an empty
// one is written "-".
//
//   ddprun-rdzv 1
//   seq 12
//   round 3
//   flags complete closed          (the ones that are set)
//   restarts 1
//   job 1 4 3                      (min max max_restarts)
//   ending 3 1                     (round, counted)
//   requests 57 4321               (lines applied; where the next begins, if known)
//   closed_reason <text to the end of the line>
//   P <id> <addr> <host> <master> <nproc> [<fixed node rank>]
// where <master> is "<master_addr>/<master_port>" once the node listens for its workers
// ("/" is in no address or host name), else "<master_addr>".

namespace {

constexpr std::string_view kMagic = "ddprun-rdzv ";

// torchrun's state: base64 of a pickle (protocol 2..5), or its "no state yet" sentinel.
bool looks_like_torchrun(const std::string& v) {
  return v == "Y2FuaW1hZGFt" || v.starts_with("gASV") || v.starts_with("gAWV") || v.starts_with("gAJ") ||
         v.starts_with("gAN");
}

std::string field(const std::string& s) { return s.empty() ? "-" : s; }
std::string unfield(std::string_view s) { return s == "-" ? "" : std::string(s); }

std::vector<std::string_view> split(std::string_view line) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (pos < line.size()) {
    size_t sp = line.find(' ', pos);
    if (sp == std::string_view::npos) sp = line.size();
    if (sp > pos) out.push_back(line.substr(pos, sp - pos));
    pos = sp + 1;
  }
  return out;
}

struct Corrupt {
  std::string why;
};

template <typename T>
T number(std::string_view s) {
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) throw Corrupt{fmt::format("'{}' is not a number", s)};
  return v;
}

std::string master_field(const NodeDesc& n) {
  return n.master_port > 0 ? fmt::format("{}/{}", field(n.master_addr), n.master_port) : field(n.master_addr);
}

void read_master(std::string_view f, NodeDesc& n) {
  size_t slash = f.rfind('/');
  n.master_port = slash == std::string_view::npos ? 0 : number<int>(f.substr(slash + 1));
  n.master_addr = unfield(f.substr(0, slash));
}

// The five fields of a node (encode_node's) from t[at] on; throws Corrupt.
void read_node(const std::vector<std::string_view>& t, size_t at, NodeDesc& n) {
  n.id = unfield(t[at]);
  n.addr = unfield(t[at + 1]);
  n.host = unfield(t[at + 2]);
  read_master(t[at + 3], n);
  n.nproc = number<int>(t[at + 4]);
}

void need(const std::vector<std::string_view>& t, size_t n, std::string_view line) {
  if (t.size() < n) throw Corrupt{fmt::format("line '{}' has too few fields", line)};
}

void put_nodes(std::string& out, char tag, const std::vector<NodeDesc>& list) {
  for (auto& n : list) {
    out += fmt::format("{} {}", tag, encode_node(n));
    out += n.rank >= 0 ? fmt::format(" {}\n", n.rank) : "\n";
  }
}

NodeDesc node_from(const std::vector<std::string_view>& t, std::string_view line) {
  need(t, 6, line);
  NodeDesc n;
  read_node(t, 1, n);
  if (t.size() > 6) n.rank = number<int>(t[6]);
  return n;
}

void read_line(State& s, std::string_view line) {
  auto t = split(line);
  if (t.empty()) return;
  std::string_view k = t[0];
  if (k == "P" || k == "W" || k == "R") {
    auto& list = k == "P" ? s.participants : k == "W" ? s.wait_list : s.redundancy_list;
    list.push_back(node_from(t, line));
  } else if (k == "seq") {
    need(t, 2, line);
    s.seq = number<int64_t>(t[1]);
  } else if (k == "round") {
    need(t, 2, line);
    s.round = number<int64_t>(t[1]);
  } else if (k == "flags") {
    for (size_t i = 1; i < t.size(); ++i) {
      if (t[i] == "complete") s.complete = true;
      else if (t[i] == "last_call") s.last_call = true;
      else if (t[i] == "closed") s.closed = true;
    }
  } else if (k == "restarts") {
    need(t, 2, line);
    s.restarts = number<int>(t[1]);
  } else if (k == "job") {
    need(t, 4, line);
    s.job = JobSettings{number<int>(t[1]), number<int>(t[2]), number<int>(t[3])};
  } else if (k == "ending") {
    need(t, 3, line);
    s.ending_round = number<int64_t>(t[1]);
    s.ending_counted = t[2] == "1";
  } else if (k == "requests") {
    need(t, 2, line);
    s.requests_seen = number<int64_t>(t[1]);
    if (t.size() > 2) s.requests_at = number<int64_t>(t[2]);
  } else if (k == "closed_reason") {
    s.closed_reason = line.size() > 14 ? std::string(line.substr(14)) : "";
  }
  // Unknown keys: a newer ddprun of the same format added them; ignored.
}

}  // namespace

std::string NodeDesc::describe() const {
  if (rank >= 0) return fmt::format("{} (node rank {}, {})", host.empty() ? addr : host, rank, id);
  if (host.empty() || host == addr) return fmt::format("{} ({})", addr, id);
  return fmt::format("{} ({}, {})", host, addr, id);
}

int State::rank_of(const std::string& id) const {
  for (size_t i = 0; i < participants.size(); ++i)
    if (participants[i].id == id) return static_cast<int>(i);
  return -1;
}

bool State::contains(const std::vector<NodeDesc>& list, const std::string& id) {
  for (auto& n : list)
    if (n.id == id) return true;
  return false;
}

std::string encode_state(const State& s) {
  std::string out = fmt::format("{}{}\nseq {}\nround {}\nflags{}{}{}\nrestarts {}\nending {} {}\nrequests {}", kMagic,
                                State::kFormat, s.seq, s.round, s.complete ? " complete" : "",
                                s.last_call ? " last_call" : "", s.closed ? " closed" : "", s.restarts, s.ending_round,
                                s.ending_counted ? 1 : 0, s.requests_seen);
  out += s.requests_at >= 0 ? fmt::format(" {}\n", s.requests_at) : "\n";
  if (s.job) out += fmt::format("job {} {} {}\n", s.job->min_nodes, s.job->max_nodes, s.job->max_restarts);
  if (!s.closed_reason.empty()) {
    std::string r = s.closed_reason;
    for (char& c : r)
      if (c == '\n' || c == '\r') c = ' ';
    out += "closed_reason " + r + "\n";
  }
  out.reserve(out.size() + (s.participants.size() + s.wait_list.size() + s.redundancy_list.size()) * 96);
  put_nodes(out, 'P', s.participants);
  put_nodes(out, 'W', s.wait_list);
  put_nodes(out, 'R', s.redundancy_list);
  return out;
}

State decode_state(const std::string& value, const std::string& where) {
  if (looks_like_torchrun(value))
    throw ddp::Error(fmt::format(
        "rendezvous: {} holds a torchrun agent's rendezvous state for this --rdzv-id (a pickled "
        "torch.distributed.elastic state): ddprun and torchrun cannot share a rendezvous; launch every node "
        "with ddprun, or give this job another --rdzv-id",
        where));
  if (!value.starts_with(kMagic))
    throw ddp::Error(fmt::format("rendezvous: {} holds a value for this --rdzv-id that is not a rendezvous state "
                                 "('{}...'); give this job another --rdzv-id",
                                 where, value.substr(0, 16)));
  auto nl = value.find('\n');
  std::string version = value.substr(kMagic.size(), nl == std::string::npos ? std::string::npos : nl - kMagic.size());
  if (version != std::to_string(State::kFormat))
    throw ddp::Error(fmt::format("rendezvous: {} holds a rendezvous state of format {} (this ddprun reads format {}): "
                                 "every node of a job must run the same ddprun version",
                                 where, version, State::kFormat));
  State s;
  // The member list in one allocation (a thousand members are 150 kB of them).
  size_t members = 0;
  for (size_t p = value.find("\nP "); p != std::string::npos; p = value.find("\nP ", p + 3)) ++members;
  s.participants.reserve(members);
  try {
    std::string_view rest(value);
    size_t pos = nl == std::string::npos ? value.size() : nl + 1;
    while (pos < rest.size()) {
      size_t end = rest.find('\n', pos);
      if (end == std::string_view::npos) end = rest.size();
      read_line(s, rest.substr(pos, end - pos));
      pos = end + 1;
    }
  } catch (const Corrupt& c) {
    throw ddp::Error(fmt::format("rendezvous: the state in {} is corrupt: {}", where, c.why));
  }
  return s;
}

std::string encode_node(const NodeDesc& n) {
  return fmt::format("{} {} {} {} {}", field(n.id), field(n.addr), field(n.host), master_field(n), n.nproc);
}

bool decode_node(std::string_view text, NodeDesc& n, std::vector<std::string>& rest) {
  auto t = split(text);
  if (t.size() < 5) return false;
  try {
    read_node(t, 0, n);
  } catch (const Corrupt&) {
    return false;
  }
  rest.clear();
  for (size_t i = 5; i < t.size(); ++i) rest.emplace_back(t[i]);
  return !n.id.empty();
}

}  // namespace ddprun::rdzv
