// The store server: one io_context on one thread, every socket non-blocking.
//
// Reads: async_read_some into a small per-connection buffer (512 bytes, grown to 64 KiB for
// a client that fills it), feeding the bytes to the connection's incremental RequestParser.
// Asio tries such a read at once and only then waits for readiness, which saves the
// epoll_ctl() that every async_wait() costs in Boost 1.74's reactor.
// Writes: replies are appended to a per-connection output buffer; after each event the
// buffers touched are flushed with non-blocking writes, and whatever the kernel does not
// take waits for writability (async_wait) without holding anyone else up. A connection
// with more than kPauseReadingAbove bytes unsent has no further request handled (what was
// read stays buffered) and is not read from until its output drains, so its own replies
// exceed that by one reply at most. max_pending_output_bytes caps only the output queued
// behind the batch being written (see Conn::batch_end): a client that keeps reading is never
// cut off, however large a single reply is (PyTorch has no cap at all).
#include "store/server.hpp"

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <chrono>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it under C++20
#include <vector>

#include <boost/asio.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "store/protocol.hpp"
#include "store/socket_util.hpp"

namespace ddp::detail {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

namespace {

constexpr size_t kSmallReadBuffer = 512;
constexpr size_t kLargeReadBuffer = 64 << 10;
constexpr size_t kPauseReadingAbove = 4 << 20;

std::string mib(size_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

bool is_wildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "*";
}

void raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
  rlimit want = rl;
  want.rlim_cur = rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &want) != 0)
    spdlog::warn("store server: cannot raise the open-file limit from {} to {}: {}",
                 rl.rlim_cur, rl.rlim_max, errno_text(errno));
}

bool would_block(const error_code& ec) {
  return ec == asio::error::would_block || ec == asio::error::try_again;
}

// A client broke the protocol in a way only the server notices (GET of a missing key in
// generation 1, ADD on a non-integer): its connection is closed.
class Violation : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A request over the memory budget (StoreServerOptions::max_*): refused before anything is
// built or registered; its connection is closed with a warning naming the client.
class Refused : public StoreError {
 public:
  using StoreError::StoreError;
};

// What a registration costs besides its strings (the Wait, vector and map slots).
constexpr size_t kRegistrationOverhead = 64;
// How often the server looks at its own clock while any lease has a ttl: a look later than
// due is time it did not run (arm_stall_tick()).
constexpr auto kStallTick = std::chrono::milliseconds(100);
// A longer LEASE ttl (about 34 years) is no silence limit at all (start_lease()).
constexpr auto kLongestLeaseTtl = std::chrono::milliseconds(int64_t{1} << 40);

struct Conn;
struct Wait;

// A key's waiters, oldest first: each entry a wait and which of its registrations it is.
// A list, so that a wait leaves it in O(1) however many others wait on the key.
using WaitList = std::list<std::pair<Wait*, size_t>>;

// One pending WAIT request. Registered under each key that was missing (once per
// occurrence); `remaining` counts registrations not yet satisfied.
struct Wait {
  struct Reg {
    explicit Reg(std::string k) : key(std::move(k)) {}
    std::string key;
    WaitList* list = nullptr;  // waiters_[key] (map values stay put)
    WaitList::iterator at;     // this registration's entry; valid while `live`
    bool live = false;
  };
  Conn* conn = nullptr;
  size_t remaining = 0;
  std::vector<Reg> regs;
  int64_t grows_beyond = -1;  // WAIT_GROWS: done once the key's value is longer than this
  size_t slot = 0;            // index in conn->waits
  size_t bytes = 0;           // counted in conn->wait_bytes
};

struct Conn : std::enable_shared_from_this<Conn> {
  Conn(tcp::socket s, const proto::Limits& limits, uint64_t id_)
      : sock(std::move(s)), parser(limits), id(id_) {}

  size_t pending() const { return out.size() - out_off; }
  // Output queued behind the batch being written. A batch is everything that was queued
  // when the previous one had been written: a client that reads keeps starting new batches;
  // one that does not stays on its first while everything else piles up behind it.
  uint64_t queued_behind() {
    uint64_t written = out_pos + out_off, end = out_pos + out.size();
    if (batch_end <= written) batch_end = end;
    return end - batch_end;
  }

  tcp::socket sock;
  proto::RequestParser parser;
  std::vector<uint8_t> rbuf = std::vector<uint8_t>(kSmallReadBuffer);
  size_t rpos = 0, rlen = 0;  // rbuf[rpos, rlen): read but not yet handled
  uint64_t id;
  std::string out;  // unsent replies from out_off on
  size_t out_off = 0;
  // Output positions count every byte ever queued on the connection.
  uint64_t out_pos = 0;    // position of out[0]
  uint64_t batch_end = 0;  // end of the batch being written
  uint64_t counted_behind = 0;  // queued_behind() as counted in the server's total
  bool closed = false, reading = false, writing = false, dirty = false;
  bool paused = false;  // not reading until unsent replies drain
  std::vector<std::unique_ptr<Wait>> waits;  // waits[i]->slot == i
  std::vector<std::string> watched;  // generation-1 WATCH_KEY registrations
  // Bytes held for the connection's registrations (StoreServerOptions::max_connection_bytes).
  size_t wait_bytes = 0, watch_bytes = 0, lease_bytes = 0;
  size_t held() const { return wait_bytes + watch_bytes + lease_bytes; }
  // ddprun's lease (LEASE, ON_LEASE_END): lines appended when the connection ends.
  bool leased = false;
  std::chrono::milliseconds lease_ttl{0};  // 0: ends only when the connection closes
  std::chrono::steady_clock::time_point last_request;
  std::chrono::steady_clock::duration stalled_at_request{};  // stalled_by() then
  std::unique_ptr<asio::steady_timer> lease_timer;
  // Lines in the order registered, and where each key's are (ON_LEASE_END "" drops a
  // key's lines at the cost of those lines, not of all the connection's).
  using LeaseLines = std::list<std::pair<std::string, std::string>>;  // key, value
  LeaseLines lease_lines;
  std::unordered_map<std::string, std::vector<LeaseLines::iterator>> lease_index;
};

}  // namespace

int listen_backlog(int configured) {
  int kernel = SOMAXCONN;
  if (std::FILE* f = std::fopen("/proc/sys/net/core/somaxconn", "re")) {
    int v = 0;
    if (std::fscanf(f, "%d", &v) == 1 && v > 0) kernel = v;
    std::fclose(f);
  }
  return std::max(configured, kernel);
}

class StoreServer::Impl {
 public:
  explicit Impl(StoreServerOptions o);
  ~Impl() { stop(); }

  uint16_t port() const { return port_; }
  void start();
  void stop();
  size_t num_connections() const { return nconn_.load(std::memory_order_relaxed); }

