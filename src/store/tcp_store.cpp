// ddp::TcpStore: a blocking client over plain POSIX sockets (no Boost, no spdlog, so that
// libddp stays light). One connection per store object; one mutex serialises calls.
#include "ddp/tcp_store.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <atomic>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ddp/error.hpp"
#include "store/protocol.hpp"
#include "store/socket_util.hpp"

namespace ddp {

namespace proto = detail::proto;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

// Thrown by the I/O helpers when a deadline passes; callers turn it into a TimeoutError
// with their context.
struct IoTimeout {};
struct PingRefused {};

std::string quoted_keys(const std::vector<std::string>& keys, size_t max = 16) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < max; ++i) {
    if (i) s += ", ";
    s += '\'';
    s += keys[i];
    s += '\'';
  }
  if (keys.size() > max) s += fmt::format(", ... ({} keys)", keys.size());
  return s;
}

// The longest one connection attempt waits for the server's SYN-ACK (Impl::connect), and
// how often a handshake still waiting for its reply tells `retrying` (Impl::await_reply).
constexpr milliseconds kConnectAttempt{10000};

milliseconds since(Clock::time_point t0) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
}

thread_local Clock::time_point t_call_deadline = Clock::time_point::max();

// A call's deadline: its timeout from now (saturating: milliseconds::max() is none), and no
// later than the thread's StoreCallDeadline.
Clock::time_point call_deadline(milliseconds timeout) {
  return std::min(detail::deadline_after(timeout), t_call_deadline);
}

int poll_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 60'000 ? 60'000 : static_cast<int>(left) + 1;
}

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// The connection's socket, closable by its owner thread and shut down from another
// (interrupt) without the race of a reused descriptor number.
class ConnFd {
 public:
  int get() const { return fd_.get(); }
  explicit operator bool() const { return static_cast<bool>(fd_); }
  void reset() {
    std::lock_guard lk(mu_);
    fd_.reset();
  }
  ConnFd& operator=(Fd&& f) {
    std::lock_guard lk(mu_);
    fd_ = std::move(f);
    return *this;
  }
  void shutdown() {
    std::lock_guard lk(mu_);
    if (fd_) ::shutdown(fd_.get(), SHUT_RDWR);
  }

 private:
  std::mutex mu_;
  Fd fd_;
};

}  // namespace

struct TcpStore::Impl {
  explicit Impl(const TcpStoreOptions& o)
      : opt(o),
        gen(o.generation == WireGeneration::kV1 ? proto::Generation::kV1 : proto::Generation::kV2),
        find_gen(o.generation == WireGeneration::kAuto),
        addr(o.host.find(':') != std::string::npos ? fmt::format("[{}]:{}", o.host, o.port)
                                                   : fmt::format("{}:{}", o.host, o.port)),
        wake_fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
        stop_fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

  TcpStoreOptions opt;
  TcpStore::ConnectRetry retrying;  // told of each failed connection attempt (may be empty)
  proto::Generation gen;
  bool ping = true;  // false once a server closed the connection on PING (torch 2.2, 2.3)
  bool find_gen = false;  // kAuto, until the first connection says which generation
  bool leased = false;  // a lease connection: never reconnects
  std::string addr;
  std::mutex mu;
  ConnFd fd;
  std::atomic<bool> interrupted{false};
  Fd wake_fd;             // wake(): readable until a wakeable wait took it
  Fd stop_fd;             // interrupt(): readable for ever after (ends connecting, and its pauses)
  bool wakeable = false;  // the reply awaited now is a wakeable wait's (under mu)

  // ---- connection -------------------------------------------------------------------

