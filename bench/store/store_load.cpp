// store-load: a rendezvous-shaped load on a TCPStore server, in either wire generation.
//
// N clients connect at once (non-blocking sockets, one epoll thread), each ADDs 1 to a
// counter and then WAITs for a release key; the client whose ADD returns N SETs the
// release key. Reported: time from the start until every client is connected, and until
// every client is released.
//
//   store-load --gen 1|2 --host 127.0.0.1 --port P --clients N [--timeout-s 60] [--sources K]
//
// --sources K spreads the clients over the source addresses 127.0.0.1 .. 127.0.0.K (IPv4
// loopback only). One source address and one server leave Linux about 14k ephemeral ports
// that connect() finds at once (it prefers even ones); past them, each connect() searches
// the whole range (about 1 ms here), which swamps what is measured. Real clients come from
// many hosts.
//
// Output (one line): store-load gen=G clients=N [sources=K] connect_ms=X total_ms=Y
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "store/protocol.hpp"

namespace proto = ddp::detail::proto;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "store-load: %s\n", msg.c_str());
  std::exit(1);
}

enum class State { kConnecting, kPing, kAdd, kWait, kDone };

struct Client {
  int fd = -1;
  State state = State::kConnecting;
  std::string in;   // bytes of the reply being read
  std::string out;  // unsent request bytes
  int attempts = 0;
};

