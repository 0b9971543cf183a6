// The etcd transport plugin (transport.hpp): HTTP/1.1 and TLS to etcd members with
// Boost.Beast and OpenSSL, built as lib/ddprun/etcd-http.so. Only ddprun_etcd_transport is
// exported. Boost.Beast runs over one io_context per session. Each operation starts the async call with
// the stream's expiry set to the deadline and runs the context until its handler ran:
// Beast closes the socket when the expiry passes, so no call outlives its deadline.
#include "rendezvous/etcd/http.hpp"
#include "rendezvous/etcd/transport.hpp"
#include "store/socket_util.hpp"

#include <sys/socket.h>

#include <netdb.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <fmt/format.h>

namespace ddprun::rdzv::etcd {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using Kind = ExchangeError::Kind;

namespace {

bool is_address(const std::string& host) {
  error_code ec;
  asio::ip::make_address(host, ec);
  return !ec;
}

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// getaddrinfo on a helper thread, so that a stuck resolver cannot hold a call past its
// deadline (the thread finishes on its own later).
std::vector<tcp::endpoint> resolve(const Endpoint& ep, Deadline deadline) {
  error_code ec;
  auto addr = asio::ip::make_address(ep.host, ec);
  if (!ec) return {tcp::endpoint(addr, ep.port)};
  struct Shared {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    int rc = 0;
    std::vector<tcp::endpoint> out;
  };
  auto s = std::make_shared<Shared>();
  std::thread([s, host = ep.host, port = std::to_string(ep.port)] {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
    std::vector<tcp::endpoint> out;
    for (addrinfo* p = rc == 0 ? res : nullptr; p; p = p->ai_next) {
      tcp::endpoint e;
      std::memcpy(e.data(), p->ai_addr, p->ai_addrlen);
      e.resize(p->ai_addrlen);
      out.push_back(e);
    }
    if (res) freeaddrinfo(res);
    std::lock_guard<std::mutex> lk(s->m);
    s->rc = rc;
    s->out = std::move(out);
    s->done = true;
    s->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lk(s->m);
  if (!s->cv.wait_until(lk, deadline, [&] { return s->done; }))
    throw ExchangeError(Kind::connect, false, fmt::format("resolving {}: no answer from the name service in time", ep.host));
  if (s->rc != 0 || s->out.empty())
    throw ExchangeError(Kind::connect, false, fmt::format("cannot resolve {}: {}", ep.host, gai_strerror(s->rc)));
  return s->out;
}

std::string remaining_text(Clock::time_point start, Deadline deadline) {
  return ddp::format_duration(std::chrono::duration_cast<milliseconds>(deadline - start));
}

// Why a TLS handshake failed, in terms of what the user configured.
std::string explain_tls(const Endpoint& ep, const error_code& ec, long verify) {
  if (verify != X509_V_OK) {
    const char* hint = "cacert must be the CA that signed the etcd members' certificates";
    if (verify == X509_V_ERR_HOSTNAME_MISMATCH || verify == X509_V_ERR_IP_ADDRESS_MISMATCH)
      hint = "the certificate must name the host or address in the endpoint";
    else if (verify == X509_V_ERR_CERT_HAS_EXPIRED || verify == X509_V_ERR_CERT_NOT_YET_VALID)
      hint = "the member needs a valid certificate, or this machine's clock is wrong";
    return fmt::format("TLS with {}: the member's certificate is not accepted: {} ({})", ep.str(),
                       X509_verify_cert_error_string(verify), hint);
  }
  std::string reason = ec.message();
  if (contains(reason, "wrong version number") || contains(reason, "packet length too long") ||
      contains(reason, "unknown protocol") || contains(reason, "record layer failure") ||
      contains(reason, "http request"))
    return fmt::format("TLS with {}: the member does not answer in TLS ({}); is it a plain-http etcd? then "
                       "use protocol=http",
                       ep.str(), reason);
  if (contains(reason, "alert"))
    return fmt::format("TLS with {}: the member refused the connection ({}): it wants a client certificate "
                       "signed by a CA it trusts (check cert and key)",
                       ep.str(), reason);
  if (ec == asio::ssl::error::stream_truncated || ec == asio::error::eof || ec == asio::error::connection_reset)
    return fmt::format("TLS with {}: the member does not answer in TLS (it dropped the handshake: {}); is it a "
                       "plain-http etcd? then use protocol=http",
                       ep.str(), reason);
  return fmt::format("TLS handshake with {} failed: {}", ep.str(), reason);
}

}  // namespace

// ---- TLS settings --------------------------------------------------------------------

namespace {

class TlsSettings {
 public:
  explicit TlsSettings(const TlsConfig& c) : ctx(ssl::context::tls_client) {
    ctx.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                    ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
    ctx.set_verify_mode(ssl::verify_peer);
    error_code ec;
    if (c.cacert.empty()) {
      ctx.set_default_verify_paths(ec);
    } else {
      readable("cacert", c.cacert);
      ctx.load_verify_file(c.cacert, ec);
      if (ec) throw bad("cacert", c.cacert, ec.message() + " (expected PEM certificates)");
    }
    if (c.cert.empty() && !c.key.empty())
      throw ddp::UsageError("etcd TLS: key is given without cert (the client certificate)");
    if (c.cert.empty()) return;
    std::string key = c.key.empty() ? c.cert : c.key;
    readable("cert", c.cert);
    readable("key", key);
    ctx.use_certificate_chain_file(c.cert, ec);
    if (ec) throw bad("cert", c.cert, ec.message() + " (expected a PEM certificate)");
    check_dates(c.cert);
    ctx.use_private_key_file(key, ssl::context::pem, ec);
    if (ec && ec.message().find("mismatch") != std::string::npos)
      throw ddp::UsageError(fmt::format("etcd TLS: key {} does not belong to cert {}", key, c.cert));
    if (ec) throw bad("key", key, ec.message() + " (expected an unencrypted PEM private key)");
    if (SSL_CTX_check_private_key(ctx.native_handle()) != 1)
      throw ddp::UsageError(fmt::format("etcd TLS: key {} does not belong to cert {}", key, c.cert));
  }

  ssl::context ctx;

 private:
  static ddp::UsageError bad(const char* what, const std::string& path, const std::string& why) {
    return ddp::UsageError(fmt::format("etcd TLS: cannot use {} {}: {}", what, path, why));
  }
  static void readable(const char* what, const std::string& path) {
    if (::access(path.c_str(), R_OK) != 0) throw bad(what, path, ddp::errno_text(errno));
  }
  // An expired (or not yet valid) client certificate is refused by every member: say so
  // here, naming the dates, rather than as a handshake failure later.
  void check_dates(const std::string& path) {
    X509* cert = SSL_CTX_get0_certificate(ctx.native_handle());
    if (!cert) return;
    auto date = [](const ASN1_TIME* t) {
      tm out{};
      if (!t || ASN1_TIME_to_tm(t, &out) != 1) return std::string("?");
      char buf[64];
      std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &out);
      return std::string(buf);
    };
    if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0)
      throw bad("cert", path, "the certificate expired on " + date(X509_get0_notAfter(cert)));
    if (X509_cmp_current_time(X509_get0_notBefore(cert)) > 0)
      throw bad("cert", path, "the certificate is not valid before " + date(X509_get0_notBefore(cert)));
  }
};

// ---- one connection ------------------------------------------------------------------

// One connection: Beast over a TCP stream, TLS or not.
struct Session {
  Endpoint ep;
  TlsSettings* tls = nullptr;  // owned by ddprun's TlsContext, which outlives the session
  milliseconds connect_timeout;
  asio::io_context ioc{1};
  std::optional<beast::tcp_stream> plain;
  std::optional<beast::ssl_stream<beast::tcp_stream>> secure;
  beast::flat_buffer buffer;
  std::optional<http::response_parser<http::string_body>> stream;
  std::string chunk;  // streamed body bytes not handed out yet
  std::function<size_t(uint64_t, beast::string_view, error_code&)> on_chunk = [this](uint64_t, beast::string_view body,
                                                                                      error_code&) {
    chunk.append(body.data(), body.size());
    return body.size();
  };
  bool open = false;
  std::atomic<bool> interrupted{false};  // set by interrupt() from another thread