 private:
  using ConnPtr = std::shared_ptr<Conn>;

  error_code try_listen(const tcp::endpoint& ep, bool dual_stack);
  void do_accept();
  error_code accept_pending();
  void on_accept(tcp::socket s);
  void arm_read(const ConnPtr& c);
  void on_read(const ConnPtr& c, size_t n);
  void pump(const ConnPtr& c);
  void process(Conn& c);
  void handle(Conn& c, proto::Request& r);
  void handle_extension(Conn& c, proto::Request& r);
  // The requests that are more than a line in handle(), each replying on c.
  void compare_set(Conn& c, const std::string& key, std::string& expected, std::string& desired);
  void get(Conn& c, const std::string& key, bool gen1);
  void add(Conn& c, const std::string& key, int64_t delta);
  void delete_key(Conn& c, const std::string& key);
  void multi_get(Conn& c, const std::vector<std::string>& keys, bool gen1);
  void queue_pop(Conn& c, const std::string& key);
  void lease(Conn& c, int64_t ttl_ms);
  void read_log(Conn& c, proto::Op op, const std::string& key, int64_t offset);
  std::string& out(Conn& c);
  void flush_dirty();
  void flush(const ConnPtr& c);
  uint64_t recount_behind(Conn& c);
  bool over_output_budget(Conn& c);
  void close(Conn& c, std::string_view why, std::string_view lease_why = {});
  void close_broken(Conn& c, const std::string& why);
  std::string peer(const Conn& c) const;
  void refuse(Conn& c, proto::Op op, const Refused& e);
  void check_reply(const Conn& c, size_t bytes) const;
  void check_registration(const Conn& c, size_t count, size_t cap, const char* what,
                          const char* option, size_t bytes) const;
  void shutdown_all();
  void start_lease(Conn& c, int64_t ttl_ms);
  void arm_lease_timer(const ConnPtr& c, std::chrono::steady_clock::duration after);
  void end_lease(Conn& c, std::string_view why);
  void heard(Conn& c);
  std::chrono::steady_clock::duration silence(const Conn& c, std::chrono::steady_clock::time_point now) const;
  std::chrono::steady_clock::duration stalled_by(std::chrono::steady_clock::time_point now) const;
  void arm_stall_tick();

  // The key-value data and the waits on it (all touched on the io thread only).
  bool present(const std::string& key) const;
  void store_value(const std::string& key, std::string value, bool wake = true);
  void append_value(const std::string& key, std::string value);
  void wait_grows(Conn& c, const std::string& key, int64_t beyond);
  void wait_on(Conn& c, const std::string& key, int64_t grows_beyond = -1);
  void wait_keys(Conn& c, const std::vector<std::string>& keys);
  void add_wait(Conn& c, std::unique_ptr<Wait> w);
  void remove_wait(Wait* w);
  void unregister(Wait& w, size_t i);
  void barrier(Conn& c, const std::string& key, int64_t world_size);
  void wake_all(const std::string& key);
  void wake_one(const std::string& key);
  void complete(Wait* w);
  void cancel_waits(Conn& c);
  void notify(const std::string& key, uint8_t type, std::string_view old_value,
              std::string_view new_value);
  void unwatch(Conn& c);
  void watch(Conn& c, const std::string& key);
  void add_lease_line(Conn& c, std::string key, std::string value);
  int64_t trim_log(const std::string& key, int64_t line);
  int64_t logical_size(const std::string& key) const;
  std::string_view held(const std::string& key, const std::string& stored) const;
  void drop_lease_lines(Conn& c, const std::string& key);
  size_t reply_bytes(const proto::Request& r) const;
  void check_connection(const Conn& c, size_t bytes, const char* what) const;

  StoreServerOptions opt_;
  int backlog_ = 0;
  proto::Limits limits_;
  asio::io_context io_{1};
  tcp::acceptor acceptor_{io_};
  tcp listen_protocol_ = tcp::v4();
  asio::steady_timer accept_retry_{io_};
  // The server's own stalls (a stopped process, a starved or paused host), measured by a
  // tick while leases have a ttl: that time is not a client's silence (silence()).
  asio::steady_timer stall_tick_{io_};
  bool ticking_ = false;
  std::chrono::steady_clock::duration stalled_{};  // sum of the ticks' lateness
  uint16_t port_ = 0;
  std::thread thread_;
  std::mutex stop_mu_;
  bool stopped_ = false;
  bool shutting_down_ = false;  // io thread: connections closing because the server stops
  std::atomic<size_t> nconn_{0};
  size_t broken_ = 0;  // clients disconnected for breaking the protocol (close_broken)

  std::unordered_map<uint64_t, ConnPtr> conns_;
  uint64_t next_id_ = 1;
  std::vector<ConnPtr> dirty_;
  uint64_t behind_total_ = 0;  // queued_behind() summed over the connections

  std::unordered_map<std::string, std::string> kv_;
  // TRIM_LOG: per trimmed key, what its value no longer holds (offsets and line numbers
  // count from the key's first byte ever). Gone with the key's value (any write but APPEND).
  struct Trimmed {
    int64_t bytes = 0, lines = 0;
    // Of those bytes, the ones still at the front of the stored string: removed once they are
    // as many as the bytes held, so that a trim costs what it drops, not what it keeps.
    size_t dead = 0;
  };
  std::unordered_map<std::string, Trimmed> trimmed_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  std::unordered_map<std::string, WaitList> waiters_;
  std::unordered_map<std::string, std::vector<Conn*>> watchers_;
};

// ---------------------------------------------------------------------------------------
// Listening, accepting, stopping

StoreServer::Impl::Impl(StoreServerOptions o) : opt_(std::move(o)) {
  // The logger is made before any server: one stopped at exit (libddp's hosted servers)
  // is then stopped before the logger is destroyed.
  (void)spdlog::default_logger_raw();
  limits_.max_key_bytes = opt_.max_key_bytes;
  limits_.max_payload_bytes = opt_.max_payload_bytes;
  limits_.max_keys_per_request = opt_.max_keys_per_request;
  limits_.max_request_bytes = opt_.max_request_bytes;
  backlog_ = listen_backlog(opt_.backlog);
  raise_fd_limit();

  error_code ec;
  if (is_wildcard(opt_.host)) {
    ec = try_listen(tcp::endpoint(tcp::v6(), opt_.port), /*dual_stack=*/true);
    if (ec && ec != asio::error::address_in_use && ec != asio::error::access_denied) {
      spdlog::debug("store server: no IPv6 listener ({}), using IPv4", ec.message());
      ec = try_listen(tcp::endpoint(tcp::v4(), opt_.port), false);
    }
  } else {
    auto addr = asio::ip::make_address(opt_.host, ec);
    if (!ec) {
      ec = try_listen(tcp::endpoint(addr, opt_.port), false);
    } else {
      tcp::resolver resolver(io_);
      auto results = resolver.resolve(opt_.host, std::to_string(opt_.port), ec);
      if (ec)
        throw NetworkError(fmt::format("bind {}:{}: cannot resolve {}: {}", opt_.host, opt_.port, opt_.host,
                                       ec.message()));  // no errno to add
      ec = asio::error::host_not_found;
      for (const auto& entry : results) {
        ec = try_listen(entry.endpoint(), false);
        if (!ec) break;
      }
    }
  }
  if (ec) throw SystemError(fmt::format("bind {}:{}", opt_.host, opt_.port), ec.value());
  port_ = acceptor_.local_endpoint().port();
}