  // One connect attempt to one resolved address, bounded by the deadline. Returns the
  // connected socket or sets err.
  // An interrupt() (stop, readable) ends the attempt at once: err ECANCELED.
  static Fd try_connect(const addrinfo* ai, Clock::time_point deadline, int& err, int stop) {
    Fd s(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s) {
      err = errno;
      return {};
    }
    if (::connect(s.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        err = errno;
        return {};
      }
      pollfd p[2] = {{s.get(), POLLOUT, 0}, {stop, POLLIN, 0}};
      int r;
      do {
        r = ::poll(p, stop >= 0 ? 2 : 1, poll_ms(deadline));
      } while (r < 0 && errno == EINTR);
      if (r == 0) {
        err = ETIMEDOUT;
        return {};
      }
      if (r > 0 && !p[0].revents) {
        err = ECANCELED;
        return {};
      }
      if (r < 0) {
        err = errno;
        return {};
      }
      int soerr = 0;
      socklen_t len = sizeof soerr;
      ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &soerr, &len);
      if (soerr != 0) {
        err = soerr;
        return {};
      }
    }
    if (detail::self_connected(s.get())) {  // nobody listens: as refused, and the port left free
      detail::close_with_reset(s.release());
      err = ECONNREFUSED;
      return {};
    }
    int one = 1;
    ::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return s;
  }

  void connect() {
    const auto t0 = Clock::now();
    const auto deadline = call_deadline(opt.connect_timeout);
    // Jitter for the retries only: the pid and the clock make a seed (std::random_device
    // probes the CPU first, costly in a VM, and a thousand agents connect several times each).
    std::mt19937_64 rng(static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ULL ^
                        static_cast<uint64_t>(t0.time_since_epoch().count()));
    auto backoff = milliseconds(10);
    int attempts = 0;
    std::string last_error = "no attempt made";
    for (;;) {
      if (interrupted) shut_down();
      ++attempts;
      if (auto res = resolve(last_error))
        for (addrinfo* ai = res.get(); ai; ai = ai->ai_next)
          if (connect_to(ai, deadline, t0, last_error)) return;
      auto now = Clock::now();
      if (now >= deadline)
        throw NetworkError(fmt::format(
            "cannot connect to the store at {}: gave up after {} and {} attempts; last error: {}",
            addr, format_duration(since(t0)), attempts, last_error));
      if (retrying) retrying(since(t0), last_error);
      // Jittered exponential backoff: uniformly in [b/2, 3b/2), b doubling up to 1 s.
      std::uniform_int_distribution<int64_t> jitter(backoff.count() / 2, backoff.count() * 3 / 2);
      auto sleep = milliseconds(jitter(rng));
      auto left = std::chrono::duration_cast<milliseconds>(deadline - now);
      sleep_unless_stopped(std::min(sleep, left));
      backoff = std::min(backoff * 2, milliseconds(1000));
    }
  }

  using AddrInfo = std::unique_ptr<addrinfo, void (*)(addrinfo*)>;

  // The host's addresses; null (last_error says why) when it does not resolve.
  AddrInfo resolve(std::string& last_error) const {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const std::string port = std::to_string(opt.port);
    int rc = ::getaddrinfo(opt.host.c_str(), port.c_str(), &hints, &res);
    if (rc == 0) return {res, ::freeaddrinfo};
    last_error = fmt::format("cannot resolve {}: {}", opt.host, rc == EAI_SYSTEM ? errno_text(errno) : ::gai_strerror(rc));
    return {nullptr, ::freeaddrinfo};
  }

  // One address of the host: connect, then the handshake. True: connected (fd set, the
  // generation known); false: on to the next address or attempt (last_error says why).
  bool connect_to(addrinfo* ai, Clock::time_point deadline, Clock::time_point t0, std::string& last_error) {
    int err = 0;
    // One attempt waits at most kConnectAttempt: a host that drops SYNs (a firewall, a
    // full accept queue) is tried afresh, and `retrying` hears of it meanwhile.
    Fd s = try_connect(ai, std::min(deadline, Clock::now() + kConnectAttempt), err, stop_fd.get());
    if (err == ECANCELED) shut_down();
    if (!s) {
      last_error = errno_text(err);
      return false;
    }
    fd = std::move(s);
    try {
      handshake(deadline, t0);
    } catch (const PingRefused&) {
      return after_ping_refused(ai, t0, last_error);
    }
    find_gen = false;
    return true;
  }

  // Closed on the handshake: a generation-2 server older than PING (torch 2.2/2.3), or a
  // generation-1 server (its daemon reads VALIDATE as a SET of an impossible length).
  // VALIDATE alone would stall a generation-1 daemon for every client, so ask which first.
  // Returns as connect_to does.
  bool after_ping_refused(addrinfo* ai, Clock::time_point t0, std::string& last_error) {
    if (Fd g1 = generation1_answers(ai, call_deadline(milliseconds(2000)))) {
      // ddprun's own server answers generation 1 too (torch 1.13's clients): the close may
      // have been a moment's (a relay or proxy that accepted before it could reach the
      // server). Only a second close says generation 1.
      auto again = handshake_closed_again(ai, t0);
      if (!again) {
        last_error = "the server closed the connection on the handshake, then refused another";
        return false;
      }
      if (!*again) {
        find_gen = false;
        return true;  // answered: a generation-2 server after all
      }
      if (!find_gen)
        throw StoreError(fmt::format("store at {} speaks only wire generation 1: it is PyTorch 1.13 .. 2.1's "
                                     "TCPStore (a torchrun of those versions hosts one), not ddprun's store",
                                     addr));
      gen = proto::Generation::kV1;
      find_gen = false;
      fd = std::move(g1);
      return true;
    }
    // Otherwise connect again and send VALIDATE alone.
    ping = false;
    last_error = "the server closed the connection on PING";
    return false;
  }

  // Generation 2: VALIDATE, then PING with our pid, expecting it echoed (as torch's client
  // does). Throws PingRefused when the server closes the connection instead of answering:
  // torch's servers before PING existed (2.2, 2.3) treat it as an invalid command.
  void handshake(Clock::time_point deadline, Clock::time_point t0) {
    if (gen != proto::Generation::kV2) return;
    const uint32_t nonce = static_cast<uint32_t>(::getpid());
    std::string req;
    proto::Request r;
    r.op = proto::Op::kValidate;
    r.u32 = proto::kValidationMagic;
    proto::encode_request(gen, r, req);
    // Give the handshake a few seconds even if connecting used the budget up, but no more
    // than one call may take (a caller with a short timeout stays bounded by it).
    // (in milliseconds first: milliseconds::max() would overflow the clock's nanoseconds)
    const milliseconds grace = std::min<milliseconds>(std::chrono::seconds(5), std::max(opt.timeout, opt.connect_timeout));
    deadline = std::min(std::max(deadline, Clock::now() + grace), t_call_deadline);  // (a StoreCallDeadline's too)
    if (!ping) {
      send_all(req, deadline, "VALIDATE");
      return;
    }
    r.op = proto::Op::kPing;
    r.u32 = nonce;
    proto::encode_request(gen, r, req);
    uint32_t echo = 0;
    try {
      send_all(req, deadline, "handshake");
      await_reply(deadline, t0);
      recv_exact(&echo, sizeof echo, deadline, "handshake");
    } catch (const NetworkError&) {
      if (fd || interrupted) throw;
      throw PingRefused{};  // closed (EOF or reset) before the echo
    } catch (const IoTimeout&) {
      fd.reset();
      throw NetworkError(fmt::format(
          "store at {}: it accepted the connection but sent no reply to the handshake (VALIDATE + PING) within "
          "{}: is it frozen or overloaded, or not a store?",
          addr, format_duration(since(t0))));
    }
    if (echo != nonce) {
      fd.reset();
      // Another server's first bytes ("HTTP" of a web server) say more than a number.
      std::string bytes(reinterpret_cast<const char*>(&echo), sizeof echo);
      const bool text = std::all_of(bytes.begin(), bytes.end(), [](unsigned char c) { return c >= 32 && c < 127; });
      throw StoreError(fmt::format("store at {}: it answered the handshake's PING with {} instead of the nonce {}: "
                                   "not a store{}",
                                   addr, text ? fmt::format("'{}'", bytes) : std::to_string(echo), nonce,
                                   text ? " (another server's reply)" : ""));
    }
  }

  // Waits for the handshake's reply, telling `retrying` every kConnectAttempt meanwhile: a
  // server that accepted the connection and does not answer (frozen, or a listener that
  // never reads) is no more silent than one that refuses.
  void await_reply(Clock::time_point deadline, Clock::time_point t0) {
    if (!retrying) return;
    for (;;) {
      try {
        wait_fd(POLLIN, std::min(deadline, Clock::now() + kConnectAttempt), "handshake");
        return;
      } catch (const IoTimeout&) {
        if (Clock::now() >= deadline) throw;
        retrying(since(t0), "connected, but the store has not answered");
      }
    }
  }

  // A new connection on which a generation-1 request is answered: CHECK of no keys, which a
  // generation-1 server answers READY and a generation-2 one (whose first request must be
  // VALIDATE) answers by closing. Empty when it is not answered by the deadline (a moment:
  // a server that just closed a connection of ours answers at once).
  Fd generation1_answers(const addrinfo* ai, Clock::time_point deadline) {
    int err = 0;
    Fd s = try_connect(ai, deadline, err, stop_fd.get());
    if (!s) return {};
    proto::Request check;
    check.op = proto::Op::kCheck;
    std::string req;
    proto::encode_request(proto::Generation::kV1, check, req);
    if (::send(s.get(), req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) return {};
    pollfd p{s.get(), POLLIN, 0};
    int r;
    do {
      r = ::poll(&p, 1, poll_ms(deadline));
    } while (r < 0 && errno == EINTR);
    uint8_t ready = 0xff;
    if (r != 1 || ::recv(s.get(), &ready, 1, 0) != 1 || ready != proto::kCheckReady) return {};
    return s;
  }

  // The generation-2 handshake once more, on a new connection (fd): true, closed again;
  // false, answered (fd is that connection); nullopt, no connection.
  std::optional<bool> handshake_closed_again(const addrinfo* ai, Clock::time_point t0) {
    int err = 0;
    Fd s = try_connect(ai, call_deadline(milliseconds(2000)), err, stop_fd.get());
    if (!s) return std::nullopt;
    fd = std::move(s);
    try {
      handshake(Clock::now(), t0);  // (the handshake's own grace)
      return false;
    } catch (const PingRefused&) {
      return true;
    }
  }

  // Whether the server still accepts connections: a short probe after it closed one.
  bool still_listening() const {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (::getaddrinfo(opt.host.c_str(), std::to_string(opt.port).c_str(), &hints, &res) != 0) return false;
    std::unique_ptr<addrinfo, void (*)(addrinfo*)> owner(res, ::freeaddrinfo);
    const auto deadline = call_deadline(milliseconds(500));
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
      int err = 0;
      if (Fd s = try_connect(ai, deadline, err, stop_fd.get())) return stays_open(s, milliseconds(200));
    }
    return false;
  }

  // A server that is dying (SIGKILL: the kernel closes its sockets one by one) can still
  // complete a connect from its listening socket's backlog, and resets that connection a
  // moment later; a live server sends nothing until asked. Open for `quiet`: live.
  static bool stays_open(const Fd& s, milliseconds quiet) {
    pollfd p{s.get(), POLLIN | POLLRDHUP, 0};
    int r;
    do {
      r = ::poll(&p, 1, static_cast<int>(quiet.count()));
    } while (r < 0 && errno == EINTR);
    return r == 0;
  }

  // interrupt() was called: no connection, nor an attempt at one, any more.
  [[noreturn]] void shut_down() const {
    throw NetworkError(fmt::format("store at {}: the connection was shut down", addr));
  }

  // Sleeps for d, or until interrupt().
  void sleep_unless_stopped(milliseconds d) const {
    pollfd p{stop_fd.get(), POLLIN, 0};
    const auto until = Clock::now() + d;
    while (::poll(&p, 1, poll_ms(until)) < 0 && errno == EINTR) {
    }
  }

  void ensure_connected() {
    if (fd) return;
    if (interrupted) shut_down();
    if (leased) throw NetworkError(fmt::format("store at {}: the lease connection was lost", addr));
    connect();
  }

  // ---- I/O --------------------------------------------------------------------------

  [[noreturn]] void lost(const std::string& what, int err) {
    fd.reset();
    throw NetworkError(fmt::format("store at {}: {} failed: {}", addr, what, errno_text(err)));
  }

  // A wake() (another thread) ends a wakeable wait as its deadline would; an interrupt()
  // ends any wait (also a handshake's on a socket that interrupt() could not shut down yet).
  void wait_fd(short events, Clock::time_point deadline, const std::string& what) {
    pollfd p[3] = {{fd.get(), events, 0}, {stop_fd.get(), POLLIN, 0}, {wake_fd.get(), POLLIN, 0}};
    const nfds_t n = wakeable && wake_fd ? 3 : 2;
    for (;;) {
      int ms = poll_ms(deadline);
      if (ms == 0) throw IoTimeout{};
      int r = ::poll(p, n, ms);
      if (r > 0 && p[1].revents) {
        fd.reset();
        shut_down();
      }
      if (r > 0 && p[0].revents) return;
      if (r > 0) {
        uint64_t count;
        if (::read(wake_fd.get(), &count, sizeof count) == sizeof count) throw IoTimeout{};
      }
      if (r < 0 && errno != EINTR) lost(what, errno);
    }
  }

  void send_all(std::string_view data, Clock::time_point deadline, const std::string& what) {
    while (!data.empty()) {
      ssize_t n = ::send(fd.get(), data.data(), data.size(), MSG_NOSIGNAL);
      if (n > 0) {
        data.remove_prefix(static_cast<size_t>(n));
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        wait_fd(POLLOUT, deadline, what);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        lost("sending " + what, errno);
      }
    }
  }

  void recv_exact(void* buf, size_t size, Clock::time_point deadline, const std::string& what) {
    auto* p = static_cast<char*>(buf);
    while (size > 0) {
      ssize_t n = ::recv(fd.get(), p, size, 0);
      if (n > 0) {
        p += n;
        size -= static_cast<size_t>(n);
      } else if (n == 0) {
        fd.reset();
        throw NetworkError(fmt::format("store at {} closed the connection during {}", addr, what));
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        wait_fd(POLLIN, deadline, what);
      } else if (errno != EINTR) {
        lost("receiving the reply to " + what, errno);
      }
    }
  }

  template <typename T>
  T recv_value(Clock::time_point deadline, const std::string& what) {
    T v;
    recv_exact(&v, sizeof v, deadline, what);
    return v;
  }

  std::string recv_str(Clock::time_point deadline, const std::string& what) {
    auto len = recv_value<uint64_t>(deadline, what);
    if (len > (uint64_t{1} << 32)) {
      fd.reset();
      throw StoreError(fmt::format("store at {}: reply to {} announces {} bytes", addr, what, len));
    }
    std::string s(static_cast<size_t>(len), '\0');
    recv_exact(s.data(), s.size(), deadline, what);
    return s;
  }

  // ---- requests ---------------------------------------------------------------------

  static std::string describe(const proto::Request& r) {
    if (r.keys.empty()) return proto::op_name(r.op);
    return fmt::format("{} {}", proto::op_name(r.op), quoted_keys(r.keys, 4));
  }

  // Sends a request (connecting first if needed); the caller then reads the reply.
  Clock::time_point send_request(const proto::Request& r, milliseconds timeout) {
    ensure_connected();
    // In generation 1 the client speaks torch 1.13's numbering (SET .. DELETE_KEY, 0-8): a
    // 1.13 server drops a connection on anything after it, and 2.1 numbers DELETE_KEY apart.
    const auto code = proto::encode_opcode(gen, r.op);
    if (!code || (gen == proto::Generation::kV1 && *code > 8))
      throw StoreError(fmt::format("store at {}: {} needs wire generation 2 (torch >= 2.2)", addr,
                                   proto::op_name(r.op)));
    std::string buf;
    proto::encode_request(gen, r, buf);
    auto deadline = call_deadline(timeout);
    try {
      send_all(buf, deadline, describe(r));
    } catch (const IoTimeout&) {
      fd.reset();
      throw TimeoutError(fmt::format("store at {}: sending {} timed out after {}", addr,
                                     describe(r), format_duration(timeout)));
    }
    return deadline;
  }

  // Runs `read` for the reply; a timeout leaves the connection in an unknown state, so it
  // is dropped (the next call reconnects).
  template <typename F>
  auto reply(const proto::Request& r, Clock::time_point deadline, milliseconds timeout, F read) {
    try {
      return read(deadline, describe(r));
    } catch (const IoTimeout&) {
      fd.reset();
      throw TimeoutError(fmt::format("store at {}: no reply to {} within {}", addr, describe(r),
                                     format_duration(timeout)));
    }
  }

  template <typename F>
  auto call(const proto::Request& r, milliseconds timeout, F read) {
    auto deadline = send_request(r, timeout);
    return reply(r, deadline, timeout, read);
  }

  void call_noreply(const proto::Request& r, milliseconds timeout) { send_request(r, timeout); }

  // Returns true when all keys exist; false at the timeout.
  bool do_wait(const std::vector<std::string>& keys, milliseconds timeout) {
    proto::Request r;
    r.op = proto::Op::kWait;
    r.keys = keys;
    return do_wait_request(r, timeout);
  }

  // A WAIT-like request (WAIT, WAIT_GROWS): true when it completed, false at the timeout
  // (then cancelled with CANCEL_WAIT in generation 2), or at a wake() when `wake`.
  bool do_wait_request(const proto::Request& r, milliseconds timeout, bool wake = false) {
    auto deadline = send_request(r, timeout);
    const std::string what = describe(r);
    try {
      auto v = [&] {
        wakeable = wake;
        struct Reset {
          bool& b;
          ~Reset() { b = false; }
        } reset{wakeable};
        return recv_value<uint8_t>(deadline, what);
      }();
      if (v != proto::kWaitStopWaiting) {
        fd.reset();
        throw StoreError(fmt::format("store at {}: unexpected reply {} to {}", addr, v, what));
      }
      return true;
    } catch (const IoTimeout&) {
    }
    if (gen == proto::Generation::kV1) {
      // Generation 1 has no way to cancel: the server would later send a stray 0x00 on
      // this connection. Start afresh with the next call.
      fd.reset();
      return false;
    }
    proto::Request cancel;
    cancel.op = proto::Op::kCancelWait;
    std::string buf;
    proto::encode_request(gen, cancel, buf);
    // A live server answers the cancel at once; don't let a dead one hold us for minutes.
    auto grace = call_deadline(std::clamp(opt.timeout, milliseconds(1000), milliseconds(10000)));
    try {
      send_all(buf, grace, "CANCEL_WAIT");
      auto v = recv_value<uint8_t>(grace, "CANCEL_WAIT");
      if (v == proto::kWaitCanceled) return false;
      if (v == proto::kWaitStopWaiting) {
        // The keys appeared just before the cancel: the wait succeeded after all; the
        // server still answers the cancel.
        v = recv_value<uint8_t>(grace, "CANCEL_WAIT");
        if (v == proto::kWaitCanceled) return true;
      }
      fd.reset();
      throw StoreError(fmt::format("store at {}: unexpected reply {} to CANCEL_WAIT", addr, v));
    } catch (const IoTimeout&) {
      fd.reset();
      return false;
    }
  }

  // Best effort, for error messages: which of the keys are still missing.
  std::vector<std::string> missing_keys(const std::vector<std::string>& keys) {
    std::vector<std::string> missing;
    if (!fd || keys.size() > 16) return missing;
    try {
      for (auto& k : keys) {
        proto::Request r;
        r.op = proto::Op::kCheck;
        r.keys = {k};
        auto ok = call(r, milliseconds(1000), [&](auto deadline, const std::string& what) {
          return recv_value<uint8_t>(deadline, what);
        });
        if (ok != proto::kCheckReady) missing.push_back(k);
      }
    } catch (const Error&) {
      missing.clear();
    }
    return missing;
  }
};

