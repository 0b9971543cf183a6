// The rendezvous backend over etcd's v3 API. Keys of one run, under <prefix>/<run id>/:
//   run-lease         the run lease's id; every key below except alive/ is attached to it
//   members           rewritten by every open_lease (the last close checks it)
//   state             the rendezvous state; its token is the key's mod revision
//   ctr/<name>        a counter: "<value> <op>:<value>..." (the last ops, to recognise a retry)
//   log/<name>/<op>   a line of a log, under a name no other write uses (a retried append
//                     writes the same key again: never twice); the lines' order is their
//                     create revisions' (then their keys', within one transaction)
//   trim/<name>       "<n> <revision> <key>": the log's lines [0, n) are dropped, the last of
//                     them was (revision, key); readers count lines after it from n
//   alive/<lease>     one per open node lease, attached to that lease: gone when it ends
//   pending/<lease>   that lease's end lines (JSON); deleted in the transaction that
//                     appends them, so they are appended exactly once
// Names are percent-encoded, so a log name never reaches into another's keys.
#include "rendezvous/etcd/etcd_backend.hpp"

#include <algorithm>
#include <deque>
#include <cctype>
#include <functional>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "rendezvous/etcd/client.hpp"

namespace ddprun::rdzv {
namespace {

using namespace etcd;
using json = nlohmann::json;

std::string escape(const std::string& name) {
  std::string out;
  for (unsigned char c : name) {
    if (std::isalnum(c) || c == '.' || c == '_' || c == '-')
      out += static_cast<char>(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

std::string hex(int64_t id) { return fmt::format("{:016x}", static_cast<uint64_t>(id)); }

int64_t unhex(const std::string& s) {
  try {
    return static_cast<int64_t>(std::stoull(s, nullptr, 16));
  } catch (const std::exception&) {
    return 0;
  }
}

constexpr size_t kRememberedLines = 1024;  // per log, the positions of the last lines read
// A wait() reads again at least this often, watch or no watch: etcd has lost and delayed
// events of watches that share a stream (etcd-io/etcd#17529, #18089), and ours shares one
// between the log and the live leases. A missed event then costs a second, not the wait.
constexpr milliseconds kRereadEvery{1000};

// 16 hex digits naming one operation, so that a retry can recognise its own earlier write.
std::string random_op() {
  thread_local std::mt19937_64 rng{(uint64_t(std::random_device{}()) << 32) ^ std::random_device{}()};
  return hex(static_cast<int64_t>(rng()));
}

struct Keys {
  std::string p;  // "<prefix>/<run id>/"
  std::string run_lease() const { return p + "run-lease"; }
  std::string members() const { return p + "members"; }
  std::string state() const { return p + "state"; }
  std::string counter(const std::string& name) const { return p + "ctr/" + escape(name); }
  std::string log_dir(const std::string& log) const { return p + "log/" + escape(log) + "/"; }
  std::string log_key(const std::string& log, const std::string& op, size_t i) const {
    return log_dir(log) + fmt::format("{}{:04}", op, i);
  }
  std::string trim(const std::string& log) const { return p + "trim/" + escape(log); }
  std::string alive_dir() const { return p + "alive/"; }
  std::string alive(int64_t lease) const { return alive_dir() + hex(lease); }
  std::string pending_dir() const { return p + "pending/"; }
  std::string pending(int64_t lease) const { return pending_dir() + hex(lease); }
};

Range whole(const std::string& dir, bool count_only = false, bool keys_only = false) {
  return Range(dir, prefix_end(dir), count_only, keys_only);
}

std::optional<KeyValue> first(const TxnResult& t, size_t i) {
  if (i >= t.ranges.size() || t.ranges[i].kvs.empty()) return std::nullopt;
  return t.ranges[i].kvs[0];
}

// "<value> <op>:<value> ...": the counter and the results of its last few adds.
struct CounterValue {
  int64_t value = 0;
  std::vector<std::pair<std::string, int64_t>> recent;

  static CounterValue parse(const std::string& text) {
    CounterValue c;
    size_t pos = 0;
    bool head = true;
    while (pos < text.size()) {
      size_t sp = text.find(' ', pos);
      std::string word = text.substr(pos, sp == std::string::npos ? std::string::npos : sp - pos);
      pos = sp == std::string::npos ? text.size() : sp + 1;
      try {
        if (head) {
          c.value = std::stoll(word);
          head = false;
        } else if (size_t colon = word.find(':'); colon != std::string::npos) {
          c.recent.emplace_back(word.substr(0, colon), std::stoll(word.substr(colon + 1)));
        }
      } catch (const std::exception&) {
      }
    }
    return c;
  }
  std::string text() const {
    std::string out = std::to_string(value);
    for (const auto& [op, v] : recent) out += fmt::format(" {}:{}", op, v);
    return out;
  }
};

// A log's dropped lines (trim_log): [0, lines), the last of them at `last` (create revision,
// key). A line at or before `last` is never counted, even while its key is not deleted yet.
struct TrimMark {
  size_t lines = 0;
  std::pair<int64_t, std::string> last;

  static TrimMark parse(const std::optional<KeyValue>& kv) {
    TrimMark m;
    if (!kv) return m;
    const std::string& v = kv->value;
    size_t a = v.find(' '), b = a == std::string::npos ? a : v.find(' ', a + 1);
    if (b == std::string::npos) return m;
    try {
      m.lines = std::stoull(v.substr(0, a));
      m.last = {std::stoll(v.substr(a + 1, b - a - 1)), v.substr(b + 1)};
    } catch (const std::exception&) {
      return TrimMark{};
    }
    return m;
  }
  std::string text() const { return fmt::format("{} {} {}", lines, last.first, last.second); }
};

class Watching;

class EtcdBackend final : public Backend {
 public:
  EtcdBackend(EtcdOptions o, std::unique_ptr<Client> client)
      : opts_(std::move(o)), keys_{opts_.prefix + "/" + escape(opts_.run_id) + "/"}, client_(std::move(client)) {}

  std::string describe() const override { return client_->describe(); }

  std::unique_ptr<Backend> clone() const override {
    return std::make_unique<EtcdBackend>(opts_, client_->clone());
  }

  Snapshot load() override {
    check_interrupted();
    auto r = client_->range({keys_.state()}, deadline(), "reading the state");
    Snapshot s;
    if (!r.kvs.empty()) {
      s.state = r.kvs[0].value;
      s.token.value = std::to_string(r.kvs[0].mod_revision);
    }
    return s;
  }

  CasResult compare_and_set(const std::string& value, const Token& expected) override {
    check_interrupted();
    Deadline d = deadline();
    const std::string key = keys_.state();
    Compare cmp = expected.value.empty() ? Compare::absent(key) : Compare::mod_is(key, parse_token(expected));
    TxnResult t = with_run_lease(d, [&](int64_t run) {
      return client_->txn({cmp}, {Put{key, value, run}}, {Range(key)}, d, "writing the state");
    });
    CasResult out;
    if (t.succeeded) {
      out.ok = true;
      out.current.state = value;
      out.current.token.value = std::to_string(t.revision);
      return out;
    }
    if (auto kv = first(t, 0)) {
      out.current.state = kv->value;
      out.current.token.value = std::to_string(kv->mod_revision);
    }
    // A try whose answer was lost may have gone through: it did if the first write after
    // the expected version is ours (only one write can follow a given version).
    if (t.maybe_repeated) {
      if (cmp.target == Compare::Target::mod) {
        auto next = first_change_after(key, cmp.number, d);
        out.ok = next ? !next->deleted && next->kv.value == value : out.current.state == value;
      } else {
        out.ok = out.current.state == value;
      }
    }
    return out;
  }

  void append(const std::string& log, const std::string& line) override {
    check_interrupted();
    Deadline d = deadline();
    const std::string key = keys_.log_key(log, random_op(), 0), what = "appending to log '" + log + "'";
    with_run_lease(d, [&](int64_t run) { return client_->txn({}, {Put{key, line, run}}, {}, d, what.c_str()); });
  }

  std::vector<std::string> read(const std::string& log, size_t from) override {
    check_interrupted();
    return read_at(log, from, deadline(), nullptr);
  }

  std::vector<std::string> wait(const std::string& log, size_t from, milliseconds timeout) override;

  void drop_log(const std::string& log) override {
    check_interrupted();
    seen_lines_.erase(log);
    const std::string dir = keys_.log_dir(log);
    client_->txn({}, {Delete{dir, prefix_end(dir)}, Delete{keys_.trim(log), {}}}, {}, deadline(),
                 "removing a finished round's log");
  }

  bool trim_log(const std::string& log, size_t upto) override;

  int64_t add(const std::string& counter, int64_t delta) override;

  void drop_counter(const std::string& counter) override {
    check_interrupted();
    counters_.erase(keys_.counter(counter));
    client_->txn({}, {Delete{keys_.counter(counter), {}}}, {}, deadline(), "removing a finished round's counter");
  }

  void open_lease(milliseconds ttl) override;
  void keep_alive(milliseconds timeout) override;
  void on_lease_end(const std::string& log, const std::string& line) override;
  void drop_lease_end(const std::string& log) override;
  void close() override;
  void release() override;
  void interrupt() override;

 private:
  friend class Watching;
  using Lines = std::vector<std::pair<std::string, std::string>>;  // (log, line)

  Deadline deadline() const { return Clock::now() + opts_.op_timeout; }

  void check_interrupted() const {
    if (interrupted_) throw ddp::NetworkError(describe() + ": interrupted (this node is stopping)");
  }

  int64_t parse_token(const Token& t) const {
    bool digits = !t.value.empty() && std::all_of(t.value.begin(), t.value.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits) throw ddp::StoreError(fmt::format("{}: '{}' is not a state token of this backend", describe(), t.value));
    return std::stoll(t.value);
  }

  [[noreturn]] void lease_over() const {
    throw LeaseEnded(fmt::format("{}: this node's lease has ended (no keep-alive within {}): the other nodes "
                                      "count this node as lost",
                                      describe(), ddp::format_duration(lease_ttl_)));
  }

  std::optional<WatchEvent> first_change_after(const std::string& key, int64_t revision, Deadline d);
  void ensure_run_lease(Deadline d);
  TxnResult with_run_lease(Deadline d, const std::function<TxnResult(int64_t)>& f);
  std::vector<std::string> read_at(const std::string& log, size_t from, Deadline d, int64_t* revision);
  std::optional<std::pair<int64_t, std::string>> line_position(const std::string& log, size_t& upto, Deadline d);
  void delete_lines_up_to(const std::string& log, const std::pair<int64_t, std::string>& last, Deadline d);
  bool reap(int64_t lease, const std::string* reason, Deadline d);
  bool reap_ended(Deadline d);
  TxnResult register_lease(int64_t lease, Deadline d);
  bool put_end_lines(Deadline d);
  void remove_run_if_last(Deadline d);

  EtcdOptions opts_;
  Keys keys_;
  std::unique_ptr<Client> client_;
  int64_t run_lease_ = 0;
  Clock::time_point run_renewed_{};
  int64_t lease_ = 0;  // this node's lease
  milliseconds lease_ttl_{0};
  bool lease_over_ = false;
  Lines end_lines_;           // (log, line) registered with on_lease_end
  int64_t pending_mod_ = 0;   // mod revision of our pending/<lease> record
  // Per log, how many lines were read and the (create revision, key) of each of the last
  // ones: a read from line i asks only for lines created since line i-1 (a read from a line
  // older than those remembered, for all).
  struct LineCursor {
    size_t count = 0;
    std::deque<std::pair<int64_t, std::string>> last;  // lines [count - last.size(), count)
  };
  std::map<std::string, LineCursor> seen_lines_;
  std::map<std::string, KeyValue> counters_;           // the last counter keys we wrote or saw
  // interrupt(): from another thread, it fails every later call and aborts the watch of a
  // wait() in progress (watching_, set while one runs).
  std::atomic<bool> interrupted_{false};
  std::mutex watch_mu_;
  Watch* watching_ = nullptr;
};

// The first change of `key` after `revision`, from etcd's history (nullopt when etcd has
// compacted it away, or nothing came in time).
std::optional<WatchEvent> EtcdBackend::first_change_after(const std::string& key, int64_t revision, Deadline d) {
  try {
    auto watch = client_->watch({{key, {}, revision + 1, false, false}}, d, "looking up an earlier write");
    while (true) {
      auto evs = watch->next(d);
      if (!evs || evs->empty()) return std::nullopt;  // timed out, or cancelled (compacted)
      for (const auto& e : *evs)
        if (e.kv.key == key) return e;
    }
  } catch (const ddp::Error&) {
    return std::nullopt;
  }
}

// ---- the run lease -----------------------------------------------------------------------

void EtcdBackend::ensure_run_lease(Deadline d) {
  auto now = Clock::now();
  if (run_lease_ && now - run_renewed_ < opts_.run_ttl / 4) return;
  if (run_lease_) {
    // Writers renew it too, so that a run whose nodes have not opened leases yet lives on.
    auto ttl = client_->lease_keep_alive({run_lease_}, d, "renewing the run lease");
    if (ttl[0] > 0) {
      run_renewed_ = now;
      return;
    }
    run_lease_ = 0;  // expired: the run's keys are gone, a new run lease starts it afresh
  }
  for (int attempt = 0; attempt < 3 && !run_lease_; ++attempt) {
    if (auto r = client_->range({keys_.run_lease()}, d, "reading the run lease"); !r.kvs.empty()) {
      run_lease_ = unhex(r.kvs[0].value);
      break;
    }
    auto ttl_s = std::max<int64_t>(1, (opts_.run_ttl.count() + 999) / 1000);
    auto g = client_->lease_grant(ttl_s, d, "granting the run lease");
    auto t = client_->txn({Compare::absent(keys_.run_lease())}, {Put{keys_.run_lease(), hex(g.id), g.id}}, {Range(keys_.run_lease())},
                          d, "creating the run lease");
    if (t.succeeded) {
      run_lease_ = g.id;
      break;
    }
    if (auto kv = first(t, 0)) run_lease_ = unhex(kv->value);
    try {
      client_->lease_revoke(g.id, d, "revoking an unused run lease");
    } catch (const ddp::Error&) {
      // it expires by itself
    }
  }
  if (!run_lease_) throw ddp::StoreError(describe() + ": cannot settle on a run lease");
  run_renewed_ = Clock::now();
}

// Runs f(run lease); when etcd no longer knows the lease (the run's keys expired meanwhile),
// once more with a new one.
TxnResult EtcdBackend::with_run_lease(Deadline d, const std::function<TxnResult(int64_t)>& f) {
  for (int attempt = 0;; ++attempt) {
    ensure_run_lease(d);
    try {
      return f(run_lease_);
    } catch (const EtcdError& e) {
      if (!e.lease_not_found() || attempt >= 2) throw;
      run_lease_ = 0;
    }
  }
}

// ---- logs ----------------------------------------------------------------------------------

// One read of the log from line `from` (and a look for ended leases whose lines are not
// appended yet: there are more pending records than live leases). `revision`: the store's
// revision of the read, to watch from.
std::vector<std::string> EtcdBackend::read_at(const std::string& log, size_t from, Deadline d, int64_t* revision) {
  if (!seen_lines_.count(log) && seen_lines_.size() >= 16) seen_lines_.clear();  // per-round logs come and go
  auto& seen = seen_lines_[log];
  for (int pass = 0;; ++pass) {
    // Only lines after the last one known before `from` (or all, knowing none).
    const size_t first_known = seen.count - seen.last.size();
    size_t base = from > first_known ? std::min(from, seen.count) : 0;
    const std::pair<int64_t, std::string>* after = base > 0 ? &seen.last[base - 1 - first_known] : nullptr;
    Range lines = whole(keys_.log_dir(log));
    lines.by_creation = true;
    if (after) lines.min_create_revision = after->first;
    TxnResult t = client_->txn(
        {}, {lines, whole(keys_.pending_dir(), true), whole(keys_.alive_dir(), true), Range(keys_.trim(log))}, {}, d,
        "reading a log");
    if (pass == 0 && t.ranges.at(1).count > t.ranges.at(2).count && reap_ended(d)) continue;
    if (TrimMark mark = TrimMark::parse(first(t, 3)); mark.lines > base) {
      // Lines this cursor had not read were dropped: count on from the first line held.
      seen = LineCursor{mark.lines, {mark.last}};
      base = mark.lines;
      after = &seen.last.back();
    }
    auto& kvs = t.ranges.at(0).kvs;
    // One transaction's lines share a create revision: their keys order them.
    std::sort(kvs.begin(), kvs.end(), [](const KeyValue& a, const KeyValue& b) {
      return std::tie(a.create_revision, a.key) < std::tie(b.create_revision, b.key);
    });
    size_t skip = 0;
    if (after)
      while (skip < kvs.size() && std::make_pair(kvs[skip].create_revision, kvs[skip].key) <= *after) ++skip;
    if (base == 0) seen = LineCursor{};
    std::vector<std::string> out;
    for (size_t i = skip, line = base; i < kvs.size(); ++i, ++line) {
      if (line >= seen.count) {  // a line this cursor had not seen
        seen.last.emplace_back(kvs[i].create_revision, kvs[i].key);
        if (seen.last.size() > kRememberedLines) seen.last.pop_front();
        ++seen.count;
      }
      if (line >= from) out.push_back(std::move(kvs[i].value));
    }
    if (revision) *revision = t.revision;
    if (from < base)
      throw LogTrimmed(fmt::format("{}: log '{}' from line {}: lines before {} were dropped", describe(), log, from,
                                   base),
                       base);
    return out;
  }
}

// Where line upto-1 is (create revision, key), read if this object does not know it yet;
// upto is cut to the log's length. nullopt: nothing to drop (or too old to find).
std::optional<std::pair<int64_t, std::string>> EtcdBackend::line_position(const std::string& log, size_t& upto,
                                                                          Deadline d) {
  if (upto == 0) return std::nullopt;
  try {
    read_at(log, upto - 1, d, nullptr);
  } catch (const LogTrimmed&) {
    return std::nullopt;  // dropped already
  }
  const auto& seen = seen_lines_[log];
  upto = std::min(upto, seen.count);
  const size_t first_known = seen.count - seen.last.size();
  if (upto == 0 || upto - 1 < first_known) return std::nullopt;
  return seen.last[upto - 1 - first_known];
}

// Deletes the keys of the lines at or before `last` (a transaction per 64 of them).
void EtcdBackend::delete_lines_up_to(const std::string& log, const std::pair<int64_t, std::string>& last,
                                     Deadline d) {
  Range r = whole(keys_.log_dir(log), false, true);
  r.by_creation = true;
  r.max_create_revision = last.first;
  auto found = client_->range(r, d, "listing a log's dropped lines");
  std::vector<Request> ops;
  auto flush = [&] {
    if (!ops.empty()) client_->txn({}, ops, {}, d, "deleting a log's dropped lines");
    ops.clear();
  };
  for (const auto& kv : found.kvs) {
    if (std::make_pair(kv.create_revision, kv.key) > last) continue;
    ops.push_back(Delete{kv.key, {}});
    if (ops.size() == 64) flush();
  }
  flush();
}

// The mark first (readers then skip the lines it covers), then the lines' keys. A mark
// that moved meanwhile (another node trimmed) is left as it is.
bool EtcdBackend::trim_log(const std::string& log, size_t upto) {
  check_interrupted();
  Deadline d = deadline();
  auto last = line_position(log, upto, d);
  if (!last) return true;
  auto now = client_->range(Range(keys_.trim(log)), d, "reading a log's trim mark");
  std::optional<KeyValue> kv;
  if (!now.kvs.empty()) kv = now.kvs[0];
  if (TrimMark::parse(kv).lines >= upto) return true;
  const std::string key = keys_.trim(log), text = TrimMark{upto, *last}.text();
  Compare unchanged = kv ? Compare::mod_is(key, kv->mod_revision) : Compare::absent(key);
  TxnResult t = with_run_lease(d, [&](int64_t run) {
    return client_->txn({unchanged}, {Put{key, text, run}}, {}, d, "marking a log's dropped lines");
  });
  if (t.succeeded || t.maybe_repeated) delete_lines_up_to(log, *last, d);
  return true;
}

// Makes the watch of a wait() in progress reachable by interrupt() (another thread).
class Watching {
 public:
  Watching(EtcdBackend& b, Watch& w) : b_(b) {
    std::lock_guard lk(b_.watch_mu_);
    b_.watching_ = &w;
    if (b_.interrupted_) w.interrupt();  // interrupted between the check and now
  }
  ~Watching() {
    std::lock_guard lk(b_.watch_mu_);
    b_.watching_ = nullptr;
  }

 private:
  EtcdBackend& b_;
};

// Reads; when there is nothing yet, watches the log (and the live leases, whose end may
// bring lines) from the read's revision on, and reads again after each change, on the same
// watch, until lines come or the time is up; and anew every kRereadEvery.
std::vector<std::string> EtcdBackend::wait(const std::string& log, size_t from, milliseconds timeout) {
  const Deadline end = Clock::now() + timeout;
  while (true) {
    check_interrupted();
    int64_t rev = 0;
    auto lines = read_at(log, from, deadline(), &rev);
    if (!lines.empty() || Clock::now() >= end) return lines;
    std::vector<WatchSpec> specs{{keys_.log_dir(log), prefix_end(keys_.log_dir(log)), rev + 1, false, true},
                                 {keys_.alive_dir(), prefix_end(keys_.alive_dir()), rev + 1, true, false}};
    const Deadline reread = std::min(end, Clock::now() + kRereadEvery);
    try {
      auto watch = client_->watch(specs, std::min(end, deadline()), "watching a log");
      Watching guard(*this, *watch);
      while (true) {
        auto events = watch->next(reread);
        if (!events && Clock::now() >= end) return {};
        if (!events) break;  // time to read anew
        if (events->empty()) break;  // the member cancelled it: read and watch anew
        lines = read_at(log, from, deadline(), nullptr);
        if (!lines.empty()) return lines;
      }
    } catch (const ddp::TimeoutError&) {
      if (Clock::now() >= end) return {};
      throw;
    } catch (const ExchangeError&) {
      check_interrupted();  // interrupt() aborted the watch: no pause
      // The member went away mid-watch: read again (from another member, if need be).
      std::this_thread::sleep_for(std::min<Clock::duration>(milliseconds(50), std::max<Clock::duration>(end - Clock::now(), {})));
    }
  }
}

// ---- counters ------------------------------------------------------------------------------

int64_t EtcdBackend::add(const std::string& counter, int64_t delta) {
  check_interrupted();
  Deadline d = deadline();
  const std::string key = keys_.counter(counter);
  const std::string op = random_op();
  if (!counters_.count(key) && counters_.size() >= 16) counters_.clear();  // per-round counters come and go
  std::optional<KeyValue> seen;
  if (auto it = counters_.find(key); it != counters_.end()) seen = it->second;
  while (true) {
    CounterValue c = CounterValue::parse(seen ? seen->value : "");
    c.value += delta;
    c.recent.insert(c.recent.begin(), {op, c.value});
    if (c.recent.size() > 8) c.recent.resize(8);
    std::string text = c.text();
    Compare cmp = seen ? Compare::mod_is(key, seen->mod_revision) : Compare::absent(key);
    TxnResult t = with_run_lease(d, [&](int64_t run) {
      return client_->txn({cmp}, {Put{key, text, run}}, {Range(key)}, d, "adding to a counter");
    });
    if (t.succeeded) {
      counters_[key] = KeyValue{key, text, 0, t.revision, 0, 0};
      return c.value;
    }
    // A try whose answer was lost may have gone through: it did if the first write after
    // the version it expected is ours (exact while etcd keeps that history), or if our op
    // is among the counter's last ones.
    if (t.maybe_repeated && cmp.target == Compare::Target::mod) {
      if (auto next = first_change_after(key, cmp.number, d); next && !next->deleted) {
        auto c2 = CounterValue::parse(next->kv.value);
        if (!c2.recent.empty() && c2.recent.front().first == op) {
          counters_.erase(key);
          return c2.recent.front().second;
        }
      }
    }
    seen = first(t, 0);
    if (seen) {
      counters_[key] = *seen;
      for (const auto& [id, v] : CounterValue::parse(seen->value).recent)
        if (id == op) return v;  // an earlier try went through
    } else {
      counters_.erase(key);
    }
    if (Clock::now() >= d) throw ddp::TimeoutError(fmt::format("{}: adding to counter '{}': too much contention", describe(), counter));
  }
}

// ---- this node's lease -----------------------------------------------------------------------

TxnResult EtcdBackend::register_lease(int64_t lease, Deadline d) {
  json rec{{"ttl_ms", lease_ttl_.count()}, {"lines", json::array()}};
  for (const auto& [log, line] : end_lines_) rec["lines"].push_back({{"log", log}, {"line", line}});
  return with_run_lease(d, [&](int64_t run) {
    return client_->txn({}, {Put{keys_.alive(lease), "", lease}, Put{keys_.pending(lease), rec.dump(), run}, Put{keys_.members(), hex(lease), run}},
                        {}, d, "registering this node's lease");
  });
}

void EtcdBackend::open_lease(milliseconds ttl) {
  if (lease_) throw ddp::Error(describe() + ": open_lease called twice");
  if (ttl >= opts_.run_ttl)
    throw ddp::UsageError(fmt::format("{}: a node lease of {} would outlive the run's keys (run ttl {})", describe(),
                                      ddp::format_duration(ttl), ddp::format_duration(opts_.run_ttl)));
  Deadline d = deadline();
  auto g = client_->lease_grant(std::max<int64_t>(1, (ttl.count() + 999) / 1000), d, "granting this node's lease");
  lease_ttl_ = std::chrono::seconds(g.ttl_s);  // etcd may grant more than asked (its minimum)
  end_lines_.clear();
  try {
    pending_mod_ = register_lease(g.id, d).revision;
  } catch (...) {
    try {
      client_->lease_revoke(g.id, d, "revoking this node's lease");
    } catch (const ddp::Error&) {
    }
    throw;
  }
  lease_ = g.id;
  lease_over_ = false;
}

void EtcdBackend::keep_alive(milliseconds timeout) {
  if (!lease_) throw ddp::Error(describe() + ": keep_alive before open_lease");
  if (lease_over_) lease_over();
  Deadline d = Clock::now() + timeout;
  std::vector<int64_t> ids{lease_};
  if (run_lease_) ids.push_back(run_lease_);
  auto ttl = client_->lease_keep_alive(ids, d, "renewing this node's lease");
  if (ttl[0] == 0) {
    lease_over_ = true;
    try {
      reap(lease_, nullptr, d);  // our own lines, if nobody has yet
    } catch (const ddp::Error&) {
    }
    lease_over();
  }
  if (ids.size() > 1 && ttl[1] > 0) run_renewed_ = Clock::now();
  if (ids.size() > 1 && ttl[1] == 0) {
    // The run's keys expired under a live node (run ttl too short): register again.
    run_lease_ = 0;
    pending_mod_ = register_lease(lease_, d).revision;
  }
}

void EtcdBackend::on_lease_end(const std::string& log, const std::string& line) {
  if (!lease_) throw ddp::Error(describe() + ": on_lease_end before open_lease");
  if (lease_over_) lease_over();
  end_lines_.emplace_back(log, line);
  if (!put_end_lines(deadline())) {
    end_lines_.pop_back();
    lease_over_ = true;
    lease_over();
  }
}

void EtcdBackend::drop_lease_end(const std::string& log) {
  if (!lease_) throw ddp::Error(describe() + ": drop_lease_end before open_lease");
  if (lease_over_) lease_over();
  if (std::erase_if(end_lines_, [&](const auto& l) { return l.first == log; }) == 0) return;
  if (!put_end_lines(deadline())) {
    lease_over_ = true;
    lease_over();
  }
}

// Writes end_lines_ as this lease's pending record; false when the lease is gone.
bool EtcdBackend::put_end_lines(Deadline d) {
  json rec{{"ttl_ms", lease_ttl_.count()}, {"lines", json::array()}};
  for (const auto& [l, text] : end_lines_) rec["lines"].push_back({{"log", l}, {"line", text}});
  const std::string value = rec.dump(), key = keys_.pending(lease_);
  while (true) {
    TxnResult t = with_run_lease(d, [&](int64_t run) {
      return client_->txn({Compare::mod_is(key, pending_mod_), Compare::exists(keys_.alive(lease_))}, {Put{key, value, run}},
                          {Range(key), Range(keys_.alive(lease_), {}, true)}, d, "registering a lease-end line");
    });
    if (t.succeeded) {
      pending_mod_ = t.revision;
      return true;
    }
    if (t.ranges.at(1).count == 0) return false;
    auto kv = first(t, 0);
    pending_mod_ = kv ? kv->mod_revision : 0;
    if (kv && kv->value == value) return true;  // an earlier try went through
    if (Clock::now() >= d) throw ddp::TimeoutError(describe() + ": registering a lease-end line: too much contention");
  }
}

// Appends the end lines of `lease` (with `reason`, or "no keep-alive for <ttl>") and deletes
// its pending record in one transaction that requires the record unchanged: whoever comes
// second finds nothing to do. False when there was nothing to append.
bool EtcdBackend::reap(int64_t lease, const std::string* reason, Deadline d) {
  auto r = client_->range({keys_.pending(lease)}, d, "reading the lines of an ended lease");
  if (r.kvs.empty()) return false;
  const KeyValue& kv = r.kvs[0];
  json rec = json::parse(kv.value, nullptr, false);
  if (rec.is_discarded() || !rec.is_object()) rec = json::object();
  std::string why = reason ? *reason : fmt::format("no keep-alive for {}", ddp::format_duration(milliseconds(rec.value("ttl_ms", int64_t(0)))));
  // One transaction: the lines (in registration order: one op, numbered keys) and the
  // record's deletion, if the record is still as read.
  const std::string op = random_op();
  std::vector<Request> ops{Delete{keys_.pending(lease), {}}};
  size_t i = 0;
  for (const auto& e : rec.value("lines", json::array()))
    ops.push_back(Put{keys_.log_key(e.value("log", ""), op, i++), e.value("line", "") + " " + why, 0});
  TxnResult t = with_run_lease(d, [&](int64_t run) {
    for (auto& r : ops)
      if (auto* put = std::get_if<Put>(&r)) put->lease = run;
    return client_->txn({Compare::mod_is(keys_.pending(lease), kv.mod_revision)}, ops, {}, d,
                        "appending the lines of an ended lease");
  });
  return t.succeeded;
}

// Appends the lines of every lease that has ended (pending record, no alive key).
bool EtcdBackend::reap_ended(Deadline d) {
  TxnResult t = client_->txn({}, {whole(keys_.pending_dir(), false, true), whole(keys_.alive_dir(), false, true)}, {}, d,
                             "looking for ended leases");
  std::set<std::string> alive;
  for (const auto& kv : t.ranges.at(1).kvs) alive.insert(kv.key.substr(keys_.alive_dir().size()));
  bool any = false;
  for (const auto& kv : t.ranges.at(0).kvs) {
    std::string id = kv.key.substr(keys_.pending_dir().size());
    if (!alive.count(id)) any = reap(unhex(id), nullptr, d) || any;
  }
  return any;
}

// The last node to leave removes the run's keys, unless a node opened a lease meanwhile
// (it rewrote `members`): a later job with this run id starts clean.
void EtcdBackend::remove_run_if_last(Deadline d) {
  TxnResult t = client_->txn({}, {whole(keys_.alive_dir(), true), Range(keys_.members())}, {}, d, "counting live nodes");
  if (t.ranges.at(0).count > 0) return;
  auto members = first(t, 1);
  TxnResult del = client_->txn({Compare::mod_is(keys_.members(), members ? members->mod_revision : 0)},
                               {Delete{keys_.p, prefix_end(keys_.p)}}, {}, d, "removing the run's keys");
  if (del.succeeded && run_lease_) {
    try {
      client_->lease_revoke(run_lease_, d, "revoking the run lease");
    } catch (const ddp::Error&) {
    }
    run_lease_ = 0;
  }
}

// Leaving in good order: the pending record goes first (nobody appends its lines), then
// the lease (its alive/ key with it).
void EtcdBackend::release() {
  if (lease_ && !lease_over_) {
    Deadline d = deadline();
    client_->txn({}, {Delete{keys_.pending(lease_), {}}}, {}, d, "leaving the run in good order");
    client_->lease_revoke(lease_, d, "ending this node's lease");
    lease_over_ = true;
    if (opts_.remove_run_on_last_close) remove_run_if_last(d);
  }
  client_->close();
}

void EtcdBackend::interrupt() {
  interrupted_ = true;
  std::lock_guard lk(watch_mu_);
  if (watching_) watching_->interrupt();
}

void EtcdBackend::close() {
  if (lease_ && !lease_over_) {
    Deadline d = deadline();
    const std::string reason = "lease closed";
    reap(lease_, &reason, d);
    client_->lease_revoke(lease_, d, "ending this node's lease");
    lease_over_ = true;
    if (opts_.remove_run_on_last_close) remove_run_if_last(d);
  }
  client_->close();
}

}  // namespace

std::unique_ptr<Backend> make_etcd_backend(const EtcdOptions& o) {
  if (o.protocol != "http" && o.protocol != "https")
    throw ddp::UsageError(fmt::format("etcd: protocol must be http or https, not '{}'", o.protocol));
  if (o.run_id.empty()) throw ddp::UsageError("etcd: the run id is empty");
  if (o.op_timeout <= milliseconds(0)) throw ddp::UsageError("etcd: the operation timeout must be positive");
  ClientOptions c;
  bool https = o.protocol == "https";
  c.endpoints = parse_endpoints(o.endpoints, https);
  if (!https && (!o.cacert.empty() || !o.cert.empty() || !o.key.empty()))
    throw ddp::UsageError("etcd: cacert, cert and key need protocol=https");
  c.tls = TlsConfig{https, o.cacert, o.cert, o.key};
  c.connect_timeout = std::min(o.connect_timeout, o.op_timeout);
  c.spread = o.spread;
  c.still_failing = o.still_failing;
  return std::make_unique<EtcdBackend>(o, std::make_unique<Client>(std::move(c)));
}

}  // namespace ddprun::rdzv
