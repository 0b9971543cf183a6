#include "launcher/rendezvous.hpp"

#include <dirent.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <set>
#include <cerrno>
#include <mutex>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "ddp/tcp_store.hpp"
#include "launcher/background.hpp"
#include "launcher/net.hpp"
#include "launcher/fileio.hpp"
#include "launcher/random.hpp"
#include "store/server.hpp"

namespace ddprun {

using nlohmann::json;
using namespace std::chrono_literals;

namespace {

std::string random_nonce() {
  return fmt::format("{:016x}", random_u64());
}

std::chrono::milliseconds seconds(double s) { return std::chrono::milliseconds(static_cast<long>(s * 1000)); }

}  // namespace

std::string unsent_note() {
  return "rendezvous: the other nodes could not be told in time that this node stops (the rendezvous does not "
         "answer); they notice its absence within their keep-alive window";
}

// Store writes that must not hold up the supervisor (a failure note, an exit arrival, a
// node's goodbye): run in order on a thread of their own, over a connection of their own,
// each bounded by the connection's per-call timeout. The thread owns everything it
// touches, so it can be abandoned at a deadline (background.hpp).
class StorePoster {
 public:
  using Job = std::function<void(ddp::TcpStore&)>;
  explicit StorePoster(ddp::TcpStoreOptions so) : s_(std::make_shared<Shared>()) {
    s_->so = std::move(so);
    task_ = BackgroundTask([s = s_] { run(*s); });
  }
  ~StorePoster() { stop(std::chrono::steady_clock::now()); }

  void post(std::string what, Job job) {
    std::lock_guard lk(s_->mu);
    s_->queue.push_back({std::move(what), std::move(job)});
    s_->cv.notify_all();
  }
  // Every job posted so far has run, or `deadline` passed (false).
  bool drain(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lk(s_->mu);
    return s_->cv.wait_until(lk, deadline, [&] { return s_->queue.empty() && !s_->busy; });
  }
  // Ends the thread: what is still queued is dropped, a call in progress interrupted; a
  // thread still connecting at `deadline` is abandoned.
  void stop(std::chrono::steady_clock::time_point deadline) {
    {
      std::lock_guard lk(s_->mu);
      s_->stop = true;
      s_->queue.clear();
      if (s_->conn) s_->conn->interrupt();
      s_->cv.notify_all();
    }
    if (!task_.wait_until(std::max(deadline, std::chrono::steady_clock::now() + 50ms))) task_.abandon();
  }

 private:
  struct Shared {
    ddp::TcpStoreOptions so;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::pair<std::string, Job>> queue;
    bool busy = false, stop = false;
    ddp::TcpStore* conn = nullptr;  // while connected (mu)
  };

  static void run(Shared& s) {
    std::unique_ptr<ddp::TcpStore> conn;
    std::unique_lock lk(s.mu);
    for (;;) {
      s.cv.wait(lk, [&] { return s.stop || !s.queue.empty(); });
      if (s.stop) break;
      auto [what, job] = std::move(s.queue.front());
      s.queue.pop_front();
      s.busy = true;
      lk.unlock();
      try {
        if (!conn) {
          conn = std::make_unique<ddp::TcpStore>(s.so);
          std::lock_guard l2(s.mu);
          if (s.stop) conn->interrupt();
          s.conn = conn.get();
        }
        job(*conn);
      } catch (const std::exception& e) {
        std::lock_guard l2(s.mu);
        if (!s.stop) spdlog::error("cannot tell the other nodes ({}): {}", what, e.what());
      }
      lk.lock();
      s.busy = false;
      s.cv.notify_all();
    }
    s.conn = nullptr;
  }

  std::shared_ptr<Shared> s_;
  BackgroundTask task_;
};

// A connection that another thread may interrupt() while this scope uses it: published
// in `slot` (under `mu`) for its lifetime.
class Reachable {
 public:
  Reachable(std::mutex& mu, ddp::TcpStore*& slot, ddp::TcpStore& conn) : mu_(mu), slot_(slot) {
    std::lock_guard lk(mu_);
    slot_ = &conn;
  }
  ~Reachable() {
    std::lock_guard lk(mu_);
    slot_ = nullptr;
  }
  Reachable(const Reachable&) = delete;
  Reachable& operator=(const Reachable&) = delete;