  beast::tcp_stream& lowest() { return secure ? beast::get_lowest_layer(*secure) : *plain; }

  template <class F>
  void with_stream(F&& f) {
    if (secure)
      f(*secure);
    else
      f(*plain);
  }

  // Starts one async operation and runs the context until its handler has run. An
  // interrupt() (another thread) cancels the socket's operation in progress; one that comes
  // between operations fails the next one before it starts.
  template <class Start>
  error_code run(Start&& start) {
    if (interrupted.exchange(false)) return asio::error::operation_aborted;
    error_code result;
    bool done = false;
    start([&](error_code ec, auto&&...) {
      result = ec;
      done = true;
    });
    ioc.restart();
    bool cancelled = false;
    while (!done && ioc.run_one() > 0) {
      if (!done && !cancelled && interrupted.exchange(false)) {
        cancelled = true;
        error_code ignored;
        if (plain || secure) lowest().socket().cancel(ignored);
      }
    }
    return done ? result : asio::error::interrupted;
  }

  void close() {
    if (plain) plain->close();
    if (secure) beast::get_lowest_layer(*secure).close();
    plain.reset();
    secure.reset();
    stream.reset();
    buffer.clear();
    chunk.clear();
    open = false;
  }

  void connect(Deadline deadline) {
    close();
    auto start = Clock::now();
    Deadline d = std::min(deadline, start + connect_timeout);
    auto addrs = resolve(ep, d);
    if (tls)
      secure.emplace(ioc, tls->ctx);
    else
      plain.emplace(ioc);
    lowest().expires_at(d);
    error_code ec = asio::error::host_not_found;
    for (const tcp::endpoint& a : addrs) {
      // Opened here, close-on-exec from the start (Asio's own open() takes no SOCK_CLOEXEC, and
      // ddprun forks workers while this thread connects): a worker inherits no etcd socket.
      int fd = ::socket(a.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC, IPPROTO_TCP);
      if (fd < 0) {
        ec = error_code(errno, asio::error::get_system_category());
        continue;
      }
      lowest().socket().close(ec);
      lowest().socket().assign(a.protocol(), fd, ec);
      if (ec) {
        ::close(fd);
        continue;
      }
      ec = run([&](auto h) { lowest().async_connect(a, h); });
      if (!ec || ec == beast::error::timeout || ec == asio::error::operation_aborted) break;
    }
    if (ec == beast::error::timeout)
      throw ExchangeError(Kind::connect, false, fmt::format("no connection to {} within {}", ep.str(), remaining_text(start, d)));
    if (ec) throw ExchangeError(Kind::connect, false, fmt::format("cannot connect to {}: {}", ep.str(), ec.message()));
    lowest().socket().set_option(tcp::no_delay(true), ec);
    // A renewal of this node's lease sent during a short partition gets through within a
    // second of the network's return (socket_util.hpp); every call keeps its own deadline.
    ddp::detail::bound_retransmit_backoff(lowest().socket().native_handle(), std::chrono::minutes(10));
    if (secure) handshake(start, d);
    open = true;
  }

