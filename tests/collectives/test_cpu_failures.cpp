// Failure behaviour of the CPU backend: timeouts name the operation, rank and peer; a peer
// killed mid-collective makes every other rank fail well within the timeout, naming it; a
// /dev/shm too small for the shared-memory segment means loopback TCP, not SIGBUS.
#include <sched.h>
#include <signal.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "file_store.hpp"
#include "harness.hpp"

using namespace ddp_test;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using ddp::test::scaled;
using ddp::test::scaled_seconds;

namespace {

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

void timeout_names_peer(ddp::Transport t, size_t count, size_t slice = 0) {
  GroupConfig c;
  c.n = 2;
  c.transport = t;
  c.slice = slice;
  std::string err0, err1, type0;
  double waited = 0;
  std::atomic<bool> rank0_done{false};
  auto errors = run_ranks(c, [&](ddp::ProcessGroup& pg) {
    std::vector<float> v(count, 1.0f);
    if (pg.rank() == 0) {
      auto t0 = Clock::now();
      try {
        pg.all_reduce(std::span<float>(v), {.timeout = 300ms});
      } catch (const ddp::TimeoutError& e) {
        type0 = "TimeoutError";
        err0 = e.what();
      } catch (const std::exception& e) {
        type0 = "other";
        err0 = e.what();
      }
      waited = std::chrono::duration<double>(Clock::now() - t0).count();
      // The group is now unusable.
      try {
        pg.barrier();
        err0 += " | barrier after failure did not throw";
      } catch (const ddp::CollectiveError& e) {
        if (!contains(e.what(), "unusable")) err0 += std::string(" | ") + e.what();
      }
      rank0_done = true;
    } else {
      while (!rank0_done) std::this_thread::sleep_for(5ms);  // never joins in time
      auto t0 = Clock::now();
      try {
        pg.all_reduce(std::span<float>(v), {.timeout = scaled(60s)});
        err1 = "no error";
      } catch (const std::exception& e) {
        err1 = e.what();
      }
      // Told at once (milliseconds), not at its own timeout: the bound is far from both.
      if (Clock::now() - t0 > scaled(10s)) err1 += " | took longer than " + ddp::format_duration(scaled(10s));
    }
  });
  expect_no_errors(errors);
  EXPECT_EQ(type0, "TimeoutError") << err0;
  EXPECT_TRUE(contains(err0, "all_reduce")) << err0;
  EXPECT_TRUE(contains(err0, "rank 0")) << err0;
  EXPECT_TRUE(contains(err0, "peer rank 1")) << err0;
  EXPECT_TRUE(contains(err0, "300 ms")) << err0;
  EXPECT_FALSE(contains(err0, " | ")) << err0;
  EXPECT_GE(waited, 0.29);
  EXPECT_LT(waited, scaled_seconds(10));  // at the 300 ms timeout, not much later
  // Rank 1 learns that rank 0 gave up (shared-memory flag or closed socket), quickly.
  EXPECT_TRUE(contains(err1, "peer rank 0")) << err1;
  EXPECT_FALSE(contains(err1, " | ")) << err1;
}

TEST(CollectiveFailures, TimeoutShmFlat) { timeout_names_peer(ddp::Transport::kAuto, 16); }
TEST(CollectiveFailures, TimeoutShmRing) { timeout_names_peer(ddp::Transport::kAuto, 1 << 20); }
TEST(CollectiveFailures, TimeoutShmSlice) { timeout_names_peer(ddp::Transport::kAuto, 1 << 20, 1); }
TEST(CollectiveFailures, TimeoutTcp) { timeout_names_peer(ddp::Transport::kTcp, 1 << 20); }

// Options of rank `rank` of `world` on `store`, bootstrap bounded by `timeout`.
ddp::ProcessGroupOptions rank_of(int rank, int world, std::shared_ptr<ddp::Store> store,
                                 std::chrono::milliseconds timeout) {
  ddp::ProcessGroupOptions o;
  o.rank = rank;
  o.world_size = world;
  o.store = std::move(store);
  o.timeout = timeout;
  return o;
}

TEST(CollectiveFailures, BootstrapTimesOutNamingMissingRank) {
  auto o = rank_of(0, 3, std::make_shared<ddp::MemoryStore>(), 200ms);
  try {
    ddp::init_process_group(o);
    FAIL() << "no exception";
  } catch (const ddp::TimeoutError& e) {
    EXPECT_TRUE(contains(e.what(), "init_process_group")) << e.what();
    // Every missing rank, by rank (it named the first key it waited for: 'pg/host/1' alone).
    EXPECT_TRUE(contains(e.what(), "ranks 1, 2 of 3 did not join within the timeout (200 ms)")) << e.what();
  }
}

// A rank whose rank 0 never came names it (it named the key 'pg/tag').
TEST(CollectiveFailures, BootstrapTimesOutNamingAMissingRankZero) {
  try {
    ddp::init_process_group(rank_of(1, 3, std::make_shared<ddp::MemoryStore>(), 200ms));
    FAIL() << "no exception";
  } catch (const ddp::TimeoutError& e) {
    EXPECT_TRUE(contains(e.what(), "rank 0 of 3 did not join within the timeout (200 ms)")) << e.what();
  }
}

// A rank given another world size than rank 0's is told at once, not at the timeout.
TEST(CollectiveFailures, AWorldSizeOtherThanRankZerosIsAnErrorAtOnce) {
  auto store = std::make_shared<ddp::MemoryStore>();
  std::string err1;
  std::thread r0([&] {
    try {
      ddp::init_process_group(rank_of(0, 2, store, 3s));
    } catch (const ddp::Error&) {
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  try {
    ddp::init_process_group(rank_of(1, 3, store, 3s));
  } catch (const ddp::UsageError& e) {  // (the caller's to fix)
    err1 = e.what();
  } catch (const ddp::Error& e) {
    err1 = std::string("not a UsageError: ") + e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  r0.join();
  EXPECT_TRUE(contains(err1, "rank 0 has world size 2, this rank (1) 3")) << err1;
}

TEST(CollectiveFailures, UnknownBackendOrTransportIsAUsageError) {
  ddp::ProcessGroupOptions o;
  o.rank = 0;
  o.world_size = 1;
  o.backend = static_cast<ddp::Backend>(7);
  EXPECT_THROW(ddp::init_process_group(o), ddp::UsageError);
  o.backend = ddp::Backend::kCpu;
  o.transport = static_cast<ddp::Transport>(9);
  EXPECT_THROW(ddp::init_process_group(o), ddp::UsageError);
}

// A group belongs to the process that made it: a forked child's call is refused (it spoke on
// its parent's links and rings, and a peer's result came out wrong with no error), and the
// parent's calls go on.
TEST(CollectiveFailures, AForkedChildsCallIsRefused) {
  ddp::ProcessGroupOptions o;
  o.rank = 0;
  o.world_size = 1;
  auto pg = ddp::init_process_group(o);
  float x = 1;
  const pid_t child = fork();
  if (child == 0) {
    try {
      pg->all_reduce(std::span<float>(&x, 1));
    } catch (const ddp::UsageError& e) {
      _exit(contains(e.what(), "called in a process forked from the one that made the group") ? 0 : 2);
    } catch (...) {
      _exit(3);
    }
    _exit(4);  // not refused
  }
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  pg->all_reduce(std::span<float>(&x, 1));
  EXPECT_EQ(x, 1);
}

// Forks n ranks (FileStore rendezvous); `victim` SIGKILLs itself 300 ms into a loop of
// large all_reduces (mid_element: once it has sent 1 MiB over TCP, 2 bytes into a float, its
// stream's end inside an element). Every other rank must fail, naming the victim, long before
// the timeout.
// A port nobody listens on now (bound, then released).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    ADD_FAILURE() << "no free port: " << ddp::errno_text(errno);
  ::close(fd);
  return ntohs(a.sin_port);
}

// env_store: the ranks join from the environment with no launcher's store
// (TORCHELASTIC_USE_AGENT_STORE unset): rank 0 hosts the job's store, as PyTorch's env://.
void killed_peer(int n, int victim, ddp::Transport transport, size_t slice = 0, bool mid_element = false,
                 bool env_store = false) {
  namespace fs = std::filesystem;
  std::string dir = fs::temp_directory_path() / ("ddp-kill-" + std::to_string(getpid()) + "-" +
                                                 std::to_string(Clock::now().time_since_epoch().count()));
  fs::create_directories(dir + "/store");
  // What a rank without failure detection would wait for: far above every bound below.
  const auto op_timeout = scaled(180s);
  const auto guard = scaled(60s);  // then the ranks are killed: a hang
  std::vector<pid_t> pids;
  const int port = env_store ? free_port() : 0;
  auto start = Clock::now();
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::string result;
      try {
        ddp::ProcessGroupOptions o;
        o.rank = r;
        o.world_size = n;
        if (!env_store) o.store = std::make_shared<ddp_testing::FileStore>(dir + "/store");
        o.transport = transport;
        o.slice_min_bytes = slice;
        o.timeout = scaled(30s);  // a hang guard for the bootstrap
        if (r == victim && mid_element) setenv("DDP_TEST_FAULT", "tcp-die-mid-element", 1);
        if (env_store) {
          for (const char* v : {"TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "GROUP_RANK"})
            unsetenv(v);
          const std::pair<const char*, std::string> vars[] = {
              {"RANK", std::to_string(r)},       {"LOCAL_RANK", std::to_string(r)},
              {"WORLD_SIZE", std::to_string(n)}, {"LOCAL_WORLD_SIZE", std::to_string(n)},
              {"MASTER_ADDR", "127.0.0.1"},      {"MASTER_PORT", std::to_string(port)}};
          for (const auto& [k, v] : vars) setenv(k, v.c_str(), 1);
          o.timeout = op_timeout;  // what a notice to a store that is gone waited for, up to a minute
        }
        auto pg = env_store ? ddp::init_process_group_from_env(o) : ddp::init_process_group(o);
        if (r == victim && !mid_element)
          std::thread([] {
            std::this_thread::sleep_for(300ms);
            kill(getpid(), SIGKILL);
          }).detach();
        std::vector<float> v(1 << 20, 1.0f);
        for (int it = 0; it < 1000000; ++it) {
          std::fill(v.begin(), v.end(), 1.0f);
          pg->all_reduce(std::span<float>(v), {.timeout = op_timeout});
        }
        result = "OK no error";
      } catch (const std::exception& e) {
        result = ddp::exception_type_name(e) + ": " + e.what();
      }
      std::ofstream(dir + "/result." + std::to_string(r)) << result;
      _exit(0);
    }
    pids.push_back(pid);
  }
  // Reap everything (a zombie victim would still look alive to kill(pid, 0)).
  int status_victim = 0;
  for (int left = n; left > 0;) {
    int st = 0;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      --left;
      if (p == pids[victim]) status_victim = st;
      continue;
    }
    if (Clock::now() - start > guard) {
      for (pid_t q : pids) kill(q, SIGKILL);
      ADD_FAILURE() << "ranks still running after " << ddp::format_duration(guard);
      while (waitpid(-1, nullptr, 0) > 0) {
      }
      break;
    }
    std::this_thread::sleep_for(2ms);
  }
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_TRUE(WIFSIGNALED(status_victim) && WTERMSIG(status_victim) == SIGKILL);
  // Forking, the bootstrap, 300 ms of all_reduces, then detection: a second or two. The
  // bound is far from that and from the operation timeout.
  EXPECT_LT(elapsed, scaled_seconds(30)) << "others should fail by detection, not by the "
                                         << ddp::format_duration(op_timeout) << " timeout";
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    std::ifstream f(dir + "/result." + std::to_string(r));
    std::stringstream ss;
    ss << f.rdbuf();
    std::string res = ss.str();
    EXPECT_TRUE(contains(res, "ddp::CollectiveError")) << "rank " << r << ": " << res;
    // With the store gone too, only the victim's neighbours can name it: the others learn
    // from a closed link, with no notice to quote.
    const bool neighbour = r == (victim + 1) % n || (r + 1) % n == victim;
    if (!env_store || neighbour) {
      EXPECT_TRUE(contains(res, "rank " + std::to_string(victim))) << "rank " << r << ": " << res;
    }
    EXPECT_TRUE(contains(res, "all_reduce")) << "rank " << r << ": " << res;
    // Over TCP the rank the victim sent to (its connection accepted from the victim) names
    // the victim's address, not "accepted connection".
    if (const auto own = res.substr(0, res.find("; rank"));
        transport == ddp::Transport::kTcp && r == (victim + 1) % n && contains(own, "closed the TCP connection")) {
      EXPECT_TRUE(contains(own, "peer rank " + std::to_string(victim) + " (127.0.0.1:")) << res;
    }
    // The rank the victim sent to fails on that piece (unless a broken send came first).
    if (mid_element && r == (victim + 1) % n) {
      if (auto own = res.substr(0, res.find("; rank")); contains(own, "peer rank " + std::to_string(victim))) {
        EXPECT_TRUE(contains(own, "in the middle of an element: 2 byte(s) of it came")) << res;
      }
    }
  }
  fs::remove_all(dir);
}

TEST(CollectiveFailures, KilledPeerShmFourRanks) { killed_peer(4, 2, ddp::Transport::kAuto); }
TEST(CollectiveFailures, KilledPeerTcpFourRanks) { killed_peer(4, 2, ddp::Transport::kTcp); }
// A rank killed between two partial sends leaves its stream's end inside an element: the
// rank it sent to has a piece of a float, then EOF (once, in CI, ranks waited for more).
TEST(CollectiveFailures, KilledPeerTcpMidElementFourRanks) {
  killed_peer(4, 2, ddp::Transport::kTcp, 0, true);
}
TEST(CollectiveFailures, KilledPeerShmSliceFourRanks) {
  killed_peer(4, 2, ddp::Transport::kAuto, 1);
}
TEST(CollectiveFailures, KilledPeerShmSliceThreeRanksFirst) {
  killed_peer(3, 0, ddp::Transport::kAuto, 1);
}
// Rank 1 (a process) destroys its group and exits at once; rank 0 then calls all_reduce: it
// is told that rank 1 made fewer calls (over shared memory it said "exited", as of a crash).
TEST(CollectiveFailures, APeerThatLeftAndExitedMadeFewerCalls) {
  namespace fs = std::filesystem;
  const std::string dir = fs::temp_directory_path() / ("ddp-left-" + std::to_string(getpid()));
  fs::create_directories(dir + "/store");
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    pids[r] = fork();
    ASSERT_GE(pids[r], 0);
    if (pids[r] > 0) continue;
    std::string result = "no error";
    try {
      ddp::ProcessGroupOptions o;
      o.rank = r;
      o.world_size = 2;
      o.store = std::make_shared<ddp_testing::FileStore>(dir + "/store");
      o.timeout = scaled(30s);
      auto pg = ddp::init_process_group(o);
      if (r == 1) {  // leaves, then is gone
        pg.reset();
        _exit(0);
      }
      std::this_thread::sleep_for(300ms);  // rank 1 has exited by then
      std::vector<float> v(16, 1.0f);
      pg->all_reduce(std::span<float>(v), {.timeout = scaled(30s)});
    } catch (const std::exception& e) {
      result = e.what();
    }
    std::ofstream(dir + "/result." + std::to_string(r)) << result;
    _exit(0);
  }
  for (pid_t p : pids) waitpid(p, nullptr, 0);
  std::ifstream in(dir + "/result.0");
  const std::string err0((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove_all(dir);
  EXPECT_TRUE(contains(err0, "rank 1 destroyed its process group after 0 collective(s) where this rank is at #1"))
      << err0;
}

TEST(CollectiveFailures, KilledPeerShmTwoRanks) { killed_peer(2, 0, ddp::Transport::kAuto); }
// Rank 0 hosted the store (no launcher) and is killed: the others fail at once too. Their
// abort notice to that store retried for its connect timeout (a minute) before they reported.
TEST(CollectiveFailures, KilledStoreHostingRankZeroThreeRanks) {
  const auto t0 = Clock::now();
  killed_peer(3, 0, ddp::Transport::kAuto, 0, false, true);
  EXPECT_LT(Clock::now() - t0, scaled(20s)) << "the others waited for the store that died with rank 0";
}

// The same on a TCP ring of 8: a failing rank closes its links after a brief try of the
// store that is gone, so every rank learns at once (each then tries for up to 2 s, side by
// side). It tried for 2 s first: each rank learnt 2 s after its neighbour (12 s in all).
TEST(CollectiveFailures, KilledStoreHostingRankZeroEightRanksTcp) {
  const auto t0 = Clock::now();
  killed_peer(8, 0, ddp::Transport::kTcp, 0, false, true);
  EXPECT_LT(Clock::now() - t0, scaled(7s)) << "the loss went round the ring one store timeout a rank";
}

// The shared-memory segment's name is gone once everyone mapped it.
TEST(CollectiveFailures, ShmSegmentNameIsUnlinked) {
  GroupConfig c;
  c.n = 3;
  auto errors = run_ranks(c, [&](ddp::ProcessGroup& pg) {
    pg.barrier();
    if (pg.rank() == 0)
      for (auto& e : std::filesystem::directory_iterator("/dev/shm"))
        if (contains(e.path().filename().string(), "ddp-" + std::to_string(getpid()) + "-"))
          throw std::runtime_error("segment still named: " + e.path().string());
    pg.barrier();
  });
  expect_no_errors(errors);
}

// A store that refuses to set one key, so that the rank using it fails inside its bootstrap.
class RefusingStore : public ddp::Store {
 public:
  RefusingStore(std::shared_ptr<ddp::Store> inner, std::string refused)
      : inner_(std::move(inner)), refused_(std::move(refused)) {}
  void set(const std::string& k, const std::string& v) override {
    if (k == refused_) throw ddp::StoreError("injected failure: cannot set " + k);
    inner_->set(k, v);
  }
  std::string get(const std::string& k) override { return inner_->get(k); }
  int64_t add(const std::string& k, int64_t d) override { return inner_->add(k, d); }
  std::string compare_set(const std::string& k, const std::string& e, const std::string& d) override {
    return inner_->compare_set(k, e, d);
  }
  bool check(const std::vector<std::string>& k) override { return inner_->check(k); }
  void wait(const std::vector<std::string>& k, std::chrono::milliseconds t) override { inner_->wait(k, t); }
  bool delete_key(const std::string& k) override { return inner_->delete_key(k); }
  int64_t num_keys() override { return inner_->num_keys(); }

 private:
  std::shared_ptr<ddp::Store> inner_;
  std::string refused_;
};

// Rank 2 of 3 fails while the others wait for it in the bootstrap (for its shared-memory
// mapping, its TCP address, its TCP connection): they must give up at once, naming it,
// not after the init timeout.
void bootstrap_failure_is_fast(ddp::Transport transport, const std::string& refused_key) {
  GroupConfig c;
  c.n = 3;
  c.transport = transport;
  c.timeout = scaled(60s);
  std::vector<Clock::duration> took(3);
  auto t0 = Clock::now();
  auto errors = run_ranks_with(
      3,
      [&](int r, std::shared_ptr<ddp::Store> store) {
        if (r == 2) store = std::make_shared<RefusingStore>(store, refused_key);
        return options_for(c, r, std::move(store));
      },
      [](ddp::ProcessGroup&) {});
  auto all = Clock::now() - t0;
  // Milliseconds; the bound is far from that and from the init timeout.
  EXPECT_LT(all, scaled(15s)) << "the ranks waited for the init timeout";
  EXPECT_TRUE(contains(errors[2], "injected failure: cannot set " + refused_key)) << errors[2];
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(contains(errors[r], "init_process_group")) << errors[r];
    EXPECT_TRUE(contains(errors[r], "rank 2")) << errors[r];
  }
  // At least one of them names what rank 2 reported (the other may see rank 2's sockets or
  // shared-memory flag first).
  EXPECT_TRUE(contains(errors[0] + errors[1], "rank 2 reported: ")) << errors[0] << "\n" << errors[1];
}

TEST(CollectiveFailures, BootstrapFailureOfAShmPeerEndsEveryonesWait) {
  bootstrap_failure_is_fast(ddp::Transport::kAuto, "pg/shm_mapped/2");
}

TEST(CollectiveFailures, BootstrapFailureOfATcpPeerEndsEveryonesWait) {
  bootstrap_failure_is_fast(ddp::Transport::kTcp, "pg/addr/2");
}

// Exact results of all_reduce (flat-path, ring and slice sizes), broadcast and all_gather.
void check_collectives(ddp::ProcessGroup& pg);

// One rank told to use TCP among ranks left on kAuto: every link must agree on its kind
// (it used to be shared memory at one end and TCP at the other: a hang until the timeout).
// A host a rank names for itself that is no IPv4 address (a typo, an IPv6 address) is
// refused at init_process_group on that rank, and the others hear of it at once; before,
// every peer retried it until the group's timeout.
TEST(CollectiveFailures, AHostThatIsNoIPv4AddressIsRefusedAtOnce) {
  for (const char* bad : {"not an address", "::1"}) {
    SCOPED_TRACE(bad);
    GroupConfig c;
    c.n = 2;
    c.timeout = scaled(60s);
    auto t0 = Clock::now();
    auto errors = run_ranks_with(
        c.n,
        [&](int r, std::shared_ptr<ddp::Store> store) {
          auto o = options_for(c, r, std::move(store));
          o.transport = ddp::Transport::kTcp;
          if (r == 1) o.host = bad;
          return o;
        },
        check_collectives);
    ASSERT_EQ(errors.size(), 2u);
    EXPECT_TRUE(contains(errors[1], std::string("ProcessGroupOptions::host '") + bad +
                                        "' is not an IPv4 address, nor a name of one"))
        << errors[1];
    EXPECT_FALSE(errors[0].empty());
    EXPECT_LT(Clock::now() - t0, scaled(20s));
  }
}

TEST(CollectiveFailures, MixedTransportOptionsAgreeOnEveryLink) {
  GroupConfig c;
  c.n = 4;
  c.timeout = scaled(60s);  // what a link whose ends disagree would hang for
  auto t0 = Clock::now();
  auto errors = run_ranks_with(
      c.n,
      [&](int r, std::shared_ptr<ddp::Store> store) {
        auto o = options_for(c, r, std::move(store));
        if (r == 1) o.transport = ddp::Transport::kTcp;
        return o;
      },
      check_collectives);
  expect_no_errors(errors);
  // Well under a second idle, a few seconds on a loaded machine: far below the hang.
  EXPECT_LT(Clock::now() - t0, scaled(30s));
}

void check_collectives(ddp::ProcessGroup& pg) {
  const int n = pg.size(), r = pg.rank();
  auto fail = [&](const std::string& what, size_t i, double got, double want) {
    throw std::runtime_error(what + ": element " + std::to_string(i) + " is " +
                             std::to_string(got) + ", expected " + std::to_string(want));
  };
  for (size_t bytes : {size_t{16}, size_t{1} << 20, size_t{5} << 20}) {
    std::vector<float> v(bytes / sizeof(float));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>(input_value(ddp::ReduceOp::kSum, ddp::DType::kFloat32, r, i));
    pg.all_reduce(std::span<float>(v));
    for (size_t i = 0; i < v.size(); ++i) {
      double want = expected_value(ddp::ReduceOp::kSum, ddp::DType::kFloat32, n, i);
      if (v[i] != want) fail("all_reduce of " + std::to_string(bytes) + " bytes", i, v[i], want);
    }
  }
  std::vector<float> b(1 << 18);
  for (size_t i = 0; i < b.size(); ++i) b[i] = r == 2 ? static_cast<float>(i % 1000) : -1.0f;
  pg.broadcast(std::span<float>(b), {.root = 2});
  for (size_t i = 0; i < b.size(); ++i)
    if (b[i] != static_cast<float>(i % 1000)) fail("broadcast", i, b[i], double(i % 1000));
  for (size_t count : {size_t{4}, size_t{1} << 17}) {
    std::vector<float> in(count), out(count * n);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(r * 1000 + i % 7);
    pg.all_gather(std::span<const float>(in), std::span<float>(out));
    for (size_t i = 0; i < out.size(); ++i) {
      double want = static_cast<double>(i / count * 1000 + i % count % 7);
      if (out[i] != want) fail("all_gather of " + std::to_string(count), i, out[i], want);
    }
  }
  pg.barrier();
}

// Runs c's ranks in a child with its own mount namespace and a tmpfs of `size` on /dev/shm
// (Docker's default is 64 MiB; many ranks or a big shm_ring_bytes outgrow it the same way).
// Every host whose segment does not fit must fall back to loopback TCP with one warning,
// and every result must be exact.
void small_dev_shm(const char* size, const GroupConfig& c, int hosts_without_shm) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // stdout and stderr (libddp's warning) go to the parent
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    alarm(static_cast<unsigned>(scaled_seconds(90)));  // a hang guard
    std::string opts = std::string("size=") + size;
    if (unshare(CLONE_NEWNS) != 0 ||
        mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()) != 0) {
      int e = errno;
      dprintf(1, "cannot mount a small tmpfs on /dev/shm in a private mount namespace: %s\n",
              strerror(e));
      _exit(77);  // an environment without mount namespaces (EPERM, EACCES, seccomp...)
    }
    auto errors = run_ranks(c, check_collectives);
    int rc = 0;
    for (int r = 0; r < c.n; ++r)
      if (!errors[r].empty()) {
        dprintf(1, "FAILED rank %d: %s\n", r, errors[r].c_str());
        rc = 1;
      }
    for (auto& e : std::filesystem::directory_iterator("/dev/shm")) {
      dprintf(1, "FAILED left in /dev/shm: %s\n", e.path().c_str());
      rc = 1;
    }
    _exit(rc);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (;;) {  // until the child exits (or its alarm() ends it)
    ssize_t k = read(fds[0], buf, sizeof buf);
    if (k > 0)
      out.append(buf, static_cast<size_t>(k));
    else if (k == 0 || errno != EINTR)
      break;
  }
  close(fds[0]);
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  if (WIFEXITED(st) && WEXITSTATUS(st) == 77) GTEST_SKIP() << out;
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
      << (WIFSIGNALED(st) ? "killed by " + std::string(strsignal(WTERMSIG(st)))
                          : "exit status " + std::to_string(WEXITSTATUS(st)))
      << "\n"
      << out;
  // One warning per such host (its first rank), naming the cause and what to do.
  const std::string warning = "ddp: warning: shared memory unavailable (cannot reserve ";
  int warnings = 0;
  for (size_t at = out.find(warning); at != std::string::npos; at = out.find(warning, at + 1))
    ++warnings;
  EXPECT_EQ(warnings, hosts_without_shm) << out;
  EXPECT_TRUE(contains(out, " MiB): No space left on device); ")) << out;
  EXPECT_TRUE(contains(out, "loopback TCP")) << out;
  EXPECT_TRUE(contains(out, "--shm-size")) << out;
}

