#include "rendezvous/etcd/client.hpp"

#include <algorithm>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace ddprun::rdzv::etcd {

using json = nlohmann::json;
using Kind = ExchangeError::Kind;

namespace {

// ---- base64 (the gateway's encoding of bytes) ----------------------------------------
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string b64(const std::string& in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kB64[(v >> s) & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (i + 1 < in.size()) v |= uint8_t(in[i + 1]) << 8;
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += i + 1 < in.size() ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string unb64(const std::string& in) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v = val(c);
    if (v < 0) continue;  // '=' padding
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((acc >> bits) & 0xff);
    }
  }
  return out;
}

// proto3 JSON: 64-bit numbers are strings, fields at their default are left out.
int64_t num(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_string()) return std::stoll(it->get<std::string>());
  return it->get<int64_t>();
}

std::string str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool flag(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

KeyValue to_kv(const json& j) {
  KeyValue kv;
  kv.key = unb64(str(j, "key"));
  kv.value = unb64(str(j, "value"));
  kv.create_revision = num(j, "create_revision");
  kv.mod_revision = num(j, "mod_revision");
  kv.version = num(j, "version");
  kv.lease = num(j, "lease");
  return kv;
}

RangeResult to_range(const json& j) {
  RangeResult r;
  if (auto it = j.find("kvs"); it != j.end())
    for (const auto& kv : *it) r.kvs.push_back(to_kv(kv));
  r.count = num(j, "count");
  return r;
}

json to_json(const Range& r) {
  json j{{"key", b64(r.key)}};
  if (!r.end.empty()) j["range_end"] = b64(r.end);
  if (r.keys_only) j["keys_only"] = true;
  if (r.by_creation) {
    j["sort_order"] = "ASCEND";
    j["sort_target"] = "CREATE";
  }
  if (r.min_create_revision) j["min_create_revision"] = std::to_string(r.min_create_revision);
  if (r.max_create_revision) j["max_create_revision"] = std::to_string(r.max_create_revision);
  if (r.count_only) j["count_only"] = true;
  return j;
}

json to_json(const Compare& c) {
  static const char* targets[] = {"VERSION", "CREATE", "MOD", "VALUE"};
  static const char* results[] = {"EQUAL", "GREATER", "LESS", "NOT_EQUAL"};
  json j{{"key", b64(c.key)}, {"target", targets[int(c.target)]}, {"result", results[int(c.result)]}};
  switch (c.target) {
    case Compare::Target::version: j["version"] = std::to_string(c.number); break;
    case Compare::Target::create: j["create_revision"] = std::to_string(c.number); break;
    case Compare::Target::mod: j["mod_revision"] = std::to_string(c.number); break;
    case Compare::Target::value: j["value"] = b64(c.value); break;
  }
  return j;
}

json to_json(const Request& r) {
  if (auto* range = std::get_if<Range>(&r)) return {{"request_range", to_json(*range)}};
  if (auto* put = std::get_if<Put>(&r)) {
    json p{{"key", b64(put->key)}, {"value", b64(put->value)}};
    if (put->lease) p["lease"] = std::to_string(put->lease);
    return {{"request_put", p}};
  }
  const auto& del = std::get<Delete>(r);
  json d{{"key", b64(del.key)}};
  if (!del.end.empty()) d["range_end"] = b64(del.end);
  return {{"request_delete_range", d}};
}

json to_json(const WatchSpec& w) {
  json c{{"key", b64(w.key)}};
  if (!w.end.empty()) c["range_end"] = b64(w.end);
  if (w.start_revision) c["start_revision"] = std::to_string(w.start_revision);
  json filters = json::array();
  if (w.no_put) filters.push_back("NOPUT");
  if (w.no_delete) filters.push_back("NODELETE");
  if (!filters.empty()) c["filters"] = filters;
  return {{"create_request", c}};
}

// A member's "try again elsewhere" answer (no leader, leader changed, request timed out).
struct Unavailable {
  std::string text;
};

bool retryable(int status, int code) {
  return code == 4 || code == 8 || code == 14 || status == 502 || status == 503 || status == 504;
}

// The whole answer of a unary call: JSON on 200; otherwise etcd's error, thrown.
json parse_answer(const Endpoint& ep, const HttpResponse& r, const std::string& describe, const char* what) {
  json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    std::string head = r.body.substr(0, 120);
    std::replace(head.begin(), head.end(), '\n', ' ');
    throw ExchangeError(Kind::fatal, false,
                        fmt::format("{} does not answer like etcd's v3 API (HTTP {}: {}); is it etcd 3.4 or newer?",
                                    ep.str(), r.status, head));
  }
  if (r.status == 200) return j;
  int code = static_cast<int>(num(j, "code"));
  std::string msg = str(j, "message");
  if (msg.empty()) msg = str(j, "error");
  if (retryable(r.status, code)) throw Unavailable{fmt::format("{}: {}", ep.str(), msg)};
  throw EtcdError(fmt::format("{}: {}: {}", describe, what, msg), code, msg);
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) {
    if (p.empty()) continue;
    if (!out.empty()) out += "; ";
    out += p;
  }
  return out;
}

}  // namespace

