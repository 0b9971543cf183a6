// Slurm: host lists against the vectors `scontrol show hostnames` gave on Slurm 22.05 (and
// 23.02+'s suffixes), the derived port, the SLURM_* variables read, and what ddprun derives
// inside an srun step, in the batch shell and with several tasks per node; explicit flags
// and --no-slurm win; the GPUs a step was given.
#include <csignal>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ddp/error.hpp"
#include "launcher/gpu.hpp"
#include "launcher/options.hpp"
#include "launcher/slurm.hpp"
#include "launcher/slurm_signals.hpp"
#include "test_util.hpp"

namespace {

using ddprun::Options;
using ddprun::slurm::derived_port;
using ddprun::slurm::expand_hostlist;
using Env = std::map<std::string, std::string>;
using Hosts = std::vector<std::string>;

Hosts expand(const std::string& s) { return expand_hostlist(s, "SLURM_STEP_NODELIST"); }

std::string hostlist_error(const std::string& s) {
  try {
    expand(s);
  } catch (const ddp::UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "'" << s << "' was accepted";
  return "";
}

// ------------------------------------------------------------------ host lists

TEST(SlurmHostlist, VectorsFromScontrol) {
  EXPECT_EQ(expand("a[8-11]"), (Hosts{"a8", "a9", "a10", "a11"}));
  EXPECT_EQ(expand("a[098-101]"), (Hosts{"a098", "a099", "a100", "a101"}));
  EXPECT_EQ(expand("a[1-10]"), (Hosts{"a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9", "a10"}));
  EXPECT_EQ(expand("a[001-10]"),
            (Hosts{"a001", "a002", "a003", "a004", "a005", "a006", "a007", "a008", "a009", "a010"}));
  EXPECT_EQ(expand("a[01-1]"), (Hosts{"a01"}));
  EXPECT_EQ(expand("rack[1-2]-n[01-02]"), (Hosts{"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"}));
  EXPECT_EQ(expand("a[1,2][3,4]"), (Hosts{"a13", "a14", "a23", "a24"}));
  // Slurm's own order for three brackets: the last innermost, the others right to left.
  EXPECT_EQ(expand("a[1-2]b[3-4]c[5-6]"),
            (Hosts{"a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6", "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6"}));
  EXPECT_EQ(expand("n[1-2],n1"), (Hosts{"n1", "n2", "n1"}));  // duplicates and order kept
  EXPECT_EQ(expand("n2,n1,n3"), (Hosts{"n2", "n1", "n3"}));
  EXPECT_EQ(expand("a[1-2] b[1]"), (Hosts{"a1", "a2", "b1"}));
  EXPECT_EQ(expand("[1-2]"), (Hosts{"1", "2"}));
  EXPECT_EQ(expand("a,,b"), (Hosts{"a", "b"}));
  EXPECT_EQ(expand("host"), (Hosts{"host"}));
  EXPECT_EQ(expand("a[3]"), (Hosts{"a3"}));
}

TEST(SlurmHostlist, SuffixesAfterABracket) {  // Slurm 23.02.5+
  EXPECT_EQ(expand("x[1-3]y"), (Hosts{"x1y", "x2y", "x3y"}));
  EXPECT_EQ(expand("node[01-04,07],gpu-a[1-2]-ib"),
            (Hosts{"node01", "node02", "node03", "node04", "node07", "gpu-a1-ib", "gpu-a2-ib"}));
  EXPECT_EQ(expand("n[1-2].ib.cluster"), (Hosts{"n1.ib.cluster", "n2.ib.cluster"}));
  EXPECT_EQ(expand("node[0001-0003]-int"), (Hosts{"node0001-int", "node0002-int", "node0003-int"}));
}

TEST(SlurmHostlist, WhatSlurmProducesForItsNodes) {
  EXPECT_EQ(expand("n[1-3]"), (Hosts{"n1", "n2", "n3"}));
  EXPECT_EQ(expand("n[1,3]"), (Hosts{"n1", "n3"}));
  EXPECT_EQ(expand("a[9-11,08]"), (Hosts{"a9", "a10", "a11", "a08"}));  // widths mix inside one bracket
  EXPECT_EQ(expand("rack1-n[01-02],rack2-n[01-02]"), (Hosts{"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"}));
  EXPECT_EQ(expand("gpu-a1-ib,gpu-a2-ib"), (Hosts{"gpu-a1-ib", "gpu-a2-ib"}));
  EXPECT_EQ(expand("n1\tn2\nn3"), (Hosts{"n1", "n2", "n3"}));
  EXPECT_EQ(expand("10.0.0.[1-2]"), (Hosts{"10.0.0.1", "10.0.0.2"}));
  EXPECT_EQ(expand("c[1-1000]").size(), 1000u);
}

TEST(SlurmHostlist, MalformedListsNameTheVariableAndTheText) {
  for (const char* bad : {"a[5-3]", "a[x-y]", "a[1-2]]", "a[1-2", "a[]", "a[1-]", "a[-1]", "a[[1]]", "a[1-2-3]",
                          "a[1,]", "a[1 2]", "n{1..3}", "", " , ", "a[1-99999999]"}) {
    std::string msg = hostlist_error(bad);
    EXPECT_NE(msg.find("SLURM_STEP_NODELIST"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
  }
  EXPECT_NE(hostlist_error("a[5-3]").find("backwards"), std::string::npos);
  EXPECT_NE(hostlist_error("a[1-2").find("without its ']'"), std::string::npos);
  EXPECT_NE(hostlist_error("a[1-2]]").find("without its '['"), std::string::npos);
}

// ------------------------------------------------------------------ the port

TEST(SlurmPort, WithinRangeAndSkipsTorchrunDefaults) {
  std::set<int> seen;
  for (long job = 0; job < 1595; ++job)
    for (long step = 0; step < 8; ++step) {
      int p = derived_port(std::to_string(job), step);
      ASSERT_GE(p, 20000);
      ASSERT_LT(p, 32768);  // below the ephemeral range
      ASSERT_NE(p, 29400);
      ASSERT_NE(p, 29500);
      seen.insert(p);
    }
  EXPECT_EQ(seen.size(), 1595u * 8);  // every (job, step) of a window has its own port
}

TEST(SlurmPort, DeterministicAndCollisionProperties) {
  EXPECT_EQ(derived_port("4242", 0), derived_port("4242", 0));
  EXPECT_EQ(derived_port("100", 0), 20000 + 100 * 8);
  // Jobs whose ids differ by less than 1595 never share a port, whatever their steps.
  for (long d = 1; d < 1595; d += 97)
    for (long s1 = 0; s1 < 8; ++s1)
      for (long s2 = 0; s2 < 8; ++s2) EXPECT_NE(derived_port("5000", s1), derived_port(std::to_string(5000 + d), s2));
  EXPECT_EQ(derived_port("10", 1), derived_port(std::to_string(10 + 1595), 1));  // the cycle
  EXPECT_EQ(derived_port("10", 1), derived_port("10", 9));                       // 8 steps apart
  int hashed = derived_port("12345_7", 0);                                       // not a number: hashed, still in range
  EXPECT_GE(hashed, 20000);
  EXPECT_LT(hashed, 32768);
}

// ------------------------------------------------------------------ the environment

Env step_env(const std::string& list, int nnodes, int node_id, int ntasks = -1) {
  return Env{{"SLURM_JOB_ID", "77"},
             {"SLURM_STEP_ID", "0"},
             {"SLURM_STEP_NODELIST", list},
             {"SLURM_JOB_NODELIST", "n[1-3]"},
             {"SLURM_STEP_NUM_NODES", std::to_string(nnodes)},
             {"SLURM_NNODES", std::to_string(nnodes)},
             {"SLURM_JOB_NUM_NODES", "3"},
             {"SLURM_STEP_NUM_TASKS", std::to_string(ntasks < 0 ? nnodes : ntasks)},
             {"SLURM_NODEID", std::to_string(node_id)},
             {"SLURMD_NODENAME", "n" + std::to_string(node_id + 1)}};
}

Env batch_env(int nnodes) {
  return Env{{"SLURM_JOB_ID", "78"},
             {"SLURM_JOB_NODELIST", nnodes > 1 ? "n[1-" + std::to_string(nnodes) + "]" : "n1"},
             {"SLURM_JOB_NUM_NODES", std::to_string(nnodes)},
             {"SLURM_NNODES", std::to_string(nnodes)},
             {"SLURM_NODEID", "0"},
             {"SLURMD_NODENAME", "n1"}};
}

TEST(SlurmEnv, StepAndBatchShell) {
  EXPECT_FALSE(ddprun::slurm::read_env({}).has_value());
  auto s = ddprun::slurm::read_env(step_env("n[2-3]", 2, 1));
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->in_step());
  EXPECT_EQ(s->step_name(), "77.0");
  EXPECT_EQ(s->nnodes, 2);
  EXPECT_EQ(s->node_id, 1);
  EXPECT_EQ(s->nodelist_var, "SLURM_STEP_NODELIST");
  EXPECT_EQ(s->nodes(), (Hosts{"n2", "n3"}));
  auto b = ddprun::slurm::read_env(batch_env(3));
  ASSERT_TRUE(b.has_value());
  EXPECT_FALSE(b->in_step());
  EXPECT_EQ(b->nnodes, 3);
  EXPECT_EQ(b->nodelist_var, "SLURM_JOB_NODELIST");
  Env bad = step_env("n[1-2]", 2, 0);
  bad["SLURM_NODEID"] = "x";
  EXPECT_THROW(ddprun::slurm::read_env(bad), ddp::UsageError);
}

// ------------------------------------------------------------------ deriving the job

// Resolves n1..n9 (and their FQDNs) to 127.0.0.1x, nothing else.
std::vector<std::string> fake_resolve(const std::string& host) {
  std::string h = host.substr(0, host.find('.'));
  if (h.size() == 2 && h[0] == 'n' && std::isdigit(static_cast<unsigned char>(h[1])))
    return {std::string("127.0.0.1") + h[1]};
  return {};
}

// Options as parse_options leaves them before slurm::apply, with `given` flags set.
Options parsed(std::map<std::string, std::string> given = {}) {
  Options o;
  o.given = std::move(given);
  return o;
}

Options applied(Options o, const Env& env) {
  ddprun::slurm::apply(o, env, fake_resolve);
  return o;
}

// The UsageError slurm::apply throws for env ("" and a failure when it throws none).
std::string usage_error(Options o, const Env& env) {
  try {
    applied(std::move(o), env);
  } catch (const ddp::UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return "";
}

bool mentions(const std::vector<std::string>& lines, const std::string& what) {
  for (auto& l : lines)
    if (l.find(what) != std::string::npos) return true;
  return false;
}

Options c10d(const std::string& endpoint, std::map<std::string, std::string> given = {}) {
  given["rdzv-backend"] = "--rdzv-backend";
  given["rdzv-endpoint"] = "--rdzv-endpoint";
  Options o = parsed(std::move(given));
  o.rdzv_backend = "c10d";
  o.rdzv_endpoint = endpoint;
  return o;
}

TEST(SlurmDerive, StepWithOneTaskPerNode) {
  Options o = applied(parsed(), step_env("n[1-2]", 2, 1));
  EXPECT_EQ(o.min_nodes, 2);
  EXPECT_EQ(o.max_nodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "n1");
  EXPECT_EQ(o.master_port, derived_port("77", 0));
  EXPECT_EQ(o.rdzv_id, "77.0");
  ASSERT_EQ(o.infos.size(), 1u);
  EXPECT_NE(o.infos[0].find("--nnodes 2 --node-rank 1 --master-addr n1"), std::string::npos) << o.infos[0];
  EXPECT_TRUE(o.warnings.empty());
}

TEST(SlurmDerive, StepOnPartOfTheJobTakesTheStepsFirstNode) {
  Options o = applied(parsed(), step_env("n[2-3]", 2, 0));
  EXPECT_EQ(o.master_addr, "n2");
  EXPECT_EQ(o.node_rank, 0);
  Options p = applied(parsed(), step_env("n[1,3]", 2, 1));
  EXPECT_EQ(p.master_addr, "n1");
  EXPECT_EQ(p.node_rank, 1);
}

TEST(SlurmDerive, ExplicitFlagsWin) {
  Options o = parsed({{"master-port", "PET_MASTER_PORT"}, {"master-addr", "--master-addr"}, {"rdzv-id", "--rdzv-id"}});
  o.master_port = 29999;
  o.master_addr = "head";
  o.rdzv_id = "mine";
  o = applied(o, step_env("n[1-2]", 2, 1));
  EXPECT_EQ(o.master_port, 29999);
  EXPECT_EQ(o.master_addr, "head");
  EXPECT_EQ(o.rdzv_id, "mine");
  EXPECT_EQ(o.node_rank, 1);  // still derived
  EXPECT_EQ(o.max_nodes, 2);
}

TEST(SlurmDerive, NodeRankThatDisagreesIsKeptAndWarned) {
  Options o = parsed({{"node-rank", "--node-rank"}, {"nnodes", "--nnodes"}, {"master-addr", "--master-addr"}});
  o.min_nodes = o.max_nodes = 2;
  o.node_rank = 0;
  o = applied(o, step_env("n[1-2]", 2, 1));
  EXPECT_EQ(o.node_rank, 0);
  ASSERT_TRUE(mentions(o.warnings, "--node-rank 0 disagrees with SLURM_NODEID=1"))
      << ::testing::PrintToString(o.warnings);
}

TEST(SlurmDerive, NnodesThatDisagreesIsKeptAndWarned) {
  Options o = parsed({{"nnodes", "--nnodes"}});
  o.min_nodes = o.max_nodes = 3;
  o = applied(o, step_env("n[1-2]", 2, 0));
  EXPECT_EQ(o.max_nodes, 3);
  EXPECT_TRUE(mentions(o.warnings,
                       "--nnodes 3 but Slurm step 77.0 has 2 nodes (SLURM_STEP_NUM_NODES=2): taken as a job whose "
                       "other nodes run in other steps, so nothing else is derived from Slurm (this node's rank, the "
                       "store's address): give them, or leave --nnodes out"))
      << ::testing::PrintToString(o.warnings);
  EXPECT_EQ(o.master_port, 29500);  // the other node runs in another step: nothing step-specific
  EXPECT_EQ(o.rdzv_id, "none");
  EXPECT_EQ(o.node_rank, 0);
  // On a dynamic line only the run id would have been derived.
  Options d = c10d("n1:29500", {{"nnodes", "--nnodes"}});
  d.min_nodes = d.max_nodes = 3;
  d = applied(d, step_env("n[1-2]", 2, 0));
  EXPECT_TRUE(mentions(d.warnings, "so nothing else is derived from Slurm (the run id): give --rdzv-id, or leave "
                                   "--nnodes out"))
      << ::testing::PrintToString(d.warnings);
}

TEST(SlurmDerive, OneSrunPerNodeKeepsTheGivenLine) {
  // srun -N1 -w n2 ddprun --nnodes 2 --node-rank 1 --master-addr n1 ... (a step per node)
  Options o = parsed({{"nnodes", "--nnodes"}, {"node-rank", "--node-rank"}, {"master-addr", "--master-addr"}});
  o.min_nodes = o.max_nodes = 2;
  o.node_rank = 1;
  o.master_addr = "n1";
  o = applied(o, step_env("n2", 1, 0));
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "n1");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.rdzv_id, "none");
  EXPECT_FALSE(mentions(o.warnings, "disagrees"));
  Options c = c10d("n1:29500", {{"nnodes", "--nnodes"}});
  c.min_nodes = c.max_nodes = 2;
  c = applied(c, step_env("n2", 1, 0));
  EXPECT_EQ(c.rdzv_id, "none");
}

TEST(SlurmDerive, OneNodeJobsInAMultiNodeStep) {
  Options o = parsed({{"nnodes", "--nnodes"}});
  o = applied(o, step_env("n[1-2]", 2, 1));  // --nnodes 1: each node its own job
  EXPECT_EQ(o.max_nodes, 1);
  EXPECT_EQ(o.node_rank, 0);
  EXPECT_EQ(o.master_port, 0);
}

TEST(SlurmDerive, NoSlurmAndStandaloneTurnItOff) {
  Options o = parsed({{"no-slurm", "--no-slurm"}});
  o.no_slurm = true;
  o = applied(o, step_env("n[1-2]", 2, 1));
  EXPECT_EQ(o.max_nodes, 1);
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_TRUE(o.infos.empty());
  Options s = parsed({{"standalone", "--standalone"}});
  s.standalone = true;
  s = applied(s, step_env("n[1-2]", 2, 1));
  EXPECT_EQ(s.max_nodes, 1);
}

TEST(SlurmDerive, BatchShellWarnsAndRunsOneNode) {
  Options o = applied(parsed(), batch_env(3));
  EXPECT_EQ(o.max_nodes, 1);
  EXPECT_EQ(o.node_rank, 0);
  EXPECT_EQ(o.master_port, 0);  // a free port: jobs sharing the node never meet
  ASSERT_TRUE(mentions(o.warnings, "not in an srun step")) << ::testing::PrintToString(o.warnings);
  EXPECT_TRUE(mentions(o.warnings, "srun --ntasks-per-node=1 ddprun"));
  Options one = applied(parsed(), batch_env(1));
  EXPECT_TRUE(one.warnings.empty());
  EXPECT_EQ(one.master_port, 0);
}

TEST(SlurmDerive, SeveralTasksPerNodeWarn) {
  Options o = applied(parsed(), step_env("n[1-2]", 2, 0, 4));
  EXPECT_EQ(o.max_nodes, 1);
  EXPECT_EQ(o.master_port, 0);
  ASSERT_TRUE(mentions(o.warnings, "runs 4 tasks on 2 nodes")) << ::testing::PrintToString(o.warnings);
}

TEST(SlurmDerive, OneNodeStepTakesAFreePort) {
  Options o = applied(parsed(), step_env("n2", 1, 0));
  EXPECT_EQ(o.max_nodes, 1);
  EXPECT_EQ(o.master_port, 0);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_TRUE(o.warnings.empty());
}

TEST(SlurmDerive, UnresolvableHeadIsAnErrorNamingIt) {
  try {
    applied(parsed(), step_env("gpu[1-2]", 2, 1));
    FAIL() << "accepted";
  } catch (const ddp::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("'gpu1'"), std::string::npos) << m;
    EXPECT_NE(m.find("--master-addr"), std::string::npos) << m;
  }
}

TEST(SlurmDerive, MalformedListIsAUsageErrorNamingTheVariable) {
  const std::string m = usage_error(parsed(), step_env("n[2-1]", 2, 1));
  EXPECT_NE(m.find("SLURM_STEP_NODELIST"), std::string::npos) << m;
  EXPECT_NE(m.find("n[2-1]"), std::string::npos) << m;
}

TEST(SlurmDerive, C10dEndpointOnTheFirstNodeHostsOnNodeZero) {
  for (const char* ep : {"n1:29500", "N1:29500", "n1.cluster.example:29500", "127.0.0.11:29500", "n1"}) {
    Options a = applied(c10d(ep), step_env("n[1-2]", 2, 0));
    Options b = applied(c10d(ep), step_env("n[1-2]", 2, 1));
    ASSERT_TRUE(a.rdzv_conf.is_host.has_value()) << ep;
    ASSERT_TRUE(b.rdzv_conf.is_host.has_value()) << ep;
    EXPECT_TRUE(*a.rdzv_conf.is_host) << ep;
    EXPECT_FALSE(*b.rdzv_conf.is_host) << ep;
    EXPECT_EQ(a.max_nodes, 2);
    EXPECT_EQ(a.rdzv_id, "77.0");
    EXPECT_EQ(b.master_port, 29500);  // static settings untouched
  }
}

// c10d with no endpoint in a multi-node step: the step's first node hosts the store at the
// step's derived port (before: every node ran a 1-node job of its own, and succeeded). One
// node, or an elastic range (nodes of other steps), derives no endpoint.
TEST(SlurmDerive, C10dWithoutAnEndpointMeetsOnTheStepsFirstNode) {
  Options bare = parsed({{"rdzv-backend", "--rdzv-backend"}});
  bare.rdzv_backend = "c10d";
  Options a = applied(bare, step_env("n[1-2]", 2, 0));
  Options b = applied(bare, step_env("n[1-2]", 2, 1));
  EXPECT_EQ(a.rdzv_endpoint, "n1:" + std::to_string(derived_port("77", 0)));
  EXPECT_EQ(b.rdzv_endpoint, a.rdzv_endpoint);
  EXPECT_TRUE(*a.rdzv_conf.is_host);
  EXPECT_FALSE(*b.rdzv_conf.is_host);
  EXPECT_EQ(b.max_nodes, 2);
  EXPECT_EQ(b.rdzv_id, "77.0");
  ASSERT_EQ(b.infos.size(), 1u);
  EXPECT_NE(b.infos[0].find("--rdzv-endpoint " + a.rdzv_endpoint + " --nnodes 2"), std::string::npos)
      << b.infos[0];
  EXPECT_TRUE(b.warnings.empty());
  EXPECT_EQ(applied(bare, step_env("n1", 1, 0)).rdzv_endpoint, "");
  Options range = bare;
  range.given["nnodes"] = "--nnodes";
  range.min_nodes = 1, range.max_nodes = 4;
  EXPECT_EQ(applied(range, step_env("n[1-2]", 2, 1)).rdzv_endpoint, "");
}

TEST(SlurmDerive, C10dOtherEndpointsAndExplicitIsHostAreLeftAlone) {
  for (const char* ep : {"n2:29500", "n11.cluster.example:1", "127.0.0.12:29500", "login:29500"}) {
    Options o = applied(c10d(ep), step_env("n[1-2]", 2, 0));
    EXPECT_FALSE(o.rdzv_conf.is_host.has_value()) << ep;
  }
  Options e = c10d("n1:29500", {{"rdzv-conf", "--rdzv-conf"}, {"rdzv-id", "--rdzv-id"}, {"nnodes", "--nnodes"}});
  e.rdzv_conf.is_host = false;
  e.rdzv_id = "123";
  e.min_nodes = 1, e.max_nodes = 4;
  e = applied(e, step_env("n[1-2]", 2, 0));
  EXPECT_FALSE(*e.rdzv_conf.is_host);
  EXPECT_EQ(e.rdzv_id, "123");
  EXPECT_EQ(e.min_nodes, 1);
  EXPECT_EQ(e.max_nodes, 4);
}

// `srun --het-group=0,1` on a job of components n3 and n[1-2], as Slurm 22.05 sets it: the
// step's node list is sorted, its node ids go component by component (n3 is 0).
Env het_step_env(int node_id, const std::string& group0 = "n3", const std::string& group1 = "n[1-2]") {
  Env e = step_env("n[1-3]", 3, node_id);
  e["SLURM_HET_SIZE"] = "2";
  e["SLURM_JOB_NODELIST_HET_GROUP_0"] = group0;
  e["SLURM_JOB_NODELIST_HET_GROUP_1"] = group1;
  return e;
}

TEST(SlurmDerive, HeterogeneousStepTakesItsFirstComponentsFirstNode) {
  Options o = applied(parsed(), het_step_env(1));
  EXPECT_EQ(o.master_addr, "n3");
  EXPECT_EQ(o.node_rank, 1);
  for (int id : {0, 2}) EXPECT_EQ(applied(parsed(), het_step_env(id)).master_addr, "n3");
  // c10d with the endpoint on that node: node 0 hosts it, whatever the sorted list says.
  Options a = applied(c10d("n3:29400"), het_step_env(0));
  Options b = applied(c10d("n1:29400"), het_step_env(1));
  ASSERT_TRUE(a.rdzv_conf.is_host.has_value());
  EXPECT_TRUE(*a.rdzv_conf.is_host);
  EXPECT_FALSE(b.rdzv_conf.is_host.has_value());  // n1 is not node 0's host: nothing derived
  // A step on one component of a heterogeneous job is numbered as its list.
  Env one = step_env("n[1-2]", 2, 0);
  one["SLURM_HET_SIZE"] = "2";
  one["SLURM_JOB_NODELIST_HET_GROUP_0"] = "n3";
  one["SLURM_JOB_NODELIST_HET_GROUP_1"] = "n[1-2]";
  EXPECT_EQ(applied(parsed(), one).master_addr, "n1");
  // A step on part of one component (srun -N2 in a job whose first component has 4 nodes).
  Env part = step_env("n[2-3]", 2, 0);
  part["SLURM_HET_SIZE"] = "2";
  part["SLURM_JOB_NODELIST_HET_GROUP_0"] = "n[1-4]";
  part["SLURM_JOB_NODELIST_HET_GROUP_1"] = "n[5-6]";
  EXPECT_EQ(applied(parsed(), part).master_addr, "n2");
  // Slurm before 20.02 named them PACK.
  Env pack = het_step_env(1);
  pack.erase("SLURM_HET_SIZE");
  pack.erase("SLURM_JOB_NODELIST_HET_GROUP_0");
  pack.erase("SLURM_JOB_NODELIST_HET_GROUP_1");
  pack["SLURM_PACK_SIZE"] = "2";
  pack["SLURM_JOB_NODELIST_PACK_GROUP_0"] = "n3";
  pack["SLURM_JOB_NODELIST_PACK_GROUP_1"] = "n[1-2]";
  EXPECT_EQ(applied(parsed(), pack).master_addr, "n3");
}

TEST(SlurmDerive, HeterogeneousStepWhoseOrderCannotBeToldNeedsMasterAddr) {
  // Part of a component in the step: its node ids cannot be told from the job's lists.
  Env part = het_step_env(0, "n[3-4]");
  const std::string m = usage_error(parsed(), part);
  EXPECT_NE(m.find("heterogeneous"), std::string::npos) << m;
  EXPECT_NE(m.find("SLURM_JOB_NODELIST_HET_GROUP_0=n[3-4]"), std::string::npos) << m;
  EXPECT_NE(m.find("--master-addr"), std::string::npos) << m;
  Options given = parsed({{"master-addr", "--master-addr"}});
  given.master_addr = "n3";
  EXPECT_EQ(applied(given, part).master_addr, "n3");
}

TEST(SlurmDerive, MissingNodeIdInAMultiNodeStepIsAnError) {
  Env e = step_env("n[1-2]", 2, 1);
  e.erase("SLURM_NODEID");
  const std::string m = usage_error(parsed(), e);
  EXPECT_NE(m.find("SLURM_NODEID is not set"), std::string::npos) << m;
  EXPECT_NE(m.find("--node-rank"), std::string::npos) << m;
  EXPECT_THROW(applied(c10d("n1:29400"), e), ddp::UsageError);  // which node hosts the store
  Options given = parsed({{"node-rank", "--node-rank"}});
  given.node_rank = 1;
  Options o = applied(given, e);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_TRUE(o.warnings.empty());
  ASSERT_EQ(o.infos.size(), 1u);
  EXPECT_NE(o.infos[0].find("SLURM_NODEID=unset"), std::string::npos) << o.infos[0];
  Env one = step_env("n1", 1, 0);  // one node: nothing needs it
  one.erase("SLURM_NODEID");
  EXPECT_NO_THROW(applied(parsed(), one));
}

TEST(SlurmDerive, EtcdTakesTheNodeCountAndRunIdButHostsNothing) {
  for (const char* backend : {"etcd", "etcd-v2"}) {
    Options o = c10d("n1:2379", {{"log-level", "--log-level"}});
    o.rdzv_backend = backend;
    o = applied(o, step_env("n[1-2]", 2, 0));
    EXPECT_EQ(o.min_nodes, 2) << backend;
    EXPECT_EQ(o.max_nodes, 2) << backend;
    EXPECT_EQ(o.rdzv_id, "77.0") << backend;  // two jobs on one etcd never share a run id
    EXPECT_FALSE(o.rdzv_conf.is_host.has_value()) << backend;  // the endpoint is etcd, not a node's store
    ASSERT_EQ(o.infos.size(), 1u) << backend;
    EXPECT_NE(o.infos[0].find("as if given --nnodes 2 --rdzv-id 77.0 (--no-slurm"), std::string::npos) << o.infos[0];
  }
  Options e = c10d("n1:2379", {{"rdzv-id", "--rdzv-id"}, {"nnodes", "--nnodes"}});
  e.rdzv_backend = "etcd";
  e.rdzv_id = "mine";
  e.min_nodes = 1, e.max_nodes = 3;
  e = applied(e, step_env("n[1-2]", 2, 1));
  EXPECT_EQ(e.rdzv_id, "mine");
  EXPECT_EQ(e.max_nodes, 3);
  EXPECT_TRUE(e.infos.empty());
}

TEST(SlurmDerive, SameHost) {
  using ddprun::slurm::same_host;
  EXPECT_TRUE(same_host("n1", "n1", fake_resolve));
  EXPECT_TRUE(same_host("n1.x.y", "n1", fake_resolve));
  EXPECT_TRUE(same_host("n1", "n1.x.y", fake_resolve));
  EXPECT_FALSE(same_host("n1.x.y", "n1.z.w", fake_resolve));
  EXPECT_FALSE(same_host("n10", "n1", fake_resolve));
  EXPECT_TRUE(same_host("127.0.0.11", "n1", fake_resolve));
  EXPECT_FALSE(same_host("127.0.0.11", "n2", fake_resolve));
}

// ------------------------------------------------------------------ through parse_options

TEST(SlurmDerive, ParseOptionsRecordsGivenFlagsAndDerives) {
  ddprun_test::TempDir dir;
  std::string script = dir.write("train.py", "print('hi')\n");
  Env env = step_env("127.0.0.[1-2]", 2, 1);  // addresses: they resolve anywhere
  env["PET_MASTER_PORT"] = "23456";
  Options o = ddprun::parse_options({"--nproc-per-node", "2", script}, env);
  EXPECT_EQ(o.given.at("nproc-per-node"), "--nproc-per-node");
  EXPECT_EQ(o.given.at("master-port"), "PET_MASTER_PORT");
  EXPECT_EQ(o.given.count("node-rank"), 0u);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.max_nodes, 2);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 23456);
  Options off = ddprun::parse_options({"--no-slurm", script}, env);
  EXPECT_TRUE(off.no_slurm);
  EXPECT_EQ(off.max_nodes, 1);
  Env pet = env;
  pet["PET_NO_SLURM"] = "1";
  EXPECT_EQ(ddprun::parse_options({script}, pet).max_nodes, 1);
}

