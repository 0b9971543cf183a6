#include "rendezvous/memory_backend.hpp"

#include <fmt/format.h>

#include "ddp/error.hpp"

namespace ddprun::rdzv {

class MemoryBackend : public Backend {
 public:
  MemoryBackend(std::shared_ptr<MemoryWorld> w, std::string name) : w_(std::move(w)), name_(std::move(name)) {}
  ~MemoryBackend() override { close(); }

  std::string describe() const override { return fmt::format("the memory backend ({})", name_); }
  std::unique_ptr<Backend> clone() const override { return std::make_unique<MemoryBackend>(w_, name_); }

  Snapshot load() override {
    std::lock_guard lk(w_->mu_);
    w_->check(name_);
    return snapshot();
  }

  CasResult compare_and_set(const std::string& value, const Token& expected) override {
    std::lock_guard lk(w_->mu_);
    w_->check(name_);
    CasResult r;
    if (snapshot().token == expected) {
      w_->state_ = value;
      ++w_->version_;
      r.ok = true;
      w_->cv_.notify_all();
    }
    r.current = snapshot();
    return r;
  }

  void append(const std::string& log, const std::string& line) override {
    std::lock_guard lk(w_->mu_);
    w_->check(name_);
    w_->logs_[log].push_back(line);
    w_->cv_.notify_all();
  }

  std::vector<std::string> read(const std::string& log, size_t from) override {
    std::lock_guard lk(w_->mu_);
    w_->check(name_);
    return tail(log, from);
  }

  std::vector<std::string> wait(const std::string& log, size_t from, milliseconds timeout) override {
    std::unique_lock lk(w_->mu_);
    w_->check(name_);
    w_->cv_.wait_for(lk, timeout, [&] { return w_->down_ || interrupted_ || woken_ || end(log) > from; });
    w_->check_up(name_);
    woken_ = false;
    if (interrupted_) throw ddp::NetworkError(fmt::format("{}: interrupted", describe()));
    return tail(log, from);
  }

  void drop_log(const std::string& log) override {
    std::lock_guard lk(w_->mu_);
    w_->check(name_);
    w_->logs_.erase(log);
    w_->trimmed_.erase(log);
  }

  bool trim_log(const std::string& log, size_t upto) override {
    std::lock_guard lk(w_->mu_);
    w_->check(name_);
    if (!w_->trims_) return false;
    auto it = w_->logs_.find(log);
    if (it == w_->logs_.end()) return true;
    size_t& first = w_->trimmed_[log];
    const size_t n = std::min(upto > first ? upto - first : 0, it->second.size());
    it->second.erase(it->second.begin(), it->second.begin() + static_cast<long>(n));
    first += n;
    return true;
  }

  void drop_counter(const std::string& counter) override {
    std::lock_guard lk(w_->mu_);
    w_->check(name_);
    w_->counters_.erase(counter);
  }

  void drop_lease_end(const std::string& log) override {
    std::lock_guard lk(w_->mu_);
    w_->check(name_);
    std::erase_if(lease()->lines, [&](const auto& l) { return l.first == log; });
  }

  int64_t add(const std::string& counter, int64_t delta) override {
    std::lock_guard lk(w_->mu_);
    w_->check(name_);
    return w_->counters_[counter] += delta;
  }

  void open_lease(milliseconds ttl) override {
    std::lock_guard lk(w_->mu_);
    w_->check(name_);
    lease_ = w_->next_lease_++;
    auto& l = w_->leases_[lease_];
    l.owner = name_;
    l.ttl = ttl;
    l.last = w_->now_;
  }

  void keep_alive(milliseconds) override {
    std::lock_guard lk(w_->mu_);
    w_->check(name_);
    auto* l = lease();
    if (l->ended) throw LeaseEnded(fmt::format("{}: the lease has ended", describe()));
    if (w_->cut_.count(name_)) throw ddp::TimeoutError(fmt::format("{}: cut off", describe()));
    l->last = w_->now_;
  }

  void on_lease_end(const std::string& log, const std::string& line) override {
    std::lock_guard lk(w_->mu_);
    w_->check(name_);
    auto* l = lease();
    if (l->ended) throw ddp::NetworkError(fmt::format("{}: the lease has ended", describe()));
    l->lines.emplace_back(log, line + " ");
  }

  void release() override {
    std::lock_guard lk(w_->mu_);
    if (lease_ == 0) return;
    auto it = w_->leases_.find(lease_);
    if (it != w_->leases_.end()) {
      it->second.lines.clear();
      it->second.ended = true;
    }
    lease_ = 0;
  }

