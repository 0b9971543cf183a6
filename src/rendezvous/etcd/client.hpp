// A small etcd v3 client over the JSON gateway (POST /v3/...): ranges, transactions,
// leases, watches, member status. It talks to one member at a time and moves to the next
// when that one fails (no connection, no answer in time, no leader); every call ends by its
// deadline. Keys and values are bytes (base64 on the wire, plain here).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ddp/error.hpp"
#include "rendezvous/etcd/http.hpp"

namespace ddprun::rdzv::etcd {

struct ClientOptions {
  std::vector<Endpoint> endpoints;
  TlsConfig tls;
  milliseconds connect_timeout{5000};
  bool spread = true;  // start at a random member; false: at the first
  // Told when a call has found no member that answers for 10 s, then every minute after:
  // "etcd at ...: <what>: no member has answered for 10 s of 60 s: <each one's error>". It
  // runs on the calling thread, and may be called from several at once.
  std::function<void(const std::string&)> still_failing;
};

// etcd refused a request (a gRPC status other than "unavailable").
class EtcdError : public ddp::StoreError {
 public:
  EtcdError(const std::string& what, int code, std::string message)
      : ddp::StoreError(what), code_(code), message_(std::move(message)) {}
  int code() const { return code_; }                  // gRPC status code
  const std::string& message() const { return message_; }  // etcd's text
  bool lease_not_found() const { return code_ == 5 && message_.find("lease not found") != std::string::npos; }

 private:
  int code_;
  std::string message_;
};

struct KeyValue {
  std::string key, value;
  int64_t create_revision = 0, mod_revision = 0, version = 0, lease = 0;
};

// ---- transactions ----------------------------------------------------------------------
struct Compare {
  enum class Target { version, create, mod, value };
  enum class Result { equal, greater, less, not_equal };
  std::string key;
  Target target = Target::version;
  Result result = Result::equal;
  int64_t number = 0;  // version or revision
  std::string value;   // Target::value

  static Compare absent(std::string key) { return {std::move(key), Target::create, Result::equal, 0, {}}; }
  static Compare exists(std::string key) { return {std::move(key), Target::create, Result::greater, 0, {}}; }
  static Compare mod_is(std::string key, int64_t rev) { return {std::move(key), Target::mod, Result::equal, rev, {}}; }
};

struct Range {
  Range(std::string k, std::string e = {}, bool count = false, bool keys = false)
      : key(std::move(k)), end(std::move(e)), count_only(count), keys_only(keys) {}
  std::string key;
  std::string end;          // empty: just `key`
  bool count_only = false;  // only the number of keys
  bool keys_only = false;   // no values
  bool by_creation = false;          // sorted by create revision (else by key)
  int64_t min_create_revision = 0;   // only keys created at or after it (0: all)
  int64_t max_create_revision = 0;   // only keys created at or before it (0: all)
};
struct Put {
  std::string key, value;
  int64_t lease = 0;
};
struct Delete {
  std::string key;
  std::string end;  // empty: just `key`
};
using Request = std::variant<Range, Put, Delete>;

struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t count = 0;
};

struct TxnResult {
  bool succeeded = false;
  int64_t revision = 0;             // the store's revision after the transaction
  std::vector<RangeResult> ranges;  // one per Range of the branch that ran, in order
  bool maybe_repeated = false;      // an earlier try may have been applied (its answer was lost)
};

// The end of the range of keys that start with `prefix`.
std::string prefix_end(const std::string& prefix);

// ---- watches ---------------------------------------------------------------------------
struct WatchSpec {
  std::string key, end;
  int64_t start_revision = 0;
  bool no_put = false, no_delete = false;
};
struct WatchEvent {
  bool deleted = false;
  KeyValue kv;
};

class Client;

// One watch request (one or several ranges) on one member, until destroyed.
class Watch {
 public:
  Watch(std::unique_ptr<HttpSession> session, std::string describe);
  ~Watch();
  // Waits for events. nullopt at the deadline (the watch is then closed); an empty list
  // when the member cancelled a watch (e.g. compaction): look again. Throws ExchangeError or
  // EtcdError when the stream breaks.
  std::optional<std::vector<WatchEvent>> next(Deadline deadline);
  // Makes a next() in progress in another thread throw ExchangeError soon (thread-safe).
  void interrupt() { session_->interrupt(); }

 private:
  std::unique_ptr<HttpSession> session_;
  std::string describe_;
  std::string pending_;
};

struct MemberStatus {
  uint64_t member_id = 0, leader_id = 0;
  int64_t raft_term = 0;
  std::string version;
};

class Client {
 public:
  explicit Client(ClientOptions options);  // throws ddp::UsageError for unusable TLS files
  ~Client();
  // Another client to the same members, sharing the TLS settings (for another thread).
  std::unique_ptr<Client> clone() const;

  // "etcd at a:2379,b:2379" (", https" when TLS).
  std::string describe() const;
  const std::vector<Endpoint>& endpoints() const { return options_.endpoints; }

  // Each call names what it does (`what`, for messages) and ends by `deadline`.
  TxnResult txn(const std::vector<Compare>& compare, const std::vector<Request>& success,
                const std::vector<Request>& failure, Deadline deadline, const char* what);
  RangeResult range(const Range& r, Deadline deadline, const char* what, int64_t* revision = nullptr);

  struct Grant {
    int64_t id = 0;
    int64_t ttl_s = 0;
  };
  Grant lease_grant(int64_t ttl_s, Deadline deadline, const char* what);
  // Renews each lease; its ttl now, 0 for a lease that has ended.
  std::vector<int64_t> lease_keep_alive(const std::vector<int64_t>& ids, Deadline deadline, const char* what);
  void lease_revoke(int64_t id, Deadline deadline, const char* what);  // an ended lease is fine

  std::unique_ptr<Watch> watch(const std::vector<WatchSpec>& specs, Deadline deadline, const char* what);

  // Closes the connections (the next call opens them again).
  void close();

  // One member's view (no failover): for tests and the harness.
  MemberStatus status(size_t endpoint, Deadline deadline);

 private:
  Client(ClientOptions options, std::shared_ptr<TlsContext> tls);
  struct Answer;
  Answer call(const std::string& path, const std::string& body, Deadline deadline, const char* what);
  template <class Attempt>
  auto failover(Deadline deadline, const char* what, Attempt&& attempt);

  ClientOptions options_;
  std::shared_ptr<TlsContext> tls_;
  std::vector<std::unique_ptr<HttpSession>> sessions_;
  size_t current_ = 0;
};

}  // namespace ddprun::rdzv::etcd