  void handshake(Clock::time_point start, Deadline d) {
    SSL* s = secure->native_handle();
    X509_VERIFY_PARAM* param = SSL_get0_param(s);
    if (is_address(ep.host)) {
      X509_VERIFY_PARAM_set1_ip_asc(param, ep.host.c_str());
    } else {
      X509_VERIFY_PARAM_set1_host(param, ep.host.c_str(), 0);
      SSL_set_tlsext_host_name(s, ep.host.c_str());
    }
    error_code ec = run([&](auto h) { secure->async_handshake(ssl::stream_base::client, h); });
    if (ec == beast::error::timeout)
      throw ExchangeError(Kind::connect, false,
                          fmt::format("no TLS handshake with {} within {}", ep.str(), remaining_text(start, d)));
    if (ec) {
      long verify = SSL_get_verify_result(s);
      close();
      throw ExchangeError(Kind::fatal, false, explain_tls(ep, ec, verify));
    }
  }

  http::request<http::string_body> request(const std::string& target, const std::string& body) {
    http::request<http::string_body> req{http::verb::post, target, 11};
    req.set(http::field::host, ep.str());
    req.set(http::field::content_type, "application/json");
    req.set(http::field::user_agent, "ddprun");
    req.keep_alive(true);
    req.body() = body;
    req.prepare_payload();
    return req;
  }

