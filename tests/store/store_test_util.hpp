// Helpers for the store tests: a server fixture and a raw socket that speaks bytes.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "ddp/tcp_store.hpp"
#include "store/protocol.hpp"
#include "store/server.hpp"
#include "test_timeouts.hpp"

namespace store_test {

namespace proto = ddp::detail::proto;
using namespace std::chrono_literals;
using ddp::test::scaled;

// How long a reply or a connection may take before the test calls it a hang. Only a
// broken server ever makes a test wait this long.
inline std::chrono::milliseconds hang_guard() { return scaled(30s); }

inline std::unique_ptr<ddp::detail::StoreServer> start_server(ddp::detail::StoreServerOptions o = {}) {
  o.host = "127.0.0.1";
  auto s = std::make_unique<ddp::detail::StoreServer>(o);
  s->start();
  return s;
}

// timeout: the client's bound on get/wait; by default a hang guard.
inline ddp::TcpStoreOptions client_options(uint16_t port, ddp::WireGeneration g,
                                           std::chrono::milliseconds timeout = hang_guard()) {
  ddp::TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.generation = g;
  o.timeout = timeout;
  o.connect_timeout = hang_guard();
  return o;
}

inline proto::Generation to_proto(ddp::WireGeneration g) {
  return g == ddp::WireGeneration::kV1 ? proto::Generation::kV1 : proto::Generation::kV2;
}

inline void raise_fd_limit() {
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
}

// A blocking client socket that sends raw bytes; reads take a timeout.
class RawConn {
 public:
  RawConn(uint16_t port, proto::Generation gen, bool handshake = true) : gen_(gen) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      int e = errno;
      ::close(fd_);
      throw std::runtime_error(std::string("connect: ") + std::strerror(e));
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (gen == proto::Generation::kV2 && handshake) {
      proto::Request r;
      r.op = proto::Op::kValidate;
      r.u32 = proto::kValidationMagic;
      send_request(r);
    }
  }
  ~RawConn() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;

  int fd() const { return fd_; }

  void send(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw std::runtime_error(std::string("send: ") + std::strerror(errno));
      off += static_cast<size_t>(n);
    }
  }
  // Sends one byte per send() call, each its own TCP segment (TCP_NODELAY).
  void send_bytewise(const std::string& bytes) {
    for (char c : bytes) send(std::string(1, c));
  }
  std::string encode(const proto::Request& r) const {
    std::string b;
    proto::encode_request(gen_, r, b);
    return b;
  }
  void send_request(const proto::Request& r) { send(encode(r)); }

  // Exactly n bytes, or nullopt at the timeout or when the server closed the connection.
  std::optional<std::string> recv(size_t n, std::chrono::milliseconds timeout = hang_guard()) {
    std::string out;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (out.size() < n) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now())
                      .count();
      if (left <= 0) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(left));
      if (r <= 0) continue;
      char buf[65536];
      ssize_t got = ::recv(fd_, buf, std::min(sizeof buf, n - out.size()), 0);
      if (got <= 0) return std::nullopt;
      out.append(buf, static_cast<size_t>(got));
    }
    return out;
  }
  uint8_t recv_u8() { return static_cast<uint8_t>(must(1)[0]); }
  int64_t recv_i64() {
    auto b = must(8);
    int64_t v;
    std::memcpy(&v, b.data(), 8);
    return v;
  }
  uint32_t recv_u32() {
    auto b = must(4);
    uint32_t v;
    std::memcpy(&v, b.data(), 4);
    return v;
  }
  std::string recv_str() {
    auto len = static_cast<uint64_t>(recv_i64());
    return len ? must(len) : std::string();
  }
  // True if the server closed the connection within the timeout.
  bool closed_by_peer(std::chrono::milliseconds timeout = hang_guard()) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now())
                      .count();
      if (left <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buf[4096];
      ssize_t got = ::recv(fd_, buf, sizeof buf, 0);
      if (got == 0 || (got < 0 && errno == ECONNRESET)) return true;
    }
  }
  // True if nothing arrives within the window. Only ever asserts an absence: a slow
  // machine makes it pass more easily, never fail.
  bool silent_for(std::chrono::milliseconds window) {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, static_cast<int>(window.count())) == 0;
  }

 private:
  std::string must(size_t n) {
    auto b = recv(n);
    if (!b) throw std::runtime_error("no reply from the server");
    return *b;
  }
  int fd_ = -1;
  proto::Generation gen_;
};

using proto::request;

}  // namespace store_test