// ---------------------------------------------------------------------------------------

TcpStore::TcpStore(TcpStoreOptions options) : TcpStore(std::move(options), nullptr) {}

TcpStore::TcpStore(TcpStoreOptions options, ConnectRetry retrying)
    : options_(std::move(options)), impl_(std::make_unique<Impl>(options_)) {
  impl_->retrying = std::move(retrying);
  timeout_ = options_.timeout;
  if (!options_.lazy) impl_->connect();
}

TcpStore::~TcpStore() = default;

void TcpStore::set(const std::string& key, const std::string& value) {
  std::lock_guard lk(impl_->mu);
  impl_->call_noreply(proto::request(proto::Op::kSet, {key}, {value}), timeout());
}

std::string TcpStore::get(const std::string& key) {
  wait({key}, timeout());
  std::lock_guard lk(impl_->mu);
  return impl_->call(proto::request(proto::Op::kGet, {key}), timeout(),
                     [&](auto d, const std::string& w) { return impl_->recv_str(d, w); });
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::lock_guard lk(impl_->mu);
  auto r = proto::request(proto::Op::kAdd, {key});
  r.i64 = delta;
  return impl_->call(r, timeout(),
                     [&](auto d, const std::string& w) { return impl_->recv_value<int64_t>(d, w); });
}