  void send(const std::string& target, const std::string& body, Deadline deadline) {
    auto req = request(target, body);
    // A stream (watch) ends when its member loses the cluster's leader, rather than going
    // silent (etcd's "hasleader" metadata, passed through by the gateway).
    if (stream) req.set("Grpc-Metadata-hasleader", "true");
    auto start = Clock::now();
    lowest().expires_at(deadline);
    error_code ec = run([&](auto h) { with_stream([&](auto& s) { http::async_write(s, req, h); }); });
    if (!ec) return;
    close();
    if (ec == beast::error::timeout)
      throw ExchangeError(Kind::timeout, true, fmt::format("{} took no request within {}", ep.str(), remaining_text(start, deadline)));
    refused_after_handshake(ec);
    bool dropped = ec == asio::error::connection_reset || ec == asio::error::broken_pipe || ec == asio::error::eof ||
                   ec == asio::ssl::error::stream_truncated;
    throw ExchangeError(dropped ? Kind::closed : Kind::broken, true, fmt::format("sending to {}: {}", ep.str(), ec.message()));
  }

  // TLS 1.3 completes the client's handshake before the member checks its certificate: a
  // refusal arrives as an alert on the first read or write.
  void refused_after_handshake(const error_code& ec) {
    if (!tls || ec.message().find("alert") == std::string::npos) return;
    close();
    throw ExchangeError(Kind::fatal, false, explain_tls(ep, ec, X509_V_OK));
  }

  [[noreturn]] void read_failed(const error_code& ec, Clock::time_point start, Deadline deadline, bool got_bytes) {
    close();
    if (ec == beast::error::timeout)
      throw ExchangeError(Kind::timeout, true, fmt::format("no answer from {} within {}", ep.str(), remaining_text(start, deadline)));
    refused_after_handshake(ec);
    bool silent = !got_bytes && (ec == http::error::end_of_stream || ec == asio::error::eof ||
                                 ec == asio::error::connection_reset || ec == asio::ssl::error::stream_truncated);
    // Sent in full: the member may have applied it before it went away.
    throw ExchangeError(silent ? Kind::closed : Kind::broken, true,
                        fmt::format("reading from {}: {}", ep.str(), ec.message()));
  }

  // A plain-http request answered by a TLS member (Go says so in a 400).
  void check_not_tls(int status, const std::string& body) {
    if (!tls && status == 400 && contains(body, "HTTPS"))
      throw ExchangeError(Kind::fatal, false,
                          fmt::format("{} speaks TLS: use protocol=https (with cacert, cert and key)", ep.str()));
  }