// ------------------------------------------------------------------ stop notes

// A node that gets Slurm's stop first tells the others; the note survives the wrapping
// each rendezvous adds ("node 1: ...", "node n2 (...) left: ...") and names its step.
TEST(SlurmStopNote, RoundTripsThroughARoundEndAndNamesItsStep) {
  using ddprun::slurm_stop_in;
  using ddprun::slurm_stop_note;
  const std::string note = slurm_stop_note("12.0", {SIGTERM, false}, "n2");
  EXPECT_EQ(note, "Slurm is stopping step 12.0 (signal 15, SIGTERM; Slurm signals ddprun only): ddprun on n2 got it first");
  for (const std::string& wrapped : {note, "node 1: " + note, "node n2 (n2_7_ab) left: " + note}) {  // static, c10d
    auto stop = slurm_stop_in(wrapped, "12.0");
    ASSERT_TRUE(stop.has_value()) << wrapped;
    EXPECT_EQ(stop->sig, SIGTERM);
    EXPECT_FALSE(stop->direct);
  }
  auto direct = slurm_stop_in("node 1: " + slurm_stop_note("12.0", {SIGINT, true}, "n1"), "12.0");
  ASSERT_TRUE(direct.has_value());
  EXPECT_EQ(direct->sig, SIGINT);
  EXPECT_TRUE(direct->direct);  // proctrack/linuxproc: Slurm signals the workers itself
  EXPECT_FALSE(slurm_stop_in(note, "12.1").has_value());   // another step of the job
  EXPECT_FALSE(slurm_stop_in(note, "112.0").has_value());  // another job
  EXPECT_FALSE(slurm_stop_in("node 1: ddprun on n2 received SIGTERM", "12.0").has_value());  // not Slurm's
  EXPECT_FALSE(slurm_stop_in("node 1: rank 3 exited with code 15", "12.0").has_value());
  EXPECT_FALSE(slurm_stop_in("Slurm is stopping step 12.0 (signal x, SIGTERM; Slurm signals ddprun only)", "12.0"));
  EXPECT_FALSE(slurm_stop_in("Slurm is stopping step 12.0 (signal 15", "12.0").has_value());
  EXPECT_FALSE(slurm_stop_in("Slurm is stopping step 12.0 (signal 15, SIGTERM", "12.0").has_value());
  EXPECT_FALSE(slurm_stop_in("Slurm is stopping step 12.0 (signal 15, SIGTERM; who knows)", "12.0").has_value());
  EXPECT_FALSE(slurm_stop_in("Slurm is stopping step 12.0 (signal 999, X; Slurm signals ddprun only)", "12.0"));
}

