// The launcher's side of the rendezvous for every multi-node job: the backend and who
// hosts it, this node's identity, and the round plans as JobPlans.
//   static (--node-rank): node 0's ddprun hosts the store at --master-addr:--master-port;
//     the node count is fixed (min = max = --nnodes) and so are the node ranks; every
//     round's workers use that same store (as torchrun's static rendezvous does)
//   c10d: a store at --rdzv-endpoint, hosted by the node it names (or by anyone)
//   etcd: nobody hosts it
// With c10d and etcd each round's node rank 0 hosts that round's worker store
// (DynamicRendezvous). Either way the workers' store is an agent's:
// TORCHELASTIC_USE_AGENT_STORE=True.
#include <unistd.h>

#include <cerrno>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "launcher/background.hpp"
#include "launcher/net.hpp"
#include "launcher/random.hpp"
#include "launcher/rendezvous.hpp"
#include "rendezvous/etcd/etcd_backend.hpp"
#include "rendezvous/store_backend.hpp"
#include "store/server.hpp"

namespace ddprun {

namespace {

// A round whose MASTER_ADDR is a loopback address while some of its nodes are on other
// hosts (node rank 0 has no other interface that is up, and reached the endpoint over
// loopback, e.g. through a tunnel) cannot run: every node says so at once, rather than
// its workers timing out connecting to an address that is their own machine. (An endpoint
// that is itself a loopback name puts every node on one machine.)
void check_master_reachable(const rdzv::RoundPlan& r, const std::string& endpoint_host) {
  if (r.members.empty() || is_loopback_host(endpoint_host) || !is_loopback_host(r.master_addr)) return;
  const rdzv::NodeDesc& master = r.members.front();
  for (const rdzv::NodeDesc& n : r.members)
    if (n.host != master.host)
      throw ddp::Error(fmt::format(
          "rendezvous: no usable address: node rank 0, {}, published MASTER_ADDR={}, a loopback address, as it "
          "has no other network interface that is up, but {} is another host, whose workers cannot reach it; "
          "bring up a network interface on {}, or give it --local-addr with an address the other hosts reach",
          master.describe(), r.master_addr, n.describe(), master.host));
}

using std::chrono::milliseconds;

milliseconds seconds(double s) { return milliseconds(static_cast<long>(s * 1000)); }

std::string endpoint_text(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

class NodeRendezvous : public Rendezvous {
 public:
  NodeRendezvous(const Options& o, std::string hostname);
  ~NodeRendezvous() override {
    if (d_) stop_ahead();
    d_.reset();
    if (server_) server_->stop();
  }

  JobPlan next_round() override;
  int notify_fd() override { return d_->notify_fd(); }
  std::optional<RoundEnd> round_end() override { return d_->round_end(); }
  // Posted: the notes go out in order, each after the one before, on threads of their own.
  void end_round(RoundEnd::Kind kind, const std::string& what) override {
    post_note([d = d_.get(), kind, what] { d->end_round(kind, what); });
  }
  std::optional<RoundEnd> arrive_exit() override {
    // The watcher tells how the round ends (notify_fd).
    post_note([d = d_.get()] {
      try {
        d->arrive_exit();
      } catch (const std::exception& e) {
        spdlog::error("rendezvous: cannot tell the other nodes (exit): {}", e.what());
      }
    });
    return std::nullopt;
  }
  std::string restart_refused(const RoundEnd& end) override {
    if (!refusal_.valid()) {
      // The rendezvous's calls share one backend object with the notes.
      if (auto cut = notes_out_or_cut_off(d_.get(), note_.get())) return *cut;
      return d_->restart_refused(end);
    }
    std::string why = refusal_.get();
    refusal_ = {};
    ahead_refused_ = !why.empty();  // then prejoin's thread ends without joining
    return why;
  }
  void prejoin(const RoundEnd& end) override {
    if (ahead_.valid()) return;
    auto refusal = std::make_shared<std::promise<std::string>>();
    refusal_ = refusal->get_future();
    ahead_ = std::async(std::launch::async, [this, before = note_, end, refusal]() -> std::optional<rdzv::RoundPlan> {
      std::string why = notes_out_or_cut_off(d_.get(), before.get()).value_or("");
      try {
        if (why.empty()) why = d_->restart_refused(end);
      } catch (const std::exception& e) {
        why = fmt::format("{}; and the rendezvous cannot be read: {}", end.describe(), e.what());
      }
      refusal->set_value(why);
      if (!why.empty()) return std::nullopt;
      return d_->next_round();
    });
  }
  void cancel() override { d_->cancel(); }
  void ask_dump(const std::string& what) override {
    post_note([d = d_.get(), what] {
      try {
        d->ask_dump(what);
      } catch (const std::exception& e) {
        spdlog::warn("rendezvous: cannot ask the other nodes for their stacks: {}", e.what());
      }
    });
  }
  std::vector<std::string> dump_requests() override { return d_->take_dump_requests(); }
  void answer_dump(const std::string& what, const std::string& answer) override {
    post_note([d = d_.get(), what, answer] {
      try {
        d->answer_dump(what, answer);
      } catch (const std::exception& e) {
        spdlog::warn("rendezvous: cannot send this node's stacks to the node that asked ({}): {}", what, e.what());
      }
    });
  }
  void gather_dump(const std::string& what, size_t nodes, Deadline deadline) override {
    d_->gather_dump(what, nodes, deadline);
  }
  std::vector<DumpAnswers> dump_answers() override { return d_->take_dump_answers(); }
  void note_progress(int64_t delta) override {
    if (progress_->busy.exchange(true)) return;  // the last one is still out: the next check asks again
    post_note([d = d_.get(), delta, p = progress_] {
      try {
        const int64_t count = d->add_progress(delta);
        p->read_at = std::chrono::steady_clock::now().time_since_epoch().count();
        p->count = count;
      } catch (const std::exception& e) {
        spdlog::debug("rendezvous: progress count: {}", e.what());
      }
      p->busy = false;
    });
  }
  std::optional<JobProgress> job_progress() override {
    const int64_t v = progress_->count;
    if (v < 0) return std::nullopt;
    using Clock = std::chrono::steady_clock;
    return JobProgress{v, Clock::time_point(Clock::duration(progress_->read_at.load()))};
  }
  void finish(FinishKind kind, const std::string& reason, std::optional<Deadline> deadline) override;

 private:
  std::unique_ptr<rdzv::Backend> open_static();
  std::unique_ptr<rdzv::Backend> open_c10d(bool& hosting);
  std::unique_ptr<rdzv::Backend> open_etcd() const;
  bool decide_host(std::string& why) const;
  bool host_store(bool inferred, const std::string& why);
  void bind_store(const ddp::detail::StoreServerOptions& so, bool inferred);
  std::string blocked_port_text(int port) const;
  // hosting: this node hosts the store. Else `why` says why this node would host it or not,
  // and taken whether it tried but found the port in use: the hint when the store cannot be
  // reached.
  std::unique_ptr<rdzv::StoreBackend> connect(bool hosting, const std::string& why, bool taken = false);
  // connect_host empty: no address to publish (static: the workers' store is node 0's).
  rdzv::NodeDesc describe_me(const std::string& connect_host, int port) const;
  rdzv::DynamicConfig config(bool hosting) const;

  const Options& o_;
  std::string hostname_;
  int port_ = 0;  // the store's port (the endpoint's, or the one picked for port 0)
  std::unique_ptr<ddp::detail::StoreServer> server_;
  std::unique_ptr<rdzv::DynamicRendezvous> d_;
  std::future<std::optional<rdzv::RoundPlan>> ahead_;  // prejoin()'s next_round (nullopt: refused)
  std::future<std::string> refusal_;                    // prejoin()'s restart_refused
  bool ahead_refused_ = false;                          // prejoin() found no round may follow
  std::shared_ptr<BackgroundTask> note_;  // the last note posted (end_round, arrive_exit)
  struct ProgressCount {
    std::atomic<int64_t> count{-1};  // the job-wide progress count as last heard
    std::atomic<int64_t> read_at{0};  // when (steady clock ticks)
    std::atomic<bool> busy{false};   // a note_progress is out
  };
  std::shared_ptr<ProgressCount> progress_ = std::make_shared<ProgressCount>();
  // When the goodbye after a signal is given up (steady clock ticks; 0: not leaving): a
  // connection still being tried then says what it is for, and until when.
  std::shared_ptr<std::atomic<int64_t>> leaving_by_ = std::make_shared<std::atomic<int64_t>>(0);

  // The notes use the rendezvous's main backend object, which one thread at a time may use
  // (etcd's HTTP session is not shared): calls from this thread wait for them first.
  void wait_notes() const {
    if (note_) note_->wait();
  }

  // Waits until the notes posted so far have gone out; unless this node is cut off from the
  // backend meanwhile (its lease's keeper heard nothing for the keep-alive window: the store
  // or its host frozen, a partition), when a note may wait out its own timeout (a new
  // connection's is join_timeout) and no round can follow here anyway: then how it was cut off.
  static std::optional<std::string> notes_out_or_cut_off(rdzv::DynamicRendezvous* d, const BackgroundTask* last) {
    if (!last) return std::nullopt;
    while (!last->wait_until(BackgroundTask::Clock::now() + milliseconds(50)))
      if (auto cut = d->cut_off()) return cut->text;
    return std::nullopt;
  }

  // Runs `note` on a thread of its own once the note posted before it has gone out.
  void post_note(std::function<void()> note) {
    note_ = std::make_shared<BackgroundTask>([before = note_, note = std::move(note)] {
      if (before) before->wait();
      note();
    });
  }

  void abandon();
  void stop_ahead() {
    if (!ahead_.valid()) return;
    d_->cancel();
    try {
      ahead_.get();
    } catch (const std::exception&) {
    }
  }
};

// With a deadline the whole goodbye runs on a thread of its own; past the deadline it is
// abandoned, with the rendezvous object (its threads may still be in a call): the process
// is about to end (background.hpp).
void NodeRendezvous::finish(FinishKind kind, const std::string& reason, std::optional<Deadline> deadline) {
  if (!d_) return;
  // Owns what it uses: nothing of this adapter but the rendezvous, leaked if abandoned.
  auto goodbye = [d = d_.get(), ahead = std::make_shared<decltype(ahead_)>(std::move(ahead_)), refused = ahead_refused_,
                  note = note_, kind, reason] {
    if (ahead->valid()) {
      // A join in progress is cancelled, and the goodbye below is skipped (the lease's end
      // tells the others), except by the store's host: it still closes the job and waits
      // for the others to leave. A prejoin that was refused is not joining: the goodbye runs.
      if (!refused) d->cancel();
      try {
        ahead->get();
      } catch (const std::exception&) {
      }
    }
    // Cut off from the backend, a note still out may wait out its own timeout: the lease's
    // end tells the others.
    if (notes_out_or_cut_off(d, note.get())) return;
    d->finish(kind, reason);
  };
  if (!deadline) {
    goodbye();
  } else {
    leaving_by_->store(deadline->time_since_epoch().count());
    BackgroundTask bye(goodbye);
    if (!bye.wait_until(*deadline)) {
      bye.abandon();
      return abandon();
    }
  }
  if (note_ && !note_->wait_until(BackgroundTask::Clock::now())) return abandon();  // cut off, a note still out
  d_.reset();
  if (server_) server_->stop();
}

// What still runs inside the rendezvous (a note, the goodbye) is left to itself, with the
// rendezvous object: the process is about to end (background.hpp).
void NodeRendezvous::abandon() {
  spdlog::warn("{}", unsent_note());
  d_->cancel();
  if (note_) note_->abandon();
  (void)d_.release();
  if (server_) server_->stop();
}

// --rdzv-conf is_host when given; else whether the endpoint names this machine.
bool NodeRendezvous::decide_host(std::string& why) const {
  if (o_.rdzv_conf.is_host) {
    why = fmt::format("--rdzv-conf is_host={}", *o_.rdzv_conf.is_host ? 1 : 0);
    return *o_.rdzv_conf.is_host;
  }
  return names_this_machine(o_.rdzv_host, hostname_, why);
}

// Agents that start together on the endpoint's machine all try to host: the first
// listens, the others find the port in use and join it. But two whose listen() calls meet
// can each make the other's fail (the kernel sees the other half-way into listening), and
// then nobody hosts: when hosting is inferred, a port in use with nobody accepting behind
// the endpoint is bound again, for up to 2 s. Still blocked then, it is held by something
// that does not listen (a connection of this machine in TIME_WAIT, most likely): nobody
// can host there, and joining would wait out read_timeout for nothing.
void NodeRendezvous::bind_store(const ddp::detail::StoreServerOptions& so, bool inferred) {
  const auto until = std::chrono::steady_clock::now() + seconds(2);
  for (bool said = false;; said = true) {
    try {
      server_ = std::make_unique<ddp::detail::StoreServer>(so);
      return;
    } catch (const ddp::SystemError& e) {
      if (e.code() != EADDRINUSE || !inferred || accepts_connections(o_.rdzv_host, so.port)) throw;
      if (std::chrono::steady_clock::now() >= until) throw ddp::Error(blocked_port_text(so.port));
      if (!said)
        spdlog::debug("rendezvous: port {} is in use, but nobody accepts connections there (another agent bound it "
                      "at the same moment?): binding it again",
                      so.port);
      std::this_thread::sleep_for(std::chrono::microseconds(500 + random_u64() % 4500));
    }
  }
}

std::string NodeRendezvous::blocked_port_text(int port) const {
  const auto [low, high] = ephemeral_ports();
  return fmt::format(
      "--rdzv-endpoint {}: this machine should host the rendezvous store, but port {} is in use here{} and nobody "
      "accepts connections on it{}; choose another port{}",
      o_.rdzv_endpoint, port, held_by(port),
      port >= low && port <= high
          ? fmt::format(": a closed connection (TIME_WAIT) holds a port of the ephemeral range ({}-{}) for up to a "
                        "minute",
                        low, high)
          : "",
      port >= low && port <= high ? fmt::format(", below {}", low) : "");
}

// Binds the endpoint's port on every interface. Returns false when another process
// already holds it and hosting was only inferred (then this node joins that store).
bool NodeRendezvous::host_store(bool inferred, const std::string& why) {
  ddp::detail::StoreServerOptions so;
  so.host = "";
  so.port = static_cast<uint16_t>(o_.rdzv_port);
  try {
    bind_store(so, inferred);
  } catch (const ddp::SystemError& e) {
    if (e.code() != EADDRINUSE) throw;
    if (!inferred) {
      throw ddp::Error(fmt::format("--rdzv-endpoint {}: cannot host the rendezvous store (--rdzv-conf is_host=1): port "
                                   "{} is already in use{}; choose another port",
                                   o_.rdzv_endpoint, o_.rdzv_port, held_by(o_.rdzv_port)));
    }
    // Not who_listens(): it reads every process's descriptors, and with many agents on one
    // machine (all but the first land here) that scan was most of a start.
    spdlog::info("rendezvous: {}, but port {} is already in use here (by the agent that hosts the store, as a rule): "
                 "joining it as a client",
                 why, o_.rdzv_port);
    return false;
  }
  server_->start();
  port_ = server_->port();
  spdlog::info("rendezvous: this node hosts the c10d store on port {} ({})", port_, why);
  return true;
}

// The store was reached and answered, but not as ddprun's: PyTorch's TCPStore (a torchrun
// agent hosts it), or a server that refused the rendezvous's requests.
static ddp::StoreError not_ddprun_store(const std::string& where, const ddp::StoreError& e) {
  return ddp::StoreError(fmt::format("rendezvous: the store at {} cannot serve ddprun: {}; every node of a job must "
                                     "run ddprun (is a torchrun agent hosting it?)",
                                     where, e.what()));
}

// A node still waiting for a store it does not host says so after 10 s, then every minute:
// a wrong address or port, or a store host that never started, is not silent until the limit.
// The backend's clones (one per thread, connected when first used) share it. While the node
// leaves after a signal (leaving_by set), the goodbye's own deadline is the limit.
static ddp::TcpStore::ConnectRetry still_connecting(std::string store, std::string limit,
                                                    std::shared_ptr<const std::atomic<int64_t>> leaving_by) {
  struct Said {
    std::mutex mu;
    milliseconds last{0};                // the last attempt's time: a smaller one is a new connection
    std::chrono::seconds next{10};       // when to say it again
  };
  auto said = std::make_shared<Said>();
  return [=](milliseconds tried, const std::string& why) {
    auto s = std::chrono::duration_cast<std::chrono::seconds>(tried);
    {
      std::lock_guard lk(said->mu);
      if (tried < said->last) said->next = std::chrono::seconds(10);
      said->last = tried;
      if (s < said->next) return;
      said->next = s + std::chrono::seconds(60);
    }
    if (const int64_t by = leaving_by->load()) {
      const auto left = std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(by)) -
                        std::chrono::steady_clock::now();
      if (left <= std::chrono::steady_clock::duration::zero()) return;  // given up already: said so
      spdlog::warn("rendezvous: telling the other nodes that this node stops: still connecting to {} after {} s ({}); "
                   "giving up in {}",
                   store, s.count(), why, ddp::format_duration(std::chrono::duration_cast<milliseconds>(left)));
      return;
    }
    spdlog::warn("rendezvous: still connecting to {} after {} s ({}); trying until {}", store, s.count(), why, limit);
  };
}

std::unique_ptr<rdzv::StoreBackend> NodeRendezvous::connect(bool hosting, const std::string& why, bool taken) {
  rdzv::StoreBackendOptions bo;
  bo.host = hosting ? "127.0.0.1" : o_.rdzv_host;
  bo.port = static_cast<uint16_t>(port_);
  bo.run_id = o_.rdzv_id;
  bo.timeout = seconds(o_.rdzv_conf.read_timeout);
  bo.connect_timeout = seconds(o_.rdzv_conf.read_timeout);
  if (!hosting)
    bo.retrying = still_connecting(fmt::format("the c10d store at {} (--rdzv-endpoint)", endpoint_text(o_.rdzv_host, port_)),
                                   fmt::format("read_timeout {}", ddp::format_duration(bo.connect_timeout)),
                                   leaving_by_);
  try {
    return std::make_unique<rdzv::StoreBackend>(bo);
  } catch (const ddp::StoreError& e) {
    throw not_ddprun_store(endpoint_text(o_.rdzv_host, port_) + " (--rdzv-endpoint)", e);
  } catch (const ddp::Error& e) {
    if (hosting) throw;
    throw ddp::NetworkError(fmt::format(
        "rendezvous: cannot reach the c10d store at {} (--rdzv-endpoint) within read_timeout {} (--rdzv-conf "
        "read_timeout=SECONDS): {}; {}",
        endpoint_text(o_.rdzv_host, port_), ddp::format_duration(bo.connect_timeout), e.what(),
        taken ? fmt::format("this node should host it ({}), but port {} here is in use{}, and what holds it does not "
                            "answer as a rendezvous store: if that is not an agent of this job, stop it or choose "
                            "another port",
                            why, port_, held_by(port_))
              : fmt::format("this node did not host it because {}: start the node that hosts it (or give it "
                            "--rdzv-conf is_host=1), or run ddp-store-server there",
                            why)));
  }
}

// Identity: address (--local-addr, else the hostname) for the node-rank order, a random
// part so that two containers with the same hostname and pid are two nodes; and the
// address other nodes reach it at (MASTER_ADDR when it is rank 0).
rdzv::NodeDesc NodeRendezvous::describe_me(const std::string& connect_host, int port) const {
  rdzv::NodeDesc me;
  me.addr = o_.local_addr.empty() ? hostname_ : o_.local_addr;
  me.host = hostname_;
  me.id = fmt::format("{}_{}_{:08x}", me.addr, getpid(), static_cast<uint32_t>(random_u64()));
  me.nproc = o_.nproc_per_node;
  me.master_addr = o_.local_addr;
  if (me.master_addr.empty() && !connect_host.empty()) {
    PublishedAddress a = address_for_peers(connect_host, port);
    if (a.loopback_only) spdlog::warn("rendezvous: {}", a.note);
    else if (!a.note.empty()) spdlog::info("rendezvous: {}", a.note);
    me.master_addr = a.addr;
  }
  return me;
}

// static: node 0 hosts the store at --master-port; the others wait for it up to
// join_timeout (they may start long before it).
std::unique_ptr<rdzv::Backend> NodeRendezvous::open_static() {
  const bool hosting = o_.node_rank == 0;
  if (hosting) {
    server_ = host_master_store(o_);
    port_ = server_->port();
  } else {
    port_ = o_.master_port;
  }
  rdzv::StoreBackendOptions bo;
  bo.name = "node 0's store";  // (--master-addr, --master-port: no c10d flag was given)
  bo.host = hosting ? "127.0.0.1" : o_.master_addr;
  bo.port = static_cast<uint16_t>(port_);
  bo.run_id = o_.rdzv_id;
  bo.timeout = seconds(o_.rdzv_conf.read_timeout);
  bo.connect_timeout = hosting ? bo.timeout : seconds(o_.rdzv_conf.join_timeout);
  if (!hosting)
    bo.retrying = still_connecting(fmt::format("node 0's store at {} (--master-addr, --master-port)",
                                               endpoint_text(o_.master_addr, port_)),
                                   fmt::format("join_timeout {}", ddp::format_duration(bo.connect_timeout)),
                                   leaving_by_);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    return std::make_unique<rdzv::StoreBackend>(bo);
  } catch (const ddp::StoreError& e) {
    throw not_ddprun_store(endpoint_text(o_.master_addr, port_) + " (--master-addr, --master-port)", e);
  } catch (const ddp::Error& e) {
    if (hosting) throw;
    // A store that accepted late in join_timeout still gets a few seconds to answer.
    const auto took = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
    std::string in_all;
    if (took > bo.connect_timeout + milliseconds(500))
      in_all = fmt::format(" ({} in all: a store that accepts is given time to answer)", ddp::format_duration(took));
    throw ddp::NetworkError(fmt::format("node {} could not reach node 0's store at {} (--master-addr, --master-port) "
                                        "within join_timeout {}{}: {}",
                                        o_.node_rank, endpoint_text(o_.master_addr, port_),
                                        ddp::format_duration(bo.connect_timeout), in_all, e.what()));
  }
}

// c10d: the store at the endpoint, hosted by this node when it is the endpoint's.
std::unique_ptr<rdzv::Backend> NodeRendezvous::open_c10d(bool& hosting) {
  port_ = o_.rdzv_port;
  std::string why;
  hosting = decide_host(why);
  if (!hosting && port_ == 0)  // one node (options.cpp): nobody else could host a port it picks
    throw ddp::UsageError(fmt::format("--rdzv-endpoint {}: port 0 picks a free port for the store this node "
                                      "hosts, but {}: name this machine (localhost:0)",
                                      o_.rdzv_endpoint, why));
  const bool wanted = hosting;
  if (wanted) hosting = host_store(!o_.rdzv_conf.is_host.has_value(), why);
  else
    spdlog::info("rendezvous: joining the c10d store at {} (not hosting it: {})", endpoint_text(o_.rdzv_host, port_),
                 why);
  auto backend = connect(hosting, why, wanted && !hosting);
  if (hosting) {
    backend->claim_host();
  } else if (std::string host = backend->host_run_id(); !host.empty() && host != o_.rdzv_id) {
    // A port another job's node hosts: this job would live only as long as that one (its
    // host exits when its own job ends), and fail then. Refused now instead.
    throw ddp::Error(fmt::format(
        "--rdzv-endpoint {}: the c10d store there is hosted by a node of another job (--rdzv-id '{}'; this one is "
        "'{}'), and goes when that job ends: give each job its own port, or run ddp-store-server for jobs that share "
        "one. (Nodes of one job need the same --rdzv-id; an earlier job's ddprun on {} may also still be exiting.)",
        o_.rdzv_endpoint, host, o_.rdzv_id, wanted ? "this machine" : "the endpoint's host"));
  }
  return backend;
}

// etcd: nobody hosts the rendezvous. The node lease is keep_alive_interval x
// keep_alive_max_attempt; the run's keys outlive the last renewal by a few of those, so a
// crashed job's keys expire and a reused run id starts clean.
std::unique_ptr<rdzv::Backend> NodeRendezvous::open_etcd() const {
  const auto& c = o_.rdzv_conf;
  auto conf = [&](const char* k) { return c.raw.count(k) ? c.raw.at(k) : std::string(); };
  rdzv::EtcdOptions e;
  e.endpoints = o_.rdzv_endpoint;
  e.run_id = o_.rdzv_id;
  e.protocol = conf("protocol").empty() ? "http" : conf("protocol");
  e.cacert = conf("cacert");
  e.cert = conf("cert");
  e.key = conf("key");
  e.op_timeout = seconds(c.read_timeout);
  e.connect_timeout = std::min(seconds(5), e.op_timeout);
  const milliseconds ttl = seconds(c.keep_alive_interval * c.keep_alive_max_attempt);
  e.run_ttl = std::max(milliseconds(60000), 4 * ttl);
  e.still_failing = [](const std::string& text) { spdlog::warn("rendezvous: still trying: {}", text); };
  auto b = rdzv::make_etcd_backend(e);
  spdlog::info("rendezvous: {} (run '{}', node lease {})", b->describe(), o_.rdzv_id, ddp::format_duration(ttl));
  return b;
}

rdzv::DynamicConfig NodeRendezvous::config(bool hosting) const {
  rdzv::DynamicConfig c;
  c.run_id = o_.rdzv_id;
  c.job = rdzv::JobSettings{o_.min_nodes, o_.max_nodes, o_.max_restarts};
  c.join_timeout = seconds(o_.rdzv_conf.join_timeout);
  c.last_call_timeout = seconds(o_.rdzv_conf.last_call_timeout);
  c.close_timeout = seconds(o_.rdzv_conf.close_timeout);
  c.keep_alive_interval = seconds(o_.rdzv_conf.keep_alive_interval);
  c.keep_alive_max_attempt = o_.rdzv_conf.keep_alive_max_attempt;
  c.replace_timeout = seconds(o_.rdzv_conf.replace_timeout);
  c.hosts_store = hosting;
  c.share_worker_store = o_.share_worker_store;
  return c;
}

NodeRendezvous::NodeRendezvous(const Options& o, std::string hostname) : o_(o), hostname_(std::move(hostname)) {
  bool hosting = false;
  std::unique_ptr<rdzv::Backend> main;
  rdzv::DynamicConfig c;
  if (!o_.dynamic()) {
    main = open_static();
    c = config(o_.node_rank == 0);
    c.job.min_nodes = c.job.max_nodes;
    c.me = describe_me("", port_);
    c.me.rank = o_.node_rank;
    c.worker_store = rdzv::DynamicConfig::Endpoint{o_.master_addr, port_};
    c.store_lost_hint = " (the store lives in node 0's ddprun: when node 0 stops, so does the job)";
  } else {
    const bool etcd = o_.rdzv_backend == "etcd" || o_.rdzv_backend == "etcd-v2";
    main = etcd ? open_etcd() : open_c10d(hosting);
    c = config(hosting);
    c.me = describe_me(o_.rdzv_host, o_.rdzv_port > 0 ? o_.rdzv_port : port_);
    if (!etcd && !hosting)
      c.store_lost_hint = " (a c10d store lives in the ddprun of one node: when that node stops, so does the job; a "
                          "ddp-store-server of its own, or etcd, outlives any node)";
  }
  auto events = main->clone();
  auto lease = main->clone();
  d_ = std::make_unique<rdzv::DynamicRendezvous>(std::move(c), std::move(main), std::move(events), std::move(lease));
}

JobPlan NodeRendezvous::next_round() {
  rdzv::RoundPlan r;
  try {
    if (!ahead_.valid()) {
      wait_notes();
      r = d_->next_round();
    } else if (auto joined = ahead_.get()) {
      r = *joined;
    } else {
      throw ddp::Error("rendezvous: no further round may follow (asked to join one after a refusal)");
    }
    if (o_.dynamic()) check_master_reachable(r, o_.rdzv_host);
    d_->start_round();
  } catch (...) {
    // The store lives in this process: the nodes still joining keep it until they have
    // learnt how their own join ends (or close_timeout), instead of losing it with this one.
    if (server_) d_->finish(rdzv::FinishKind::kJoinFailed, "");
    throw;
  }
  JobPlan p;
  p.hostname = hostname_;
  p.run_id = o_.rdzv_id;
  p.group_rank = r.group_rank;
  p.group_world_size = r.group_world_size;
  p.rank_base = r.rank_base;
  p.world_size = r.world_size;
  p.master_addr = r.master_addr;
  p.master_port = r.master_port;
  p.use_agent_store = o_.share_worker_store;
  p.restart_count = r.restart_count;
  p.round = o_.dynamic() ? r.round : -1;  // static jobs count attempts (restart_count), as torchrun's
  return p;
}

}  // namespace

std::unique_ptr<Rendezvous> make_node_rendezvous(const Options& o, const std::string& hostname) {
  return std::make_unique<NodeRendezvous>(o, hostname);
}

}  // namespace ddprun
