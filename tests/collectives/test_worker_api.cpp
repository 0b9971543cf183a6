// Error-file helper (torch's JSON format) and joining from ddprun's environment.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ddp/ddp.hpp"
#include "ports.hpp"
#include "test_timeouts.hpp"

namespace {

// Options with only the bootstrap's bound changed.
ddp::ProcessGroupOptions with_timeout(std::chrono::milliseconds t) {
  ddp::ProcessGroupOptions o;
  o.timeout = t;
  return o;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() /
          (std::string(name) + "." + std::to_string(getpid())))
      .string();
}

TEST(ErrorFile, RunMainWritesTorchFormat) {
  std::string path = temp_path("ddp-error-file.json");
  std::filesystem::remove(path);
  setenv("TORCHELASTIC_ERROR_FILE", path.c_str(), 1);
  int rc = ddp::run_main([]() -> int {
    throw ddp::CollectiveError("all_reduce failed on rank 3: peer \"rank 1\" exited\nline 2");
  });
  unsetenv("TORCHELASTIC_ERROR_FILE");
  EXPECT_EQ(rc, 1);
  auto j = nlohmann::json::parse(slurp(path));
  ASSERT_TRUE(j.contains("message"));
  EXPECT_EQ(j["message"]["message"],
            "ddp::CollectiveError: all_reduce failed on rank 3: peer \"rank 1\" exited\nline 2");
  ASSERT_TRUE(j["message"]["extraInfo"]["py_callstack"].is_string());
  EXPECT_NE(j["message"]["extraInfo"]["py_callstack"].get<std::string>().find("CollectiveError"),
            std::string::npos);
  auto ts = j["message"]["extraInfo"]["timestamp"];
  ASSERT_TRUE(ts.is_string());
  long long t = std::stoll(ts.get<std::string>());
  EXPECT_NEAR(static_cast<double>(t), static_cast<double>(std::time(nullptr)), 5.0);
  std::filesystem::remove(path);
}

TEST(ErrorFile, RunMainPassesThroughAndHandlesUnknownExceptions) {
  EXPECT_EQ(ddp::run_main([] { return 7; }), 7);
  std::string path = temp_path("ddp-error-file2.json");
  setenv("TORCHELASTIC_ERROR_FILE", path.c_str(), 1);
  EXPECT_EQ(ddp::run_main([]() -> int { throw 42; }), 1);
  unsetenv("TORCHELASTIC_ERROR_FILE");
  auto j = nlohmann::json::parse(slurp(path));
  EXPECT_EQ(j["message"]["message"].get<std::string>().rfind("UnknownException: ", 0), 0u);
  std::filesystem::remove(path);
}

TEST(ErrorFile, NoPathMeansNoFile) {
  unsetenv("TORCHELASTIC_ERROR_FILE");
  EXPECT_FALSE(ddp::write_error_file("ValueError", "x"));
}

TEST(ErrorFile, JsonEscapesControlCharacters) {
  auto doc = ddp::error_file_json("T", std::string("a\tb\x01") + "\\", "cs", 12);
  auto j = nlohmann::json::parse(doc);
  EXPECT_EQ(j["message"]["message"], std::string("T: a\tb\x01") + "\\");
  EXPECT_EQ(j["message"]["extraInfo"]["timestamp"], "12");
}

// Bytes that are not UTF-8 become U+FFFD (Python's json.load refused the whole file);
// UTF-8 passes as it is, up to four bytes long.
TEST(ErrorFile, JsonReplacesWhatIsNotUtf8) {
  const std::string ok = "\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";  // é € 😀
  const std::string bad = "\xff\xfe|\xc3|\xed\xa0\x80|\xc0\xaf|\xe2\x82";  // stray, cut, surrogate, overlong, cut at the end
  auto j = nlohmann::json::parse(ddp::error_file_json("T", ok + " " + bad, "cs", 1));
  const std::string r = "\xef\xbf\xbd";
  EXPECT_EQ(j["message"]["message"], "T: " + ok + " " + r + r + "|" + r + "|" + r + r + r + "|" + r + r + "|" + r + r);
}

struct EnvGuard {
  std::vector<std::string> names{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
                                 "TORCHELASTIC_RESTART_COUNT"};
  EnvGuard() { clear(); }
  ~EnvGuard() { clear(); }
  void clear() {
    for (auto& n : names) unsetenv(n.c_str());
  }
};

