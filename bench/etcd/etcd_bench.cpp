// The etcd rendezvous backend's primitives against a real etcd member, next to the same
// operations on ddprun's TCP store (ddp-store-server's code, in this process) as the anchor
// measured in the same run:
//   state     read the state, then compare-and-set it (etcd: range + txn on the revision;
//             store: get + compare_set on the whole value)
//   append    one line to a log (etcd: a txn creating the next index key; store: APPEND)
//   add       a counter (etcd: a txn on the revision; store: ADD)
//   wake      a waiter blocked on a log sees a line another client appended (etcd: a watch;
//             store: WAIT on a key)
//   join N    N agents (threads, each its own connection) join one round: a compare-and-
//             set loop adds each to the state; the one that completes it writes a line
//             that every agent waits for. Time until all have seen it. And the same round
//             through a log: each appends its line and reads until it has seen all N.
// Also etcd's lease ends: close() to the line seen by a waiting node, and a silent node's
// lease (ttl 2 s) to its line. Medians (and p90) of REPS runs; ratios etcd / store.
//
//   etcd-bench [--reps N] [--agents 8,64] [--members 1]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "ddp/tcp_store.hpp"
#include "etcd_harness.hpp"
#include "rendezvous/etcd/etcd_backend.hpp"
#include "store/server.hpp"

namespace {

using ddprun::rdzv::Backend;
using ddprun::rdzv::Token;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

struct Stats {
  double median = 0, p90 = 0;
};
Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return {};
  return {v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 9 / 10)]};
}

// The few operations the benchmark needs, over either backend.
struct Ops {
  virtual ~Ops() = default;
  virtual std::pair<std::string, std::string> load() = 0;  // (state, token)
  virtual bool cas(const std::string& value, const std::string& token, std::string& current, std::string& now_token) = 0;
  virtual void append(const std::string& log, const std::string& line) = 0;
  virtual int64_t add(const std::string& counter) = 0;
  // Waits for line `from` of `log` (store: for the key "<log>/<from>").
  virtual void wait(const std::string& log, size_t from) = 0;
  // Lines from `from` on, once there is one.
  virtual std::vector<std::string> lines(const std::string& log, size_t from) = 0;
};

struct EtcdOps : Ops {
  explicit EtcdOps(std::unique_ptr<Backend> b) : b(std::move(b)) {}
  std::pair<std::string, std::string> load() override {
    auto s = b->load();
    return {s.state.value_or(""), s.token.value};
  }
  bool cas(const std::string& v, const std::string& token, std::string& cur, std::string& tok) override {
    auto r = b->compare_and_set(v, Token{token});
    cur = r.current.state.value_or("");
    tok = r.current.token.value;
    return r.ok;
  }
  void append(const std::string& log, const std::string& line) override { b->append(log, line); }
  int64_t add(const std::string& c) override { return b->add(c, 1); }
  void wait(const std::string& log, size_t from) override {
    while (b->wait(log, from, milliseconds(60000)).empty()) {
    }
  }
  std::vector<std::string> lines(const std::string& log, size_t from) override {
    return b->wait(log, from, milliseconds(60000));
  }
  std::unique_ptr<Backend> b;
};

// The anchor: ddprun's TCP store. Its compare_set compares whole values, so the token is
// the value itself ("" = missing); a log line is a key per index that waiters WAIT on.
struct StoreOps : Ops {
  StoreOps(uint16_t port, std::string run) : p(std::move(run) + "/") {
    ddp::TcpStoreOptions o;
    o.port = port;
    o.timeout = milliseconds(60000);
    s = std::make_unique<ddp::TcpStore>(o);
  }
  std::pair<std::string, std::string> load() override {
    std::string v = s->check({p + "state"}) ? s->get(p + "state") : "";
    return {v, v};
  }
  bool cas(const std::string& v, const std::string& token, std::string& cur, std::string& tok) override {
    cur = s->compare_set(p + "state", token, v);
    tok = cur;
    return cur == v;
  }
  void append(const std::string& log, const std::string& line) override {
    int64_t i = s->add(p + log + "/n", 1) - 1;
    s->set(p + log + "/" + std::to_string(i), line);
  }
  int64_t add(const std::string& c) override { return s->add(p + c, 1); }
  void wait(const std::string& log, size_t from) override { s->wait({p + log + "/" + std::to_string(from)}); }
  std::vector<std::string> lines(const std::string& log, size_t from) override {
    wait(log, from);
    std::vector<std::string> out;
    for (size_t i = from; s->check({p + log + "/" + std::to_string(i)}); ++i) out.push_back(s->get(p + log + "/" + std::to_string(i)));
    return out;
  }
  std::string p;  // the run's prefix
  std::unique_ptr<ddp::TcpStore> s;
};