// A rank that destroys its group while a peer waits in a collective (it ran out of batches
// first, say, and goes on with other work): the peer is told at once, naming it, not at its
// timeout.
void destroyed_peer(ddp::Transport t, size_t count) {
  GroupConfig c;
  c.transport = t;
  std::string err0;
  double waited = 0;
  auto errors = run_ranks(c, [&](ddp::ProcessGroup& pg) {
    if (pg.rank() == 1) {
      std::this_thread::sleep_for(100ms);  // rank 0 waits in its call by then
      return;                              // the group is destroyed as this returns
    }
    std::vector<float> v(count, 1.0f);
    auto t0 = Clock::now();
    try {
      pg.all_reduce(std::span<float>(v), {.timeout = scaled(60s)});
      err0 = "no error";
    } catch (const ddp::CollectiveError& e) {
      err0 = e.what();
    } catch (const std::exception& e) {
      err0 = std::string("not a CollectiveError: ") + e.what();
    }
    waited = std::chrono::duration<double>(Clock::now() - t0).count();
  });
  expect_no_errors(errors);
  EXPECT_TRUE(contains(err0, "all_reduce")) << err0;
  EXPECT_TRUE(contains(err0, "rank 1 destroyed its process group after 0 collective(s) where this rank is at #1")) << err0;
  EXPECT_LT(waited, scaled_seconds(5)) << err0;  // told at once, not at the 60 s timeout
}