TEST(LaunchEnv, MissingVariablesPointAtDdprun) {
  EnvGuard g;
  try {
    ddp::init_process_group_from_env();
    FAIL() << "no exception";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK is not set"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ddprun"), std::string::npos) << e.what();
  }
}

// The environment PyTorch's env:// reads, and nothing else: a rank started without a launcher.
void set_env_rank(int rank, int world, int port) {
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
}

// Whether a group's all-reduce summed every rank's rank + 1.
bool sums(ddp::ProcessGroup& pg) {
  std::vector<double> v{double(pg.rank() + 1)};
  pg.all_reduce(std::span<double>(v));
  return v[0] == pg.size() * (pg.size() + 1) / 2.0;
}

// One rank of a job started without a launcher, in a child process: the environment
// PyTorch's env:// reads and nothing else. Exits 0 when `body` (by default: one group's
// all-reduce summed every rank) returned true.
pid_t start_rank(int rank, int world, int port, const std::function<bool()>& body = {}) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  int rc = 1;
  try {
    EnvGuard g;
    set_env_rank(rank, world, port);
    if (body)
      rc = body() ? 0 : 3;
    else
      rc = sums(*ddp::init_process_group_from_env(with_timeout(std::chrono::seconds(30)))) ? 0 : 3;
  } catch (const std::exception& e) {
    fprintf(stderr, "rank %d: %s\n", rank, e.what());
  }
  _exit(rc);
}