using Factory = std::function<std::unique_ptr<Ops>(const std::string& run)>;

std::vector<double> time_each(int reps, const std::function<void()>& f) {
  std::vector<double> out;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    f();
    out.push_back(ms_since(t0));
  }
  return out;
}

std::vector<double> bench_state(const Factory& make, int reps, const std::string& run) {
  auto ops = make(run);
  int n = 0;
  return time_each(reps, [&] {
    auto [v, tok] = ops->load();
    std::string cur, now;
    ops->cas("value " + std::to_string(n++), tok, cur, now);
  });
}

std::vector<double> bench_wake(const Factory& make, int reps, const std::string& run) {
  auto waiter = make(run), writer = make(run);
  std::vector<double> out;
  for (int i = 0; i < reps; ++i) {
    std::atomic<bool> waiting{false};
    Clock::time_point seen;
    std::thread t([&] {
      waiting = true;
      waiter->wait("wake", static_cast<size_t>(i));
      seen = Clock::now();
    });
    while (!waiting) std::this_thread::yield();
    std::this_thread::sleep_for(milliseconds(20));  // the waiter is blocked by now
    auto t0 = Clock::now();
    writer->append("wake", "x");
    t.join();
    out.push_back(std::chrono::duration<double, std::milli>(seen - t0).count());
  }
  return out;
}

// N agents join a round: add themselves to the state by compare-and-set; the one that
// makes it complete appends "complete"; all wait for that line.
double bench_join(const Factory& make, int agents, const std::string& run) {
  std::vector<std::unique_ptr<Ops>> ops;
  for (int i = 0; i < agents; ++i) ops.push_back(make(run));  // connections made beforehand
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int i = 0; i < agents; ++i)
    ts.emplace_back([&, i] {
      Ops& o = *ops[i];
      ++ready;
      while (!go) std::this_thread::yield();
      auto [state, token] = o.load();
      while (true) {
        int count = state.empty() ? 0 : static_cast<int>(std::count(state.begin(), state.end(), ',')) + 1;
        std::string mine = state.empty() ? "a" + std::to_string(i) : state + ",a" + std::to_string(i);
        std::string cur, tok;
        if (o.cas(mine, token, cur, tok)) {
          if (count + 1 == agents) o.append("round", "complete");
          break;
        }
        state = cur;
        token = tok;
      }
      o.wait("round", 0);
    });
  while (ready < agents) std::this_thread::yield();
  auto t0 = Clock::now();
  go = true;
  for (auto& t : ts) t.join();
  return ms_since(t0);
}

// N agents join through a log: each appends its line, then reads the log until it holds
// all N (no compare-and-set, so no retries).
double bench_join_log(const Factory& make, int agents, const std::string& run) {
  std::vector<std::unique_ptr<Ops>> ops;
  for (int i = 0; i < agents; ++i) ops.push_back(make(run));
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int i = 0; i < agents; ++i)
    ts.emplace_back([&, i] {
      Ops& o = *ops[i];
      ++ready;
      while (!go) std::this_thread::yield();
      o.append("joined", "a" + std::to_string(i));
      size_t n = 0;
      while (n < static_cast<size_t>(agents)) n += o.lines("joined", n).size();
    });
  while (ready < agents) std::this_thread::yield();
  auto t0 = Clock::now();
  go = true;
  for (auto& t : ts) t.join();
  return ms_since(t0);
}

