#include "rendezvous/store_backend.hpp"

#include <fmt/format.h>

#include "ddp/error.hpp"
#include "ddp/tcp_store.hpp"

namespace ddprun::rdzv {

namespace {

std::vector<std::string> lines_from(const std::string& raw, size_t from) {
  std::vector<std::string> out;
  size_t i = 0, start = 0;
  while (start < raw.size()) {
    size_t nl = raw.find('\n', start);
    if (nl == std::string::npos) nl = raw.size();
    if (i++ >= from) out.push_back(raw.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

}  // namespace

StoreBackend::StoreBackend(StoreBackendOptions o) : o_(std::move(o)) {
  ddp::TcpStoreOptions so;
  so.host = o_.host;
  so.port = o_.port;
  so.timeout = o_.timeout;
  so.connect_timeout = o_.connect_timeout;
  store_ = std::make_unique<ddp::TcpStore>(so);
}

StoreBackend::~StoreBackend() = default;

std::string StoreBackend::describe() const {
  return o_.host.find(':') != std::string::npos ? fmt::format("the c10d store at [{}]:{}", o_.host, o_.port)
                                                : fmt::format("the c10d store at {}:{}", o_.host, o_.port);
}

std::unique_ptr<Backend> StoreBackend::clone() const { return std::make_unique<StoreBackend>(o_); }

// PyTorch's TCPStore client puts "/" before every key it sends: torchrun's state is
// "/torch.rendezvous.<run id>" on the wire.
std::string StoreBackend::state_key() const { return "/torch.rendezvous." + o_.run_id; }
std::string StoreBackend::key(const std::string& name) const { return "ddprun.rdzv." + o_.run_id + "/" + name; }

// COMPARE_SET(key, "", "") reads the state in one round trip without blocking: it creates
// an empty value when there is none ("" is never a state).
Snapshot StoreBackend::load() {
  std::string v = store_->compare_set(state_key(), "", "");
  Snapshot s;
  if (!v.empty()) s.state = v;
  s.token.value = v;
  return s;
}

CasResult StoreBackend::compare_and_set(const std::string& value, const Token& expected) {
  std::string now = store_->compare_set(state_key(), expected.value, value);
  CasResult r;
  r.ok = now == value;
  if (!now.empty()) r.current.state = now;
  r.current.token.value = now;
  return r;
}

void StoreBackend::append(const std::string& log, const std::string& line) { store_->append(key(log), line + "\n"); }

// MULTI_GET answers "" for a missing key without waiting (GET would wait for it).
std::string StoreBackend::raw_log(const std::string& log) { return store_->multi_get({key(log)}).at(0); }

std::vector<std::string> StoreBackend::read(const std::string& log, size_t from) {
  return lines_from(raw_log(log), from);
}

std::vector<std::string> StoreBackend::wait(const std::string& log, size_t from, milliseconds timeout) {
  std::string raw = raw_log(log);
  auto lines = lines_from(raw, from);
  if (!lines.empty() || timeout.count() <= 0) return lines;
  if (!store_->wait_grows(key(log), static_cast<int64_t>(raw.size()), timeout)) return {};
  return lines_from(raw_log(log), from);
}

int64_t StoreBackend::add(const std::string& counter, int64_t delta) { return store_->add(key(counter), delta); }

void StoreBackend::open_lease(milliseconds ttl) {
  ddp::TcpStoreOptions so = store_->options();
  lease_ = std::make_unique<ddp::TcpStore>(so);
  lease_->lease(ttl);
}

// The lease is the connection: once a ping fails the connection is dropped (a timeout
// leaves it in an unknown state), the server ends the lease, and it cannot come back.
void StoreBackend::keep_alive(milliseconds timeout) {
  if (!lease_) throw LeaseEnded(fmt::format("rendezvous: no lease open on {}", describe()));
  try {
    lease_->ping(std::max(timeout, milliseconds(1)));
  } catch (const ddp::Error& e) {
    throw LeaseEnded(e.what());
  }
}

void StoreBackend::on_lease_end(const std::string& log, const std::string& line) {
  if (!lease_) throw ddp::Error(fmt::format("rendezvous: no lease open on {}", describe()));
  lease_->on_lease_end(key(log), line + " ");
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

}  // namespace ddprun::rdzv
