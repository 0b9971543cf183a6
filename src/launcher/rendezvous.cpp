#include "launcher/rendezvous.hpp"

#include <dirent.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
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

// Multi-node: the nodes meet in node 0's store under "ddprun/<run_id>/".
class StoreSync {
 public:
  StoreSync(ddp::TcpStoreOptions so, std::string prefix, int node_rank, int nnodes, std::chrono::milliseconds timeout,
            std::chrono::milliseconds keep_alive, int keep_alive_max)
      : so_(so), prefix_(std::move(prefix)), node_(node_rank), nnodes_(nnodes), timeout_(timeout),
        keep_alive_(keep_alive), keep_alive_max_(keep_alive_max) {
    store_ = std::make_unique<ddp::TcpStore>(so_);
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
    if (efd_ >= 0) close(efd_);
  }
  ddp::Store& store() { return *store_; }
  std::string key(const std::string& k) const { return prefix_ + k; }

  int notify_fd() { return efd_; }

  std::string remote_failure(int attempt) {
    uint64_t v;
    while (read(efd_, &v, sizeof v) == sizeof v) {
    }
    std::lock_guard lk(mu_);
    if (seen_attempt_ != attempt) return "";
    return seen_reason_;
  }

  void report_failure(int attempt, const std::string& what) {
    try {
      std::string mine = fmt::format("node {}: {}", node_, what);
      std::lock_guard lk(mu_);
      store_->compare_set(key(fmt::format("fail/{}", attempt)), "", mine);
      store_->set(key(fmt::format("exit/{}/done", attempt)), "failed");
    } catch (const std::exception& e) {
      spdlog::error("cannot tell the other nodes about the failure: {}", e.what());
    }
  }

  void attempt_barrier(int attempt) {
    {
      std::lock_guard lk(mu_);
      current_ = attempt;
      seen_attempt_ = -1;
      seen_reason_.clear();
    }
    barrier(fmt::format("attempt/{}", attempt), "attempt barrier");
    if (!watcher_.joinable()) watcher_ = std::thread([this] { watch(); });
  }

  std::string exit_barrier_reason(int attempt) {
    barrier(fmt::format("exit/{}", attempt), "exit barrier");
    passed_exit_barrier_ = true;  // every node is here: the host waits for them to leave
    quiet_ = true;
    std::lock_guard lk(mu_);
    std::string fk = key(fmt::format("fail/{}", attempt));
    if (store_->check({fk})) {
      std::string why = store_->get(fk);
      if (!why.starts_with(fmt::format("node {}:", node_))) return why;
    }
    return "";
  }
  void exit_barrier(int attempt) { last_exit_reason_ = exit_barrier_reason(attempt); }
  std::string last_exit_reason() const { return last_exit_reason_; }
  std::string node_lost() {
    try {
      std::lock_guard lk(mu_);
      if (store_->check({key("lost")})) return store_->get(key("lost"));
    } catch (const std::exception& e) {
      return fmt::format("lost the connection to the store: {}", e.what());
    }
    return "";
  }
  bool passed_exit_barrier_ = false;

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
  // All nodes arrive; the last one releases the others (an ADD, one WAIT: no polling).
  void barrier(const std::string& name, const char* what) {
    std::string release = key(name + "/done");
    {
      std::lock_guard lk(mu_);
      if (store_->add(key(name + "/count"), 1) == nnodes_) store_->set(release, "ok");
    }
    try {
      std::unique_ptr<ddp::TcpStore> waiter = std::make_unique<ddp::TcpStore>(so_);
      waiter->wait({release}, timeout_);
    } catch (const ddp::TimeoutError&) {
      throw ddp::TimeoutError(fmt::format("{}: not every node arrived within {} ({} of {} nodes)", what,
                                          ddp::format_duration(timeout_), count(name), nnodes_));
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

  // A second connection blocks on the current attempt's failure key.
  // The watcher, on a second connection: blocks on the current attempt's failure key, and
  // beats: every keep_alive_interval it bumps "alive/<node>" and checks the others' beats;
  // a node silent for keep_alive_max_attempt intervals (SIGKILLed, its host gone) fails the
  // attempt on every node.
  void watch() {
    try {
      // Short connect deadline: a watcher must never hold ddprun's exit for long.
      ddp::TcpStoreOptions wo = so_;
      wo.connect_timeout = std::min<std::chrono::milliseconds>(so_.connect_timeout, 2s);
      ddp::TcpStore w(wo);
      {
        std::lock_guard lk(watch_mu_);
        if (stop_) return;
        watch_conn_ = &w;
      }
      struct Unpublish {
        StoreSync* s;
        ~Unpublish() {
          std::lock_guard lk(s->watch_mu_);
          s->watch_conn_ = nullptr;
        }
      } unpublish{this};
      using Clock = std::chrono::steady_clock;
      std::vector<std::string> beat(static_cast<size_t>(nnodes_));
      std::vector<Clock::time_point> beat_changed(static_cast<size_t>(nnodes_), Clock::now());
      long beats = 0;
      auto next_beat = Clock::now();
      int handled = -1;  // the attempt whose failure was already passed on
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
        std::string fk = key(fmt::format("fail/{}", attempt));
        try {
          w.wait({fk}, slice);
        } catch (const ddp::TimeoutError&) {
          continue;
        }
        std::string why = w.get(fk);
        if (!why.starts_with(fmt::format("node {}:", node_))) notify(attempt, why);
        handled = attempt;
      }
    } catch (const std::exception& e) {
      if (!stop_) {
        const int attempt = current_attempt();
        notify(attempt, fmt::format("lost the connection to the store: {}", e.what()));
      }
    }
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
        std::lock_guard lk(mu_);
        store_->compare_set(key("lost"), "", why);
      } catch (const std::exception&) {
      }
      report_failure(attempt, why);
      notify(attempt, why);
    }
  }

  int current_attempt() {
    std::lock_guard lk(mu_);
    return current_;
  }

  // Wakes this node's supervisor about a failure elsewhere (once per attempt).
  void notify(int attempt, const std::string& why) {
    std::lock_guard lk(mu_);
    if (attempt != current_ || seen_attempt_ == attempt) return;
    seen_attempt_ = attempt;
    seen_reason_ = why;
    uint64_t one = 1;
    ssize_t r = write(efd_, &one, sizeof one);
    (void)r;
  }

  ddp::TcpStoreOptions so_;
  std::string prefix_;
  int node_, nnodes_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<ddp::TcpStore> store_;
  int efd_ = -1;
  std::mutex mu_;
  int current_ = 0, seen_attempt_ = -1;
  std::string seen_reason_, last_exit_reason_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> quiet_{false};  // past the exit barrier: nodes stop beating as they leave
  std::chrono::milliseconds keep_alive_{5000};
  int keep_alive_max_ = 3;
  std::thread watcher_;
  std::mutex watch_mu_;
  ddp::TcpStore* watch_conn_ = nullptr;  // the watcher's connection while it runs (watch_mu_)
};