int exit_code(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// No launcher shares its store (torchrun's c10d before torch 2.4, a Kubernetes or srun job
// that sets RANK, WORLD_SIZE and MASTER_* itself): rank 0 hosts it, as env:// does, and the
// others wait for it to listen, whichever starts first.
TEST(LaunchEnv, WithoutAgentStoreRankZeroHostsTheStore) {
  int port = ddp::test::free_port();
  std::vector<pid_t> ranks;
  for (int r : {2, 1}) ranks.push_back(start_rank(r, 3, port));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // they retry until rank 0 listens
  ranks.push_back(start_rank(0, 3, port));
  for (pid_t pid : ranks) EXPECT_EQ(exit_code(pid), 0);
}

// Without a launcher a group is destroyed and made again (as after a caught error), and two
// groups live side by side: rank 0's store outlives its groups. Before, each
// group served a store of its own on MASTER_PORT: the others' calls to the old one failed
// ("Connection reset by peer") as it stopped under them, and rank 0's second group could
// not listen on its own port (EADDRINUSE).
TEST(LaunchEnv, WithoutAgentStoreGroupsAreMadeAgainAndSideBySide) {
  const int port = ddp::test::free_port();
  auto body = [] {
    for (int round = 0; round < 5; ++round) {
      auto pg = ddp::init_process_group_from_env(with_timeout(std::chrono::seconds(30)));
      if (!sums(*pg)) return false;
    }
    auto grads = with_timeout(std::chrono::seconds(30)), metrics = grads;
    grads.name = "grads";
    metrics.name = "metrics";
    auto a = ddp::init_process_group_from_env(grads);
    auto b = ddp::init_process_group_from_env(metrics);
    return sums(*a) && sums(*b);
  };
  std::vector<pid_t> ranks;
  for (int r : {0, 1, 2}) ranks.push_back(start_rank(r, 3, port, body));
  for (pid_t pid : ranks) EXPECT_EQ(exit_code(pid), 0);
}

// Two processes started with the same RANK: the store's count of the groups each rank made
// puts the second in the group "made again" (pg#1), where nobody joins it; its timeout says
// what may have happened, a duplicate RANK among it. The other forms the group with rank 0.
// (Refusing the second outright would also refuse a rank started again while rank 0's
// store lives on, and every rank of a second run on a long-lived store: both work.)
TEST(LaunchEnv, TwoProcessesWithTheSameRankAreToldAtTheTimeout) {
  const int port = ddp::test::free_port();
  constexpr auto kTimeout = std::chrono::seconds(3);
  auto body = [&] {
    try {
      auto pg = ddp::init_process_group_from_env(with_timeout(kTimeout));
      const bool ok = sums(*pg);
      // rank 0 serves the store: past the late one's timeout
      if (pg->rank() == 0) std::this_thread::sleep_for(kTimeout + ddp::test::scaled(std::chrono::seconds(5)));
      return ok;
    } catch (const ddp::TimeoutError& e) {
      const std::string what = e.what();
      if (what.find("group is 'pg' made again (#1 of that name by rank 1 on this store)") != std::string::npos &&
          what.find("two processes started with RANK=1") != std::string::npos)
        _exit(4);
      throw;
    }
  };
  const pid_t zero = start_rank(0, 2, port, body);
  const pid_t one = start_rank(1, 2, port, body), again = start_rank(1, 2, port, body);
  EXPECT_EQ(exit_code(zero), 0);
  std::multiset<int> ones{exit_code(one), exit_code(again)};
  EXPECT_EQ(ones, (std::multiset<int>{0, 4}));
}

TEST(LaunchEnv, WithoutAgentStoreRankZeroSaysItsPortIsTaken) {
  EnvGuard g;
  int taken = socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  socklen_t len = sizeof a;
  ASSERT_EQ(bind(taken, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << ddp::errno_text(errno);
  ASSERT_EQ(listen(taken, 1), 0);
  ASSERT_EQ(getsockname(taken, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin6_port);
  set_env_rank(0, 2, port);
  try {
    ddp::init_process_group_from_env();
    FAIL() << "no exception";
  } catch (const ddp::SystemError& e) {
    EXPECT_EQ(e.code(), EADDRINUSE) << e.what();
    const std::string want = "rank 0 hosts the job's store (TORCHELASTIC_USE_AGENT_STORE is not True) "
                             "but cannot listen on MASTER_PORT=" + std::to_string(port) + ": ";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  close(taken);
}

// Rank 1 of 2 with no launcher, whose rank 0 at 127.0.0.1:port never answers: the
// NetworkError's text, which must come within the group's timeout (1 s) and some slack.
std::string rank_one_without_rank_zero(int port) {
  EnvGuard g;
  set_env_rank(1, 2, port);
  const auto t0 = std::chrono::steady_clock::now();
  std::string what = "no exception";
  try {
    ddp::init_process_group_from_env(with_timeout(std::chrono::seconds(1)));
  } catch (const ddp::NetworkError& e) {
    what = e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, ddp::test::scaled(std::chrono::seconds(10)));
  return what;
}

constexpr const char* kRankZeroHint =
    "rank 1: rank 0 hosts the job's store (TORCHELASTIC_USE_AGENT_STORE is not True), and it never answered: "
    "is rank 0 running, and is MASTER_ADDR its host? ";

TEST(LaunchEnv, WithoutAgentStoreARankSaysRankZeroNeverAnswered) {
  const std::string what = rank_one_without_rank_zero(ddp::test::free_port());
  EXPECT_NE(what.find(std::string(kRankZeroHint) + "cannot connect"), std::string::npos) << what;
  EXPECT_NE(what.find("Connection refused"), std::string::npos) << what;
}

// Something listens on MASTER_PORT but never answers (another program, a frozen rank 0):
// the store's handshake times out, and the error says what to check, as when nobody listens.
TEST(LaunchEnv, WithoutAgentStoreARankSaysASilentRankZeroNeverAnswered) {
  int silent = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(bind(silent, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << ddp::errno_text(errno);
  ASSERT_EQ(listen(silent, 4), 0);  // the kernel accepts; nobody reads or answers
  ASSERT_EQ(getsockname(silent, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  const std::string what = rank_one_without_rank_zero(port);
  EXPECT_NE(what.find(std::string(kRankZeroHint) + "store at 127.0.0.1:" + std::to_string(port) +
                      ": it accepted the connection but sent no reply to the handshake"),
            std::string::npos)
      << what;
  close(silent);
}

TEST(LaunchEnv, ReadsWhatDdprunSets) {
  EnvGuard g;
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "node0", 1);
  setenv("MASTER_PORT", "29400", 1);
  setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
  auto e = ddp::read_launch_env();
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 29400);
  EXPECT_TRUE(e.use_agent_store);
  EXPECT_EQ(e.restart_count, 2);
  setenv("RANK", "x", 1);
  EXPECT_THROW(ddp::read_launch_env(), ddp::UsageError);
}

// The launcher's store (TORCHELASTIC_USE_AGENT_STORE=True) that never answers: the error
// names the rank and what to check, as it does when rank 0 hosts the store.
TEST(LaunchEnv, ALauncherStoreThatNeverAnswersIsNamed) {
  EnvGuard g;
  set_env_rank(1, 2, ddp::test::free_port());  // nothing listens there
  setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  try {
    ddp::init_process_group_from_env(with_timeout(std::chrono::seconds(1)));
    ADD_FAILURE() << "no exception";
  } catch (const ddp::NetworkError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 1: the launcher's store (TORCHELASTIC_USE_AGENT_STORE=True, MASTER_ADDR:MASTER_PORT) "
                        "could not be reached: is the launcher still running? cannot connect"),
              std::string::npos)
        << what;
  }
}

// A group timeout that is not positive is refused before any store is reached (before: a
// 0 ms handshake with the launcher's store failed as "sent no reply ... within 5 ms").
TEST(LaunchEnv, ANonPositiveTimeoutIsRefusedBeforeTheStoreIsReached) {
  EnvGuard g;
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "1", 1);  // nothing listens: reaching it would fail otherwise
  setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  for (auto t : {std::chrono::milliseconds(0), std::chrono::milliseconds(-5)}) {
    ddp::ProcessGroupOptions o;
    o.timeout = t;
    try {
      ddp::init_process_group_from_env(o);
      ADD_FAILURE() << "accepted " << t.count() << " ms";
    } catch (const ddp::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("timeout must be positive (got " + std::to_string(t.count()) + " ms)"),
                std::string::npos)
          << e.what();
    }
  }
}

// Each variable the group uses is checked and named (before: a MASTER_PORT of 70000 and a
// negative restart count were taken; WORLD_SIZE=99999999999 "is not an integer";
// WORLD_SIZE=0 "RANK=0 / WORLD_SIZE=0 are inconsistent"). What launchers set as they see
// fit is taken: LOCAL_* that disagree with each other or with WORLD_SIZE, a port no peer uses.
TEST(LaunchEnv, EachVariableIsCheckedAndNamed) {
  const std::pair<std::map<std::string, std::string>, std::string> cases[] = {
      {{{"MASTER_PORT", "70000"}}, "MASTER_PORT=70000 is not a TCP port"},
      {{{"MASTER_PORT", "-5"}}, "MASTER_PORT=-5 is not a TCP port"},
      {{{"LOCAL_RANK", "-1"}}, "LOCAL_RANK=-1 is negative"},
      {{{"TORCHELASTIC_RESTART_COUNT", "-3"}}, "TORCHELASTIC_RESTART_COUNT=-3 is negative"},
      {{{"WORLD_SIZE", "99999999999"}}, "WORLD_SIZE='99999999999' is out of range"},
      {{{"WORLD_SIZE", "0"}}, "WORLD_SIZE=0 must be at least 1"},
      {{{"RANK", "4"}}, "RANK=4 is outside [0, WORLD_SIZE=4)"},
  };
  for (const auto& [vars, says] : cases) {
    EnvGuard g;
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("MASTER_PORT", "29400", 1);
    for (const auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
    try {
      ddp::read_launch_env();
      ADD_FAILURE() << "accepted: " << says;
    } catch (const ddp::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
}

TEST(LaunchEnv, WhatLaunchersSetAsTheySeeFitIsTaken) {
  const std::map<std::string, std::string> cases[] = {
      {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "4"}},  // a helper group of one
      {{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}},                      // no LOCAL_RANK
      {{"RANK", "2"}, {"WORLD_SIZE", "5"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},  // submitit, 5 over 2
      {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}},                       // no peer uses it
  };
  for (const auto& vars : cases) {
    EnvGuard g;
    for (const auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
    EXPECT_NO_THROW(ddp::read_launch_env()) << vars.at("RANK") << "/" << vars.at("WORLD_SIZE");
  }
}

TEST(LaunchEnv, WorldSizeOneNeedsNoStore) {
  EnvGuard g;
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  auto pg = ddp::init_process_group_from_env();
  EXPECT_EQ(pg->size(), 1);
  std::vector<double> v{2.0};
  pg->all_reduce(std::span<double>(v));
  EXPECT_EQ(v[0], 2.0);
}

TEST(Types, HalfAndBFloat16RoundTrip) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.96e-08f, 1e-3f}) {
    EXPECT_NEAR(ddp::Half::from_float(f).to_float(), f, std::abs(f) * 1e-3 + 6e-8) << f;
    EXPECT_NEAR(ddp::BFloat16::from_float(f).to_float(), f, std::abs(f) * 1e-2) << f;
  }
  EXPECT_EQ(ddp::Half::from_float(1e6f).bits, 0x7c00);      // overflow -> inf
  EXPECT_EQ(ddp::Half::from_float(1.0f).bits, 0x3c00);
  EXPECT_EQ(ddp::BFloat16::from_float(1.0f).bits, 0x3f80);
  EXPECT_EQ(ddp::Half::from_float(2049.0f).to_float(), 2048.0f);  // ties to even
}

}  // namespace