std::string TcpStore::compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  std::lock_guard lk(impl_->mu);
  return impl_->call(proto::request(proto::Op::kCompareSet, {key}, {expected, desired}), timeout(),
                     [&](auto d, const std::string& w) { return impl_->recv_str(d, w); });
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lk(impl_->mu);
  return impl_->call(proto::request(proto::Op::kCheck, keys), timeout(), [&](auto d, const std::string& w) {
           return impl_->recv_value<uint8_t>(d, w);
         }) == proto::kCheckReady;
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::lock_guard lk(impl_->mu);
  const auto t0 = Clock::now();
  if (impl_->do_wait(keys, timeout)) return;
  auto waited = since(t0);
  auto missing = impl_->missing_keys(keys);
  std::string detail = missing.empty() ? std::string()
                                       : fmt::format(" (still missing: {})", quoted_keys(missing));
  throw TimeoutError(fmt::format("store at {}: wait timed out after {} (timeout {}), keys: {}{}",
                                 impl_->addr, format_duration(waited), format_duration(timeout),
                                 quoted_keys(keys), detail));
}

bool TcpStore::delete_key(const std::string& key) {
  std::lock_guard lk(impl_->mu);
  return impl_->call(proto::request(proto::Op::kDeleteKey, {key}), timeout(),
                     [&](auto d, const std::string& w) {
                       return impl_->recv_value<int64_t>(d, w);
                     }) > 0;
}