struct Options {
  proto::Generation gen = proto::Generation::kV2;
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  int clients = 64;
  int timeout_s = 60;
  int sources = 1;
};

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--gen") {
      auto g = val();
      if (g != "1" && g != "2") die("--gen must be 1 or 2");
      opt.gen = g == "1" ? proto::Generation::kV1 : proto::Generation::kV2;
    } else if (a == "--host") {
      opt.host = val();
    } else if (a == "--port") {
      opt.port = static_cast<uint16_t>(std::atoi(val().c_str()));
    } else if (a == "--clients") {
      opt.clients = std::atoi(val().c_str());
    } else if (a == "--timeout-s") {
      opt.timeout_s = std::atoi(val().c_str());
    } else if (a == "--sources") {
      opt.sources = std::atoi(val().c_str());
    } else {
      die("usage: store-load --gen 1|2 --host H --port P --clients N [--timeout-s S] [--sources K]");
    }
  }
  if (opt.port == 0 || opt.clients < 1) die("--port and --clients >= 1 are required");
  if (opt.sources < 1 || opt.sources > 250) die("--sources must be 1 .. 250");

  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < rlim_t(opt.clients) + 16) die("open-file limit too low for --clients");

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(opt.host.c_str(), std::to_string(opt.port).c_str(), &hints, &res))
    die(std::string("cannot resolve ") + opt.host + ": " + gai_strerror(rc));
  if (opt.sources > 1 && res->ai_family != AF_INET) die("--sources needs an IPv4 server address");

  // Unique keys per run, so that runs against one long-lived server do not collide.
  const std::string prefix = "store-load/" + std::to_string(getpid()) + "-" +
                             std::to_string(Clock::now().time_since_epoch().count()) + "/";
  const std::string counter = prefix + "count", release = prefix + "release";

  auto encode = [&](proto::Op op, std::vector<std::string> keys, std::vector<std::string> values,
                    int64_t i64 = 0, uint32_t u32 = 0) {
    std::string b;
    proto::encode_request(opt.gen, proto::request(op, std::move(keys), std::move(values), i64, u32), b);
    return b;
  };
  const std::string handshake =
      opt.gen == proto::Generation::kV2
          ? encode(proto::Op::kValidate, {}, {}, 0, proto::kValidationMagic) +
                encode(proto::Op::kPing, {}, {}, 0, 0x5eed)
          : std::string();
  const std::string add = encode(proto::Op::kAdd, {counter}, {}, 1);
  const std::string wait = encode(proto::Op::kWait, {release}, {});
  const std::string set_release = encode(proto::Op::kSet, {release}, {"go"});

  int ep = epoll_create1(EPOLL_CLOEXEC);
  std::vector<Client> clients(static_cast<size_t>(opt.clients));

  auto start_connect = [&](size_t i) {
    Client& c = clients[i];
    if (c.fd >= 0) close(c.fd);
    c.fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) die(std::string("socket: ") + strerror(errno));
    int one = 1;
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (opt.sources > 1) {  // 127.0.0.(1 + i % K); the port is picked by connect()
      setsockopt(c.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
      sockaddr_in src{};
      src.sin_family = AF_INET;
      src.sin_addr.s_addr = htonl(INADDR_LOOPBACK + static_cast<uint32_t>(i % static_cast<size_t>(opt.sources)));
      if (bind(c.fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0)
        die(std::string("bind: ") + strerror(errno));
    }
    ++c.attempts;
    c.state = State::kConnecting;
    if (connect(c.fd, res->ai_addr, res->ai_addrlen) != 0 && errno != EINPROGRESS)
      die(std::string("connect: ") + strerror(errno));
    epoll_event ev{};
    ev.events = EPOLLOUT | EPOLLIN;
    ev.data.u64 = i;
    epoll_ctl(ep, EPOLL_CTL_ADD, c.fd, &ev);
  };
  auto send_some = [&](size_t i) {
    Client& c = clients[i];
    while (!c.out.empty()) {
      ssize_t n = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        c.out.erase(0, static_cast<size_t>(n));
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        break;
      } else {
        die(std::string("send: ") + strerror(errno));
      }
    }
    epoll_event ev{};
    ev.events = EPOLLIN | (c.out.empty() ? 0u : uint32_t(EPOLLOUT));
    ev.data.u64 = i;
    epoll_ctl(ep, EPOLL_CTL_MOD, c.fd, &ev);
  };
  auto expect_bytes = [](State s) -> size_t {
    switch (s) {
      case State::kPing: return 4;
      case State::kAdd: return 8;
      case State::kWait: return 1;
      default: return 0;
    }
  };

  const auto t0 = Clock::now();
  for (size_t i = 0; i < clients.size(); ++i) start_connect(i);

  int connected = 0, released = 0;
  double connect_ms = 0;
  const auto deadline = t0 + std::chrono::seconds(opt.timeout_s);
  std::vector<epoll_event> events(1024);
  while (released < opt.clients) {
    if (Clock::now() > deadline)
      die("timed out: " + std::to_string(connected) + " connected, " + std::to_string(released) +
          " released of " + std::to_string(opt.clients));
    int n = epoll_wait(ep, events.data(), static_cast<int>(events.size()), 100);
    for (int e = 0; e < n; ++e) {
      size_t i = events[e].data.u64;
      Client& c = clients[i];
      if (c.state == State::kConnecting) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          if (c.attempts > 50) die(std::string("connect failed: ") + strerror(err));
          epoll_ctl(ep, EPOLL_CTL_DEL, c.fd, nullptr);
          start_connect(i);
          continue;
        }
        if (++connected == opt.clients) connect_ms = ms_since(t0);
        if (opt.gen == proto::Generation::kV2) {
          c.state = State::kPing;
          c.out = handshake;
        } else {
          c.state = State::kAdd;
          c.out = add;
        }
        send_some(i);
        continue;
      }
      if (events[e].events & EPOLLOUT) send_some(i);
      if (!(events[e].events & (EPOLLIN | EPOLLERR | EPOLLHUP))) continue;
      char buf[256];
      ssize_t got = recv(c.fd, buf, sizeof buf, 0);
      if (got == 0) die("server closed a connection");
      if (got < 0) {
        if (errno == EAGAIN || errno == EINTR) continue;
        die(std::string("recv: ") + strerror(errno));
      }
      c.in.append(buf, static_cast<size_t>(got));
      while (c.state != State::kDone && c.in.size() >= expect_bytes(c.state)) {
        size_t need = expect_bytes(c.state);
        std::string reply = c.in.substr(0, need);
        c.in.erase(0, need);
        if (c.state == State::kPing) {
          c.state = State::kAdd;
          c.out += add;
        } else if (c.state == State::kAdd) {
          int64_t v;
          std::memcpy(&v, reply.data(), 8);
          if (v == opt.clients) c.out += set_release;
          c.out += wait;
          c.state = State::kWait;
        } else if (c.state == State::kWait) {
          if (reply[0] != 0) die("unexpected WAIT reply");
          c.state = State::kDone;
          ++released;
        }
        send_some(i);
      }
    }
  }
  const double total_ms = ms_since(t0);
  const std::string sources = opt.sources > 1 ? " sources=" + std::to_string(opt.sources) : "";
  std::printf("store-load gen=%d clients=%d%s connect_ms=%.1f total_ms=%.1f\n",
              opt.gen == proto::Generation::kV1 ? 1 : 2, opt.clients, sources.c_str(), connect_ms, total_ms);
  // Reset rather than close gracefully: no TIME_WAIT, so repeated runs do not exhaust ports.
  for (auto& c : clients) {
    linger lg{1, 0};
    setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(c.fd);
  }
  freeaddrinfo(res);
  close(ep);
  return 0;
}