 private:
  std::mutex& mu_;
  ddp::TcpStore*& slot_;
};

// Multi-node: the nodes meet in node 0's store under "ddprun/<run_id>/". Keys, per attempt
// a: fail/<a> (the first failure, "node <i>: <what>"), exit/<a>/count and exit/<a>/done
// (set when the count reaches every node, or to "failed" with fail/<a>), attempt/<a>/*
// (the attempt barrier); alive/<i> (heartbeats), lost, closed (a node that stopped for good).
//
// Only join (next_round) and leaving a finished job talk to the store on the caller's
// thread; what happens while workers run goes through the poster (writes) and the watcher
// (reads, heartbeats), which wake the supervisor through notify_fd.
class StoreSync {
 public:
  StoreSync(ddp::TcpStoreOptions so, std::string prefix, int node_rank, int nnodes, std::chrono::milliseconds timeout,
            std::chrono::milliseconds keep_alive, int keep_alive_max)
      : so_(so), prefix_(std::move(prefix)), node_(node_rank), nnodes_(nnodes), timeout_(timeout),
        keep_alive_(keep_alive), keep_alive_max_(keep_alive_max) {
    store_ = std::make_unique<ddp::TcpStore>(so_);
    ddp::TcpStoreOptions po = so_;
    po.connect_timeout = so_.timeout;
    poster_ = std::make_unique<StorePoster>(po);
    efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  }
  ~StoreSync() {
    stop_ = true;
    {
      // Wakes the watcher's blocked wait at once: the job's exit does not wait for its slice.
      std::lock_guard lk(watch_mu_);
      if (watch_conn_) watch_conn_->interrupt();
    }
    if (watcher_.joinable()) watcher_.join();
    poster_.reset();
    if (efd_ >= 0) close(efd_);
  }
  ddp::Store& store() { return *store_; }
  std::string key(const std::string& k) const { return prefix_ + k; }

  int notify_fd() { return efd_; }

  // How `attempt` ended elsewhere, once the watcher saw it (nullopt: not yet).
  std::optional<RoundEnd> take_end(int attempt) {
    uint64_t v;
    while (read(efd_, &v, sizeof v) == sizeof v) {
    }
    std::lock_guard lk(mu_);
    if (seen_attempt_ != attempt) return std::nullopt;
    return seen_end_;
  }

  // Posted: the supervisor goes on at once (its signal must not wait for the store).
  void report_failure(int attempt, const std::string& what) {
    poster_->post("failure", [k = failure_keys(attempt), mine = fmt::format("node {}: {}", node_, what)](
                                 ddp::TcpStore& s) { publish_failure(s, k, mine); });
  }

  // This node's workers succeeded: counted in the background; the watcher sees the release.
  void arrive_exit(int attempt) {
    const std::string count = key(fmt::format("exit/{}/count", attempt));
    const std::string done = key(fmt::format("exit/{}/done", attempt));
    poster_->post("exit", [count, done, n = nnodes_](ddp::TcpStore& s) {
      if (s.add(count, 1) == n) s.set(done, "ok");
    });
  }

  void attempt_barrier(int attempt) {
    // The failure note of the attempt before goes first: the others must read it before
    // they meet this node at the next barrier.
    poster_->drain(std::chrono::steady_clock::now() + so_.timeout);
    {
      std::lock_guard lk(mu_);
      current_ = attempt;
      seen_attempt_ = -1;
      seen_end_.reset();
    }
    barrier(fmt::format("attempt/{}", attempt), "attempt barrier");
    if (!watcher_.joinable()) watcher_ = std::thread([this] { watch(); });
  }