int64_t TcpStore::num_keys() {
  std::lock_guard lk(impl_->mu);
  return impl_->call(proto::request(proto::Op::kGetNumKeys), timeout(), [&](auto d, const std::string& w) {
    return impl_->recv_value<int64_t>(d, w);
  });
}

WireGeneration TcpStore::generation() const {
  if (options_.generation != WireGeneration::kAuto) return options_.generation;
  std::lock_guard lk(impl_->mu);
  return impl_->gen == proto::Generation::kV1 ? WireGeneration::kV1 : WireGeneration::kV2;
}

namespace {
// With kAuto, a generation-1 server is found at the first connection; a request it cannot
// serve is then refused by send_request() (the opcode has no generation-1 number).
void require_v2(const TcpStoreOptions& o, const char* what) {
  if (o.generation == WireGeneration::kV1)
    throw StoreError(fmt::format("store at {}:{}: {} needs wire generation 2 (torch >= 2.2)",
                                 o.host, o.port, what));
}
}  // namespace

void TcpStore::append(const std::string& key, const std::string& value) {
  require_v2(options_, "append");
  std::lock_guard lk(impl_->mu);
  impl_->call_noreply(proto::request(proto::Op::kAppend, {key}, {value}), timeout());
}

std::vector<std::string> TcpStore::multi_get(const std::vector<std::string>& keys) {
  require_v2(options_, "multi_get");
  std::lock_guard lk(impl_->mu);
  return impl_->call(proto::request(proto::Op::kMultiGet, keys), timeout(),
                     [&](auto d, const std::string& w) {
                       std::vector<std::string> out;
                       out.reserve(keys.size());
                       for (size_t i = 0; i < keys.size(); ++i) out.push_back(impl_->recv_str(d, w));
                       return out;
                     });
}