std::string prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<uint8_t>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

struct Client::Answer {
  json body;
  bool maybe_repeated = false;
};

Client::Client(ClientOptions options) : Client(options, make_tls_context(options.tls)) {}

Client::Client(ClientOptions options, std::shared_ptr<TlsContext> tls) : options_(std::move(options)), tls_(std::move(tls)) {
  if (options_.endpoints.empty()) throw ddp::UsageError("etcd: no endpoint given");
  for (const auto& ep : options_.endpoints)
    sessions_.push_back(std::make_unique<HttpSession>(ep, tls_, options_.connect_timeout));
  // Clients spread over the members; each stays with its member while it answers.
  current_ = options_.spread ? std::random_device{}() % sessions_.size() : 0;
}

Client::~Client() = default;

std::unique_ptr<Client> Client::clone() const {
  return std::unique_ptr<Client>(new Client(options_, tls_));
}

std::string Client::describe() const {
  std::string list;
  for (const auto& ep : options_.endpoints) {
    if (!list.empty()) list += ',';
    list += ep.str();
  }
  return fmt::format("etcd at {}{}", list, options_.tls.enabled ? " (https)" : "");
}

// Runs attempt(session, deadline, maybe_repeated) on the current member, moving on to the
// next one whenever a member fails, until one answers or the deadline passes. A pass in
// which every member failed for good (TLS refused, wrong protocol) ends it at once.
template <class Attempt>
auto Client::failover(Deadline deadline, const char* what, Attempt&& attempt) {
  const size_t n = sessions_.size();
  const auto start = Clock::now();
  const auto total = std::chrono::duration_cast<milliseconds>(deadline - start);
  // One try gets a third of the time, between 1 and 3 s: a member that lost its leader
  // holds a write for up to 7 s before it says so, while a new leader is elected in 1-2.
  const auto budget = std::clamp(total / 3, milliseconds(1000), milliseconds(3000));
  std::vector<std::string> last(n), said(n);  // said: each member's last answer in a try of its own length
  bool repeated = false, all_fatal = true;
  size_t tried = 0;
  int passes = 0;
  auto next_report = std::chrono::seconds(10);
  while (true) {
    size_t i = current_;
    Deadline d = std::min(deadline, Clock::now() + budget);
    bool fatal = false;
    try {
      return attempt(*sessions_[i], d, repeated);
    } catch (const ExchangeError& e) {
      // A connection that the caller's deadline cut short says little ("no connection
      // within 7 ms"): what the member said before (connection refused) stands beside it.
      const bool cut = d == deadline && e.kind() == Kind::connect;
      last[i] = cut && !said[i].empty() && said[i] != e.what() ? fmt::format("{} (before that: {})", e.what(), said[i])
                                                                : e.what();
      if (!cut) said[i] = e.what();
      repeated = repeated || e.maybe_delivered();
      fatal = e.kind() == Kind::fatal;
    } catch (const Unavailable& u) {
      last[i] = u.text;
      repeated = true;
    }
    all_fatal = all_fatal && fatal;
    current_ = (i + 1) % n;
    if (++tried % n == 0) {
      if (all_fatal) throw ddp::NetworkError(fmt::format("{}: {}: {}", describe(), what, join(last)));
      all_fatal = true;
      auto pause = milliseconds(std::min(500, 50 << std::min(++passes, 4)));
      // At most half of what is left: a last try still fits, and members that refuse at once
      // near the deadline are not tried in a busy loop.
      const auto now = Clock::now();
      if (now < deadline) std::this_thread::sleep_until(now + std::min<Clock::duration>(pause, (deadline - now) / 2));
      if (options_.still_failing && Clock::now() - start >= next_report && Clock::now() < deadline) {
        options_.still_failing(fmt::format("{}: {}: no member has answered for {} s of {}: {}", describe(), what,
                                           next_report.count(), ddp::format_duration(total), join(last)));
        next_report += std::chrono::seconds(60);
      }
    }
    if (Clock::now() >= deadline)
      throw ddp::TimeoutError(fmt::format("{}: {}: no member answered within {}: {}", describe(), what,
                                          ddp::format_duration(total), join(last)));
  }
}

