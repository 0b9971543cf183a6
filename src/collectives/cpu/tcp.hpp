// TCP pieces of the CPU backend (internal): listening, connecting with retry, the hello
// that tells an acceptor who connected, and the non-blocking Link over a socket.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "link.hpp"

namespace ddp::detail {

using Clock = std::chrono::steady_clock;

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept;
  int get() const { return fd_; }
  int release() { int f = fd_; fd_ = -1; return f; }

 private:
  int fd_ = -1;
};

// Listens on all IPv4 interfaces, ephemeral port.
Fd tcp_listen(uint16_t& port);
// Accepts one connection that says hello with (group_tag, expected_rank); others are closed.
Fd tcp_accept_peer(int listen_fd, uint64_t group_tag, int expected_rank, Clock::time_point deadline);
// Connects to host:port (retrying refused connections) and says hello as my_rank.
Fd tcp_connect_peer(const std::string& host, uint16_t port, uint64_t group_tag, int my_rank,
                    int peer_rank, Clock::time_point deadline);
// Local IPv4 address that routes to host (UDP connect + getsockname); empty on failure.
std::string local_address_towards(const std::string& host);
// First IPv4 address of this machine's hostname; empty on failure.
std::string hostname_address();
// "ip:port" of the other end of a connected socket (an accepted peer, for error messages);
// "accepted connection" when the socket cannot tell.
std::string peer_address(int fd);

class TcpLink : public Link {
 public:
  TcpLink(int peer, Fd fd, std::string peer_addr, size_t buffer_bytes);
  const char* kind() const override { return "tcp"; }
  size_t try_send(const uint8_t* p, size_t n) override;
  size_t try_send2(const uint8_t* a, size_t na, const uint8_t* b, size_t nb) override;
  std::span<const uint8_t> peek() override;
  void consume(size_t n) override;
  int fd() const override { return fd_.get(); }
  void shutdown() noexcept override;
  void leave(const uint8_t* p, size_t n) noexcept override;
  bool at_eof() const override { return eof_; }
  [[noreturn]] void fail_at_eof() override;
  void end_message() override { msg_sent_ = 0; }

 private:
  [[noreturn]] void fail(const char* what, int err);
  size_t sent(ssize_t k);
  [[noreturn]] void die_mid_element(const uint8_t* p, size_t n);
  Fd fd_;
  std::string peer_addr_;
  std::vector<uint8_t> buf_;
  size_t rpos_ = 0, rend_ = 0;
  bool eof_ = false;
  size_t msg_sent_ = 0;    // bytes sent in this collective
  bool die_mid_element_;   // DDP_TEST_FAULT=tcp-die-mid-element (tests only)
};

}  // namespace ddp::detail