TEST(CollectiveFailures, DestroyedPeerShmFlat) { destroyed_peer(ddp::Transport::kAuto, 16); }
TEST(CollectiveFailures, DestroyedPeerShmRing) { destroyed_peer(ddp::Transport::kAuto, 1 << 20); }
TEST(CollectiveFailures, DestroyedPeerTcp) { destroyed_peer(ddp::Transport::kTcp, 1 << 20); }

// Ranks that finish their last collective and destroy their groups at once, while a later
// rank is still in it: on the ring broadcast 0 -> 1 -> 2 -> 3 with rank 3 late, rank 0 is
// done once its data is on its way, and leaves, while rank 1 still waits to pass the rest on
// (the small rings are full until rank 3 takes its part). Rank 0 must not look gone to rank
// 1, which no longer needs it; marked as left, it did ("rank 0 destroyed its process group
// after 1 collective(s) where this rank is at #1"), and every rank failed.
void finish_then_destroy(ddp::Transport t) {
  GroupConfig c;
  c.n = 4;
  c.transport = t;
  c.ring = 1024;
  c.chunk = 512;
  c.small = 256;  // the ring broadcast, not the flat one
  auto errors = run_ranks(c, [&](ddp::ProcessGroup& pg) {
    std::vector<float> v(4 << 10, pg.rank() == 0 ? 7.0f : 0.0f);
    if (pg.rank() == 3) std::this_thread::sleep_for(200ms);
    pg.broadcast(std::span<float>(v), {.root = 0});
    if (v.front() != 7.0f || v.back() != 7.0f) throw std::runtime_error("wrong data");
  });
  expect_no_errors(errors);
}

TEST(CollectiveFailures, FinishThenDestroyShmRing) { finish_then_destroy(ddp::Transport::kAuto); }
TEST(CollectiveFailures, FinishThenDestroyTcp) { finish_then_destroy(ddp::Transport::kTcp); }

// 4 ranks with the default 2 MiB rings need 8.5 MiB (13.5 MiB with the slice areas, when
// ranks outnumber the CPUs): the flat, slice and ring paths all become the TCP ring.
TEST(CollectiveFailures, SmallDevShmFallsBackToTcp) {
  GroupConfig c;
  c.n = 4;
  small_dev_shm("4m", c, 1);
}

// Two simulated hosts: the 3-rank one (6.4 MiB) falls back, the 2-rank one (4.3 MiB) still
// uses shared memory; both ends of every link must agree on its kind.
TEST(CollectiveFailures, SmallDevShmFallsBackOnOneHostOnly) {
  GroupConfig c;
  c.n = 5;
  c.host_ids = {"a", "a", "a", "b", "b"};
  small_dev_shm("5m", c, 1);
}

}  // namespace