Client::Answer Client::call(const std::string& path, const std::string& body, Deadline deadline, const char* what) {
  return failover(deadline, what, [&](HttpSession& s, Deadline d, bool repeated) {
    HttpResponse r = s.post("/v3/" + path, body, d);
    return Answer{parse_answer(s.endpoint(), r, describe(), what), repeated};
  });
}

TxnResult Client::txn(const std::vector<Compare>& compare, const std::vector<Request>& success,
                      const std::vector<Request>& failure, Deadline deadline, const char* what) {
  json body = json::object();
  for (const char* k : {"compare", "success", "failure"}) body[k] = json::array();
  for (const auto& c : compare) body["compare"].push_back(to_json(c));
  for (const auto& r : success) body["success"].push_back(to_json(r));
  for (const auto& r : failure) body["failure"].push_back(to_json(r));
  Answer a = call("kv/txn", body.dump(), deadline, what);
  TxnResult out;
  out.succeeded = flag(a.body, "succeeded");
  out.maybe_repeated = a.maybe_repeated;
  if (auto h = a.body.find("header"); h != a.body.end()) out.revision = num(*h, "revision");
  if (auto rs = a.body.find("responses"); rs != a.body.end())
    for (const auto& r : *rs)
      if (auto rr = r.find("response_range"); rr != r.end()) out.ranges.push_back(to_range(*rr));
  return out;
}

RangeResult Client::range(const Range& r, Deadline deadline, const char* what, int64_t* revision) {
  Answer a = call("kv/range", to_json(r).dump(), deadline, what);
  if (revision) *revision = a.body.contains("header") ? num(a.body["header"], "revision") : 0;
  return to_range(a.body);
}

Client::Grant Client::lease_grant(int64_t ttl_s, Deadline deadline, const char* what) {
  Answer a = call("lease/grant", json{{"TTL", std::to_string(ttl_s)}}.dump(), deadline, what);
  std::string err = str(a.body, "error");
  if (!err.empty()) throw EtcdError(fmt::format("{}: {}: {}", describe(), what, err), 0, err);
  return {num(a.body, "ID"), num(a.body, "TTL")};
}