void TcpStore::multi_set(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values) {
  require_v2(options_, "multi_set");
  if (keys.size() != values.size())
    throw StoreError(fmt::format("multi_set: {} keys but {} values", keys.size(), values.size()));
  std::lock_guard lk(impl_->mu);
  impl_->call_noreply(proto::request(proto::Op::kMultiSet, keys, values), timeout());
}

std::vector<std::string> TcpStore::list_keys() {
  require_v2(options_, "list_keys");
  std::lock_guard lk(impl_->mu);
  return impl_->call(proto::request(proto::Op::kList), timeout(), [&](auto d, const std::string& w) {
    auto n = impl_->recv_value<int64_t>(d, w);
    if (n < 0 || n > (int64_t{1} << 32))
      throw StoreError(fmt::format("store at {}: LIST announced {} keys", impl_->addr, n));
    std::vector<std::string> out;
    out.reserve(static_cast<size_t>(std::min<int64_t>(n, 1 << 16)));
    for (int64_t i = 0; i < n; ++i) out.push_back(impl_->recv_str(d, w));
    return out;
  });
}

void TcpStore::queue_push(const std::string& key, const std::string& value) {
  require_v2(options_, "queue_push");
  std::lock_guard lk(impl_->mu);
  impl_->call_noreply(proto::request(proto::Op::kQueuePush, {key}, {value}), timeout());
}