error_code StoreServer::Impl::try_listen(const tcp::endpoint& ep, bool dual_stack) {
  error_code ec, ignored;
  // Opened here, close-on-exec from the start: Asio's open() takes no SOCK_CLOEXEC, and a
  // worker that inherited the listener would keep the port bound and could accept() our
  // clients. Non-blocking, for accept_pending().
  int fd = ::socket(ep.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, IPPROTO_TCP);
  if (fd < 0) return error_code(errno, boost::system::system_category());
  acceptor_.assign(ep.protocol(), fd, ec);
  if (ec) {
    ::close(fd);
    return ec;
  }
  listen_protocol_ = ep.protocol();
  if (dual_stack) acceptor_.set_option(asio::ip::v6_only(false), ignored);
  acceptor_.set_option(tcp::acceptor::reuse_address(true), ignored);
  // Linux copies TCP_NODELAY to accepted sockets: one setsockopt here, none per client.
  acceptor_.set_option(tcp::no_delay(true), ignored);
  acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(backlog_, ec);
  if (ec) acceptor_.close(ignored);
  return ec;
}

void StoreServer::Impl::start() {
  std::lock_guard lk(stop_mu_);
  if (stopped_ || thread_.joinable()) return;
  thread_ = std::thread([this] {
    do_accept();
    for (;;) {
      try {
        io_.run();
        break;
      } catch (const std::exception& e) {  // handlers catch their own; belt and braces
        spdlog::error("store server: unexpected error: {}", e.what());
      }
    }
  });
}

void StoreServer::Impl::stop() {
  std::lock_guard lk(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  if (thread_.joinable()) {
    asio::post(io_, [this] {
      shutdown_all();
      io_.stop();
    });
    thread_.join();
  } else {
    shutdown_all();
  }
  // Run the aborted handlers here so that they release their connections.
  io_.restart();
  io_.poll();
}

void StoreServer::Impl::shutdown_all() {
  shutting_down_ = true;  // a stopping server writes no lease lines: nobody would read them
  error_code ignored;
  acceptor_.close(ignored);
  accept_retry_.cancel();
  stall_tick_.cancel();
  std::vector<ConnPtr> all;
  all.reserve(conns_.size());
  for (auto& [id, c] : conns_) all.push_back(c);
  for (auto& c : all) close(*c, "server stopping");
  dirty_.clear();
}

// Waits until the listener is readable, then accepts everything pending (accept_pending).
void StoreServer::Impl::do_accept() {
  acceptor_.async_wait(tcp::acceptor::wait_read, [this](error_code ec) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) ec = accept_pending();
    if (ec) {
      spdlog::warn("store server: accept on port {} failed: {}", port_, ec.message());
      // Out of descriptors or memory: retry shortly instead of spinning.
      accept_retry_.expires_after(std::chrono::milliseconds(50));
      accept_retry_.async_wait([this](error_code e) {
        if (!e) do_accept();
      });
      return;
    }
    do_accept();
  });
}

// accept4 with SOCK_CLOEXEC (Asio's accept has no flags, and setting FD_CLOEXEC afterwards
// leaves a window in which a worker being started inherits the connection), until the
// backlog is empty.
error_code StoreServer::Impl::accept_pending() {
  for (;;) {
    int fd = ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) return {};
      if (err == EINTR || err == ECONNABORTED || err == EPROTO) {
        spdlog::debug("store server: a client left before accept: {}", errno_text(err));
        continue;
      }
      return error_code(err, boost::system::system_category());
    }
    tcp::socket s(io_);
    error_code ec;
    s.assign(listen_protocol_, fd, ec);
    if (ec) {
      ::close(fd);
      return ec;
    }
    on_accept(std::move(s));
  }
}

void StoreServer::Impl::on_accept(tcp::socket s) {
  error_code ignored;
  s.non_blocking(true, ignored);  // TCP_NODELAY comes from the listener
  auto c = std::make_shared<Conn>(std::move(s), limits_, next_id_++);
  if (spdlog::should_log(spdlog::level::trace)) {
    auto ep = c->sock.remote_endpoint(ignored);
    spdlog::trace("store server: connection {} from {}:{}", c->id, ep.address().to_string(),
                  ep.port());
  }
  conns_.emplace(c->id, c);
  nconn_.store(conns_.size(), std::memory_order_relaxed);
  arm_read(c);
}

// lease_why: how the lease lines say it ended ("connection closed" when empty).
void StoreServer::Impl::close(Conn& c, std::string_view why, std::string_view lease_why) {
  if (c.closed) return;
  c.closed = true;
  recount_behind(c);  // none: its output goes
  if (spdlog::should_log(spdlog::level::debug))
    spdlog::debug("store server: closing connection {} ({}): {}", c.id, peer(c), why);
  cancel_waits(c);
  unwatch(c);
  if (c.leased) end_lease(c, lease_why.empty() ? std::string_view("connection closed") : lease_why);
  error_code ignored;
  c.sock.close(ignored);
  c.out.clear();
  c.out.shrink_to_fit();
  c.out_off = 0;
  c.rpos = c.rlen = 0;
  auto keep = c.shared_from_this();  // conns_ may hold the last reference
  conns_.erase(c.id);
  nconn_.store(conns_.size(), std::memory_order_relaxed);
}

// A client that broke the protocol (a value over the 8 MiB limit, say) is disconnected. Said
// at warning level: a torch client then fails with a bare "Broken pipe" and never
// reconnects, and this line is all that tells why. The first few only: a port scanner or a
// stray client must not flood the log.
void StoreServer::Impl::close_broken(Conn& c, const std::string& why) {
  constexpr size_t kSaid = 5;
  if (broken_++ < kSaid)
    spdlog::warn("store server: disconnected the client at {} for breaking the protocol: {}{}", peer(c), why,
                 broken_ == kSaid ? " (further ones are logged at debug level)" : "");
  close(c, fmt::format("protocol error: {}", why));
}