  std::string node_lost() {
    try {
      std::lock_guard lk(mu_);
      if (store_->check({key("lost")})) return store_->get(key("lost"));
    } catch (const std::exception& e) {
      return fmt::format("lost the connection to the store: {}", e.what());
    }
    return "";
  }

  // This node stops for good (a signal, the job failed, no restart): a node already waiting
  // at the next attempt barrier stops waiting at once.
  void say_closed(const std::string& why) {
    poster_->post("closing", [k = key("closed"), v = fmt::format("node {} stopped: {}", node_, why)](
                                 ddp::TcpStore& s) { s.compare_set(k, "", v); });
  }

  // A join in progress (the attempt barrier) stops waiting.
  void cancel() {
    cancelled_ = true;
    store_->interrupt();
    std::lock_guard lk(watch_mu_);
    if (barrier_conn_) barrier_conn_->interrupt();
  }

  // What was posted reaches the store by `deadline`, or is given up.
  bool drain(std::chrono::steady_clock::time_point deadline) {
    bool ok = poster_->drain(deadline);
    poster_->stop(deadline);
    return ok;
  }

  // Node 0 keeps the store up until every node has left.
  void leave(bool is_host) {
    quiet_ = true;
    // Only after an exit barrier that every node passed is everybody still there to leave;
    // they read the attempt's failure key and then leave, so the host's wait is short.
    if (!passed_exit_barrier_) return;
    try {
      std::lock_guard lk(mu_);
      store_->add(key("left"), 1);
      if (!is_host) return;
      auto deadline = std::chrono::steady_clock::now() + 30s;
      while (std::stoll(store_->get(key("left"))) < nnodes_ && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(20ms);
    } catch (const std::exception& e) {
      spdlog::debug("leaving the rendezvous: {}", e.what());
    }
  }

 private:
  struct FailureKeys {
    std::string fail, done, lost;
  };
  FailureKeys failure_keys(int attempt) const {
    return {key(fmt::format("fail/{}", attempt)), key(fmt::format("exit/{}/done", attempt)), key("lost")};
  }
  // The first failure of an attempt wins; the exit barrier's release wakes every waiter.
  static void publish_failure(ddp::TcpStore& s, const FailureKeys& k, const std::string& what, bool lost = false) {
    if (lost) s.compare_set(k.lost, "", what);
    s.compare_set(k.fail, "", what);
    s.set(k.done, "failed");
  }

  // All nodes arrive; the last one releases the others (an ADD, one WAIT in slices: a
  // node that stopped for good or was lost ends everyone's wait at once).
  void barrier(const std::string& name, const char* what) {
    std::string release = key(name + "/done");
    {
      std::lock_guard lk(mu_);
      if (store_->add(key(name + "/count"), 1) == nnodes_) store_->set(release, "ok");
    }
    auto waiter = std::make_unique<ddp::TcpStore>(so_);
    Reachable reachable(watch_mu_, barrier_conn_, *waiter);
    if (cancelled_) waiter->interrupt();
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0)
        throw ddp::TimeoutError(fmt::format("{}: not every node arrived within {} ({} of {} nodes)", what,
                                            ddp::format_duration(timeout_), count(name), nnodes_));
      try {
        waiter->wait({release}, std::min<std::chrono::milliseconds>(left, 250ms));
        return;
      } catch (const ddp::TimeoutError&) {
      }
      for (const char* stop : {"closed", "lost"})
        if (waiter->check({key(stop)})) throw ddp::Error(fmt::format("{}: {}", what, waiter->get(key(stop))));
    }
  }
  std::string count(const std::string& name) {
    try {
      std::lock_guard lk(mu_);
      return store_->get(key(name + "/count"));
    } catch (const std::exception&) {
      return "?";
    }
  }