int64_t TcpStore::queue_len(const std::string& key) {
  require_v2(options_, "queue_len");
  std::lock_guard lk(impl_->mu);
  return impl_->call(proto::request(proto::Op::kQueueLen, {key}), timeout(),
                     [&](auto d, const std::string& w) { return impl_->recv_value<int64_t>(d, w); });
}

bool TcpStore::queue_pop(const std::string& key, std::string& value) {
  require_v2(options_, "queue_pop");
  std::lock_guard lk(impl_->mu);
  return impl_->call(proto::request(proto::Op::kQueuePop, {key}), timeout(),
                     [&](auto d, const std::string& w) {
                       auto len = impl_->recv_value<int64_t>(d, w);
                       if (len <= 0) return false;
                       value = impl_->recv_str(d, w);
                       return true;
                     });
}

void TcpStore::ping() { ping(timeout()); }

void TcpStore::ping(std::chrono::milliseconds timeout) {
  require_v2(options_, "ping");
  std::lock_guard lk(impl_->mu);
  auto r = proto::request(proto::Op::kPing);
  r.u32 = static_cast<uint32_t>(::getpid());
  auto echo = impl_->call(r, timeout, [&](auto d, const std::string& w) {
    return impl_->recv_value<uint32_t>(d, w);
  });
  if (echo != r.u32)
    throw StoreError(fmt::format("store at {}: PING returned {} instead of {}", impl_->addr, echo,
                                 r.u32));
}

namespace {
// A server that closes the connection on one of ddprun's extensions, and still accepts
// connections, is not ddprun's. One that accepts none any more has stopped.
template <typename Impl, typename F>
auto extension_call(const Impl& impl, const char* what, F f) {
  try {
    return f();
  } catch (const NetworkError& e) {
    // This side shut the connection down (interrupt(): a watcher being stopped): nothing to
    // diagnose, and the probe below would hold the caller's exit for its 200 ms.
    if (impl.interrupted) throw;
    if (!impl.still_listening())
      throw NetworkError(fmt::format("{} (the store accepts no connection any more: it stopped, or cannot be reached)",
                                     e.what()));
    throw NetworkError(fmt::format("{} (the store at {} does not serve ddprun's {}: is it PyTorch's TCPStore rather "
                                   "than ddprun's, or a ddp-store-server older than this client? The rendezvous needs "
                                   "ddprun's store: an agent's, or a ddp-store-server of the same version)",
                                   e.what(), impl.addr, what));
  }
}
}  // namespace

