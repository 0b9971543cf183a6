// The dynamic rendezvous over ddprun's TCP store (--rdzv-backend c10d): the state is the
// key "/torch.rendezvous.<run id>" (torchrun's own key, as PyTorch's client sends it, so
// that a torchrun agent and a ddprun agent given the same endpoint and id notice each
// other instead of forming two jobs), logs and counters live under "ddprun.rdzv.<run
// id>/", and the lease is a connection of its own that uses the store's LEASE extension
// (docs/store.md).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "rendezvous/backend.hpp"

#include "ddp/tcp_store.hpp"

namespace ddprun::rdzv {

struct StoreBackendOptions {
  std::string host;
  uint16_t port = 29400;
  std::string name = "the c10d store";  // in messages, before " at host:port"
  std::string run_id;
  milliseconds timeout{60000};          // each call (read_timeout)
  milliseconds connect_timeout{60000};  // reaching the store
  bool lazy = false;  // connect at the first call (clones: the lease's never makes one)
  ddp::TcpStore::ConnectRetry retrying;  // told of each failed attempt to connect (may be empty)
};

class StoreBackend : public Backend {
 public:
  // Connects now (retrying until connect_timeout; lazy: at the first call); throws
  // ddp::NetworkError naming host:port.
  explicit StoreBackend(StoreBackendOptions o);
  ~StoreBackend() override;

  std::string describe() const override;
  std::unique_ptr<Backend> clone() const override;

  Snapshot load() override;
  CasResult compare_and_set(const std::string& value, const Token& expected) override;
  std::optional<bool> changed(const Token& t) override;
  void append(const std::string& log, const std::string& line) override;
  std::vector<std::string> read(const std::string& log, size_t from) override;
  std::vector<std::string> read(const std::string& log, size_t from, int64_t at) override;
  int64_t position(const std::string& log, size_t line) override;
  std::vector<std::string> wait(const std::string& log, size_t from, milliseconds timeout) override;
  int64_t add(const std::string& counter, int64_t delta) override;
  void open_lease(milliseconds ttl) override;
  void keep_alive(milliseconds timeout) override;
  void on_lease_end(const std::string& log, const std::string& line) override;
  void drop_lease_end(const std::string& log) override;
  void drop_log(const std::string& log) override;
  bool trim_log(const std::string& log, size_t upto) override;
  void drop_counter(const std::string& counter) override;
  void close() override;
  void release() override;
  void interrupt() override;
  void wake() override;

  // The node whose ddprun hosts the store says which job's it is (one key outside every
  // run's prefix); a joining node reads it: "" when no hosting ddprun said (a ddp-store-server
  // of its own, which any job may share).
  void claim_host();
  std::string host_run_id();

 private:
  std::string name(const std::string& what) const;
  // Runs f; an error from the client is rethrown as the same kind, named as describe() does.
  template <class F>
  auto named(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const ddp::TimeoutError& e) {
      throw ddp::TimeoutError(name(e.what()));
    } catch (const ddp::NetworkError& e) {
      throw ddp::NetworkError(name(e.what()));
    } catch (const ddp::StoreError& e) {
      throw ddp::StoreError(name(e.what()));
    } catch (const ddp::UsageError&) {
      throw;
    } catch (const ddp::Error& e) {
      throw ddp::Error(name(e.what()));
    }
  }
  std::string state_key() const;
  std::string key(const std::string& name) const;
  // Where this object is in a log: the complete lines read so far, their bytes (where the
  // next read starts), and where each of the last lines began (a read from a recent line,
  // such as the first request not yet applied, fetches from there, not from the start).
  struct LogCursor {
    size_t lines = 0;
    int64_t bytes = 0;
    std::deque<int64_t> starts;  // lines [lines - starts.size(), lines)
  };
  std::map<std::string, LogCursor> cursors_;
  // The log's bytes from `offset` on, and what TRIM_LOG dropped before them.
  ddp::TcpStore::LogChunk fetch(const std::string& log, int64_t offset);
  bool serves_trim();
  // Whether the server trims logs (-1: not asked yet): asked once, when first needed, and
  // shared with the clones (the same server).
  std::shared_ptr<std::atomic<int>> serves_trim_ = std::make_shared<std::atomic<int>>(-1);

  StoreBackendOptions o_;
  std::unique_ptr<ddp::TcpStore> store_, lease_;
};

}  // namespace ddprun::rdzv
