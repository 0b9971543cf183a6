// The etcd backend against real etcd members (Debian's etcd-server): the backend contract
// on one member and on a three-member cluster, then what only etcd has: members that die
// (the leader among them), a cluster down for longer than the timeout, the run's keys and
// their lifetime, TLS. Each group of members starts once per test process.
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <atomic>
#include <mutex>

#include "backend_contract.hpp"
#include "etcd_harness.hpp"
#include "rendezvous/etcd/client.hpp"
#include "rendezvous/etcd/etcd_backend.hpp"

namespace {

using ddprun::rdzv::Backend;
using ddprun::rdzv::EtcdOptions;
using ddprun::rdzv::make_etcd_backend;
using ddprun::rdzv::Token;
using ddprun_contract::since;
using ddprun_test::EtcdCluster;
using ddprun_test::scaled;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

bool have_etcd() { return !ddprun_test::find_etcd().empty(); }

// The members of one group, started on first use and stopped when the process exits.
EtcdCluster& cluster(int members) {
  static std::map<int, std::unique_ptr<EtcdCluster>> all;
  auto& c = all[members];
  if (!c) {
    c = std::make_unique<EtcdCluster>(members);
    std::fprintf(stderr, "[etcd] %d member(s) ready in %lld ms\n", members, static_cast<long long>(c->start_time().count()));
  }
  return *c;
}

EtcdOptions options(const EtcdCluster& c, const std::string& run, milliseconds op) {
  EtcdOptions o;
  o.endpoints = c.endpoints();
  o.run_id = run;
  o.op_timeout = op;
  o.connect_timeout = std::min(op, milliseconds(2000));
  o.run_ttl = scaled(milliseconds(120000));
  return o;
}

template <int N>
struct EtcdTraits {
  static void start() {
    if (have_etcd()) cluster(N);
  }
  static void stop() {}
  static std::unique_ptr<Backend> make(const std::string& run, milliseconds op) {
    if (!have_etcd()) throw std::runtime_error("no etcd");
    return make_etcd_backend(options(cluster(N), run, op));
  }
  // etcd counts a lease's ttl in whole seconds and checks expiry twice a second; a new
  // leader renews every lease once.
  static milliseconds lease_ttl() { return milliseconds(2000); }
  static milliseconds lease_end_slack() { return scaled(milliseconds(N == 1 ? 1500 : 2500)); }
  static void freeze() {
    for (int i = 0; i < N; ++i) cluster(N).freeze(i);
  }
  static void thaw() {
    for (int i = 0; i < N; ++i) cluster(N).thaw(i);
  }
  static void take_down() {
    for (int i = 0; i < N; ++i) cluster(N).kill(i);
  }
  static void bring_up() {
    for (int i = 0; i < N; ++i)
      if (!cluster(N).running(i)) cluster(N).start(i);
    cluster(N).wait_ready(scaled(milliseconds(30000)));
  }
};

}  // namespace

namespace ddprun_contract {
using EtcdOne = EtcdTraits<1>;
using EtcdThree = EtcdTraits<3>;
INSTANTIATE_TYPED_TEST_SUITE_P(EtcdOne, BackendContract, ::testing::Types<EtcdOne>);
INSTANTIATE_TYPED_TEST_SUITE_P(EtcdThree, BackendContract, ::testing::Types<EtcdThree>);
}  // namespace ddprun_contract
