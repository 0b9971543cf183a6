// --numa-binding (launcher/numa.hpp): the CPUs of each mode on made-up machines written as
// sysfs trees. (That workers really run on them: integration/test_env.py, NumaBindingTest.)
#include <sched.h>

#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ddp/error.hpp"
#include "launcher/numa.hpp"
#include "test_util.hpp"

namespace {

using ddprun::cpu_list_text;
using ddprun::NumaMode;
using ddprun::parse_cpu_list;

// sockets x nodes_per_socket NUMA nodes of `cores` cores each, `threads` logical CPUs a core
// (CPU = thread x all cores + core, as Linux numbers SMT siblings), one last-level cache per
// `cores_per_l3` cores, and GPUs as (PCI address, NUMA node).
struct Machine {
  int sockets = 2, nodes_per_socket = 2, cores = 4, threads = 2, cores_per_l3 = 2;
  std::vector<std::pair<std::string, int>> gpus;

  int all_cores() const { return sockets * nodes_per_socket * cores; }
  int all_cpus() const { return all_cores() * threads; }

  void write(const ddprun_test::TempDir& d) const {
    const int nodes = sockets * nodes_per_socket;
    d.write("devices/system/node/possible", fmt::format("0-{}\n", nodes - 1));
    for (int n = 0; n < nodes; ++n) {
      std::set<int> cpus;
      for (int c = n * cores; c < (n + 1) * cores; ++c)
        for (int t = 0; t < threads; ++t) cpus.insert(t * all_cores() + c);
      d.write(fmt::format("devices/system/node/node{}/cpulist", n), cpu_list_text(cpus) + "\n");
    }
    for (int cpu = 0; cpu < all_cpus(); ++cpu) {
      const int core = cpu % all_cores(), l3 = core / cores_per_l3;
      std::set<int> siblings, sharers;
      for (int t = 0; t < threads; ++t) {
        siblings.insert(t * all_cores() + core);
        for (int c = l3 * cores_per_l3; c < (l3 + 1) * cores_per_l3; ++c) sharers.insert(t * all_cores() + c);
      }
      const std::string dir = fmt::format("devices/system/cpu/cpu{}", cpu);
      d.write(dir + "/topology/physical_package_id", fmt::format("{}\n", core / (cores * nodes_per_socket)));
      d.write(dir + "/topology/thread_siblings_list", cpu_list_text(siblings) + "\n");
      cache(d, dir + "/cache/index0", "Data", 1, siblings);
      cache(d, dir + "/cache/index1", "Instruction", 1, siblings);
      cache(d, dir + "/cache/index2", "Unified", 2, siblings);
      cache(d, dir + "/cache/index3", "Unified", 3, sharers);
    }
    for (auto& [pci, node] : gpus) d.write(fmt::format("bus/pci/devices/{}/numa_node", pci), fmt::format("{}\n", node));
  }

  static void cache(const ddprun_test::TempDir& d, const std::string& dir, const char* type, int level,
                    const std::set<int>& shared) {
    d.write(dir + "/type", fmt::format("{}\n", type));
    d.write(dir + "/level", fmt::format("{}\n", level));
    d.write(dir + "/shared_cpu_list", cpu_list_text(shared) + "\n");
  }
};

std::set<int> range(int lo, int hi) {
  std::set<int> out;
  for (int c = lo; c <= hi; ++c) out.insert(c);
  return out;
}

class NumaTest : public ::testing::Test {
 protected:
  // The project's example: 2 sockets x 2 nodes x 4 cores x 2 threads (32 CPUs; CPU c's
  // sibling is c + 16), two GPUs a node, in CUDA's order node 0's first.
  void SetUp() override {
    for (int g = 0; g < 8; ++g) m_.gpus.push_back({fmt::format("0000:{:02x}:00.0", 0x10 + g), g / 2});
    write();
  }
  void write() {
    dir_ = std::make_unique<ddprun_test::TempDir>();
    m_.write(*dir_);
  }
  std::vector<std::string> gpus() const {
    std::vector<std::string> out;
    for (auto& g : m_.gpus) out.push_back(g.first);
    return out;
  }
  std::string cpus(NumaMode mode, size_t gpu, std::set<int> allowed = {}) const {
    if (allowed.empty()) allowed = range(0, m_.all_cpus() - 1);
    return cpu_list_text(ddprun::numa_cpus(mode, ddprun::Sysfs(dir_->path()), gpus(), gpu, allowed));
  }