// The client's address, for log lines ("?" once the socket is closed).
std::string StoreServer::Impl::peer(const Conn& c) const {
  error_code e;
  auto ep = c.sock.remote_endpoint(e);
  if (e) return "?";
  auto a = ep.address();
  if (a.is_v6() && a.to_v6().is_v4_mapped()) a = a.to_v6().to_v4();  // dual-stack listener
  return a.is_v6() ? fmt::format("[{}]:{}", a.to_string(), ep.port())
                   : fmt::format("{}:{}", a.to_string(), ep.port());
}

// The client sees the refusal as its connection closing: neither wire generation has an
// error reply, and a torch client would misread anything else as its reply.
void StoreServer::Impl::refuse(Conn& c, proto::Op op, const Refused& e) {
  spdlog::warn("store server: refused {} from {} (connection {}): {}; closing its connection",
               proto::op_name(op), peer(c), c.id, e.what());
  close(c, fmt::format("refused {}: {}", proto::op_name(op), e.what()));
}

// ---------------------------------------------------------------------------------------
// Reading and writing

void StoreServer::Impl::arm_read(const ConnPtr& c) {
  if (c->closed || c->reading) return;
  c->rpos = c->rlen = 0;
  c->reading = true;
  c->sock.async_read_some(asio::buffer(c->rbuf), [this, c](error_code ec, size_t n) {
    c->reading = false;
    if (c->closed) return;
    if (ec) {
      close(*c, ec == asio::error::eof ? "closed by the client" : ec.message());
      flush_dirty();
      return;
    }
    on_read(c, n);
  });
}

void StoreServer::Impl::on_read(const ConnPtr& c, size_t n) {
  c->rpos = 0;
  c->rlen = n;
  // A client that fills the small buffer sends bulk data: give it a large one.
  if (n == c->rbuf.size() && c->rbuf.size() < kLargeReadBuffer) c->rbuf.resize(kLargeReadBuffer);
  pump(c);
}

// Handles what was read and then reads more, unless unsent replies pile up: then the
// connection is paused, and flush() resumes it once they drained.
void StoreServer::Impl::pump(const ConnPtr& c) {
  c->paused = false;
  while (!c->closed) {
    if (c->pending() > kPauseReadingAbove) {
      c->paused = true;  // a write is in progress (flush_dirty ran after the last output)
      return;
    }
    if (c->rpos == c->rlen) {
      arm_read(c);
      return;
    }
    process(*c);
    flush_dirty();
  }
}

void StoreServer::Impl::process(Conn& c) {
  while (c.rpos < c.rlen && !c.closed && c.pending() <= kPauseReadingAbove) {
    size_t used = 0;
    auto st = c.parser.feed(c.rbuf.data() + c.rpos, c.rlen - c.rpos, used);
    c.rpos += used;
    if (st == proto::RequestParser::Status::kNeedMore) break;
    if (st == proto::RequestParser::Status::kError) {
      close_broken(c, c.parser.error());
      return;
    }
    proto::Request req = c.parser.take();
    if (c.leased) heard(c);
    try {
      if (size_t bytes = reply_bytes(req)) check_reply(c, bytes);
      handle(c, req);
    } catch (const Refused& e) {
      refuse(c, req.op, e);
    } catch (const Violation& e) {
      close_broken(c, e.what());
    } catch (const std::exception& e) {
      close(c, fmt::format("{} failed: {}", proto::op_name(req.op), e.what()));
    }
  }
}

std::string& StoreServer::Impl::out(Conn& c) {
  if (!c.dirty) {
    c.dirty = true;
    dirty_.push_back(c.shared_from_this());
  }
  return c.out;
}

void StoreServer::Impl::flush_dirty() {
  while (!dirty_.empty()) {
    auto list = std::move(dirty_);
    dirty_.clear();
    for (auto& c : list) {
      c->dirty = false;
      if (c->closed || over_output_budget(*c)) continue;
      flush(c);
    }
  }
}

// Keeps behind_total_ up to date with c's output queued behind what it is being sent.
uint64_t StoreServer::Impl::recount_behind(Conn& c) {
  const uint64_t now = c.closed ? 0 : c.queued_behind();
  behind_total_ = behind_total_ - c.counted_behind + now;
  c.counted_behind = now;
  return now;
}

// Closes c (true) when the output it does not read is over its own cap, or when the server
// holds more such output than max_total_pending_output_bytes in all and c has a share of it
// (a client that reads has almost none queued behind its batch, and is never cut off).
bool StoreServer::Impl::over_output_budget(Conn& c) {
  const uint64_t behind = recount_behind(c);
  if (behind > opt_.max_pending_output_bytes) {
    close(c, fmt::format("client does not read its replies ({} bytes unsent, {} of them queued behind the {} bytes "
                         "being written)",
                         c.pending(), behind, c.pending() - behind));
    return true;
  }
  if (behind_total_ <= opt_.max_total_pending_output_bytes || behind < kPauseReadingAbove) return false;
  const std::string why = fmt::format(
      "client does not read its replies ({} queued behind what it is being sent) while the server holds {} of such "
      "output for all its clients, over max_total_pending_output_bytes ({})",
      mib(behind), mib(behind_total_), mib(opt_.max_total_pending_output_bytes));
  spdlog::warn("store server: closing connection {} from {}: {}", c.id, peer(c), why);
  close(c, why);
  return true;
}

void StoreServer::Impl::flush(const ConnPtr& c) {
  if (c->closed || c->writing) return;
  while (c->pending() > 0) {
    error_code ec;
    size_t n = c->sock.write_some(asio::buffer(c->out.data() + c->out_off, c->pending()), ec);
    if (would_block(ec)) {
      if (c->out_off > 0 && c->out_off >= c->out.size() / 2) {
        c->out.erase(0, c->out_off);
        c->out_pos += c->out_off;
        c->out_off = 0;
      }
      recount_behind(*c);
      c->writing = true;
      c->sock.async_wait(tcp::socket::wait_write, [this, c](error_code e) {
        c->writing = false;
        if (c->closed) return;
        if (e) {
          close(*c, e.message());
          return;
        }
        flush(c);
      });
      return;
    }
    if (ec) {
      close(*c, fmt::format("write failed: {}", ec.message()));
      return;
    }
    c->out_off += n;
  }
  c->out_pos += c->out.size();
  c->out.clear();
  c->out_off = 0;
  recount_behind(*c);
  if (c->out.capacity() > (1u << 20)) c->out.shrink_to_fit();
  if (c->paused) {
    // Requests were left unhandled and reading stopped while replies piled up: go on,
    // outside this flush (which may run inside another connection's handling). The read
    // starts with an attempt, so requests that arrived meanwhile (and raised their
    // readiness edge then) are seen.
    c->paused = false;
    asio::post(io_, [this, c] { pump(c); });
  }
}

// ---------------------------------------------------------------------------------------
// Memory budget (StoreServerOptions::max_*): checked before a reply is built or a
// registration made; Refused closes the connection (refuse()).