// ------------------------------------------------------------------ GPUs

TEST(SlurmGpus, CountsWhatTheStepWasGiven) {
  using ddprun::slurm_gpus;
  EXPECT_FALSE(slurm_gpus({{"CUDA_VISIBLE_DEVICES", "0,1"}}).has_value());  // not in Slurm
  Env job{{"SLURM_JOB_ID", "5"}, {"SLURM_STEP_ID", "0"}};
  EXPECT_EQ(slurm_gpus(job)->n, 0);
  EXPECT_NE(slurm_gpus(job)->from.find("no GPU"), std::string::npos);
  auto with = [&](Env extra) {
    Env e = job;
    e.insert(extra.begin(), extra.end());
    return *slurm_gpus(e);
  };
  EXPECT_EQ(with({{"CUDA_VISIBLE_DEVICES", "2,5"}, {"SLURM_GPUS_ON_NODE", "8"}}).n, 2);
  EXPECT_EQ(with({{"CUDA_VISIBLE_DEVICES", "GPU-aa,GPU-bb,GPU-cc"}}).n, 3);
  EXPECT_EQ(with({{"CUDA_VISIBLE_DEVICES", ""}}).n, 0);
  EXPECT_EQ(with({{"SLURM_GPUS_ON_NODE", "4"}}).n, 4);
  EXPECT_EQ(with({{"SLURM_GPUS_ON_NODE", "4"}}).from, "SLURM_GPUS_ON_NODE=4");
  EXPECT_EQ(with({{"SLURM_STEP_GPUS", "1,3,6"}}).n, 3);
  EXPECT_EQ(with({{"SLURM_JOB_GPUS", "1,3,6"}}).n, 0);  // the job's list is the batch script's
  Env batch{{"SLURM_JOB_ID", "5"}, {"SLURM_JOB_GPUS", "0,1"}};
  EXPECT_EQ(slurm_gpus(batch)->n, 2);
}

}  // namespace
