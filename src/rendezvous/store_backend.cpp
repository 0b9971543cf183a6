#include "rendezvous/store_backend.hpp"

#include <string_view>

#include <fmt/format.h>

#include "ddp/error.hpp"
#include "ddp/tcp_store.hpp"

namespace ddprun::rdzv {

namespace {

// The state's version: every write stores value + "\n@<n>", n one more than the version it
// replaced, so that the token (the stored bytes) changes with every write, even of the same
// value (no ABA). A value without it (a torchrun agent's state) is handed out as it is.
constexpr char kVersionMark[] = "\n@";

std::pair<std::string, int64_t> split_version(const std::string& raw) {
  size_t at = raw.rfind(kVersionMark);
  if (at == std::string::npos || at + 2 >= raw.size()) return {raw, 0};
  int64_t n = 0;
  for (size_t i = at + 2; i < raw.size(); ++i) {
    if (raw[i] < '0' || raw[i] > '9' || n > (int64_t{1} << 55)) return {raw, 0};
    n = n * 10 + (raw[i] - '0');
  }
  return {raw.substr(0, at), n};
}

Snapshot snapshot_of(const std::string& raw) {
  Snapshot s;
  if (!raw.empty()) s.state = split_version(raw).first;
  s.token.value = raw;
  return s;
}

constexpr size_t kRememberedLines = 4096;  // per log, where each of the last lines began

}  // namespace

StoreBackend::StoreBackend(StoreBackendOptions o) : o_(std::move(o)) {
  ddp::TcpStoreOptions so;
  so.host = o_.host;
  so.port = o_.port;
  so.timeout = o_.timeout;
  so.connect_timeout = o_.connect_timeout;
  so.lazy = o_.lazy;
  store_ = std::make_unique<ddp::TcpStore>(so, o_.retrying);
}

StoreBackend::~StoreBackend() = default;

std::string StoreBackend::describe() const {
  return o_.host.find(':') != std::string::npos ? fmt::format("{} at [{}]:{}", o_.name, o_.host, o_.port)
                                                : fmt::format("{} at {}:{}", o_.name, o_.host, o_.port);
}

std::unique_ptr<Backend> StoreBackend::clone() const {
  // Connected when first used: the clone that holds the lease never uses its own.
  StoreBackendOptions o = o_;
  o.lazy = true;
  auto b = std::make_unique<StoreBackend>(o);
  b->serves_trim_ = serves_trim_;  // the same server: asked once for all
  return b;
}

// PyTorch's TCPStore client puts "/" before every key it sends: torchrun's state is
// "/torch.rendezvous.<run id>" on the wire.
std::string StoreBackend::state_key() const { return "/torch.rendezvous." + o_.run_id; }
std::string StoreBackend::key(const std::string& name) const { return "ddprun.rdzv." + o_.run_id + "/" + name; }

// COMPARE_SET(key, "", "") reads the state in one round trip without blocking: it creates
// an empty value when there is none ("" is never a state).
Snapshot StoreBackend::load() {
  return named([&] { return snapshot_of(store_->compare_set(state_key(), "", "")); });
}

CasResult StoreBackend::compare_and_set(const std::string& value, const Token& expected) {
  const int64_t version = expected.value.empty() ? 0 : split_version(expected.value).second;
  const std::string desired = value + kVersionMark + std::to_string(version + 1);
  std::string now = named([&] { return store_->compare_set(state_key(), expected.value, desired); });
  CasResult r;
  r.ok = now == desired;
  r.current = snapshot_of(now);
  return r;
}

// The state's stored bytes end with its version ("\n@<n>"), and no two writes store the
// same version (each compare-and-set goes from n to n + 1): the state is unchanged exactly
// when its bytes from where the token's version mark stands are that mark (GET_FROM there:
// a few bytes instead of the whole state). A token without a version (a torchrun agent's
// value) cannot be told that way.
std::optional<bool> StoreBackend::changed(const Token& t) {
  const std::string& raw = t.value;
  if (raw.empty()) return !named([&] { return store_->get_from(state_key(), 0); }).empty();
  const size_t at = raw.rfind(kVersionMark);
  if (at == std::string::npos || split_version(raw).second == 0) return std::nullopt;
  const std::string_view mark = std::string_view(raw).substr(at);
  return named([&] { return store_->get_from(state_key(), static_cast<int64_t>(at)); }) != mark;
}

// APPEND has no reply: the PING after it returns once the server has applied it, so the
// line is there for every other connection when append() returns.
void StoreBackend::append(const std::string& log, const std::string& line) {
  named([&] {
    store_->append(key(log), line + "\n");
    store_->ping();
  });
}

// A server that trims logs answers LOG_FROM (what was dropped, then the bytes); one that
// does not never drops a line, and GET_FROM is all there is.
bool StoreBackend::serves_trim() {
  if (*serves_trim_ < 0) *serves_trim_ = named([&] { return store_->serves_log_trim(); }) ? 1 : 0;
  return *serves_trim_ == 1;
}

ddp::TcpStore::LogChunk StoreBackend::fetch(const std::string& log, int64_t offset) {
  if (serves_trim()) return named([&] { return store_->log_from(key(log), offset); });
  ddp::TcpStore::LogChunk c;
  c.bytes = named([&] { return store_->get_from(key(log), offset); });
  return c;
}

// TRIM_LOG; false (nothing dropped) on a server without it.
bool StoreBackend::trim_log(const std::string& log, size_t upto) {
  if (!serves_trim()) return false;
  named([&] { return store_->trim_log(key(log), static_cast<int64_t>(upto)); });
  return true;
}

// Reads from where this object's last read of the log ended (GET_FROM, LOG_FROM): a reader
// fetches each line once, however long the log grows. A read of an earlier line starts
// over; one of a line that was dropped (TRIM_LOG) throws LogTrimmed, the cursor then at the
// first line held.
std::vector<std::string> StoreBackend::read(const std::string& log, size_t from) {
  if (!cursors_.count(log) && cursors_.size() >= 16) cursors_.clear();  // per-round logs come and go
  LogCursor& c = cursors_[log];
  const size_t first_known = c.lines - c.starts.size();
  if (from < first_known) c = LogCursor{};  // older than what is remembered: from the start
  // Fetch from line `at`: `from` when its start is known, else the end of what was read.
  size_t at = from < c.lines ? from : c.lines;
  int64_t offset = at < c.lines ? c.starts[at - (c.lines - c.starts.size())] : c.bytes;
  auto chunk = fetch(log, offset);
  if (chunk.trimmed_bytes > offset) {  // lines this cursor had not read were dropped
    c = LogCursor{static_cast<size_t>(chunk.trimmed_lines), chunk.trimmed_bytes, {}};
    at = c.lines;
    offset = c.bytes;
  }
  const std::string& raw = chunk.bytes;
  std::vector<std::string> out;
  size_t line = at;
  int64_t pos = offset;
  for (size_t start = 0, nl; (nl = raw.find('\n', start)) != std::string::npos; start = nl + 1, ++line) {
    if (line >= c.lines) {  // a line this cursor had not seen
      c.starts.push_back(pos);
      if (c.starts.size() > kRememberedLines) c.starts.pop_front();
      ++c.lines;
      c.bytes = pos + static_cast<int64_t>(nl - start + 1);
    }
    pos += static_cast<int64_t>(nl - start + 1);
    if (line >= from) out.push_back(raw.substr(start, nl - start));
  }
  if (from < at)
    throw LogTrimmed(fmt::format("{}: log '{}' from line {}: lines before {} were dropped", describe(), log, from, at),
                     at);
  return out;
}

// As read(log, from), starting at byte `at` (where line `from` begins: position() of the
// object that read it) when this object has not read up to line `from`, or has forgotten
// where it begins: a joiner reads the pending requests, not the whole log before them.
std::vector<std::string> StoreBackend::read(const std::string& log, size_t from, int64_t at) {
  if (at >= 0) {
    if (!cursors_.count(log) && cursors_.size() >= 16) cursors_.clear();
    LogCursor& c = cursors_[log];
    if (from > c.lines || from < c.lines - c.starts.size()) c = LogCursor{from, at, {}};
  }
  return read(log, from);
}

int64_t StoreBackend::position(const std::string& log, size_t line) {
  auto it = cursors_.find(log);
  if (it == cursors_.end()) return -1;
  const LogCursor& c = it->second;
  if (line == c.lines) return c.bytes;
  const size_t first_known = c.lines - c.starts.size();
  if (line >= first_known && line < c.lines) return c.starts[line - first_known];
  return -1;
}

// Until line `from` exists (earlier lines wake the wait, which then waits on) or the timeout.
std::vector<std::string> StoreBackend::wait(const std::string& log, size_t from, milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  // Waiting for lines after all this object has read: WAIT_GROWS first (it returns at once
  // when the log is longer already), so a wait that finds nothing costs one request, not
  // a read that comes back empty and then the wait.
  if (auto it = cursors_.find(log); it != cursors_.end() && from >= it->second.lines) {
    const int64_t known = it->second.bytes;
    auto left = std::chrono::duration_cast<milliseconds>(end - std::chrono::steady_clock::now());
    if (left.count() <= 0 || !named([&] { return store_->wait_grows(key(log), known, left); })) return {};
  }
  for (;;) {
    auto lines = read(log, from);
    auto left = std::chrono::duration_cast<milliseconds>(end - std::chrono::steady_clock::now());
    if (!lines.empty() || left.count() <= 0) return lines;
    const int64_t known = cursors_[log].bytes;
    if (!named([&] { return store_->wait_grows(key(log), known, left); })) return {};
  }
}

int64_t StoreBackend::add(const std::string& counter, int64_t delta) {
  return named([&] { return store_->add(key(counter), delta); });
}

void StoreBackend::open_lease(milliseconds ttl) {
  ddp::TcpStoreOptions so = store_->options();
  so.lazy = false;  // the lease is this connection: made now
  named([&] {
    lease_ = std::make_unique<ddp::TcpStore>(so);
    lease_->lease(ttl);
  });
}

// The lease is the connection: once a ping fails the connection is dropped (a timeout
// leaves it in an unknown state), the server ends the lease, and it cannot come back.
void StoreBackend::keep_alive(milliseconds timeout) {
  if (!lease_) throw LeaseEnded(fmt::format("rendezvous: no lease open on {}", describe()));
  try {
    lease_->ping(std::max(timeout, milliseconds(1)));
  } catch (const ddp::Error& e) {
    throw LeaseEnded(name(e.what()));
  }
}

void StoreBackend::on_lease_end(const std::string& log, const std::string& line) {
  if (!lease_) throw ddp::Error(fmt::format("rendezvous: no lease open on {}", describe()));
  named([&] { lease_->on_lease_end(key(log), line + " "); });
}

// ON_LEASE_END with an empty value drops the key's lines (docs/store.md); a registered line
// is never empty (it ends with the " " before the reason).
void StoreBackend::drop_lease_end(const std::string& log) {
  if (!lease_) throw ddp::Error(fmt::format("rendezvous: no lease open on {}", describe()));
  named([&] { lease_->on_lease_end(key(log), ""); });
}

namespace {
constexpr const char* kHostKey = "ddprun.host/run_id";
}  // namespace

void StoreBackend::claim_host() {
  named([&] { store_->set(kHostKey, o_.run_id); });
}

// COMPARE_SET(key, "", ""): the value, or "" (made so) when there is none, in one round trip.
std::string StoreBackend::host_run_id() {
  return named([&] { return store_->compare_set(kHostKey, "", ""); });
}

void StoreBackend::drop_log(const std::string& log) {
  cursors_.erase(log);
  named([&] { store_->delete_key(key(log)); });
}

void StoreBackend::drop_counter(const std::string& counter) {
  named([&] { store_->delete_key(key(counter)); });
}

// "store at H:P: ..." (the client's words) as "the c10d store at H:P: ..." (or the name the
// options give): every error names the backend as describe() does.
std::string StoreBackend::name(const std::string& what) const {
  const std::string d = describe();
  if (what.find(d) != std::string::npos) return what;
  const std::string addr = d.substr(d.find(" at ") + 4);
  for (const std::string& theirs : {"the store at " + addr, "store at " + addr}) {
    size_t at = what.find(theirs);
    if (at != std::string::npos) return what.substr(0, at) + d + what.substr(at + theirs.size());
  }
  return d + ": " + what;
}

void StoreBackend::close() { lease_.reset(); }

void StoreBackend::release() {
  if (!lease_) return;
  try {
    lease_->release_lease();
  } catch (const ddp::Error&) {  // the connection is gone: so is the lease, lines written
  }
  lease_.reset();
}

void StoreBackend::interrupt() {
  if (store_) store_->interrupt();
}

void StoreBackend::wake() {
  if (store_) store_->wake();
}

}  // namespace ddprun::rdzv
