// ddprun's TCPStore server: serves PyTorch's TCPStore clients of both wire generations and
// ddp::TcpStore, on one background thread (Boost.Asio, one io_context). See docs/store.md.
//
// Kept free of Asio/spdlog includes: the implementation lives in server.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

namespace ddp::detail {

struct StoreServerOptions {
  // "" or "0.0.0.0" or "::" = all interfaces: [::] with IPV6_V6ONLY=0 (dual stack, like
  // torch), falling back to 0.0.0.0 where IPv6 is unavailable. Otherwise an address or a
  // host name to bind.
  std::string host = "0.0.0.0";
  uint16_t port = 0;  // 0 = pick a free port
  // Listen backlog: the kernel's maximum (net.core.somaxconn, else SOMAXCONN), or this if
  // larger (listen_backlog()). Thousands of clients connect at once; a SYN beyond a full
  // accept queue is dropped and retried only after 1 s, and the kernel caps the value anyway.
  int backlog = 0;
  size_t max_key_bytes = 8 << 10, max_payload_bytes = 8 << 20,
         max_keys_per_request = 128 << 10;
  // Sum of the declared string lengths of one request. No limit by default, as in PyTorch
  // (a legal MULTI_SET carries up to 128 Ki x 8 MiB); the parser never allocates on a
  // declared length, so memory follows the bytes that actually arrive.
  size_t max_request_bytes = std::numeric_limits<size_t>::max();
  // A connection with more than this queued behind the output it is being sent is closed
  // (a client that never reads while wake-ups or watch events pile up). A reply being
  // written is never counted, however large: a client that reads is never cut off.
  size_t max_pending_output_bytes = size_t{512} << 20;
  // The same output summed over all connections: past it, every connection found with 4 MiB
  // or more queued behind its output is closed (with a warning): n clients that never read
  // (generation-1 watchers of a busy key) cannot make the server hold n x the cap above.
  size_t max_total_pending_output_bytes = size_t{1} << 30;

  // Memory budget (docs/store.md, "Memory budget"). A request past one of these is refused:
  // a warning names the client, and its connection alone is closed (the only error either
  // wire generation can report). A refused reply is never assembled. The defaults are far
  // above what torch or ddprun's rendezvous asks at 100k ranks.
  // One reply (GET, MULTI_GET, COMPARE_SET, LIST, QUEUE_POP), counted before it is built.
  size_t max_reply_bytes = size_t{1} << 30;
  // What one connection holds: its unsent replies plus its registrations (pending waits'
  // keys, watched keys, lease-end lines), when a reply or a registration would add to it.
  size_t max_connection_bytes = size_t{2} << 30;
  // Registrations per connection: WAITs, BARRIER arrivals and WAIT_GROWS not yet answered;
  // WATCH_KEY keys (generation 1); ON_LEASE_END lines.
  size_t max_pending_waits = size_t{64} << 10;
  size_t max_watches = size_t{64} << 10;
  size_t max_lease_lines = size_t{64} << 10;

  // ddprun's log trimming (TRIM_LOG, LOG_FROM, GET_FROM's feature question). false serves
  // as servers before it did (the two unknown: the connection is closed; GET_FROM reads a
  // negative offset as 0): the tests of the rendezvous's fallback.
  bool log_trim = true;
};

// The backlog a listener asks for: the larger of `configured` and the kernel's maximum
// (/proc/sys/net/core/somaxconn; SOMAXCONN where that cannot be read).
int listen_backlog(int configured);

class StoreServer {
 public:
  // Binds and listens now; throws ddp::SystemError("bind HOST:PORT: <reason>", errno) on
  // failure (code() == EADDRINUSE when the port is taken), ddp::NetworkError when HOST does
  // not resolve. Raises the RLIMIT_NOFILE soft limit to the hard limit.
  explicit StoreServer(StoreServerOptions o);
  ~StoreServer();  // stops
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  uint16_t port() const;
  // Serves on its own background thread. Call once.
  void start();
  // Idempotent; closes the listener and every connection and joins the thread.
  void stop();
  size_t num_connections() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::detail
