// The backend contract (backend_contract.hpp) for the backends that need nothing beyond
// the project: ddprun's TCP store (a real ddp-store-server process, which the tests freeze
// with SIGSTOP and take down with SIGKILL) and the in-process memory backend (its fake
// clock driven by real time here). The etcd backend's instantiation is test_etcd_backend.cpp.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <iterator>
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

namespace {

using ddprun::rdzv::Backend;
using std::chrono::milliseconds;

// ---- the store: one ddp-store-server process per suite -----------------------------------
struct StoreServerProcess {
  pid_t pid = -1;
  int port = 0;

  void start(int want_port) {
    int out[2];
    if (::pipe(out) != 0) throw std::runtime_error("pipe");
    pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork");
    if (pid == 0) {
      ::dup2(out[1], 1);
      ::close(out[0]);
      ::close(out[1]);
      std::string p = std::to_string(want_port);
      ::execl(DDP_STORE_SERVER, DDP_STORE_SERVER, "--host", "127.0.0.1", "--port", p.c_str(), "--log-level", "warn",
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(out[1]);
    std::string text;
    char buf[64];
    ssize_t n;
    while (text.find('\n') == std::string::npos && (n = ::read(out[0], buf, sizeof buf)) > 0) text.append(buf, n);
    ::close(out[0]);
    if (text.rfind("port=", 0) != 0) throw std::runtime_error("ddp-store-server did not start: " + text);
    port = std::stoi(text.substr(5));
  }
  void kill() {
    if (pid <= 0) return;
    ::kill(pid, SIGCONT);
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
};

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
  // SIGSTOP takes effect a moment after kill() returns: wait until the server is stopped.
  static void freeze() {
    ::kill(store_server().pid, SIGSTOP);
    const std::string stat = "/proc/" + std::to_string(store_server().pid) + "/stat";
    for (int i = 0; i < 1000; ++i) {
      std::ifstream f(stat);
      std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      size_t paren = text.rfind(')');
      if (paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'T') return;
      std::this_thread::sleep_for(milliseconds(1));
    }
  }
  static void thaw() { ::kill(store_server().pid, SIGCONT); }
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