  // The watcher, on a connection of its own: blocks on the current attempt's exit release
  // (set when every node arrived, or with a failure), and beats: every keep_alive_interval
  // it bumps "alive/<node>" and checks the others' beats; a node silent for
  // keep_alive_max_attempt intervals (SIGKILLed, its host gone) fails the attempt on every
  // node. A node that waits for slower ones keeps beating: finished is not lost.
  void watch() {
    try {
      // Short connect deadline: a watcher must never hold ddprun's exit for long.
      ddp::TcpStoreOptions wo = so_;
      wo.connect_timeout = std::min<std::chrono::milliseconds>(so_.connect_timeout, 2s);
      ddp::TcpStore w(wo);
      Reachable reachable(watch_mu_, watch_conn_, w);
      if (stop_) return;
      using Clock = std::chrono::steady_clock;
      std::vector<std::string> beat(static_cast<size_t>(nnodes_));
      std::vector<Clock::time_point> beat_changed(static_cast<size_t>(nnodes_), Clock::now());
      long beats = 0;
      auto next_beat = Clock::now();
      int handled = -1;  // the attempt whose end was already passed on
      while (!stop_) {
        auto now = Clock::now();
        if (now >= next_beat) {
          w.set(key(fmt::format("alive/{}", node_)), std::to_string(++beats));
          if (!quiet_) check_beats(w, beat, beat_changed, now);
          next_beat = now + keep_alive_;
        }
        const int attempt = current_attempt();
        auto slice = std::min<std::chrono::milliseconds>(
            500ms, std::chrono::duration_cast<std::chrono::milliseconds>(next_beat - Clock::now()) + 1ms);
        if (handled == attempt) {
          std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(slice, 20ms));
          continue;
        }
        FailureKeys k = failure_keys(attempt);
        try {
          w.wait({k.done}, slice);
        } catch (const ddp::TimeoutError&) {
          continue;
        }
        judge(w, attempt, k);
        handled = attempt;
      }
    } catch (const std::exception& e) {
      if (!stop_) {
        const int attempt = current_attempt();
        notify(attempt, RoundEnd{RoundEnd::Kind::kFailed, "",
                                 fmt::format("lost the connection to the store: {}", e.what())});
      }
    }
  }

  // The attempt's exit release is set: every node arrived, or one failed.
  void judge(ddp::TcpStore& w, int attempt, const FailureKeys& k) {
    if (w.check({k.fail})) {
      std::string why = w.get(k.fail);
      if (!why.starts_with(fmt::format("node {}:", node_))) notify(attempt, RoundEnd{RoundEnd::Kind::kFailed, "", why});
      return;
    }
    passed_exit_barrier_ = true;  // every node is here: the host waits for them to leave
    quiet_ = true;
    notify(attempt, RoundEnd{RoundEnd::Kind::kDone, "", ""});
  }

  void check_beats(ddp::TcpStore& w, std::vector<std::string>& beat,
                   std::vector<std::chrono::steady_clock::time_point>& changed,
                   std::chrono::steady_clock::time_point now) {
    for (int i = 0; i < nnodes_; ++i) {
      if (i == node_) continue;
      auto idx = static_cast<size_t>(i);
      std::string k = key(fmt::format("alive/{}", i));
      std::string v = w.check({k}) ? w.get(k) : "";
      if (v != beat[idx]) {
        beat[idx] = v;
        changed[idx] = now;
        continue;
      }
      if (now - changed[idx] < keep_alive_ * keep_alive_max_) continue;
      const int attempt = current_attempt();
      std::string why = fmt::format(
          "node {} stopped responding: no heartbeat for {} (--rdzv-conf keep_alive_interval={}, "
          "keep_alive_max_attempt={})",
          i, ddp::format_duration(std::chrono::duration_cast<std::chrono::milliseconds>(now - changed[idx])),
          ddp::format_duration(keep_alive_), keep_alive_max_);
      changed[idx] = now;  // once per silence
      try {
        publish_failure(w, failure_keys(attempt), why, true);
      } catch (const std::exception& e) {
        spdlog::error("cannot tell the other nodes (lost node): {}", e.what());
      }
      notify(attempt, RoundEnd{RoundEnd::Kind::kFailed, "", why});
    }
  }

  int current_attempt() {
    std::lock_guard lk(mu_);
    return current_;
  }

  // Wakes this node's supervisor about how the attempt ended (once per attempt).
  void notify(int attempt, RoundEnd end) {
    std::lock_guard lk(mu_);
    if (attempt != current_ || seen_attempt_ == attempt) return;
    seen_attempt_ = attempt;
    seen_end_ = std::move(end);
    uint64_t one = 1;
    ssize_t r = write(efd_, &one, sizeof one);
    (void)r;
  }

  ddp::TcpStoreOptions so_;
  std::string prefix_;
  int node_, nnodes_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<ddp::TcpStore> store_;
  std::unique_ptr<StorePoster> poster_;
  int efd_ = -1;
  std::mutex mu_;
  int current_ = 0, seen_attempt_ = -1;
  std::optional<RoundEnd> seen_end_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> quiet_{false};  // past the exit barrier: nodes stop beating as they leave
  std::atomic<bool> passed_exit_barrier_{false};
  std::chrono::milliseconds keep_alive_{5000};
  int keep_alive_max_ = 3;
  std::thread watcher_;
  std::mutex watch_mu_;
  ddp::TcpStore* watch_conn_ = nullptr;  // the watcher's connection while it runs (watch_mu_)
  ddp::TcpStore* barrier_conn_ = nullptr;  // a barrier's waiting connection (watch_mu_)
  std::atomic<bool> cancelled_{false};
};

