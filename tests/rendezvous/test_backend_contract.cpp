// The backend contract (backend_contract.hpp) for the backends that need nothing beyond
// the project: ddprun's TCP store (a real ddp-store-server process, which the tests freeze
// with SIGSTOP and take down with SIGKILL) and the in-process memory backend (its fake
// clock driven by real time here). The etcd backend's instantiation is test_etcd_backend.cpp.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include "backend_contract.hpp"
#include "rendezvous/memory_backend.hpp"
#include "rendezvous/store_backend.hpp"
#include "store_server_process.hpp"

namespace {

using ddprun::rdzv::Backend;
using std::chrono::milliseconds;

// ---- the store: one ddp-store-server process per suite -----------------------------------
using ddp::test::StoreServerProcess;

StoreServerProcess& store_server() {
  static StoreServerProcess s;
  return s;
}

struct StoreTraits {
  static constexpr bool kForks = true;
  static void start() { store_server().start(0); }
  static void stop() { store_server().kill(); }
  static std::unique_ptr<Backend> make(const std::string& run, milliseconds op) {
    ddprun::rdzv::StoreBackendOptions o;
    o.host = "127.0.0.1";
    o.port = static_cast<uint16_t>(store_server().port);
    o.run_id = run;
    o.timeout = op;
    o.connect_timeout = op;
    return std::make_unique<ddprun::rdzv::StoreBackend>(o);
  }
  static milliseconds lease_ttl() { return milliseconds(1000); }
  static milliseconds lease_end_slack() { return ddprun_contract::scale(milliseconds(500)); }
  static void freeze() { store_server().freeze(); }
  static void thaw() { store_server().thaw(); }
  static void take_down() {
    int port = store_server().port;
    store_server().kill();
    store_server().port = port;
  }
  static void bring_up() { store_server().start(store_server().port); }
};

// ---- memory: a world per run, its clock moved on by a thread -----------------------------
struct MemoryWorlds {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<ddprun::rdzv::MemoryWorld>> worlds;
  std::set<ddprun::rdzv::MemoryWorld*> ticking;  // worlds that have seen a tick
  std::atomic<bool> stop{false};
  std::thread ticker;

  void each(const std::function<void(ddprun::rdzv::MemoryWorld&)>& f) {
    std::lock_guard lk(mu);
    for (auto& [run, w] : worlds) f(*w);
  }
  // Moves every world's clock on by d, except a world made since the last tick: its part
  // of d may be older than the world (its leases would end early).
  void tick(milliseconds d) {
    std::lock_guard lk(mu);
    for (auto& [run, w] : worlds)
      if (!ticking.insert(w.get()).second) w->advance(d);
  }
};

MemoryWorlds& memory() {
  static MemoryWorlds m;
  return m;
}

struct MemoryTraits {
  static constexpr bool kForks = false;
  static void start() {
    memory().ticker = std::thread([] {
      auto last = std::chrono::steady_clock::now();
      while (!memory().stop) {
        std::this_thread::sleep_for(milliseconds(20));
        auto now = std::chrono::steady_clock::now();
        auto d = std::chrono::duration_cast<milliseconds>(now - last);
        last += d;
        memory().tick(d);
      }
    });
  }
  static void stop() {
    memory().stop = true;
    memory().ticker.join();
  }
  static std::unique_ptr<Backend> make(const std::string& run, milliseconds) {
    std::lock_guard lk(memory().mu);
    auto& w = memory().worlds[run];
    if (!w) w = std::make_shared<ddprun::rdzv::MemoryWorld>();
    return w->backend(run);
  }
  static milliseconds lease_ttl() { return milliseconds(1000); }
  static milliseconds lease_end_slack() { return ddprun_contract::scale(milliseconds(300)); }
  static void freeze() { set_down(true); }
  static void thaw() { set_down(false); }
  static void take_down() { set_down(true); }
  static void bring_up() { set_down(false); }
  static void set_down(bool down) {
    memory().each([&](ddprun::rdzv::MemoryWorld& w) { w.set_down(down); });
  }
};

}  // namespace

namespace ddprun_contract {
INSTANTIATE_TYPED_TEST_SUITE_P(Store, BackendContract, ::testing::Types<StoreTraits>);
INSTANTIATE_TYPED_TEST_SUITE_P(Memory, BackendContract, ::testing::Types<MemoryTraits>);
}  // namespace ddprun_contract