  Machine m_;
  std::unique_ptr<ddprun_test::TempDir> dir_;
};

TEST_F(NumaTest, NodeIsEveryCpuOfTheGpusNode) {
  EXPECT_EQ(cpus(NumaMode::kNode, 0), "0-3,16-19");
  EXPECT_EQ(cpus(NumaMode::kNode, 1), "0-3,16-19");
  EXPECT_EQ(cpus(NumaMode::kNode, 7), "12-15,28-31");
}

TEST_F(NumaTest, SocketIsEveryNodeOfTheGpusSocket) {
  EXPECT_EQ(cpus(NumaMode::kSocket, 2), "0-7,16-23");  // node 1, socket 0
  EXPECT_EQ(cpus(NumaMode::kSocket, 5), "8-15,24-31");
}

TEST_F(NumaTest, SocketPassesOverNodesWithoutCpus) {
  // A memory-only node (HBM, CXL): listed as possible, no CPU of its own.
  dir_->write("devices/system/node/possible", "0-4\n");
  dir_->write("devices/system/node/node4/cpulist", "\n");
  EXPECT_EQ(cpus(NumaMode::kSocket, 0), "0-7,16-23");
}

TEST_F(NumaTest, ExclusiveSplitsTheNodesPhysicalCoresAmongItsGpus) {
  EXPECT_EQ(cpus(NumaMode::kExclusive, 0), "0-1,16-17");
  EXPECT_EQ(cpus(NumaMode::kExclusive, 1), "2-3,18-19");
  EXPECT_EQ(cpus(NumaMode::kExclusive, 6), "12-13,28-29");
}

TEST_F(NumaTest, ExclusiveGivesTheRemainderToTheFirstGpus) {
  m_.gpus = {{"0000:10:00.0", 0}, {"0000:11:00.0", 0}, {"0000:12:00.0", 0}};
  write();
  EXPECT_EQ(cpus(NumaMode::kExclusive, 0), "0-1,16-17");
  EXPECT_EQ(cpus(NumaMode::kExclusive, 1), "2,18");
  EXPECT_EQ(cpus(NumaMode::kExclusive, 2), "3,19");
}

TEST_F(NumaTest, ExclusiveWithMoreGpusThanCoresIsAnError) {
  m_.cores = 1;
  m_.cores_per_l3 = 1;
  write();
  try {
    cpus(NumaMode::kExclusive, 0);
    FAIL() << "expected an error";
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("NUMA node 0 has 1 physical core for its 2 GPUs"), std::string::npos)
        << e.what();
  }
}

TEST_F(NumaTest, CoreComplexGivesEachGpuOfTheNodeItsOwnCache) {
  EXPECT_EQ(cpus(NumaMode::kCoreComplex, 0), "0-1,16-17");
  EXPECT_EQ(cpus(NumaMode::kCoreComplex, 1), "2-3,18-19");
  EXPECT_EQ(cpus(NumaMode::kCoreComplex, 3), "6-7,22-23");
}

TEST_F(NumaTest, CoreComplexPrefersTheCacheWithMoreCpusLeft) {
  // Core 0 (CPUs 0 and 16) is not ddprun's: the node's second cache has more CPUs left.
  std::set<int> allowed = range(0, m_.all_cpus() - 1);
  allowed.erase(0);
  allowed.erase(16);
  EXPECT_EQ(cpus(NumaMode::kCoreComplex, 0, allowed), "2-3,18-19");
  EXPECT_EQ(cpus(NumaMode::kCoreComplex, 1, allowed), "1,17");
}

