#include <algorithm>
#include <charconv>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ddp/error.hpp"
#include "ddp/store.hpp"

namespace ddp {

namespace {
int64_t parse_counter(const std::string& key, const std::string& v) {
  int64_t n = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || p != v.data() + v.size())
    throw StoreError(fmt::format("add on key '{}': value '{}' is not an integer", key, v));
  return n;
}
}  // namespace

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard lk(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
}

std::string MemoryStore::get(const std::string& key) {
  wait({key}, timeout());
  std::lock_guard lk(mu_);
  return data_.at(key);
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t v;
  {
    std::lock_guard lk(mu_);
    auto it = data_.find(key);
    int64_t cur = it == data_.end() ? 0 : parse_counter(key, it->second);
    v = static_cast<int64_t>(static_cast<uint64_t>(cur) + static_cast<uint64_t>(delta));  // wraps, as the server's
    data_[key] = std::to_string(v);
  }
  cv_.notify_all();
  return v;
}

std::string MemoryStore::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  std::string out;
  {
    std::lock_guard lk(mu_);
    auto it = data_.find(key);
    if (it == data_.end()) {
      if (!expected.empty()) return expected;
      data_[key] = desired;
      out = desired;
    } else if (it->second == expected) {
      it->second = desired;
      out = desired;
    } else {
      return it->second;
    }
  }
  cv_.notify_all();
  return out;
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lk(mu_);
  return std::all_of(keys.begin(), keys.end(), [&](auto& k) { return data_.count(k) > 0; });
}

void MemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  auto ready = [&] {
    return std::all_of(keys.begin(), keys.end(), [&](auto& k) { return data_.count(k) > 0; });
  };
  if (!cv_.wait_for(lk, timeout, ready)) {
    std::vector<std::string> missing;
    for (auto& k : keys)
      if (!data_.count(k)) missing.push_back(k);
    throw TimeoutError(fmt::format("memory store: wait timed out after {}, keys still missing: {}",
                                   format_duration(timeout), fmt::join(missing, ", ")));
  }
}

bool MemoryStore::delete_key(const std::string& key) {
  std::lock_guard lk(mu_);
  return data_.erase(key) > 0;
}

int64_t MemoryStore::num_keys() {
  std::lock_guard lk(mu_);
  return static_cast<int64_t>(data_.size());
}

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
    : prefix_(std::move(prefix)), inner_(std::move(inner)) {
  timeout_ = inner_->timeout();
}

std::vector<std::string> PrefixStore::k(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (auto& key : keys) out.push_back(k(key));
  return out;
}

void PrefixStore::set(const std::string& key, const std::string& value) { inner_->set(k(key), value); }
std::string PrefixStore::get(const std::string& key) {
  inner_->wait({k(key)}, timeout());
  return inner_->get(k(key));
}
int64_t PrefixStore::add(const std::string& key, int64_t delta) { return inner_->add(k(key), delta); }
std::string PrefixStore::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  return inner_->compare_set(k(key), expected, desired);
}
bool PrefixStore::check(const std::vector<std::string>& keys) { return inner_->check(k(keys)); }
void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  inner_->wait(k(keys), timeout);
}
bool PrefixStore::delete_key(const std::string& key) { return inner_->delete_key(k(key)); }
int64_t PrefixStore::num_keys() { return inner_->num_keys(); }

}  // namespace ddp