// Static rendezvous: node 0 hosts the store at --master-addr:--master-port; every node
// restarts with the others, attempt by attempt.
class StaticRendezvous : public Rendezvous {
 public:
  StaticRendezvous(const Options& o, std::string hostname) : o_(o), hostname_(std::move(hostname)) {}
  ~StaticRendezvous() override { finish(FinishKind::kNodeStopped, "", std::chrono::steady_clock::now() + 2s); }

  JobPlan next_round() override {
    if (attempt_ < 0) plan_ = join();
    else ++attempt_;
    if (attempt_ < 0) attempt_ = 0;
    if (sync_) sync_->attempt_barrier(attempt_);
    plan_.restart_count = attempt_;
    return plan_;
  }
  bool joins_over_network() const override { return o_.max_nodes > 1; }
  int notify_fd() override { return sync_ ? sync_->notify_fd() : -1; }
  std::optional<RoundEnd> round_end() override { return sync_ ? sync_->take_end(attempt_) : std::nullopt; }
  void end_round(RoundEnd::Kind, const std::string& what) override {
    if (sync_) sync_->report_failure(attempt_, what);
  }
  std::optional<RoundEnd> arrive_exit() override {
    if (!sync_) return RoundEnd{RoundEnd::Kind::kDone, "", ""};
    sync_->arrive_exit(attempt_);
    return std::nullopt;  // the watcher sees the release (or a failure): notify_fd
  }
  std::string restart_refused(const RoundEnd& end) override {
    if (attempt_ >= o_.max_restarts)
      return fmt::format("{}; no restart left ({} of --max-restarts {} used)", end.describe(), attempt_.load(),
                         o_.max_restarts);
    if (std::string lost = sync_ ? sync_->node_lost() : ""; !lost.empty()) return lost;
    return "";
  }
  void cancel() override {
    std::lock_guard lk(sync_mu_);
    cancelled_ = true;
    if (sync_) sync_->cancel();
  }
  void finish(FinishKind kind, const std::string& reason, std::optional<Deadline> deadline) override {
    if (sync_) {
      if (kind != FinishKind::kSucceeded) sync_->say_closed(reason.empty() ? "stopped" : reason);
      const auto by = deadline.value_or(std::chrono::steady_clock::now() + 30s);
      if (!sync_->drain(by) && deadline) spdlog::warn("{}", unsent_note());
      if (kind == FinishKind::kSucceeded) sync_->leave(server_ != nullptr);
    }
    sync_.reset();
    if (server_) server_->stop();
  }