void row(const char* name, const std::vector<double>& etcd, const std::vector<double>& store) {
  auto e = stats(etcd), s = stats(store);
  std::printf("| %s | %.3f (p90 %.3f) | %.3f (p90 %.3f) | %.1fx |\n", name, e.median, e.p90, s.median, s.p90,
              s.median > 0 ? e.median / s.median : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 200, members = 1;
  std::vector<int> agents{8, 64};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--members")) members = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--agents")) {
      agents.clear();
      for (std::string s = argv[i + 1]; !s.empty();) {
        size_t c = s.find(',');
        agents.push_back(std::stoi(s.substr(0, c)));
        s = c == std::string::npos ? "" : s.substr(c + 1);
      }
    }
  }
  if (ddprun_test::find_etcd().empty()) {
    std::fprintf(stderr, "etcd-bench: no etcd binary (Debian package etcd-server)\n");
    return 77;
  }
  auto t0 = Clock::now();
  ddprun_test::EtcdCluster cluster(members);
  double start_ms = ms_since(t0);
  ddp::detail::StoreServerOptions so;
  so.host = "127.0.0.1";
  ddp::detail::StoreServer server(so);
  server.start();
  const uint16_t port = server.port();

  int run_no = 0;
  auto fresh = [&] { return fmt::format("bench-{}-{}", ::getpid(), run_no++); };
  Factory etcd = [&](const std::string& run) {
    ddprun::rdzv::EtcdOptions o;
    o.endpoints = cluster.endpoints();
    o.run_id = run;
    o.op_timeout = milliseconds(60000);
    o.run_ttl = milliseconds(300000);
    return std::make_unique<EtcdOps>(ddprun::rdzv::make_etcd_backend(o));
  };
  Factory store = [&](const std::string& run) { return std::make_unique<StoreOps>(port, run); };

  std::printf("etcd %d member(s) ready in %.0f ms; %d reps; 2 clients per run unless noted\n\n", members, start_ms, reps);
  std::printf("| operation | etcd backend, ms | ddprun TCP store, ms | etcd / store |\n|---|---|---|---|\n");
  // Interleaved, each on a fresh run (etcd) / key space (the store is fresh per process).
  std::vector<double> e, s;
  e = bench_state(etcd, reps, fresh());
  s = bench_state(store, reps, fresh());
  row("state: load + compare-and-set", e, s);
  {
    auto eo = etcd(fresh());
    auto so2 = store(fresh());
    e = time_each(reps, [&] { eo->append("log", "line"); });
    s = time_each(reps, [&] { so2->append("log", "line"); });
    row("append a line", e, s);
    e = time_each(reps, [&] { eo->add("c"); });
    s = time_each(reps, [&] { so2->add("c"); });
    row("add to a counter", e, s);
  }
  e = bench_wake(etcd, std::max(10, reps / 4), fresh());
  s = bench_wake(store, std::max(10, reps / 4), fresh());
  row("wake: append seen by a blocked waiter", e, s);
  for (int n : agents) {
    std::vector<double> je, js;
    for (int r = 0; r < 5; ++r) {
      je.push_back(bench_join(etcd, n, fresh()));
      js.push_back(bench_join(store, n, fresh()));
    }
    row(fmt::format("join {} agents (threads) by compare-and-set, median of 5", n).c_str(), je, js);
    je.clear();
    js.clear();
    for (int r = 0; r < 5; ++r) {
      je.push_back(bench_join_log(etcd, n, fresh()));
      js.push_back(bench_join_log(store, n, fresh()));
    }
    row(fmt::format("join {} agents (threads) through a log, median of 5", n).c_str(), je, js);
  }

  // Lease ends, etcd only: a closing node and a silent one.
  std::vector<double> closing, silent;
  for (int r = 0; r < 5; ++r) {
    std::string run = fresh();
    ddprun::rdzv::EtcdOptions o;
    o.endpoints = cluster.endpoints();
    o.run_id = run;
    o.run_ttl = milliseconds(300000);
    auto observer = ddprun::rdzv::make_etcd_backend(o);
    observer->open_lease(milliseconds(60000));
    auto node = ddprun::rdzv::make_etcd_backend(o);
    node->open_lease(milliseconds(2000));
    node->on_lease_end("events", "lost");
    std::atomic<int64_t> closed_at{0};
    std::thread t([&] {
      std::this_thread::sleep_for(milliseconds(50));  // the observer waits by now
      closed_at = Clock::now().time_since_epoch().count();
      node->close();
    });
    while (observer->wait("events", 0, milliseconds(10000)).empty()) {
    }
    auto seen = Clock::now();
    t.join();
    closing.push_back(std::chrono::duration<double, std::milli>(seen - Clock::time_point(Clock::duration(closed_at.load()))).count());
    auto node2 = ddprun::rdzv::make_etcd_backend(o);
    node2->open_lease(milliseconds(2000));
    node2->on_lease_end("events", "silent");
    auto t3 = Clock::now();
    while (observer->wait("events", 1, milliseconds(10000)).empty()) {
    }
    silent.push_back(ms_since(t3));
    observer->close();
  }
  auto c = stats(closing), sl = stats(silent);
  std::printf("\netcd lease ends (median of 5): close() to the line seen by a waiting node %.1f ms; a silent "
              "node (ttl 2 s) to its line %.0f ms\n",
              c.median, sl.median);
  server.stop();
  return 0;
}
