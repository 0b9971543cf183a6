#include "launcher/rendezvous.hpp"

#include <dirent.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
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
#include "launcher/fileio.hpp"
#include "launcher/random.hpp"
#include "store/server.hpp"

namespace ddprun {

using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// "pid 1234 (python3)" for the process listening on a TCP port, if this user can see it.
std::string who_listens(int port) {
  std::set<std::string> inodes;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream f(read_file(table).value_or(""));
    std::string line;
    std::getline(f, line);
    while (std::getline(f, line)) {
      std::istringstream ss(line);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      ss >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
      auto colon = local.rfind(':');
      if (colon == std::string::npos || st != "0A") continue;
      if (std::stoi(local.substr(colon + 1), nullptr, 16) == port) inodes.insert("socket:[" + inode + "]");
    }
  }
  if (inodes.empty()) return "";
  DIR* proc = opendir("/proc");
  if (!proc) return "";
  std::string found;
  while (dirent* e = readdir(proc)) {
    if (!isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    std::string fddir = std::string("/proc/") + e->d_name + "/fd";
    DIR* fds = opendir(fddir.c_str());
    if (!fds) continue;
    while (dirent* fe = readdir(fds)) {
      char target[128];
      ssize_t n = readlink((fddir + "/" + fe->d_name).c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = 0;
      if (inodes.count(target)) {
        std::istringstream comm(read_file(std::string("/proc/") + e->d_name + "/comm").value_or(""));
        std::string name;
        std::getline(comm, name);
        found = fmt::format("pid {} ({})", e->d_name, name);
        break;
      }
    }
    closedir(fds);
    if (!found.empty()) break;
  }
  closedir(proc);
  return found;
}

std::string random_nonce() {
  return fmt::format("{:016x}", random_u64());
}

std::chrono::milliseconds conf_seconds(const Options& o, const std::string& key, double def) {
  auto it = o.rdzv_conf.find(key);
  double v = def;
  if (it != o.rdzv_conf.end()) {
    try {
      v = std::stod(it->second);
    } catch (const std::exception&) {
      throw ddp::UsageError(fmt::format("--rdzv-conf: {} expects seconds, got '{}'", key, it->second));
    }
  }
  return std::chrono::milliseconds(static_cast<long>(v * 1000));
}

}  // namespace

// Multi-node: the nodes meet in node 0's store under "ddprun/<run_id>/".
class StoreSync : public NodeSync {
 public:
  StoreSync(ddp::TcpStoreOptions so, std::string prefix, int node_rank, int nnodes, std::chrono::milliseconds timeout,
            std::chrono::milliseconds keep_alive, int keep_alive_max)
      : so_(so), prefix_(std::move(prefix)), node_(node_rank), nnodes_(nnodes), timeout_(timeout),
        keep_alive_(keep_alive), keep_alive_max_(keep_alive_max) {
    store_ = std::make_unique<ddp::TcpStore>(so_);
    efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  }
  ~StoreSync() override {
    stop_ = true;
    if (watcher_.joinable()) watcher_.join();
    if (efd_ >= 0) close(efd_);
  }
  ddp::Store& store() { return *store_; }
  std::string key(const std::string& k) const { return prefix_ + k; }

  int notify_fd() override { return efd_; }

  std::string remote_failure(int attempt) override {
    uint64_t v;
    while (read(efd_, &v, sizeof v) == sizeof v) {
    }
    std::lock_guard lk(mu_);
    if (seen_attempt_ != attempt) return "";
    return seen_reason_;
  }

  void report_failure(int attempt, const std::string& what) override {
    try {
      std::string mine = fmt::format("node {}: {}", node_, what);
      std::lock_guard lk(mu_);
      store_->compare_set(key(fmt::format("fail/{}", attempt)), "", mine);
      store_->set(key(fmt::format("exit/{}/done", attempt)), "failed");
    } catch (const std::exception& e) {
      spdlog::error("cannot tell the other nodes about the failure: {}", e.what());
    }
  }