// The size of r's reply when it depends on the data (0 for the fixed ones of 8 bytes or less).
size_t StoreServer::Impl::reply_bytes(const proto::Request& r) const {
  using proto::Op;
  auto value_size = [this](const std::string& k) -> size_t {
    auto it = kv_.find(k);
    return it == kv_.end() ? 0 : held(k, it->second).size();
  };
  switch (r.op) {
    case Op::kGet:
      return 8 + value_size(r.keys[0]);
    case Op::kGetFrom:  // the value from the offset on
    case Op::kLogFrom: {
      const size_t size = static_cast<size_t>(logical_size(r.keys[0]));
      const size_t from = static_cast<size_t>(std::max<int64_t>(r.i64, 0));
      return (r.op == Op::kLogFrom ? 24 : 8) + (size > from ? size - from : 0);
    }
    case Op::kCompareSet:  // at most the larger of the value, expected and desired
      return 8 + std::max({value_size(r.keys[0]), r.values[0].size(), r.values[1].size()});
    case Op::kMultiGet: {
      size_t n = 0;
      for (auto& k : r.keys) n += 8 + value_size(k);
      return n;
    }
    case Op::kList: {
      size_t n = 8;
      for (auto& [k, v] : kv_) n += 8 + k.size();
      return n;
    }
    case Op::kQueuePop: {
      auto it = queues_.find(r.keys[0]);
      return it == queues_.end() || it->second.empty() ? 8 : 16 + it->second.front().size();
    }
    default:
      return 0;
  }
}

void StoreServer::Impl::check_reply(const Conn& c, size_t bytes) const {
  if (bytes > opt_.max_reply_bytes)
    throw Refused(fmt::format("its reply would be {} bytes ({}), over the budget of {} bytes per reply "
                              "(max_reply_bytes)",
                              bytes, mib(bytes), opt_.max_reply_bytes));
  check_connection(c, bytes, "this reply");
}

// The connection's unsent replies and registrations, plus `bytes` more of `what`.
void StoreServer::Impl::check_connection(const Conn& c, size_t bytes, const char* what) const {
  const size_t held = c.pending() + c.held();
  if (held + bytes > opt_.max_connection_bytes)
    throw Refused(fmt::format("the connection would hold {} bytes ({} of unsent replies, {} of "
                              "registrations, {} of {}), over its budget of {} bytes "
                              "(max_connection_bytes)",
                              held + bytes, c.pending(), c.held(), bytes, what,
                              opt_.max_connection_bytes));
}

// count: registrations of this kind the connection holds; bytes: what the new one costs.
void StoreServer::Impl::check_registration(const Conn& c, size_t count, size_t cap, const char* what,
                                           const char* option, size_t bytes) const {
  if (count >= cap)
    throw Refused(fmt::format("it has {} {} pending already, the most allowed ({})", count, what, option));
  check_connection(c, bytes, "this registration");
}

// ---------------------------------------------------------------------------------------
// Operations

