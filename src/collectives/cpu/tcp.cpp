#include "tcp.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "ddp/error.hpp"

namespace ddp::detail {
namespace {

struct Hello {
  uint64_t magic;
  uint64_t group_tag;
  int32_t rank;
  int32_t reserved;
};
constexpr uint64_t kHelloMagic = 0x6464702d74637031ull;  // "ddp-tcp1"

int remaining_ms(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, 1 << 30));
}

// Blocking-with-deadline full read/write on a (possibly non-blocking) socket.
bool io_full(int fd, void* p, size_t n, bool writing, Clock::time_point deadline) {
  auto* b = static_cast<uint8_t*>(p);
  size_t done = 0;
  while (done < n) {
    ssize_t k = writing ? ::send(fd, b + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : ::recv(fd, b + done, n - done, MSG_DONTWAIT);
    if (k > 0) {
      done += static_cast<size_t>(k);
      continue;
    }
    if (k == 0 && !writing) return false;
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    pollfd pfd{fd, static_cast<short>(writing ? POLLOUT : POLLIN), 0};
    int ms = remaining_ms(deadline);
    if (ms == 0) return false;
    poll(&pfd, 1, ms);
  }
  return true;
}

void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}
Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

Fd tcp_listen(uint16_t& port) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) throw SystemError("socket() for the collective listener", errno);
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    throw SystemError("bind(0.0.0.0:0) for the collective listener", errno);
  if (::listen(fd.get(), 64) != 0) throw SystemError("listen() for the collective listener", errno);
  socklen_t len = sizeof a;
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

Fd tcp_accept_peer(int listen_fd, uint64_t group_tag, int expected_rank,
                   Clock::time_point deadline) {
  for (;;) {
    pollfd pfd{listen_fd, POLLIN, 0};
    int ms = remaining_ms(deadline);
    int r = ms > 0 ? poll(&pfd, 1, ms) : 0;
    if (r == 0)
      throw TimeoutError(fmt::format("no TCP connection from peer rank {} (it connects to this "
                                     "rank's published address)",
                                     expected_rank));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw SystemError("poll() on the collective listener", errno);
    }
    Fd c(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (c.get() < 0) continue;
    Hello h{};
    auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(10));
    if (!io_full(c.get(), &h, sizeof h, false, hello_deadline)) continue;
    if (h.magic != kHelloMagic || h.group_tag != group_tag || h.rank != expected_rank) continue;
    tune(c.get());
    return c;
  }
}

Fd tcp_connect_peer(const std::string& host, uint16_t port, uint64_t group_tag, int my_rank,
                    int peer_rank, Clock::time_point deadline) {
  auto backoff = std::chrono::milliseconds(5);
  std::string last = "no attempt";
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int gai = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai != 0) {
      last = fmt::format("getaddrinfo: {}", gai_strerror(gai));
    } else {
      for (addrinfo* ai = res; ai; ai = ai->ai_next) {
        Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
        if (fd.get() < 0) continue;
        int r = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
        if (r != 0 && errno == EINPROGRESS) {
          pollfd pfd{fd.get(), POLLOUT, 0};
          poll(&pfd, 1, std::max(1, std::min(remaining_ms(deadline), 5000)));
          int err = 0;
          socklen_t len = sizeof err;
          getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
          if (!(pfd.revents & POLLOUT)) err = err ? err : ETIMEDOUT;
          r = err ? -1 : 0;
          errno = err;
        }
        if (r != 0) {
          last = errno_text(errno);
          continue;
        }
        Hello h{kHelloMagic, group_tag, my_rank, 0};
        if (!io_full(fd.get(), &h, sizeof h, true, deadline)) {
          last = "hello not sent";
          continue;
        }
        tune(fd.get());
        freeaddrinfo(res);
        return fd;
      }
      freeaddrinfo(res);
    }
    if (Clock::now() + backoff >= deadline)
      throw TimeoutError(fmt::format("could not connect to peer rank {} at {}:{} ({})", peer_rank,
                                     host, port, last));
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) return {};
  std::string out;
  Fd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (fd.get() >= 0 && ::connect(fd.get(), res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    char buf[INET_ADDRSTRLEN];
    if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0 &&
        inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf))
      out = buf;
  }
  freeaddrinfo(res);
  return out;
}

std::string hostname_address() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return {};
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(name, nullptr, &hints, &res) != 0 || !res) return {};
  char buf[INET_ADDRSTRLEN];
  std::string out;
  if (inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof buf))
    out = buf;
  freeaddrinfo(res);
  return out;
}

