// What each worker runs and sees: worker_environment (every torchrun variable, per rank)
// and worker_command (python -u, -m, --no-python, executables, PYTHON_EXEC, ${local_rank}).
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "launcher/options.hpp"
#include "launcher/worker.hpp"
#include "test_util.hpp"

namespace {

using ddprun::JobPlan;
using ddprun::Options;
using ddprun::worker_command;
using ddprun::worker_environment;
using Env = std::map<std::string, std::string>;
using Args = std::vector<std::string>;

std::string at(const Env& env, const std::string& k) {
  auto it = env.find(k);
  return it == env.end() ? "<unset>" : it->second;
}

JobPlan two_node_plan() {
  JobPlan p;
  p.world_size = 8;
  p.rank_base = 4;  // this is node 1 of 2, 4 workers each
  p.group_rank = 1;
  p.group_world_size = 2;
  p.master_addr = "10.1.2.3";
  p.master_port = 29123;
  p.use_agent_store = true;
  p.run_id = "job42";
  p.hostname = "node1";
  return p;
}

Options four_workers() {
  Options o;
  o.nproc_per_node = 4;
  o.max_restarts = 3;
  o.role = "trainer";
  o.script = "train.py";
  return o;
}

TEST(LauncherWorkerEnv, EveryTorchrunVariablePerRank) {
  const Options o = four_workers();
  const JobPlan plan = two_node_plan();
  const Env base{{"PATH", "/usr/bin:/bin"}, {"HOME", "/root"}};
  for (int lr = 0; lr < 4; ++lr) {
    SCOPED_TRACE("local rank " + std::to_string(lr));
    const std::string ef = "/tmp/attempt_2/" + std::to_string(lr) + "/error.json";
    JobPlan p2 = plan;
    p2.restart_count = 2;
    Env env = worker_environment(o, p2, lr, ef, base);
    EXPECT_EQ(at(env, "RANK"), std::to_string(4 + lr));
    EXPECT_EQ(at(env, "LOCAL_RANK"), std::to_string(lr));
    EXPECT_EQ(at(env, "GROUP_RANK"), "1");
    EXPECT_EQ(at(env, "ROLE_RANK"), std::to_string(4 + lr));
    EXPECT_EQ(at(env, "ROLE_NAME"), "trainer");
    EXPECT_EQ(at(env, "LOCAL_WORLD_SIZE"), "4");
    EXPECT_EQ(at(env, "WORLD_SIZE"), "8");
    EXPECT_EQ(at(env, "GROUP_WORLD_SIZE"), "2");
    EXPECT_EQ(at(env, "ROLE_WORLD_SIZE"), "8");
    EXPECT_EQ(at(env, "MASTER_ADDR"), "10.1.2.3");
    EXPECT_EQ(at(env, "MASTER_PORT"), "29123");
    EXPECT_EQ(at(env, "TORCHELASTIC_RESTART_COUNT"), "2");
    EXPECT_EQ(at(env, "TORCHELASTIC_MAX_RESTARTS"), "3");
    EXPECT_EQ(at(env, "TORCHELASTIC_RUN_ID"), "job42");
    EXPECT_EQ(at(env, "TORCHELASTIC_USE_AGENT_STORE"), "True");
    EXPECT_EQ(at(env, "TORCHELASTIC_ERROR_FILE"), ef);
    EXPECT_EQ(at(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
    EXPECT_EQ(at(env, "OMP_NUM_THREADS"), "1");
    // The launcher's own environment is inherited.
    EXPECT_EQ(at(env, "PATH"), "/usr/bin:/bin");
    EXPECT_EQ(at(env, "HOME"), "/root");
  }
}

TEST(LauncherWorkerEnv, UseAgentStoreFalse) {
  Options o = four_workers();
  JobPlan plan = two_node_plan();
  plan.use_agent_store = false;
  EXPECT_EQ(at(worker_environment(o, plan, 0, "e", {}), "TORCHELASTIC_USE_AGENT_STORE"), "False");
}

TEST(LauncherWorkerEnv, LauncherValuesOverrideInheritedRankVariables) {
  Options o = four_workers();
  JobPlan plan = two_node_plan();
  Env base{{"RANK", "99"}, {"LOCAL_RANK", "98"}, {"WORLD_SIZE", "97"}, {"MASTER_PORT", "1"},
           {"TORCHELASTIC_ERROR_FILE", "/outer/error.json"}};
  Env env = worker_environment(o, plan, 1, "/inner/error.json", base);
  EXPECT_EQ(at(env, "RANK"), "5");
  EXPECT_EQ(at(env, "LOCAL_RANK"), "1");
  EXPECT_EQ(at(env, "WORLD_SIZE"), "8");
  EXPECT_EQ(at(env, "MASTER_PORT"), "29123");
  EXPECT_EQ(at(env, "TORCHELASTIC_ERROR_FILE"), "/inner/error.json");
}

TEST(LauncherWorkerEnv, WarmProcessHasNoneOfTheRankVariables) {
  Options o = four_workers();
  o.virtual_local_rank = false;
  Env base{{"RANK", "99"}, {"LOCAL_RANK", "98"}, {"WORLD_SIZE", "97"}, {"MASTER_ADDR", "10.9.9.9"},
           {"MASTER_PORT", "1"}, {"PATH", "/bin"}};
  Env warm = ddprun::warm_environment(o, base);
  // Every variable a worker gets for its rank or round (or differently from ddprun's own) is
  // not in the warm process's; what every worker gets alike is.
  Env worker = worker_environment(o, two_node_plan(), 1, "e", base);
  Env node = ddprun::node_environment(o, base);
  for (const auto& [k, v] : worker) {
    if (node.count(k) && node.at(k) == v) EXPECT_EQ(warm.at(k), v) << k;
    else EXPECT_EQ(warm.count(k), 0u) << k << " (ddprun's own: " << (base.count(k) ? base.at(k) : "-") << ")";
  }
  EXPECT_EQ(at(warm, "PATH"), "/bin");
  EXPECT_EQ(at(warm, "LOCAL_WORLD_SIZE"), "4");
}

TEST(LauncherWorkerEnv, OmpNumThreadsRule) {
  JobPlan plan = two_node_plan();
  Options many = four_workers();
  Options one = four_workers();
  one.nproc_per_node = 1;
  // Unset and nproc > 1: "1".
  EXPECT_EQ(at(worker_environment(many, plan, 0, "e", {}), "OMP_NUM_THREADS"), "1");
  EXPECT_TRUE(ddprun::sets_omp_threads(many, {}));
  // Unset and one worker: left unset.
  EXPECT_EQ(at(worker_environment(one, plan, 0, "e", {}), "OMP_NUM_THREADS"), "<unset>");
  EXPECT_FALSE(ddprun::sets_omp_threads(one, {}));
  // Inherited: kept as is.
  Env base{{"OMP_NUM_THREADS", "6"}};
  EXPECT_EQ(at(worker_environment(many, plan, 0, "e", base), "OMP_NUM_THREADS"), "6");
  EXPECT_FALSE(ddprun::sets_omp_threads(many, base));
}

TEST(LauncherWorkerEnv, NcclAsyncErrorHandlingInherited) {
  Options o = four_workers();
  Env env = worker_environment(o, two_node_plan(), 0, "e", {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"}});
  EXPECT_EQ(at(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "0");
}

TEST(LauncherWorkerEnv, VirtualLocalRank) {
  Options o = four_workers();
  o.virtual_local_rank = true;
  JobPlan plan = two_node_plan();
  for (int lr = 0; lr < 4; ++lr) {
    Env env = worker_environment(o, plan, lr, "e", {});
    EXPECT_EQ(at(env, "LOCAL_RANK"), "0");
    EXPECT_EQ(at(env, "RANK"), std::to_string(4 + lr));
    EXPECT_EQ(at(env, "CUDA_VISIBLE_DEVICES"), std::to_string(lr));
  }
  // With CUDA_VISIBLE_DEVICES set, each worker gets its entry of the list.
  Env base{{"CUDA_VISIBLE_DEVICES", "3,5,7,9"}};
  EXPECT_EQ(at(worker_environment(o, plan, 2, "e", base), "CUDA_VISIBLE_DEVICES"), "7");
  EXPECT_EQ(at(worker_environment(o, plan, 0, "e", base), "CUDA_VISIBLE_DEVICES"), "3");
  Env spaced{{"CUDA_VISIBLE_DEVICES", "4, 5"}};  // as torch's strip(): no " 5"
  EXPECT_EQ(at(worker_environment(o, plan, 1, "e", spaced), "CUDA_VISIBLE_DEVICES"), "5");
}

TEST(LauncherWorkerEnv, WithoutVirtualLocalRankCudaVisibleDevicesUntouched) {
  Options o = four_workers();
  Env env = worker_environment(o, two_node_plan(), 2, "e", {{"CUDA_VISIBLE_DEVICES", "3,5"}});
  EXPECT_EQ(at(env, "CUDA_VISIBLE_DEVICES"), "3,5");
  EXPECT_EQ(at(env, "LOCAL_RANK"), "2");
}

TEST(LauncherWorkerEnv, ToEnvp) {
  auto v = ddprun::to_envp({{"A", "1"}, {"B", "x=y"}});
  EXPECT_EQ(v, (std::vector<std::string>{"A=1", "B=x=y"}));
}

// ------------------------------------------------------------------ command

class LauncherWorkerCommand : public ::testing::Test {
 protected:
  ddprun_test::TempDir dir_;
  Env env_{{"PATH", "/usr/bin:/bin"}};
};

TEST_F(LauncherWorkerCommand, PythonUnbuffered) {
  Options o;
  o.script = dir_.write("train.py", "");
  o.script_args = {"--lr", "0.1"};
  auto c = worker_command(o, 0, env_);
  EXPECT_EQ(c.argv, (Args{"python3", "-u", o.script, "--lr", "0.1"}));
  // execve needs a path: python3 resolved through PATH.
  EXPECT_EQ(c.path.front(), '/') << c.path;
  EXPECT_TRUE(c.path.ends_with("/python3")) << c.path;
}

TEST_F(LauncherWorkerCommand, PythonExec) {
  Options o;
  o.script = dir_.write("train.py", "");
  Env env = env_;
  env["PYTHON_EXEC"] = "/opt/py/bin/python3.99";
  auto c = worker_command(o, 0, env);
  EXPECT_EQ(c.path, "/opt/py/bin/python3.99");
  EXPECT_EQ(c.argv, (Args{"/opt/py/bin/python3.99", "-u", o.script}));
}

TEST_F(LauncherWorkerCommand, Module) {
  Options o;
  o.module = true;
  o.script = "pkg.train";
  o.script_args = {"a"};
  auto c = worker_command(o, 1, env_);
  EXPECT_EQ(c.argv, (Args{"python3", "-u", "-m", "pkg.train", "a"}));
}

TEST_F(LauncherWorkerCommand, NoPython) {
  Options o;
  o.no_python = true;
  o.script = "sh";
  o.script_args = {"-c", "echo hi"};
  auto c = worker_command(o, 0, env_);
  EXPECT_EQ(c.argv, (Args{"sh", "-c", "echo hi"}));
  EXPECT_TRUE(c.path == "/usr/bin/sh" || c.path == "/bin/sh") << c.path;
}

TEST_F(LauncherWorkerCommand, ExecutableNonPyRunsDirectly) {
  Options o;
  o.script = dir_.write("run.sh", "#!/bin/sh\necho hi\n", 0755);
  o.script_args = {"x"};
  auto c = worker_command(o, 0, env_);
  EXPECT_EQ(c.path, o.script);
  EXPECT_EQ(c.argv, (Args{o.script, "x"}));
}

// --run-path runs the script in Python (torchrun: runpy.run_path), whatever the file is.
TEST_F(LauncherWorkerCommand, RunPathGoesThroughPythonEvenForAnExecutable) {
  Options o;
  o.run_path = true;
  o.script = dir_.write("run.sh", "#!/bin/sh\necho hi\n", 0755);
  auto c = worker_command(o, 0, env_);
  EXPECT_EQ(c.argv, (Args{"python3", "-u", o.script}));
}

TEST_F(LauncherWorkerCommand, NonExecutableNonPyGoesThroughPython) {
  Options o;
  o.script = dir_.write("run.txt", "print(1)\n", 0644);
  auto c = worker_command(o, 0, env_);
  EXPECT_EQ(c.argv, (Args{"python3", "-u", o.script}));
}

TEST_F(LauncherWorkerCommand, ExecutablePyStillGoesThroughPython) {
  Options o;
  o.script = dir_.write("train.py", "#!/usr/bin/env python3\n", 0755);
  auto c = worker_command(o, 0, env_);
  EXPECT_EQ(c.argv, (Args{"python3", "-u", o.script}));
}

TEST_F(LauncherWorkerCommand, LocalRankReplacedInArgs) {
  Options o;
  o.script = dir_.write("train.py", "");
  o.script_args = {"--out=/logs/${local_rank}/x", "${local_rank}", "r${local_rank}_${local_rank}", "plain"};
  auto c = worker_command(o, 3, env_);
  EXPECT_EQ(c.argv, (Args{"python3", "-u", o.script, "--out=/logs/3/x", "3", "r3_3", "plain"}));
  auto c0 = worker_command(o, 0, env_);
  EXPECT_EQ(c0.argv[3], "--out=/logs/0/x");
}

// As torchrun's macros.substitute (string.Template.safe_substitute): `$local_rank` too, `$$`
// is `$`, anything else stays. (ddprun replaced only the braced spelling, and kept `$$`.)
TEST_F(LauncherWorkerCommand, LocalRankByPythonsTemplateRules) {
  Options o;
  o.script = dir_.write("train.py", "");
  o.script_args = {"ckpt_$local_rank", "a$$b", "$${local_rank}", "$local_rank_x", "${local_rank", "$rank", "$", "5$"};
  auto c = worker_command(o, 2, env_);
  EXPECT_EQ(c.argv, (Args{"python3", "-u", o.script, "ckpt_2", "a$b", "${local_rank}", "$local_rank_x", "${local_rank",
                          "$rank", "$", "5$"}));
}

}  // namespace