bool StoreServer::Impl::present(const std::string& key) const {
  if (kv_.count(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

// Every write wakes the key's waiters, as in PyTorch. Waiters normally sit on missing keys
// only; BARRIER's are on an existing key, as are WAITs registered before a barrier created
// its key, and a SET/ADD/... of that key releases them as torch's would.
void StoreServer::Impl::store_value(const std::string& key, std::string value, bool wake) {
  const bool watched = watchers_.count(key) > 0;
  auto [it, inserted] = kv_.try_emplace(key);
  std::string old = watched && !inserted ? std::string(held(key, it->second)) : std::string();
  if (!trimmed_.empty()) trimmed_.erase(key);  // a new value: its offsets start at 0
  it->second = std::move(value);
  if (watched) notify(key, inserted ? proto::kWatchCreated : proto::kWatchUpdated, old, it->second);
  if (wake) wake_all(key);
}

// PyTorch's LibUVStoreDaemon::barrier: the counter is the key's own value (decimal text,
// parsed like std::stoll, never reset). Only the arrival that reaches world_size wakes the
// key's waiters: earlier ones write the counter without waking anyone, even the first,
// which creates the key (a plain WAIT on the key returns at the last arrival, as in torch).
void StoreServer::Impl::barrier(Conn& c, const std::string& key, int64_t world_size) {
  int64_t count = 1;
  if (auto it = kv_.find(key); it != kv_.end()) {
    auto cur = proto::parse_counter(held(key, it->second));
    if (!cur)
      throw Violation(fmt::format("BARRIER on key '{}' whose value is not an integer", key));
    count = static_cast<int64_t>(static_cast<uint64_t>(*cur) + 1);
  }
  const bool last = count >= world_size;  // also every arrival when world_size <= 0
  if (!last)  // refused before it is counted
    check_registration(c, c.waits.size(), opt_.max_pending_waits, "waits", "max_pending_waits",
                       2 * kRegistrationOverhead + key.size());
  store_value(key, std::to_string(count), /*wake=*/last);
  if (last) {
    proto::put_u8(out(c), proto::kWaitStopWaiting);
    return;
  }
  wait_on(c, key);  // like a WAIT on this key, so CANCEL_WAIT and closing clean it up
}

// c waits on one key (as WAIT does); with grows_beyond >= 0, until its value is longer.
void StoreServer::Impl::wait_on(Conn& c, const std::string& key, int64_t grows_beyond) {
  auto w = std::make_unique<Wait>();
  w->conn = &c;
  w->regs.emplace_back(key);
  w->grows_beyond = grows_beyond;
  w->bytes = 2 * kRegistrationOverhead + key.size();
  check_registration(c, c.waits.size(), opt_.max_pending_waits, "waits", "max_pending_waits", w->bytes);
  add_wait(c, std::move(w));
}

// WAIT: answered at once if every key is present, else registered under each missing one
// (once per occurrence).
void StoreServer::Impl::wait_keys(Conn& c, const std::vector<std::string>& keys) {
  auto w = std::make_unique<Wait>();
  w->conn = &c;
  w->bytes = kRegistrationOverhead;
  for (auto& k : keys) {
    if (present(k)) continue;
    w->regs.emplace_back(k);
    w->bytes += kRegistrationOverhead + k.size();
  }
  if (w->regs.empty()) {
    proto::put_u8(out(c), proto::kWaitStopWaiting);
    return;
  }
  check_registration(c, c.waits.size(), opt_.max_pending_waits, "waits", "max_pending_waits", w->bytes);
  add_wait(c, std::move(w));
}

// Registers w under each of its keys and gives it to its connection.
void StoreServer::Impl::add_wait(Conn& c, std::unique_ptr<Wait> w) {
  for (size_t i = 0; i < w->regs.size(); ++i) {
    Wait::Reg& r = w->regs[i];
    r.list = &waiters_[r.key];
    r.at = r.list->emplace(r.list->end(), w.get(), i);
    r.live = true;
  }
  w->remaining = w->regs.size();
  w->slot = c.waits.size();
  c.wait_bytes += w->bytes;
  c.waits.push_back(std::move(w));
}

// Drops w from its connection's list in O(1) (destroying it): a connection may hold many.
void StoreServer::Impl::remove_wait(Wait* w) {
  Conn& c = *w->conn;
  c.wait_bytes -= w->bytes;
  const size_t i = w->slot;
  if (i + 1 != c.waits.size()) {
    std::swap(c.waits[i], c.waits.back());
    c.waits[i]->slot = i;
  }
  c.waits.pop_back();
}

// Takes registration i of w out of its key's list (dropping the key's list when it empties).
void StoreServer::Impl::unregister(Wait& w, size_t i) {
  Wait::Reg& r = w.regs[i];
  if (!r.live) return;
  r.live = false;
  r.list->erase(r.at);
  if (r.list->empty()) waiters_.erase(r.key);
}

// Every waiter on the key whose condition holds is released; WAIT_GROWS waiters whose key
// has not grown enough stay. A wait registered n times completes on the n-th release.
void StoreServer::Impl::wake_all(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::vector<std::pair<Wait*, size_t>> due;
  const int64_t size = logical_size(key);
  for (auto& [w, i] : it->second)
    if (w->grows_beyond < 0 || size > w->grows_beyond) due.emplace_back(w, i);
  std::vector<Wait*> done;
  for (auto [w, i] : due) {  // (the list, and then the key's entry, may go meanwhile)
    unregister(*w, i);
    if (--w->remaining == 0) done.push_back(w);
  }
  for (Wait* w : done) complete(w);
}

void StoreServer::Impl::append_value(const std::string& key, std::string value) {
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    store_value(key, std::move(value));
    return;
  }
  if (watchers_.count(key)) {
    std::string old(held(key, it->second));
    it->second += value;
    notify(key, proto::kWatchUpdated, old, held(key, it->second));
  } else {
    it->second += value;
  }
  wake_all(key);
}

void StoreServer::Impl::wait_grows(Conn& c, const std::string& key, int64_t beyond) {
  if (logical_size(key) > beyond) {
    proto::put_u8(out(c), proto::kWaitStopWaiting);
    return;
  }
  wait_on(c, key, std::max<int64_t>(beyond, 0));
}

// The value's length counted from its first byte ever (its trimmed bytes included).
int64_t StoreServer::Impl::logical_size(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) return 0;
  auto t = trimmed_.find(key);
  if (t == trimmed_.end()) return static_cast<int64_t>(it->second.size());
  return static_cast<int64_t>(it->second.size() - t->second.dead) + t->second.bytes;
}

// The value as clients see it: without the bytes TRIM_LOG dropped that are still stored.
std::string_view StoreServer::Impl::held(const std::string& key, const std::string& stored) const {
  if (trimmed_.empty()) return stored;
  auto t = trimmed_.find(key);
  return t == trimmed_.end() ? std::string_view(stored) : std::string_view(stored).substr(t->second.dead);
}

// TRIM_LOG: drops the value's whole lines before line `line`; returns the first line held.
int64_t StoreServer::Impl::trim_log(const std::string& key, int64_t line) {
  auto it = kv_.find(key);
  if (it == kv_.end()) return 0;
  auto t = trimmed_.find(key);
  Trimmed now = t == trimmed_.end() ? Trimmed{} : t->second;
  const std::string& v = it->second;
  size_t cut = now.dead;
  for (size_t nl; now.lines < line && (nl = v.find('\n', cut)) != std::string::npos; ++now.lines) cut = nl + 1;
  if (cut == now.dead) return now.lines;
  now.bytes += static_cast<int64_t>(cut - now.dead);
  now.dead = cut;
  if (now.dead >= v.size() - now.dead) {  // moving what is held costs no more than was dropped
    it->second.erase(0, now.dead);
    now.dead = 0;
  }
  trimmed_[key] = now;
  return now.lines;
}

// ---------------------------------------------------------------------------------------
// ddprun's lease: a connection's lines are appended when it closes or falls silent.

void StoreServer::Impl::start_lease(Conn& c, int64_t ttl_ms) {
  c.leased = true;
  // Longer than any job (and than the clock's nanoseconds can count from now): no timer.
  if (ttl_ms > kLongestLeaseTtl.count()) ttl_ms = 0;
  c.lease_ttl = std::chrono::milliseconds(std::max<int64_t>(ttl_ms, 0));
  heard(c);
  if (c.lease_ttl.count() == 0) return;
  detail::bound_lease_retransmits(c.sock.native_handle(), c.lease_ttl);  // its replies too
  arm_stall_tick();
  if (!c.lease_timer) c.lease_timer = std::make_unique<asio::steady_timer>(io_);
  arm_lease_timer(c.shared_from_this(), c.lease_ttl);
}

void StoreServer::Impl::heard(Conn& c) {
  c.last_request = std::chrono::steady_clock::now();
  c.stalled_at_request = stalled_by(c.last_request);
}

// The lease's clock counts only the time this server ran: a client cannot be heard while
// the server itself does not run (its process stopped, starved, or its VM paused; the store
// host's own lease keeper stalls with it).
std::chrono::steady_clock::duration StoreServer::Impl::silence(const Conn& c, std::chrono::steady_clock::time_point now) const {
  return now - c.last_request - (stalled_by(now) - c.stalled_at_request);
}

// The time this server did not run so far: the ticks' lateness, and the tick in progress's
// once it is past due (a lease timer, or a request, handled after a stall but before that
// tick ran sees the stall too: a request read then must not get it counted off its silence
// later).
std::chrono::steady_clock::duration StoreServer::Impl::stalled_by(std::chrono::steady_clock::time_point now) const {
  if (!ticking_) return stalled_;
  return stalled_ + std::max<std::chrono::steady_clock::duration>(now - stall_tick_.expiry(), {});
}

// Once started, ticks until the server stops (ten wake-ups a second, on the store host only
// while a rendezvous uses it). Undercounts a stall by at most one tick.
void StoreServer::Impl::arm_stall_tick() {
  if (ticking_) return;
  ticking_ = true;
  stall_tick_.expires_after(kStallTick);
  stall_tick_.async_wait([this](error_code e) {
    if (e) return;
    auto now = std::chrono::steady_clock::now();
    stalled_ += std::max<std::chrono::steady_clock::duration>(now - stall_tick_.expiry(), {});
    ticking_ = false;
    arm_stall_tick();
  });
}

// A lease ends on the timer once the client was silent for the ttl while the server ran;
// a client whose request waits unread was not silent.
void StoreServer::Impl::arm_lease_timer(const ConnPtr& c, std::chrono::steady_clock::duration after) {
  c->lease_timer->expires_after(after);
  c->lease_timer->async_wait([this, c](error_code e) {
    if (e || c->closed) return;
    auto now = std::chrono::steady_clock::now();
    if (auto silent = silence(*c, now); silent < c->lease_ttl) {
      arm_lease_timer(c, c->lease_ttl - silent);
      return;
    }
    error_code ec;
    if (c->rpos < c->rlen || c->sock.available(ec) > 0) {
      heard(*c);
      arm_lease_timer(c, c->lease_ttl);
      return;
    }
    auto ms = [](auto d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d); };
    auto silent = silence(*c, now), wall = now - c->last_request;
    std::string why = fmt::format("no keep-alive for {}", format_duration(ms(silent)));
    if (wall - silent >= kStallTick)
      why += fmt::format(" (and {} more while this server did not run)", format_duration(ms(wall - silent)));
    close(*c, why, why);
    flush_dirty();
  });
}