  void attempt_barrier(int attempt) override {
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
    quiet_ = true;
    std::lock_guard lk(mu_);
    std::string fk = key(fmt::format("fail/{}", attempt));
    if (store_->check({fk})) {
      std::string why = store_->get(fk);
      if (!why.starts_with(fmt::format("node {}:", node_))) return why;
    }
    return "";
  }
  void exit_barrier(int attempt) override { last_exit_reason_ = exit_barrier_reason(attempt); }
  std::string last_exit_reason() const override { return last_exit_reason_; }
  std::string node_lost() override {
    try {
      std::lock_guard lk(mu_);
      if (store_->check({key("lost")})) return store_->get(key("lost"));
    } catch (const std::exception& e) {
      return fmt::format("lost the connection to the store: {}", e.what());
    }
    return "";
  }
  bool joined = false;

  // Node 0 keeps the store up until every node has left.
  void leave(bool is_host) {
    quiet_ = true;
    if (!joined) return;  // the rendezvous never completed: nobody to wait for
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
};

struct Rendezvous::Impl {
  RendezvousConfig c;
  std::unique_ptr<ddp::detail::StoreServer> server;
  std::unique_ptr<StoreSync> sync;
};

Rendezvous::Rendezvous(RendezvousConfig c) : impl_(std::make_unique<Impl>(Impl{std::move(c), nullptr, nullptr})) {}

Rendezvous::~Rendezvous() {
  if (impl_->sync) impl_->sync->leave(impl_->server != nullptr);
  impl_->sync.reset();
  if (impl_->server) impl_->server->stop();
}

NodeSync* Rendezvous::sync() { return impl_->sync.get(); }


JobPlan Rendezvous::join() {
  const Options& o = impl_->c.o;
  JobPlan p;
  p.hostname = impl_->c.hostname;
  p.run_id = o.rdzv_id;
  p.group_rank = o.node_rank;
  p.group_world_size = o.max_nodes;
  p.world_size = o.nproc_per_node;
  p.master_addr = o.standalone ? "localhost" : o.master_addr;
  p.use_agent_store = true;

  // Node 0 hosts the store that workers (TORCHELASTIC_USE_AGENT_STORE) and nodes share.
  if (o.node_rank == 0) {
    ddp::detail::StoreServerOptions so;
    so.host = "";  // every interface, dual stack
    so.port = static_cast<uint16_t>(o.standalone ? 0 : o.master_port);
    so.backlog = std::max(2048, o.nproc_per_node * o.max_nodes * 2);
    try {
      impl_->server = std::make_unique<ddp::detail::StoreServer>(so);
    } catch (const ddp::SystemError& e) {
      if (e.code() != EADDRINUSE) throw;
      std::string holder = who_listens(o.master_port);
      throw ddp::Error(fmt::format(
          "--master-port {}: the port is already in use{}; choose another with --master-port (or "
          "PET_MASTER_PORT), or use --standalone to pick a free one",
          o.master_port, holder.empty() ? "" : " by " + holder));
    }
    impl_->server->start();
  }
  p.master_port = impl_->server ? impl_->server->port() : o.master_port;
  if (o.max_nodes == 1) return p;

  // Multi-node static rendezvous.
  const auto join_timeout = conf_seconds(o, "join_timeout", 600);
  ddp::TcpStoreOptions so;
  so.host = o.master_addr;
  so.port = static_cast<uint16_t>(o.master_port);
  so.timeout = join_timeout;
  so.connect_timeout = join_timeout;
  try {
    auto keep_alive = conf_seconds(o, "keep_alive_interval", 5);
    auto max_attempt = conf_seconds(o, "keep_alive_max_attempt", 3).count() / 1000;
    if (keep_alive.count() <= 0 || max_attempt < 1)
      throw ddp::UsageError("--rdzv-conf: keep_alive_interval must be > 0 and keep_alive_max_attempt >= 1");
    impl_->sync = std::make_unique<StoreSync>(so, fmt::format("ddprun/{}/", o.rdzv_id), o.node_rank, o.max_nodes,
                                              join_timeout, keep_alive, static_cast<int>(max_attempt));
  } catch (const ddp::TimeoutError& e) {
    throw ddp::Error(fmt::format("node {} could not reach node 0's store at {}:{} within {}: {}", o.node_rank,
                                 o.master_addr, o.master_port, ddp::format_duration(join_timeout), e.what()));
  }
  ddp::Store& store = impl_->sync->store();
  auto key = [&](const std::string& k) { return impl_->sync->key(k); };
  const std::string host = o.local_addr.empty() ? p.hostname : o.local_addr;
  // The nonce tells two launches apart even on hosts with the same name.
  json me = {{"nproc", o.nproc_per_node}, {"nnodes", o.max_nodes}, {"max_restarts", o.max_restarts},
             {"run_id", o.rdzv_id}, {"host", host}, {"nonce", fmt::format("{}-{}", getpid(), random_nonce())}};
  const std::string mine = me.dump();
  const std::string abort_key = key("abort");
  auto abort_with = [&](const std::string& why) {
    try {
      store.compare_set(abort_key, "", why);
    } catch (const std::exception&) {
    }
    throw ddp::Error(why);
  };
  auto check_agrees = [&](int i, const json& n) {
    for (const char* field : {"nnodes", "max_restarts", "run_id"}) {
      if (n[field] != me[field])
        abort_with(fmt::format("rendezvous: nodes disagree on {}: node {} ({}) has {}, node {} ({}) has {}", field, i,
                               n.value("host", "?"), n[field].dump(), o.node_rank, host, me[field].dump()));
    }
  };
  std::string got = store.compare_set(key(fmt::format("node/{}", o.node_rank)), "", mine);
  if (got != mine) {
    json other = json::parse(got, nullptr, false);
    abort_with(fmt::format("rendezvous: --node-rank {} is taken by two nodes ({} and {}): give each node its own rank",
                           o.node_rank, other.is_object() ? other.value("host", "?") : "?", host));
  }
  std::vector<std::string> keys;
  for (int i = 0; i < o.max_nodes; ++i) keys.push_back(key(fmt::format("node/{}", i)));
  // Wait for every node in slices, so that an abort published by any node (a mismatch it
  // found against node 0) ends everyone's wait at once. Node 0's record comes first: every
  // node checks itself against it as soon as it exists.
  const auto deadline = std::chrono::steady_clock::now() + join_timeout;
  bool checked0 = false;
  for (;;) {
    if (store.check({abort_key})) throw ddp::Error(store.get(abort_key));
    if (!checked0 && store.check({keys[0]})) {
      check_agrees(0, json::parse(store.get(keys[0])));
      checked0 = true;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      std::vector<int> missing;
      for (int i = 0; i < o.max_nodes; ++i)
        if (!store.check({keys[static_cast<size_t>(i)]})) missing.push_back(i);
      if (missing.empty()) break;
      throw ddp::TimeoutError(fmt::format(
          "rendezvous: node rank{} {} never joined within the join timeout ({}; --rdzv-conf join_timeout=SECONDS)",
          missing.size() > 1 ? "s" : "", fmt::join(missing, ", "), ddp::format_duration(join_timeout)));
    }
    try {
      store.wait(keys, std::min<std::chrono::milliseconds>(left, 250ms));
      if (!checked0) continue;
      break;
    } catch (const ddp::TimeoutError&) {
    }
  }
  for (int i = 0; i < o.max_nodes; ++i) check_agrees(i, json::parse(store.get(keys[static_cast<size_t>(i)])));
  if (store.check({abort_key})) throw ddp::Error(store.get(abort_key));
  int world = 0;
  for (int i = 0; i < o.max_nodes; ++i) {
    json n = json::parse(store.get(keys[static_cast<size_t>(i)]));
    if (i < o.node_rank) p.rank_base += n["nproc"].get<int>();
    world += n["nproc"].get<int>();
  }
  p.world_size = world;
  spdlog::info("rendezvous: node {} of {}, ranks {}..{} of {}", o.node_rank, o.max_nodes, p.rank_base,
               p.rank_base + o.nproc_per_node - 1, world);
  return p;
}

}  // namespace ddprun