  HttpResponse exchange(const std::string& target, const std::string& body, Deadline deadline) {
    send(target, body, deadline);
    auto start = Clock::now();
    http::response_parser<http::string_body> parser;
    parser.body_limit(64u << 20);
    error_code ec = run([&](auto h) { with_stream([&](auto& s) { http::async_read(s, buffer, parser, h); }); });
    if (ec) read_failed(ec, start, deadline, parser.got_some());
    auto res = parser.release();
    if (!res.keep_alive()) close();
    HttpResponse out{static_cast<int>(res.result_int()), std::move(res.body())};
    check_not_tls(out.status, out.body);
    return out;
  }
};

HttpResponse post(Session& s, const std::string& target, const std::string& body, Deadline deadline) {
  if (!s.open) s.connect(deadline);
  try {
    return s.exchange(target, body, deadline);
  } catch (const ExchangeError& e) {
    if (e.kind() != Kind::closed) throw;
  }
  // Closed without an answer: a kept-alive connection the member had closed while idle, a
  // member that went away with the request, or one that speaks another protocol (etcd
  // drops plain http on its TLS port). Once more on a fresh connection to tell.
  try {
    s.connect(deadline);
    return s.exchange(target, body, deadline);
  } catch (const ExchangeError& again) {
    if (again.kind() == Kind::closed)
      throw ExchangeError(Kind::fatal, true,
                          fmt::format("{} closes connections without answering ({}); {}", s.ep.str(), again.what(),
                                      s.tls ? "does it refuse this client certificate? check cert and key"
                                            : "is it a TLS etcd? then use protocol=https"));
    throw ExchangeError(again.kind(), true, again.what());  // the first try may have been applied
  }
}

HttpResponse start_stream(Session& s, const std::string& target, const std::string& body, Deadline deadline) {
  s.connect(deadline);
  s.stream.emplace();
  s.stream->body_limit(boost::none);
  s.stream->on_chunk_body(s.on_chunk);
  s.send(target, body, deadline);
  auto start = Clock::now();
  error_code ec = s.run([&](auto h) { s.with_stream([&](auto& st) { http::async_read_header(st, s.buffer, *s.stream, h); }); });
  if (ec) s.read_failed(ec, start, deadline, true);
  int status = static_cast<int>(s.stream->get().result_int());
  if (status == 200) return {status, {}};
  // An error: read the whole body (chunked bodies arrive through on_chunk).
  ec = s.run([&](auto h) { s.with_stream([&](auto& st) { http::async_read(st, s.buffer, *s.stream, h); }); });
  if (ec) s.read_failed(ec, start, deadline, true);
  std::string text = s.chunk.empty() ? s.stream->get().body() : s.chunk;
  s.close();
  s.check_not_tls(status, text);
  return {status, text};
}

bool read_stream(Session& s, std::string& out, Deadline deadline) {
  if (!s.stream) throw ExchangeError(Kind::broken, true, fmt::format("no stream open to {}", s.ep.str()));
  if (s.chunk.empty()) {
    if (s.stream->is_done()) {
      s.close();
      throw ExchangeError(Kind::broken, true, fmt::format("{} ended the stream", s.ep.str()));
    }
    auto start = Clock::now();
    s.lowest().expires_at(deadline);
    error_code ec = s.run([&](auto h) { s.with_stream([&](auto& st) { http::async_read_some(st, s.buffer, *s.stream, h); }); });
    if (ec == beast::error::timeout) {
      s.close();
      return false;
    }
    if (ec) s.read_failed(ec, start, deadline, true);
  }
  out += s.chunk;
  s.chunk.clear();
  return true;
}

// ---- the C interface (transport.hpp) -------------------------------------------------

void say(DdprunEtcdSink sink, const std::string& text) { sink.append(sink.user, text.data(), text.size()); }

Deadline deadline_of(int64_t ns) { return Deadline(std::chrono::nanoseconds(ns)); }

// Runs f; any exception becomes *error and -1 (none may cross into ddprun).
template <class F>
int guarded(DdprunEtcdError* error, F&& f) noexcept {
  try {
    return f();
  } catch (const ExchangeError& e) {
    error->type = kDdprunEtcdExchange;
    error->exchange_kind = static_cast<int>(e.kind());
    error->maybe_delivered = e.maybe_delivered();
    say(error->message, e.what());
  } catch (const ddp::UsageError& e) {
    error->type = kDdprunEtcdUsage;
    say(error->message, e.what());
  } catch (const std::exception& e) {
    error->type = kDdprunEtcdOther;
    say(error->message, e.what());
  } catch (...) {
    error->type = kDdprunEtcdOther;
    say(error->message, "unknown error in the etcd transport");
  }
  return -1;
}

void* tls_open(const DdprunEtcdTls* c, DdprunEtcdError* error) {
  TlsSettings* out = nullptr;
  guarded(error, [&] {
    out = new TlsSettings(TlsConfig{true, c->cacert, c->cert, c->key});
    return 0;
  });
  return out;
}

void tls_free(void* tls) { delete static_cast<TlsSettings*>(tls); }

void* conn_new(const char* host, uint16_t port, void* tls, int64_t connect_timeout_ms) noexcept {
  try {
    auto s = std::make_unique<Session>();
    s->ep = Endpoint{host, port};
    s->tls = static_cast<TlsSettings*>(tls);
    s->connect_timeout = milliseconds(connect_timeout_ms);
    return s.release();
  } catch (...) {
    return nullptr;  // out of memory, or no io_context
  }
}

void conn_free(void* conn) { delete static_cast<Session*>(conn); }

template <class Call>
int answer(void* conn, const char* target, const char* body, size_t size, int64_t deadline_ns, int* status,
           DdprunEtcdSink response, DdprunEtcdError* error, Call call) {
  return guarded(error, [&] {
    HttpResponse r = call(*static_cast<Session*>(conn), target, std::string(body, size), deadline_of(deadline_ns));
    *status = r.status;
    say(response, r.body);
    return 0;
  });
}

int post_c(void* conn, const char* target, const char* body, size_t size, int64_t deadline_ns, int* status,
           DdprunEtcdSink response, DdprunEtcdError* error) {
  return answer(conn, target, body, size, deadline_ns, status, response, error, post);
}

int start_stream_c(void* conn, const char* target, const char* body, size_t size, int64_t deadline_ns, int* status,
                   DdprunEtcdSink response, DdprunEtcdError* error) {
  return answer(conn, target, body, size, deadline_ns, status, response, error, start_stream);
}

int read_stream_c(void* conn, int64_t deadline_ns, DdprunEtcdSink out, DdprunEtcdError* error) {
  return guarded(error, [&] {
    std::string data;
    if (!read_stream(*static_cast<Session*>(conn), data, deadline_of(deadline_ns))) return 0;
    say(out, data);
    return 1;
  });
}

void close_c(void* conn) noexcept {
  try {
    static_cast<Session*>(conn)->close();
  } catch (...) {
  }
}

// The flag is acted on by the session's own thread (Session::run), which owns the stream; the
// empty handler wakes it if it waits in run_one. (Cancelling from a posted handler alone is
// not enough: an operation that completes from buffered data has no socket operation in
// progress to cancel, and the next one would run on.)
void interrupt_c(void* conn) noexcept {
  auto* s = static_cast<Session*>(conn);
  s->interrupted = true;
  try {
    asio::post(s->ioc, [] {});
  } catch (...) {
  }
}

}  // namespace

}  // namespace ddprun::rdzv::etcd

extern "C" __attribute__((visibility("default"))) const DdprunEtcdApi* ddprun_etcd_transport(void) {
  using namespace ddprun::rdzv::etcd;
  static const DdprunEtcdApi api{kDdprunEtcdAbi, tls_open, tls_free, conn_new, conn_free, post_c,
                                 start_stream_c, read_stream_c, close_c, interrupt_c};
  return &api;
}
