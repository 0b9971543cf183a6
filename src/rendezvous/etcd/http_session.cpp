// ddprun's side of the etcd transport: the plugin's loading, and HttpSession and TlsContext
// over its C interface (transport.hpp).
#include <dlfcn.h>

#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "rendezvous/etcd/http.hpp"
#include "rendezvous/etcd/transport.hpp"

namespace ddprun::rdzv::etcd {

namespace {

namespace fs = std::filesystem;

// <bin>/../lib/ddprun/etcd-http.so: in the build tree and installed alike.
std::string plugin_path() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw ddp::Error(fmt::format("the etcd transport: cannot tell where ddprun is (/proc/self/exe: {})", ec.message()));
  return (exe.parent_path() / ".." / "lib" / "ddprun" / "etcd-http.so").lexically_normal().string();
}

const DdprunEtcdApi* load() {
  std::string path = plugin_path();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!handle) {
    std::string why = dlerror();
    if (why.rfind(path + ": ", 0) == 0) why.erase(0, path.size() + 2);
    throw ddp::Error(fmt::format("the etcd rendezvous needs ddprun's etcd transport, {}, which cannot be loaded: {} "
                                 "(install ddprun with it: the ddprun package, or cmake --install)",
                                 path, why));
  }
  auto entry = reinterpret_cast<DdprunEtcdEntry>(dlsym(handle, "ddprun_etcd_transport"));
  if (!entry) throw ddp::Error(fmt::format("{} is not ddprun's etcd transport (it has no ddprun_etcd_transport)", path));
  const DdprunEtcdApi* api = entry();
  if (!api || api->abi != kDdprunEtcdAbi)
    throw ddp::Error(fmt::format("{} is from another build of ddprun (interface {}, this ddprun's {}): install "
                                 "ddprun and its etcd transport from one build",
                                 path, api ? api->abi : 0, static_cast<int>(kDdprunEtcdAbi)));
  return api;
}

// The plugin's interface, loaded on first use.
const DdprunEtcdApi& api() {
  static const DdprunEtcdApi* loaded = load();  // a failed load throws, and the next call tries again
  return *loaded;
}

DdprunEtcdSink sink_to(std::string& s) {
  return {&s, [](void* user, const char* data, size_t n) { static_cast<std::string*>(user)->append(data, n); }};
}

// A call's failure, filled by the plugin and thrown here as what it stands for.
struct Failure {
  Failure() = default;
  Failure(const Failure&) = delete;  // the sink points at this object's message
  Failure& operator=(const Failure&) = delete;

  std::string message;
  DdprunEtcdError c{0, 0, 0, sink_to(message)};

  [[noreturn]] void raise() const {
    if (c.type == kDdprunEtcdUsage) throw ddp::UsageError(message);
    if (c.type == kDdprunEtcdExchange)
      throw ExchangeError(static_cast<ExchangeError::Kind>(c.exchange_kind), c.maybe_delivered != 0, message);
    throw ddp::Error(message);
  }
};

int64_t ns(Deadline d) { return std::chrono::duration_cast<std::chrono::nanoseconds>(d.time_since_epoch()).count(); }

}  // namespace

// The plugin's TLS settings, freed by the plugin.
class TlsContext {
 public:
  explicit TlsContext(void* handle) : handle_(handle) {}
  ~TlsContext() { api().tls_free(handle_); }
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;
  void* handle() const { return handle_; }

 private:
  void* handle_;
};

std::shared_ptr<TlsContext> make_tls_context(const TlsConfig& c) {
  if (!c.enabled) return nullptr;
  DdprunEtcdTls config{c.cacert.c_str(), c.cert.c_str(), c.key.c_str()};
  Failure f;
  void* handle = api().tls_open(&config, &f.c);
  if (!handle) f.raise();
  return std::make_shared<TlsContext>(handle);
}

struct HttpSession::Impl {
  Endpoint ep;
  std::shared_ptr<TlsContext> tls;  // outlives the connection, which uses it
  void* conn = nullptr;

  ~Impl() {
    if (conn) api().conn_free(conn);
  }

  template <class Call>
  HttpResponse answer(Call call, const std::string& target, const std::string& body, Deadline deadline) {
    HttpResponse out;
    Failure f;
    if (call(conn, target.c_str(), body.data(), body.size(), ns(deadline), &out.status, sink_to(out.body), &f.c) != 0)
      f.raise();
    return out;
  }
};

HttpSession::HttpSession(Endpoint ep, std::shared_ptr<TlsContext> tls, milliseconds connect_timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->conn = api().conn_new(ep.host.c_str(), ep.port, tls ? tls->handle() : nullptr, connect_timeout.count());
  if (!impl_->conn) throw ddp::Error(fmt::format("etcd at {}: cannot set up a connection (out of memory?)", ep.str()));
  impl_->ep = std::move(ep);
  impl_->tls = std::move(tls);
}

HttpSession::~HttpSession() = default;

const Endpoint& HttpSession::endpoint() const { return impl_->ep; }

void HttpSession::close() { api().close(impl_->conn); }

HttpResponse HttpSession::post(const std::string& target, const std::string& body, Deadline deadline) {
  return impl_->answer(api().post, target, body, deadline);
}

HttpResponse HttpSession::start_stream(const std::string& target, const std::string& body, Deadline deadline) {
  return impl_->answer(api().start_stream, target, body, deadline);
}

bool HttpSession::read_stream(std::string& out, Deadline deadline) {
  Failure f;
  int got = api().read_stream(impl_->conn, ns(deadline), sink_to(out), &f.c);
  if (got < 0) f.raise();
  return got == 1;
}

void HttpSession::interrupt() { api().interrupt(impl_->conn); }

}  // namespace ddprun::rdzv::etcd