 private:
  JobPlan join();
  void host_store();
  void connect_nodes();
  JobPlan meet(JobPlan p);
  void wait_for_nodes(const std::vector<std::string>& keys, const std::function<void(int, const json&)>& check);

  const Options& o_;
  std::string hostname_;
  std::atomic<int> attempt_{-1};
  std::mutex sync_mu_;  // sync_'s creation against cancel() from another thread
  bool cancelled_ = false;
  JobPlan plan_;
  std::unique_ptr<ddp::detail::StoreServer> server_;
  std::unique_ptr<StoreSync> sync_;
};

// Node 0 hosts the store that workers (TORCHELASTIC_USE_AGENT_STORE) and nodes share.
void StaticRendezvous::host_store() {
  ddp::detail::StoreServerOptions so;
  so.host = "";  // every interface, dual stack
  so.port = static_cast<uint16_t>(o_.standalone ? 0 : o_.master_port);
  try {
    server_ = std::make_unique<ddp::detail::StoreServer>(so);
  } catch (const ddp::SystemError& e) {
    if (e.code() != EADDRINUSE) throw;
    std::string holder = who_listens(o_.master_port);
    throw ddp::Error(fmt::format(
        "--master-port {}: the port is already in use{}; choose another with --master-port (or "
        "PET_MASTER_PORT), or use --standalone to pick a free one",
        o_.master_port, holder.empty() ? "" : " by " + holder));
  }
  server_->start();
}

void StaticRendezvous::connect_nodes() {
  const auto join_timeout = seconds(o_.rdzv_conf.join_timeout);
  ddp::TcpStoreOptions so;
  so.host = o_.master_addr;
  so.port = static_cast<uint16_t>(o_.master_port);
  // Each call is bounded by the keep-alive window (at least 10 s): a store that does not
  // answer for that long has lost this node anyway. Waits (barriers, the join) take their
  // own deadlines; the first connection may wait for node 0 the whole join_timeout.
  so.timeout = std::max<std::chrono::milliseconds>(
      10s, seconds(o_.rdzv_conf.keep_alive_interval * o_.rdzv_conf.keep_alive_max_attempt));
  so.connect_timeout = join_timeout;
  try {
    auto sync = std::make_unique<StoreSync>(so, fmt::format("ddprun/{}/", o_.rdzv_id), o_.node_rank, o_.max_nodes,
                                            join_timeout, seconds(o_.rdzv_conf.keep_alive_interval),
                                            o_.rdzv_conf.keep_alive_max_attempt);
    std::lock_guard lk(sync_mu_);
    if (cancelled_) sync->cancel();
    sync_ = std::move(sync);
  } catch (const ddp::TimeoutError& e) {
    throw ddp::Error(fmt::format("node {} could not reach node 0's store at {}:{} within {}: {}", o_.node_rank,
                                 o_.master_addr, o_.master_port, ddp::format_duration(join_timeout), e.what()));
  }
}

JobPlan StaticRendezvous::join() {
  JobPlan p;
  p.hostname = hostname_;
  p.run_id = o_.rdzv_id;
  p.group_rank = o_.node_rank;
  p.group_world_size = o_.max_nodes;
  p.world_size = o_.nproc_per_node;
  p.master_addr = o_.standalone ? "localhost" : o_.master_addr;
  p.use_agent_store = true;
  if (o_.node_rank == 0) host_store();
  p.master_port = server_ ? server_->port() : o_.master_port;
  if (o_.max_nodes == 1) return p;
  connect_nodes();
  return meet(p);
}