void StoreServer::Impl::end_lease(Conn& c, std::string_view why) {
  c.leased = false;
  if (c.lease_timer) c.lease_timer->cancel();
  if (shutting_down_) return;
  auto lines = std::move(c.lease_lines);
  c.lease_lines.clear();
  c.lease_index.clear();
  c.lease_bytes = 0;
  for (auto& [key, value] : lines) append_value(key, value + std::string(why) + "\n");
}

// QUEUE_PUSH: the oldest WAIT on the key takes every one of its registrations there; the
// next one too while the one before still waits for other keys. WAIT_GROWS waits for the
// key's value, not its queue, and is passed over.
void StoreServer::Impl::wake_one(const std::string& key) {
  for (;;) {
    auto it = waiters_.find(key);
    if (it == waiters_.end()) return;
    auto first = std::find_if(it->second.begin(), it->second.end(), [](auto& e) { return e.first->grows_beyond < 0; });
    if (first == it->second.end()) return;
    Wait* w = first->first;
    for (size_t i = 0; i < w->regs.size(); ++i)
      if (w->regs[i].live && w->regs[i].key == key) {
        unregister(*w, i);
        --w->remaining;
      }
    if (w->remaining == 0) {
      complete(w);
      return;
    }
  }
}

void StoreServer::Impl::complete(Wait* w) {
  proto::put_u8(out(*w->conn), proto::kWaitStopWaiting);
  remove_wait(w);
}

// At the cost of c's own registrations, whoever else waits on the same keys.
void StoreServer::Impl::cancel_waits(Conn& c) {
  for (auto& w : c.waits)
    for (size_t i = 0; i < w->regs.size(); ++i) unregister(*w, i);
  c.waits.clear();
  c.wait_bytes = 0;
}

void StoreServer::Impl::notify(const std::string& key, uint8_t type, std::string_view old_value,
                               std::string_view new_value) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  for (Conn* w : it->second) {
    auto& o = out(*w);
    proto::put_u8(o, type);
    proto::put_str(o, key);
    proto::put_str(o, old_value);
    proto::put_str(o, new_value);
  }
}

void StoreServer::Impl::unwatch(Conn& c) {
  for (auto& k : c.watched) {
    auto it = watchers_.find(k);
    if (it == watchers_.end()) continue;
    std::erase(it->second, &c);
    if (it->second.empty()) watchers_.erase(it);
  }
  c.watched.clear();
  c.watch_bytes = 0;
}

void StoreServer::Impl::watch(Conn& c, const std::string& key) {
  auto it = watchers_.find(key);
  if (it != watchers_.end() && std::find(it->second.begin(), it->second.end(), &c) != it->second.end())
    return;  // watched already
  const size_t bytes = kRegistrationOverhead + key.size();
  check_registration(c, c.watched.size(), opt_.max_watches, "watched keys", "max_watches", bytes);
  watchers_[key].push_back(&c);
  c.watched.push_back(key);
  c.watch_bytes += bytes;
}

void StoreServer::Impl::add_lease_line(Conn& c, std::string key, std::string value) {
  const size_t bytes = kRegistrationOverhead + key.size() + value.size();
  check_registration(c, c.lease_lines.size(), opt_.max_lease_lines, "lease-end lines",
                     "max_lease_lines", bytes);
  c.leased = true;  // without LEASE: the lines are written when the connection closes
  auto& at = c.lease_index[key];
  at.push_back(c.lease_lines.emplace(c.lease_lines.end(), std::move(key), std::move(value)));
  c.lease_bytes += bytes;
}

void StoreServer::Impl::drop_lease_lines(Conn& c, const std::string& key) {
  c.leased = true;
  auto f = c.lease_index.find(key);
  if (f == c.lease_index.end()) return;
  for (auto l : f->second) {
    c.lease_bytes -= kRegistrationOverhead + l->first.size() + l->second.size();
    c.lease_lines.erase(l);
  }
  c.lease_index.erase(f);
}

void StoreServer::Impl::handle(Conn& c, proto::Request& r) {
  using proto::Op;
  const bool gen1 = proto::is_gen1(c.parser.generation());
  switch (r.op) {
    case Op::kValidate:  // the parser checked the magic
      break;
    case Op::kPing:
      proto::put_u32(out(c), r.u32);
      break;
    case Op::kSet:
      store_value(r.keys[0], std::move(r.values[0]));
      break;
    case Op::kCompareSet:
      compare_set(c, r.keys[0], r.values[0], r.values[1]);
      break;
    case Op::kGet:
      get(c, r.keys[0], gen1);
      break;
    case Op::kAdd:
      add(c, r.keys[0], r.i64);
      break;
    case Op::kCheck: {
      bool all = std::all_of(r.keys.begin(), r.keys.end(), [&](auto& k) { return present(k); });
      proto::put_u8(out(c), all ? proto::kCheckReady : proto::kCheckNotReady);
      break;
    }
    case Op::kWait:
      wait_keys(c, r.keys);
      break;
    case Op::kGetNumKeys:
      proto::put_i64(out(c), static_cast<int64_t>(kv_.size()));
      break;
    case Op::kWatchKey:
      watch(c, r.keys[0]);
      proto::put_u8(out(c), proto::kWatchRegistered);
      break;
    case Op::kDeleteKey:
      delete_key(c, r.keys[0]);
      break;
    case Op::kAppend:
      append_value(r.keys[0], std::move(r.values[0]));
      break;
    case Op::kMultiGet:
      multi_get(c, r.keys, gen1);
      break;
    case Op::kMultiSet:
      for (size_t i = 0; i < r.keys.size(); ++i) store_value(r.keys[i], std::move(r.values[i]));
      break;
    case Op::kCancelWait:
      cancel_waits(c);
      proto::put_u8(out(c), proto::kWaitCanceled);
      break;
    case Op::kQueuePush:
      queues_[r.keys[0]].push_back(std::move(r.values[0]));
      wake_one(r.keys[0]);
      break;
    case Op::kQueuePop:
      queue_pop(c, r.keys[0]);
      break;
    case Op::kQueueLen: {
      auto it = queues_.find(r.keys[0]);
      proto::put_i64(out(c), it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size()));
      break;
    }
    case Op::kList: {
      std::string& o = out(c);
      proto::put_i64(o, static_cast<int64_t>(kv_.size()));
      for (auto& [k, v] : kv_) proto::put_str(o, k);
      break;
    }
    case Op::kBarrier:
      barrier(c, r.keys[0], r.i64);
      break;
    default:
      handle_extension(c, r);
  }
}