std::string peer_address(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  char buf[INET_ADDRSTRLEN];
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || a.sin_family != AF_INET ||
      !inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf))
    return "accepted connection";
  return fmt::format("{}:{}", buf, ntohs(a.sin_port));
}

TcpLink::TcpLink(int peer, Fd fd, std::string peer_addr, size_t buffer_bytes)
    : Link(peer), fd_(std::move(fd)), peer_addr_(std::move(peer_addr)),
      buf_(std::max<size_t>(buffer_bytes, 64 << 10)) {
  const char* fault = std::getenv("DDP_TEST_FAULT");
  die_mid_element_ = fault && std::strcmp(fault, "tcp-die-mid-element") == 0;
}

void TcpLink::fail_at_eof() {
  if (rpos_ == rend_) fail("while receiving", 0);
  throw CollectiveError(fmt::format("peer rank {} ({}) closed the TCP connection (EOF) in the middle of an "
                                    "element: {} byte(s) of it came",
                                    peer(), peer_addr_, rend_ - rpos_));
}

// Test-only fault: 1 MiB into a collective, sends what leaves its stream 2 bytes into a
// 4-byte element, then dies (the peer gets those bytes, then EOF), as a rank killed between
// two partial sends does.
void TcpLink::die_mid_element(const uint8_t* p, size_t n) {
  size_t k = (6 - msg_sent_ % 4) % 4;
  if (k == 0) k = 4;
  k = std::min(k, n);
  if (!io_full(fd_.get(), const_cast<uint8_t*>(p), k, true, Clock::now() + std::chrono::seconds(10)))
    fail("while sending", errno);
  ::raise(SIGKILL);
  std::abort();
}

void TcpLink::fail(const char* what, int err) {
  if (err == 0)
    throw CollectiveError(fmt::format("peer rank {} ({}) closed the TCP connection (EOF) {}", peer(),
                                      peer_addr_, what));
  throw CollectiveError(fmt::format("TCP connection to peer rank {} ({}) failed {}: {}", peer(),
                                    peer_addr_, what, errno_text(err)));
}

size_t TcpLink::try_send(const uint8_t* p, size_t n) {
  if (die_mid_element_ && msg_sent_ >= (1u << 20) && n >= 4) die_mid_element(p, n);
  return sent(::send(fd_.get(), p, n, MSG_NOSIGNAL | MSG_DONTWAIT));
}

// What a non-blocking send's result means: bytes gone, or 0 when the socket is full.
size_t TcpLink::sent(ssize_t k) {
  if (k >= 0) {
    msg_sent_ += static_cast<size_t>(k);
    return static_cast<size_t>(k);
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  fail("while sending", errno);
}

size_t TcpLink::try_send2(const uint8_t* a, size_t na, const uint8_t* b, size_t nb) {
  if (nb == 0) return try_send(a, na);
  iovec iov[2] = {{const_cast<uint8_t*>(a), na}, {const_cast<uint8_t*>(b), nb}};
  msghdr m{};
  m.msg_iov = iov;
  m.msg_iovlen = 2;
  return sent(::sendmsg(fd_.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT));
}

std::span<const uint8_t> TcpLink::peek() {
  if (!eof_ && rend_ - rpos_ < buf_.size() / 2) {
    if (rpos_ > 0 && rend_ + buf_.size() / 4 > buf_.size()) {  // compact the tail to the front
      std::memmove(buf_.data(), buf_.data() + rpos_, rend_ - rpos_);
      rend_ -= rpos_;
      rpos_ = 0;
    }
    ssize_t k = ::recv(fd_.get(), buf_.data() + rend_, buf_.size() - rend_, MSG_DONTWAIT);
    if (k > 0) {
      rend_ += static_cast<size_t>(k);
    } else if (k == 0) {
      eof_ = true;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      fail("while receiving", errno);
    }
  }
  if (eof_ && rpos_ == rend_) fail("while receiving", 0);
  return {buf_.data() + rpos_, rend_ - rpos_};
}

void TcpLink::consume(size_t n) {
  rpos_ += n;
  if (rpos_ == rend_) rpos_ = rend_ = 0;
}

void TcpLink::shutdown() noexcept {
  if (fd_.get() >= 0) ::shutdown(fd_.get(), SHUT_RDWR);
}

void TcpLink::leave(const uint8_t* p, size_t n) noexcept {
  const int fd = fd_.get();
  if (fd < 0) return;
  uint8_t sink[64 << 10];
  for (int i = 0; i < 64 && ::recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
  }
  (void)::send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace ddp::detail
