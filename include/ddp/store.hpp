// The key-value store that carries rendezvous and bootstrap, in the style of gloo's
// rendezvous::Store and c10d's Store: small, blocking, every wait bounded by a timeout.
//
//   Store          the interface.
//   MemoryStore    in-process, thread-safe (tests, single-process use).
//   PrefixStore    decorator: every key gets "<prefix>/" (one per restart attempt).
//   TcpStore       client of ddprun's store server and of PyTorch's TCPStore (both wire
//                  generations); declared in ddp/tcp_store.hpp.
//
// Values are byte strings (std::string is used as a byte container; it may hold NULs).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <condition_variable>
#include <map>
#include <string>
#include <vector>

namespace ddp {

class Store {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{std::chrono::seconds(300)};

  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits (up to timeout()) for the key to exist, then returns its value.
  virtual std::string get(const std::string& key) = 0;
  // Adds delta to the integer stored as decimal text under key (0 if missing); returns it.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // PyTorch's compare_set: if the key holds `expected` (or is missing and expected is
  // empty) it becomes `desired`. Returns the value after the operation (or `expected` when
  // the key is missing and expected is non-empty).
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;
  // True if all keys exist now.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Blocks until all keys exist; throws TimeoutError naming the missing keys.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  // Returns true if the key existed.
  virtual bool delete_key(const std::string& key) = 0;
  virtual int64_t num_keys() = 0;

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

 protected:
  std::chrono::milliseconds timeout_{kDefaultTimeout};
};

// In-process store; every operation is thread-safe.
class MemoryStore : public Store {
 public:
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
};

// Decorator: every key becomes "<prefix>/<key>" on the wrapped store. num_keys() is the
// wrapped store's count (as in PyTorch).
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

  const std::string& prefix() const { return prefix_; }
  Store& inner() { return *inner_; }

 private:
  std::string k(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> k(const std::vector<std::string>& keys) const;
  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

}  // namespace ddp