std::vector<int64_t> Client::lease_keep_alive(const std::vector<int64_t>& ids, Deadline deadline, const char* what) {
  // One streamed call renews them all: the body holds one request per lease, the answer
  // one line per lease, and it ends when the requests do.
  std::string body;
  for (int64_t id : ids) body += json{{"ID", std::to_string(id)}}.dump();
  return failover(deadline, what, [&](HttpSession& s, Deadline d, bool) {
    HttpResponse r = s.post("/v3/lease/keepalive", body, d);
    std::vector<int64_t> ttl(ids.size(), 0);
    size_t answered = 0;
    size_t pos = 0;
    while (pos < r.body.size()) {
      size_t nl = r.body.find('\n', pos);
      std::string line = r.body.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      pos = nl == std::string::npos ? r.body.size() : nl + 1;
      if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
      HttpResponse one{r.status, line};
      json j = parse_answer(s.endpoint(), one, describe(), what);
      if (auto e = j.find("error"); e != j.end() && e->is_object())
        throw Unavailable{fmt::format("{}: {}", s.endpoint().str(), str(*e, "message"))};
      const json& res = j.contains("result") ? j["result"] : j;
      int64_t id = num(res, "ID");
      for (size_t k = 0; k < ids.size(); ++k)
        if (ids[k] == id) ttl[k] = num(res, "TTL");
      ++answered;
    }
    if (answered < ids.size())
      throw ExchangeError(Kind::broken, false, fmt::format("{} answered {} of {} lease renewals", s.endpoint().str(), answered, ids.size()));
    return ttl;
  });
}

void Client::lease_revoke(int64_t id, Deadline deadline, const char* what) {
  try {
    call("lease/revoke", json{{"ID", std::to_string(id)}}.dump(), deadline, what);
  } catch (const EtcdError& e) {
    if (!e.lease_not_found()) throw;
  }
}

std::unique_ptr<Watch> Client::watch(const std::vector<WatchSpec>& specs, Deadline deadline, const char* what) {
  std::string body;
  for (const auto& w : specs) body += to_json(w).dump();
  return failover(deadline, what, [&](HttpSession& s, Deadline d, bool) {
    auto session = std::make_unique<HttpSession>(s.endpoint(), tls_, options_.connect_timeout);
    HttpResponse r = session->start_stream("/v3/watch", body, d);
    if (r.status != 200) parse_answer(s.endpoint(), r, describe(), what);
    return std::make_unique<Watch>(std::move(session), describe());
  });
}

void Client::close() {
  for (auto& s : sessions_) s->close();
}

MemberStatus Client::status(size_t endpoint, Deadline deadline) {
  HttpSession& s = *sessions_.at(endpoint);
  json j = parse_answer(s.endpoint(), s.post("/v3/maintenance/status", "{}", deadline), describe(), "member status");
  MemberStatus st;
  if (auto h = j.find("header"); h != j.end()) st.member_id = static_cast<uint64_t>(std::stoull(str(*h, "member_id").empty() ? "0" : str(*h, "member_id")));
  std::string leader = str(j, "leader");
  st.leader_id = leader.empty() ? 0 : std::stoull(leader);
  st.raft_term = num(j, "raftTerm");
  st.version = str(j, "version");
  return st;
}

// ---- watch ---------------------------------------------------------------------------

Watch::Watch(std::unique_ptr<HttpSession> session, std::string describe)
    : session_(std::move(session)), describe_(std::move(describe)) {}

Watch::~Watch() = default;

std::optional<std::vector<WatchEvent>> Watch::next(Deadline deadline) {
  while (true) {
    size_t nl = pending_.find('\n');
    if (nl == std::string::npos) {
      if (!session_->read_stream(pending_, deadline)) return std::nullopt;
      continue;
    }
    std::string line = pending_.substr(0, nl);
    pending_.erase(0, nl + 1);
    if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded())
      throw ExchangeError(Kind::broken, false, fmt::format("{}: a watch line that is not JSON", session_->endpoint().str()));
    if (auto e = j.find("error"); e != j.end())
      throw ExchangeError(Kind::broken, false,
                          fmt::format("{}: the watch ended: {}", session_->endpoint().str(), e->is_object() ? str(*e, "message") : e->dump()));
    const json& res = j.contains("result") ? j["result"] : j;
    if (flag(res, "canceled")) return std::vector<WatchEvent>{};
    auto evs = res.find("events");
    if (evs == res.end() || evs->empty()) continue;  // created, progress
    std::vector<WatchEvent> out;
    for (const auto& e : *evs) out.push_back({str(e, "type") == "DELETE", to_kv(e.value("kv", json::object()))});
    return out;
  }
}

}  // namespace ddprun::rdzv::etcd
