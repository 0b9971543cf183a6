// HTTP/1.1 to one etcd member, plain or TLS, for the v3 JSON gateway. Every call runs to a
// deadline: the connection is closed when it passes. Boost.Beast and OpenSSL are confined to
// http.cpp, the etcd transport plugin (transport.hpp); this API is ddprun's side of it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/error.hpp"

namespace ddprun::rdzv::etcd {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;
using std::chrono::milliseconds;

struct Endpoint {
  std::string host;  // a name or an address; IPv6 without brackets
  uint16_t port = 2379;
  std::string str() const;  // host:port, [v6]:port
};

// "a:2379,b,[::1]:2380" (an "http://" or "https://" prefix is allowed and must match
// `https`). Throws ddp::UsageError naming the bad entry.
std::vector<Endpoint> parse_endpoints(const std::string& list, bool https);

// protocol=https: the CA that signs the members' certificates (empty: the system's) and
// this client's certificate and key (both or neither; a key may sit in the cert file).
struct TlsConfig {
  bool enabled = false;
  std::string cacert, cert, key;
};

// The loaded TLS settings, shared by every connection of a client and its clones.
class TlsContext;
// Throws ddp::UsageError naming the file (never its content) that cannot be used. This and
// HttpSession's constructor load the transport plugin: ddp::Error when it cannot be.
std::shared_ptr<TlsContext> make_tls_context(const TlsConfig&);

// One failed exchange with one member.
class ExchangeError : public ddp::NetworkError {
 public:
  enum class Kind {
    connect,   // no connection (refused, unreachable, name unknown, connect timeout)
    timeout,   // connected, but no (complete) answer before the deadline
    broken,    // the connection failed mid-exchange
    closed,    // the member closed the connection without a byte of answer
    fatal,     // retrying this member cannot help: TLS refused, wrong protocol
  };
  ExchangeError(Kind kind, bool maybe_delivered, const std::string& what)
      : ddp::NetworkError(what), kind_(kind), maybe_delivered_(maybe_delivered) {}
  Kind kind() const { return kind_; }
  // The request may have reached the server (and been applied) before the failure.
  bool maybe_delivered() const { return maybe_delivered_; }

 private:
  Kind kind_;
  bool maybe_delivered_;
};

struct HttpResponse {
  int status = 0;
  std::string body;
};

// A keep-alive connection to one member, opened on first use and reopened after a failure.
// Used by one thread at a time.
class HttpSession {
 public:
  HttpSession(Endpoint ep, std::shared_ptr<TlsContext> tls, milliseconds connect_timeout);
  ~HttpSession();
  HttpSession(const HttpSession&) = delete;
  HttpSession& operator=(const HttpSession&) = delete;

  const Endpoint& endpoint() const;

  // POSTs a JSON body and reads the whole answer. Throws ExchangeError.
  HttpResponse post(const std::string& target, const std::string& body, Deadline deadline);

  // A streamed answer (etcd's watch): sends the request and reads the status line and
  // headers; a status other than 200 comes back with the whole body. Then read_stream()
  // hands out the body as it arrives.
  HttpResponse start_stream(const std::string& target, const std::string& body, Deadline deadline);
  // Appends what arrives to `out`; false when the deadline passes first (the connection is
  // then closed). Throws ExchangeError when the stream breaks or ends.
  bool read_stream(std::string& out, Deadline deadline);

  void close();

  // Makes the operation in progress on this session (in another thread) fail soon, and the
  // next one if none is in progress. Callable from any thread while the session lives.
  void interrupt();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rdzv::etcd
