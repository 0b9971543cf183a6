// TcpStore: the client of a TCP rendezvous store. It talks to ddprun's store server and to
// PyTorch's own TCPStore server, in either wire generation (see docs/store.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/store.hpp"

namespace ddp {

enum class WireGeneration {
  kV1,  // torch 1.13 .. 2.1: no handshake, opcodes SET=0 ...
  kV2,  // torch 2.2+: VALIDATE magic + PING first, opcodes SET=1 ...
  // Generation 2, or 1 when the server speaks only that (PyTorch 1.13 .. 2.1's TCPStore,
  // which resets a connection on the generation-2 handshake): found at the first
  // connection, kept for the later ones. What a worker uses when any torchrun may host.
  kAuto,
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 29500;
  // Bound on every blocking call (get/wait); also Store::timeout().
  std::chrono::milliseconds timeout{Store::kDefaultTimeout};
  // Connection attempts retry with jittered exponential backoff until this deadline.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
  WireGeneration generation = WireGeneration::kV2;
  // Connect at the first request instead of in the constructor (a connection that may
  // never be used: the rendezvous's per-thread clones).
  bool lazy = false;
};

class TcpStore : public Store {
 public:
  // Connects (retrying until options.connect_timeout; at the first request with
  // options.lazy); throws NetworkError/TimeoutError naming host:port and the time spent.
  explicit TcpStore(TcpStoreOptions options);
  // The same, telling `retrying` after each failed connection attempt how long it has tried
  // and why the last attempt failed (it runs on the connecting thread; it may throw to stop).
  using ConnectRetry = std::function<void(std::chrono::milliseconds tried, const std::string& last_error)>;
  TcpStore(TcpStoreOptions options, ConnectRetry retrying);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

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

  // Generation-2 extras (throw StoreError on a generation-1 connection).
  void append(const std::string& key, const std::string& value);
  std::vector<std::string> multi_get(const std::vector<std::string>& keys);
  void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values);
  std::vector<std::string> list_keys();
  void queue_push(const std::string& key, const std::string& value);
  int64_t queue_len(const std::string& key);
  // Returns false (and leaves value untouched) if the queue is empty.
  bool queue_pop(const std::string& key, std::string& value);
  void ping();
  void ping(std::chrono::milliseconds timeout);

  // Shuts the connection down: a call blocked in another thread returns at once with a
  // NetworkError, and every later call throws. Callable from any thread.
  void interrupt();
  // Ends a wait_grows in progress in another thread, or the next one, as its timeout
  // would (it returns false), and keeps the connection: a stopping caller's wait returns
  // now, and its later calls work. Callable from any thread.
  void wake();

  // ddprun's extensions (docs/store.md), served by ddprun's store only: PyTorch's servers
  // close the connection on them, which these report as a NetworkError saying so.
  //
  // Makes this connection a lease: when it closes, or sends no request for `ttl` (0: only
  // when it closes), the server appends the lines given to on_lease_end(). A leased
  // connection never reconnects: once it is lost, every call throws NetworkError.
  void lease(std::chrono::milliseconds ttl);
  // Ends the lease in good order: its lines are dropped, never written.
  void release_lease();
  // When this connection's lease ends, the server APPENDs value + why + "\n" to key (why:
  // "connection closed", "no keep-alive for 15 s").
  void on_lease_end(const std::string& key, const std::string& value);
  // Waits until the key's value is longer than `size` bytes (a missing key has 0); false
  // at the timeout.
  bool wait_grows(const std::string& key, int64_t size, std::chrono::milliseconds timeout);
  // ddprun's GET_FROM: the value's bytes from `offset` on ("" when the key is missing or not
  // longer than offset), without waiting: an appended log read from where the reader is.
  std::string get_from(const std::string& key, int64_t offset);
  // Whether the server trims logs (TRIM_LOG, LOG_FROM): asked with GET_FROM's feature
  // offset, which servers before them answer "" (so the question costs no connection).
  bool serves_log_trim();
  // ddprun's TRIM_LOG: drops the key's '\n'-ended lines before line `line` (lines and
  // offsets count from the key's first byte ever and stay valid); returns the first line
  // still held.
  int64_t trim_log(const std::string& key, int64_t line);
  // ddprun's LOG_FROM: what TRIM_LOG dropped and the bytes held from `offset` on (from the
  // first byte held, when offset is below it).
  struct LogChunk {
    int64_t trimmed_bytes = 0, trimmed_lines = 0;
    std::string bytes;
  };
  LogChunk log_from(const std::string& key, int64_t offset);

  const TcpStoreOptions& options() const { return options_; }
  // The generation spoken: options().generation, or with kAuto the one found (kV2 until the
  // first connection). Waits for a call in progress on another thread.
  WireGeneration generation() const;

 private:
  struct Impl;
  TcpStoreOptions options_;
  std::unique_ptr<Impl> impl_;
};

namespace detail {
// While one lives on a thread, that thread's TcpStore calls end by its deadline, connecting
// again included: a best-effort notice (a failing rank's abort key) never waits out the
// connect_timeout of a store that is gone (a rank 0 that hosted it and died).
class StoreCallDeadline {
 public:
  explicit StoreCallDeadline(std::chrono::milliseconds budget);
  ~StoreCallDeadline();
  StoreCallDeadline(const StoreCallDeadline&) = delete;
  StoreCallDeadline& operator=(const StoreCallDeadline&) = delete;
  // The innermost one's deadline on this thread (time_point::max() when none).
  static std::chrono::steady_clock::time_point current();

 private:
  std::chrono::steady_clock::time_point saved_;
};
}  // namespace detail

}  // namespace ddp