// Static rendezvous: node 0 hosts the store at --master-addr:--master-port; every node
// restarts with the others, attempt by attempt.
class StaticRendezvous : public Rendezvous {
 public:
  StaticRendezvous(const Options& o, std::string hostname) : o_(o), hostname_(std::move(hostname)) {}
  ~StaticRendezvous() override { finish(FinishKind::kNodeStopped, ""); }

  JobPlan next_round() override {
    if (attempt_ < 0) plan_ = join();
    else ++attempt_;
    if (attempt_ < 0) attempt_ = 0;
    if (sync_) sync_->attempt_barrier(attempt_);
    plan_.restart_count = attempt_;
    return plan_;
  }
  int notify_fd() override { return sync_ ? sync_->notify_fd() : -1; }
  std::optional<RoundEnd> round_end() override {
    if (!sync_) return std::nullopt;
    std::string why = sync_->remote_failure(attempt_);
    if (why.empty()) return std::nullopt;
    return RoundEnd{RoundEnd::Kind::kFailed, "", why};
  }
  void end_round(RoundEnd::Kind, const std::string& what) override {
    if (sync_) sync_->report_failure(attempt_, what);
  }
  std::optional<RoundEnd> arrive_exit() override {
    if (!sync_) return RoundEnd{RoundEnd::Kind::kDone, "", ""};
    sync_->exit_barrier(attempt_);
    std::string why = sync_->last_exit_reason();  // this node succeeded, another did not
    if (why.empty()) return RoundEnd{RoundEnd::Kind::kDone, "", ""};
    return RoundEnd{RoundEnd::Kind::kFailed, "", why};
  }
  std::string restart_refused(const RoundEnd& end) override {
    if (attempt_ >= o_.max_restarts)
      return fmt::format("{}; no restart left ({} of --max-restarts {} used)", end.describe(), attempt_,
                         o_.max_restarts);
    if (std::string lost = sync_ ? sync_->node_lost() : ""; !lost.empty()) return lost;
    return "";
  }
  void finish(FinishKind, const std::string&) override {
    if (sync_) sync_->leave(server_ != nullptr);
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
  int attempt_ = -1;
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
  so.timeout = join_timeout;
  so.connect_timeout = join_timeout;
  try {
    sync_ = std::make_unique<StoreSync>(so, fmt::format("ddprun/{}/", o_.rdzv_id), o_.node_rank, o_.max_nodes,
                                        join_timeout, seconds(o_.rdzv_conf.keep_alive_interval),
                                        o_.rdzv_conf.keep_alive_max_attempt);
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