TEST_F(NumaTest, OnlyCpusDdprunMayUseCount) {
  EXPECT_EQ(cpus(NumaMode::kNode, 0, {1, 2, 20, 30}), "1-2");
  try {
    cpus(NumaMode::kNode, 0, {20, 30});
    FAIL() << "expected an error";
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("none of NUMA node 0's CPUs is among those ddprun may use (20,30)"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(NumaTest, ADriversAddressAndNoNumaInformationAreUnderstood) {
  m_.gpus = {{"0000:1a:00.0", -1}};
  write();
  // The CUDA driver writes upper-case hex; sysfs has lower case. -1: a machine of one node.
  EXPECT_EQ(cpu_list_text(ddprun::numa_cpus(NumaMode::kNode, ddprun::Sysfs(dir_->path()), {"0000:1A:00.0"}, 0,
                                            range(0, 31))),
            "0-3,16-19");
  EXPECT_EQ(cpu_list_text(ddprun::numa_cpus(NumaMode::kNode, ddprun::Sysfs(dir_->path()), {"00000000:1A:00.0"}, 0,
                                            range(0, 31))),
            "0-3,16-19");
}

TEST_F(NumaTest, AMissingSysfsFileIsNamed) {
  try {
    ddprun::numa_cpus(NumaMode::kNode, ddprun::Sysfs(dir_->path()), {"0000:99:00.0"}, 0, range(0, 31));
    FAIL() << "expected an error";
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read " + dir_->path() + "/bus/pci/devices/0000:99:00.0/numa_node: "),
              std::string::npos)
        << e.what();
  }
}

TEST(CpuList, ParsesAndWritesSysfsLists) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n"), (std::set<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list(""), std::set<int>{});
  EXPECT_EQ(cpu_list_text({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(cpu_list_text({}), "");
  for (const char* bad : {"a", "3-1", "1-", "-1", "1,x"}) EXPECT_THROW(parse_cpu_list(bad), ddp::Error) << bad;
}

class NumaPlanTest : public ::testing::Test {
 protected:
  // One node holding every CPU this test may use, and two GPUs on it.
  void SetUp() override {
    cpu_set_t set;
    ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) mine_.insert(c);
    dir_.write("devices/system/node/node0/cpulist", cpu_list_text(mine_) + "\n");
    dir_.write("bus/pci/devices/0000:10:00.0/numa_node", "0\n");
    dir_.write("bus/pci/devices/0000:11:00.0/numa_node", "0\n");
    dir_.write("gpus", "0000:10:00.0\n0000:11:00.0\n");
  }
  std::vector<std::set<int>> plan(const std::string& mode, int nproc) {
    return ddprun::numa_binding_plan(mode, "--numa-binding", nproc, {{"DDPRUN_TEST_SYSFS", dir_.path()}});
  }
  void expect_usage_error(const std::string& mode, int nproc, const std::string& text) {
    try {
      plan(mode, nproc);
      FAIL() << "expected an error";
    } catch (const ddp::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  }
  ddprun_test::TempDir dir_;
  std::set<int> mine_;
};

TEST_F(NumaPlanTest, EachLocalRankGetsItsGpusCpus) {
  EXPECT_EQ(plan("node", 2), (std::vector<std::set<int>>{mine_, mine_}));
}

TEST_F(NumaPlanTest, MoreWorkersThanGpusIsAUsageError) {
  expect_usage_error("node", 3, "--numa-binding: 3 workers but 2 GPUs visible: local rank 2 has no GPU to bind near");
}

TEST_F(NumaPlanTest, NoGpuIsAUsageError) {
  dir_.write("gpus", "");
  expect_usage_error("node", 1, "--numa-binding: binds each worker to the CPUs near its GPU, but no GPU is visible");
}

TEST_F(NumaPlanTest, AnUnknownModeIsAUsageError) {
  expect_usage_error("numa", 1, "--numa-binding: expected node, socket, exclusive or core-complex");
}

TEST_F(NumaPlanTest, ASysfsProblemNamesTheLocalRankAndItsGpu) {
  dir_.write("gpus", "0000:10:00.0\n0000:12:00.0\n");
  expect_usage_error("node", 2, "--numa-binding: local rank 1 (GPU 1, 0000:12:00.0): cannot read ");
}

}  // namespace