void TcpStore::interrupt() {
  impl_->interrupted = true;
  if (impl_->stop_fd) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(impl_->stop_fd.get(), &one, sizeof one);
  }
  impl_->fd.shutdown();
}

void TcpStore::wake() {
  if (!impl_->wake_fd) return;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(impl_->wake_fd.get(), &one, sizeof one);  // fails only on overflow
}

void TcpStore::lease(std::chrono::milliseconds ttl) {
  require_v2(options_, "lease");
  std::lock_guard lk(impl_->mu);
  auto r = proto::request(proto::Op::kLease);
  r.i64 = ttl.count();
  extension_call(*impl_, "LEASE", [&] {
    return impl_->call(r, timeout(), [&](auto d, const std::string& w) { return impl_->recv_value<uint8_t>(d, w); });
  });
  impl_->leased = true;
  if (ttl.count() > 0) detail::bound_lease_retransmits(impl_->fd.get(), ttl);
}

void TcpStore::release_lease() {
  require_v2(options_, "release_lease");
  std::lock_guard lk(impl_->mu);
  auto r = proto::request(proto::Op::kLease);
  r.i64 = -1;
  extension_call(*impl_, "LEASE", [&] {
    return impl_->call(r, timeout(), [&](auto d, const std::string& w) { return impl_->recv_value<uint8_t>(d, w); });
  });
}

void TcpStore::on_lease_end(const std::string& key, const std::string& value) {
  require_v2(options_, "on_lease_end");
  std::lock_guard lk(impl_->mu);
  extension_call(*impl_, "ON_LEASE_END", [&] {
    return impl_->call(proto::request(proto::Op::kOnLeaseEnd, {key}, {value}), timeout(),
                       [&](auto d, const std::string& w) { return impl_->recv_value<uint8_t>(d, w); });
  });
  impl_->leased = true;
}

std::string TcpStore::get_from(const std::string& key, int64_t offset) {
  require_v2(options_, "get_from");
  std::lock_guard lk(impl_->mu);
  auto r = proto::request(proto::Op::kGetFrom, {key});
  r.i64 = offset;
  return extension_call(*impl_, "GET_FROM", [&] {
    return impl_->call(r, timeout(), [&](auto d, const std::string& w) { return impl_->recv_str(d, w); });
  });
}

bool TcpStore::serves_log_trim() {
  return get_from("ddprun.features", proto::kFeaturesOffset) == proto::kFeatureLogTrim;
}

int64_t TcpStore::trim_log(const std::string& key, int64_t line) {
  require_v2(options_, "trim_log");
  std::lock_guard lk(impl_->mu);
  auto r = proto::request(proto::Op::kTrimLog, {key});
  r.i64 = line;
  return extension_call(*impl_, "TRIM_LOG", [&] {
    return impl_->call(r, timeout(), [&](auto d, const std::string& w) { return impl_->recv_value<int64_t>(d, w); });
  });
}

TcpStore::LogChunk TcpStore::log_from(const std::string& key, int64_t offset) {
  require_v2(options_, "log_from");
  std::lock_guard lk(impl_->mu);
  auto r = proto::request(proto::Op::kLogFrom, {key});
  r.i64 = offset;
  return extension_call(*impl_, "LOG_FROM", [&] {
    return impl_->call(r, timeout(), [&](auto d, const std::string& w) {
      LogChunk c;
      c.trimmed_bytes = impl_->recv_value<int64_t>(d, w);
      c.trimmed_lines = impl_->recv_value<int64_t>(d, w);
      c.bytes = impl_->recv_str(d, w);
      return c;
    });
  });
}

bool TcpStore::wait_grows(const std::string& key, int64_t size, std::chrono::milliseconds timeout) {
  require_v2(options_, "wait_grows");
  std::lock_guard lk(impl_->mu);
  auto r = proto::request(proto::Op::kWaitGrows, {key});
  r.i64 = size;
  return extension_call(*impl_, "WAIT_GROWS", [&] { return impl_->do_wait_request(r, timeout, /*wake=*/true); });
}

namespace detail {

StoreCallDeadline::StoreCallDeadline(milliseconds budget) : saved_(t_call_deadline) {
  t_call_deadline = std::min(t_call_deadline, deadline_after(budget));
}

StoreCallDeadline::~StoreCallDeadline() { t_call_deadline = saved_; }

Clock::time_point StoreCallDeadline::current() { return t_call_deadline; }

}  // namespace detail

}  // namespace ddp