  void interrupt() override {
    std::lock_guard lk(w_->mu_);
    interrupted_ = true;
    w_->cv_.notify_all();
  }

  void wake() override {
    std::lock_guard lk(w_->mu_);
    woken_ = true;
    w_->cv_.notify_all();
  }

  void close() override {
    std::lock_guard lk(w_->mu_);
    if (lease_ == 0) return;
    auto it = w_->leases_.find(lease_);
    if (it != w_->leases_.end() && !it->second.ended) w_->end_lease(it->second, "connection closed");
    lease_ = 0;
  }

 private:
  Snapshot snapshot() const {
    Snapshot s;
    s.state = w_->state_;
    s.token.value = w_->state_ ? std::to_string(w_->version_) : "";
    return s;
  }
  // The log's line count, dropped lines included (mu_ held).
  size_t end(const std::string& log) const {
    auto it = w_->logs_.find(log);
    auto t = w_->trimmed_.find(log);
    return (it == w_->logs_.end() ? 0 : it->second.size()) + (t == w_->trimmed_.end() ? 0 : t->second);
  }
  std::vector<std::string> tail(const std::string& log, size_t from) const {
    auto t = w_->trimmed_.find(log);
    const size_t first = t == w_->trimmed_.end() ? 0 : t->second;
    if (from < first)
      throw LogTrimmed(fmt::format("{}: log '{}' from line {}: lines before {} were dropped", describe(), log, from,
                                   first),
                       first);
    auto it = w_->logs_.find(log);
    if (it == w_->logs_.end() || it->second.size() + first <= from) return {};
    return {it->second.begin() + static_cast<long>(from - first), it->second.end()};
  }
  MemoryWorld::Lease* lease() {
    auto it = w_->leases_.find(lease_);
    if (it == w_->leases_.end()) throw ddp::Error(fmt::format("{}: no lease open", describe()));
    return &it->second;
  }

  std::shared_ptr<MemoryWorld> w_;
  std::string name_;
  int lease_ = 0;
  bool interrupted_ = false;  // under w_->mu_
  bool woken_ = false;        // under w_->mu_: the next wait returns at once
};

std::unique_ptr<Backend> MemoryWorld::backend(const std::string& name) {
  return std::make_unique<MemoryBackend>(shared_from_this(), name);
}

void MemoryWorld::check(const std::string& who) {
  ++calls_[who];
  check_up(who);
}

void MemoryWorld::check_up(const std::string& who) {
  if (down_) throw ddp::NetworkError(fmt::format("the memory backend ({}) is down", who));
}

size_t MemoryWorld::calls(const std::string& name) {
  std::lock_guard lk(mu_);
  return calls_[name];
}

void MemoryWorld::end_lease(Lease& l, const std::string& why) {
  l.ended = true;
  for (auto& [log, line] : l.lines) logs_[log].push_back(line + why);
  l.lines.clear();
  cv_.notify_all();
}

void MemoryWorld::advance(milliseconds d) {
  std::lock_guard lk(mu_);
  now_ += d;
  for (auto& [id, l] : leases_)
    if (!l.ended && l.ttl.count() > 0 && now_ - l.last >= l.ttl)
      end_lease(l, fmt::format("no keep-alive for {}", ddp::format_duration(
                                                           std::chrono::duration_cast<milliseconds>(now_ - l.last))));
}

void MemoryWorld::kill(const std::string& name) {
  std::lock_guard lk(mu_);
  for (auto& [id, l] : leases_)
    if (!l.ended && l.owner == name) end_lease(l, "connection closed");
}

void MemoryWorld::cut_off(const std::string& name) {
  std::lock_guard lk(mu_);
  cut_.insert(name);
}

void MemoryWorld::set_down(bool down) {
  std::lock_guard lk(mu_);
  down_ = down;
  cv_.notify_all();
}

std::vector<std::string> MemoryWorld::log(const std::string& name) {
  std::lock_guard lk(mu_);
  return logs_[name];
}

size_t MemoryWorld::trimmed(const std::string& name) {
  std::lock_guard lk(mu_);
  return trimmed_.count(name) ? trimmed_[name] : 0;
}

void MemoryWorld::set_trims(bool trims) {
  std::lock_guard lk(mu_);
  trims_ = trims;
}

std::optional<std::string> MemoryWorld::state() {
  std::lock_guard lk(mu_);
  return state_;
}

}  // namespace ddprun::rdzv