// The requests PyTorch's TCPStore does not know (docs/store.md, "ddprun's extensions").
void StoreServer::Impl::handle_extension(Conn& c, proto::Request& r) {
  using proto::Op;
  switch (r.op) {
    case Op::kLease:
      lease(c, r.i64);
      break;
    case Op::kOnLeaseEnd:
      if (r.values[0].empty()) drop_lease_lines(c, r.keys[0]);  // a finished round's (docs/store.md)
      else add_lease_line(c, std::move(r.keys[0]), std::move(r.values[0]));
      proto::put_u8(out(c), 0);
      break;
    case Op::kWaitGrows:
      wait_grows(c, r.keys[0], r.i64);
      break;
    case Op::kGetFrom:
    case Op::kLogFrom:
      read_log(c, r.op, r.keys[0], r.i64);
      break;
    case Op::kTrimLog:
      if (!opt_.log_trim) throw Violation("TRIM_LOG: log trimming is off");
      proto::put_i64(out(c), trim_log(r.keys[0], r.i64));
      break;
    default:
      throw Violation(fmt::format("unknown request {}", static_cast<int>(r.op)));
  }
}

void StoreServer::Impl::compare_set(Conn& c, const std::string& key, std::string& expected, std::string& desired) {
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    if (expected.empty()) {
      proto::put_str(out(c), desired);
      store_value(key, std::move(desired));
    } else {
      // PyTorch's reply: nothing was set. Its libuv server also wakes the key's waiters
      // here; ours does not (a torch bug, docs/store.md).
      proto::put_str(out(c), expected);
    }
    return;
  }
  if (held(key, it->second) == expected)
    store_value(key, std::move(desired));
  else
    wake_all(key);  // as PyTorch's libuv server (waits on a present key: BARRIER's)
  proto::put_str(out(c), held(key, kv_.find(key)->second));
}

void StoreServer::Impl::get(Conn& c, const std::string& key, bool gen1) {
  auto it = kv_.find(key);
  if (it != kv_.end())
    proto::put_str(out(c), held(key, it->second));
  else if (gen1)
    throw Violation(fmt::format("GET of missing key '{}'", key));
  else
    proto::put_str(out(c), "");
}

void StoreServer::Impl::add(Conn& c, const std::string& key, int64_t delta) {
  int64_t v = delta;
  auto it = kv_.find(key);
  if (it != kv_.end()) {
    auto cur = proto::parse_counter(held(key, it->second));
    if (!cur) throw Violation(fmt::format("ADD on key '{}' whose value is not an integer", key));
    v = static_cast<int64_t>(static_cast<uint64_t>(*cur) + static_cast<uint64_t>(v));
  }
  store_value(key, std::to_string(v));
  proto::put_i64(out(c), v);
}

void StoreServer::Impl::delete_key(Conn& c, const std::string& key) {
  auto it = kv_.find(key);
  int64_t n = 0;
  if (it != kv_.end()) {
    std::string old = watchers_.count(key) ? std::string(held(key, it->second)) : std::string();
    kv_.erase(it);
    trimmed_.erase(key);
    n = 1;
    notify(key, proto::kWatchDeleted, old, "");
  }
  proto::put_i64(out(c), n);
}

void StoreServer::Impl::multi_get(Conn& c, const std::vector<std::string>& keys, bool gen1) {
  std::string& o = out(c);
  for (auto& k : keys) {
    auto it = kv_.find(k);
    if (it == kv_.end() && gen1) throw Violation(fmt::format("MULTI_GET of missing key '{}'", k));
    proto::put_str(o, it == kv_.end() ? std::string_view() : held(k, it->second));
  }
}

void StoreServer::Impl::queue_pop(Conn& c, const std::string& key) {
  auto it = queues_.find(key);
  std::string& o = out(c);
  if (it == queues_.end() || it->second.empty()) {
    proto::put_i64(o, 0);
    return;
  }
  proto::put_i64(o, static_cast<int64_t>(it->second.size()));
  proto::put_str(o, it->second.front());
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
}

void StoreServer::Impl::lease(Conn& c, int64_t ttl_ms) {
  if (ttl_ms < 0) {  // released: the connection leaves in good order, its lines unwritten
    c.leased = false;
    c.lease_lines.clear();
    c.lease_bytes = 0;
    if (c.lease_timer) c.lease_timer->cancel();
  } else {
    start_lease(c, ttl_ms);
  }
  proto::put_u8(out(c), 0);
}

// GET_FROM (a value from a byte on) and LOG_FROM (the same, after where the held part of a
// trimmed log begins, in bytes and lines). GET_FROM at kFeaturesOffset asks the features.
void StoreServer::Impl::read_log(Conn& c, proto::Op op, const std::string& key, int64_t offset) {
  const bool log_from = op == proto::Op::kLogFrom;
  if (log_from && !opt_.log_trim) throw Violation("LOG_FROM: log trimming is off");
  if (!log_from && offset == proto::kFeaturesOffset && opt_.log_trim) {
    proto::put_str(out(c), proto::kFeatureLogTrim);
    return;
  }
  auto it = kv_.find(key);
  auto t = trimmed_.find(key);
  const Trimmed dropped = t == trimmed_.end() ? Trimmed{} : t->second;
  // Below the trimmed bytes: from the first byte held (LOG_FROM says where that is).
  const size_t from = static_cast<size_t>(std::max<int64_t>(offset, dropped.bytes) - dropped.bytes);
  if (log_from) {
    proto::put_i64(out(c), dropped.bytes);
    proto::put_i64(out(c), dropped.lines);
  }
  const std::string_view value = it == kv_.end() ? std::string_view() : held(key, it->second);
  proto::put_str(out(c), value.size() <= from ? std::string_view() : value.substr(from));
}

// ---------------------------------------------------------------------------------------

StoreServer::StoreServer(StoreServerOptions o) : impl_(std::make_unique<Impl>(std::move(o))) {}
StoreServer::~StoreServer() = default;
uint16_t StoreServer::port() const { return impl_->port(); }
void StoreServer::start() { impl_->start(); }
void StoreServer::stop() { impl_->stop(); }
size_t StoreServer::num_connections() const { return impl_->num_connections(); }

}  // namespace ddp::detail