// Waits for every node's record in slices, so that an abort published by any node (a
// mismatch it found against node 0) ends everyone's wait at once. Node 0's record comes
// first: every node checks itself against it as soon as it exists.
void StaticRendezvous::wait_for_nodes(const std::vector<std::string>& keys,
                                      const std::function<void(int, const json&)>& check) {
  ddp::Store& store = sync_->store();
  const std::string abort_key = sync_->key("abort");
  const auto join_timeout = seconds(o_.rdzv_conf.join_timeout);
  const auto deadline = std::chrono::steady_clock::now() + join_timeout;
  bool checked0 = false;
  for (;;) {
    if (store.check({abort_key})) throw ddp::Error(store.get(abort_key));
    if (!checked0 && store.check({keys[0]})) {
      check(0, json::parse(store.get(keys[0])));
      checked0 = true;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      std::vector<int> missing;
      for (int i = 0; i < o_.max_nodes; ++i)
        if (!store.check({keys[static_cast<size_t>(i)]})) missing.push_back(i);
      if (missing.empty()) return;
      throw ddp::TimeoutError(fmt::format(
          "rendezvous: node rank{} {} never joined within the join timeout ({}; --rdzv-conf join_timeout=SECONDS)",
          missing.size() > 1 ? "s" : "", fmt::join(missing, ", "), ddp::format_duration(join_timeout)));
    }
    try {
      store.wait(keys, std::min<std::chrono::milliseconds>(left, 250ms));
      if (checked0) return;
    } catch (const ddp::TimeoutError&) {
    }
  }
}

// Every node publishes what it brings; they check they agree and compute the ranks.
JobPlan StaticRendezvous::meet(JobPlan p) {
  ddp::Store& store = sync_->store();
  auto key = [&](const std::string& k) { return sync_->key(k); };
  const std::string host = o_.local_addr.empty() ? p.hostname : o_.local_addr;
  // The nonce tells two launches apart even on hosts with the same name.
  json me = {{"nproc", o_.nproc_per_node}, {"nnodes", o_.max_nodes}, {"max_restarts", o_.max_restarts},
             {"run_id", o_.rdzv_id}, {"host", host}, {"nonce", fmt::format("{}-{}", getpid(), random_nonce())}};
  const std::string mine = me.dump();
  auto abort_with = [&](const std::string& why) {
    try {
      store.compare_set(key("abort"), "", why);
    } catch (const std::exception&) {
    }
    throw ddp::Error(why);
  };
  auto check_agrees = [&](int i, const json& n) {
    for (const char* field : {"nnodes", "max_restarts", "run_id"}) {
      if (n[field] != me[field])
        abort_with(fmt::format("rendezvous: nodes disagree on {}: node {} ({}) has {}, node {} ({}) has {}", field, i,
                               n.value("host", "?"), n[field].dump(), o_.node_rank, host, me[field].dump()));
    }
  };
  std::string got = store.compare_set(key(fmt::format("node/{}", o_.node_rank)), "", mine);
  if (got != mine) {
    json other = json::parse(got, nullptr, false);
    abort_with(fmt::format("rendezvous: --node-rank {} is taken by two nodes ({} and {}): give each node its own rank",
                           o_.node_rank, other.is_object() ? other.value("host", "?") : "?", host));
  }
  std::vector<std::string> keys;
  for (int i = 0; i < o_.max_nodes; ++i) keys.push_back(key(fmt::format("node/{}", i)));
  wait_for_nodes(keys, check_agrees);
  for (int i = 0; i < o_.max_nodes; ++i) check_agrees(i, json::parse(store.get(keys[static_cast<size_t>(i)])));
  if (store.check({key("abort")})) throw ddp::Error(store.get(key("abort")));
  int world = 0;
  for (int i = 0; i < o_.max_nodes; ++i) {
    json n = json::parse(store.get(keys[static_cast<size_t>(i)]));
    if (i < o_.node_rank) p.rank_base += n["nproc"].get<int>();
    world += n["nproc"].get<int>();
  }
  p.world_size = world;
  spdlog::info("rendezvous: node {} of {}, ranks {}..{} of {}", o_.node_rank, o_.max_nodes, p.rank_base,
               p.rank_base + o_.nproc_per_node - 1, world);
  return p;
}

std::unique_ptr<Rendezvous> make_rendezvous(const Options& o, const std::string& hostname) {
  if (o.dynamic()) return make_dynamic_rendezvous(o, hostname);
  return std::make_unique<StaticRendezvous>(o, hostname);
}

}  // namespace ddprun
