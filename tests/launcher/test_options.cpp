// ddprun's command line: torchrun 2.x's flag table (both spellings, --flag=value and
// --flag value, PET_ fallbacks, prefixes, short forms), defaults, the script/argument split,
// and every bad input refused with a ddp::UsageError naming the flag.
#include <sched.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ddp/error.hpp"
#include "launcher/options.hpp"
#include "launcher/process.hpp"
#include "test_util.hpp"

namespace {

using ddprun::Options;
using ddprun::parse_options;
using Env = std::map<std::string, std::string>;
using Args = std::vector<std::string>;

// The signals that stop the job by default, then `more`: SIGHUP among them unless this test
// runs under nohup (ddprun then leaves SIGHUP ignored).
std::vector<int> stop_signals(std::initializer_list<int> more = {}) {
  std::vector<int> v{SIGTERM, SIGINT};
  if (!ddprun::sighup_ignored_at_start()) v.push_back(SIGHUP);
  v.insert(v.end(), more);
  return v;
}

class LauncherOptions : public ::testing::Test {
 protected:
  void SetUp() override { script_ = dir_.write("train.py", "print('hi')\n"); }

  // Parses args with the script appended (plus script args).
  Options parse(Args args, const Env& env = {}) { return parse_options(args, env); }
  Options parse_with_script(Args before, const Env& env = {}, const Args& after = {}) {
    before.push_back(script_);
    before.insert(before.end(), after.begin(), after.end());
    return parse_options(before, env);
  }

  // The message of the UsageError parse_options must throw; "" (and a test failure) if
  // it throws nothing or something else.
  std::string usage_error(const Args& args, const Env& env = {}) {
    try {
      parse_options(args, env);
    } catch (const ddp::UsageError& e) {
      return e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "expected ddp::UsageError, got another exception: " << e.what();
      return "";
    }
    ADD_FAILURE() << "expected ddp::UsageError, parse_options accepted the arguments";
    return "";
  }
  std::string usage_error_with_script(Args before, const Env& env = {}) {
    before.push_back(script_);
    return usage_error(before, env);
  }

  ddprun_test::TempDir dir_;
  std::string script_;
};

// ------------------------------------------------------------------ defaults

TEST_F(LauncherOptions, Defaults) {
  Options o = parse_with_script({});
  EXPECT_EQ(o.min_nodes, 1);
  EXPECT_EQ(o.max_nodes, 1);
  EXPECT_EQ(o.nproc_per_node, 1);
  EXPECT_EQ(o.node_rank, 0);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_DOUBLE_EQ(o.shutdown_timeout, 30.0);
  // SIGQUIT asks for every rank's stack (docs/stacks.md) instead of stopping, as torchrun's.
  EXPECT_EQ(o.signals_to_handle, stop_signals());
  EXPECT_TRUE(o.stack_dumps);
  EXPECT_EQ(o.hang_timeout, 0);
  EXPECT_EQ(o.dump_stacks, -1);
  EXPECT_EQ(o.role, "default");
  EXPECT_EQ(o.rdzv_backend, "static");
  EXPECT_FALSE(o.standalone);
  EXPECT_FALSE(o.module);
  EXPECT_FALSE(o.no_python);
  EXPECT_FALSE(o.virtual_local_rank);
  EXPECT_EQ(o.redirects.all, 0);
  EXPECT_EQ(o.tee.all, 0);
  EXPECT_FALSE(o.local_ranks_filter.has_value());
  EXPECT_FALSE(o.log_line_prefix_template.has_value());
  EXPECT_EQ(o.script, script_);
  EXPECT_TRUE(o.script_args.empty());
}

// ------------------------------------------------------------------ spellings

TEST_F(LauncherOptions, DashAndUnderscoreSpellings) {
  EXPECT_EQ(parse_with_script({"--nproc-per-node", "4"}).nproc_per_node, 4);
  EXPECT_EQ(parse_with_script({"--nproc_per_node", "5"}).nproc_per_node, 5);
  EXPECT_EQ(parse_with_script({"--master_port", "1234"}).master_port, 1234);
  EXPECT_EQ(parse_with_script({"--max_restarts", "3"}).max_restarts, 3);
  EXPECT_TRUE(parse({"--no_python", dir_.write("run.sh", "echo hi\n", 0755)}).no_python);
}

TEST_F(LauncherOptions, EqualsAndSpaceForms) {
  EXPECT_EQ(parse_with_script({"--nproc-per-node=3"}).nproc_per_node, 3);
  EXPECT_EQ(parse_with_script({"--nproc_per_node=6"}).nproc_per_node, 6);
  Options o = parse_with_script({"--master-addr=10.0.0.1", "--master-port", "4321", "--role=trainer"});
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_EQ(o.master_port, 4321);
  EXPECT_EQ(o.role, "trainer");
  // A value that starts with '-' is still the flag's value.
  EXPECT_EQ(parse_with_script({"--role", "-x"}).role, "-x");
}

TEST_F(LauncherOptions, UnambiguousPrefixes) {
  EXPECT_EQ(parse_with_script({"--nproc", "2"}).nproc_per_node, 2);
  EXPECT_EQ(parse_with_script({"--master-p", "1234"}).master_port, 1234);
  EXPECT_EQ(parse_with_script({"--master_p=2345"}).master_port, 2345);
  EXPECT_EQ(parse_with_script({"--max-r", "4"}).max_restarts, 4);
  EXPECT_TRUE(parse_with_script({"--stand"}).standalone);
}

TEST_F(LauncherOptions, AmbiguousPrefixNamesCandidates) {
  std::string msg = usage_error_with_script({"--n", "2"});
  EXPECT_NE(msg.find("--n"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ambiguous"), std::string::npos) << msg;
  for (const char* cand : {"--nnodes", "--nproc-per-node", "--node-rank", "--no-python"})
    EXPECT_NE(msg.find(cand), std::string::npos) << cand << " missing from: " << msg;
  std::string msg2 = usage_error_with_script({"--master", "x"});
  EXPECT_NE(msg2.find("--master-addr"), std::string::npos) << msg2;
  EXPECT_NE(msg2.find("--master-port"), std::string::npos) << msg2;
}

TEST_F(LauncherOptions, ShortForms) {
  Options m = parse({"-m", "pkg.train", "--lr", "1"});
  EXPECT_TRUE(m.module);
  EXPECT_EQ(m.script, "pkg.train");
  EXPECT_EQ(m.script_args, (Args{"--lr", "1"}));

  Options r = parse_with_script({"-r3"});
  EXPECT_EQ(r.redirects.all, 3);
  EXPECT_EQ(parse_with_script({"-r", "2"}).redirects.all, 2);

  Options t = parse_with_script({"-t", "0:1,1:2"});
  EXPECT_EQ(t.tee.all, 0);
  EXPECT_EQ(t.tee.of(0), 1);
  EXPECT_EQ(t.tee.of(1), 2);
  EXPECT_EQ(t.tee.of(2), 0);
  EXPECT_EQ(parse_with_script({"--tee=3"}).tee.of(7), 3);
  EXPECT_EQ(parse_with_script({"--redirects", "0:3"}).redirects.of(0), 3);
}

// ------------------------------------------------------------------ environment

TEST_F(LauncherOptions, PetFallbacks) {
  Options o = parse_with_script({}, {{"PET_NPROC_PER_NODE", "3"}, {"PET_STANDALONE", "1"}, {"PET_MASTER_PORT", "4567"}});
  EXPECT_EQ(o.nproc_per_node, 3);
  EXPECT_TRUE(o.standalone);
  EXPECT_EQ(o.master_port, 4567);
  EXPECT_FALSE(parse_with_script({}, {{"PET_STANDALONE", "0"}}).standalone);
  // torchrun: bool(int(value)); "2" was refused with "expected 1 or 0" while "yes" was taken.
  EXPECT_TRUE(parse_with_script({}, {{"PET_STANDALONE", "2"}}).standalone);
  EXPECT_FALSE(parse_with_script({}, {{"PET_STANDALONE", "00"}}).standalone);
  for (const char* on : {" 1", "+1", "1_0", "-3 "}) EXPECT_TRUE(parse_with_script({}, {{"PET_STANDALONE", on}}).standalone) << on;
  for (const char* bad : {"1__0", "_1", "1_", "+", "0x1"})
    EXPECT_NE(usage_error_with_script({}, {{"PET_STANDALONE", bad}}).find("expected a number"), std::string::npos) << bad;
  EXPECT_NE(usage_error_with_script({}, {{"PET_STANDALONE", "maybe"}})
                .find("PET_STANDALONE: expected a number (0 is off) or true/false, yes/no, on/off; got 'maybe'"),
            std::string::npos);
  EXPECT_EQ(parse_with_script({}, {{"PET_MAX_RESTARTS", "2"}}).max_restarts, 2);
  EXPECT_EQ(parse_with_script({}, {{"PET_MASTER_ADDR", "node0"}}).master_addr, "node0");
  EXPECT_EQ(parse_with_script({}, {{"PET_ROLE", "trainer"}}).role, "trainer");
}

TEST_F(LauncherOptions, CommandLineBeatsPet) {
  Env env{{"PET_NPROC_PER_NODE", "3"}, {"PET_MASTER_PORT", "4567"}};
  Options o = parse_with_script({"--nproc-per-node", "2", "--master_port=1111"}, env);
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.master_port, 1111);
  // Even when the command line uses a prefix.
  EXPECT_EQ(parse_with_script({"--nproc", "5"}, env).nproc_per_node, 5);
}

// --preload is ddprun's own list: given twice it takes both; an empty PET_PRELOAD (a
// cluster's template with nothing to preload) is no preload, not a bad module name.
TEST_F(LauncherOptions, PreloadGivenTwiceTakesBothAndAnEmptyPetPreloadIsNone) {
  using V = std::vector<std::string>;
  EXPECT_EQ(parse_with_script({"--preload", "json", "--preload=csv,re"}).preload, (V{"json", "csv", "re"}));
  EXPECT_EQ(parse_with_script({}, {{"PET_PRELOAD", ""}}).preload, V{});
  EXPECT_EQ(parse_with_script({}, {{"PET_PRELOAD", "json"}}).preload, V{"json"});
  EXPECT_EQ(parse_with_script({"--preload", "csv"}, {{"PET_PRELOAD", "json"}}).preload, V{"csv"});
  EXPECT_NE(usage_error_with_script({"--preload", ""}).find("--preload: '' is not a Python module name"), std::string::npos);
}

// torchrun has no environment fallback for --help or --version: a PET_HELP left in the
// environment must not turn a job into a help print.
TEST_F(LauncherOptions, PetHelpAndPetVersionAreNotRead) {
  for (const char* var : {"PET_HELP", "PET_VERSION"}) {
    Options o = parse_with_script({"--standalone"}, {{var, "1"}});
    EXPECT_FALSE(o.help) << var;
    EXPECT_FALSE(o.version) << var;
    EXPECT_EQ(o.script, script_) << var;
  }
}

// Numbers as torchrun reads them (Python's int() and float()): spaces around them (a value
// read from a file ends with a newline) and a leading '+'; '+-2' or a blank stays an error.
TEST_F(LauncherOptions, NumbersAsPythonReadsThem) {
  for (const char* v : {" 2", "2 ", "+2", "2\n", "\t+2 "})
    EXPECT_EQ(parse_with_script({}, {{"PET_NPROC_PER_NODE", v}}).nproc_per_node, 2) << "'" << v << "'";
  EXPECT_EQ(parse_with_script({"--max-restarts", " 3\n"}).max_restarts, 3);
  EXPECT_DOUBLE_EQ(parse_with_script({"--monitor-interval", "+0.5"}).monitor_interval, 0.5);
  for (const char* v : {"+-2", "++2", " ", "2 2"})
    EXPECT_NE(usage_error_with_script({}, {{"PET_NPROC_PER_NODE", v}}).find("PET_NPROC_PER_NODE"), std::string::npos)
        << "'" << v << "'";
}

TEST_F(LauncherOptions, BadPetValueNamesTheVariable) {
  std::string msg = usage_error_with_script({}, {{"PET_NPROC_PER_NODE", "abc"}});
  EXPECT_NE(msg.find("PET_NPROC_PER_NODE"), std::string::npos) << msg;
}

TEST_F(LauncherOptions, ShutdownTimeoutEnvironment) {
  EXPECT_DOUBLE_EQ(parse_with_script({}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "5"}}).shutdown_timeout, 5.0);
  EXPECT_DOUBLE_EQ(
      parse_with_script({"--shutdown-timeout", "7"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "5"}}).shutdown_timeout, 7.0);
  EXPECT_DOUBLE_EQ(parse_with_script({"--shutdown-timeout=0.5"}).shutdown_timeout, 0.5);
}

TEST_F(LauncherOptions, LogLinePrefixTemplateEnvironment) {
  Options o = parse_with_script({}, {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${rank}]"}});
  ASSERT_TRUE(o.log_line_prefix_template.has_value());
  EXPECT_EQ(*o.log_line_prefix_template, "[${rank}]");
  Options c = parse_with_script({"--log-line-prefix-template", ""},
                                {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${rank}]"}});
  ASSERT_TRUE(c.log_line_prefix_template.has_value());
  EXPECT_EQ(*c.log_line_prefix_template, "");
}

TEST_F(LauncherOptions, DisableShareRdzvTcpStoreEnvironment) {
  const Env off{{"TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"}};
  EXPECT_TRUE(parse_with_script({"--standalone"}).share_worker_store);
  EXPECT_FALSE(parse_with_script({"--standalone"}, off).share_worker_store);
  EXPECT_FALSE(
      parse_with_script({"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "--rdzv-id", "j"}, off)
          .share_worker_store);
  EXPECT_TRUE(parse_with_script({"--standalone"}, {{"TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0"}}).share_worker_store);
  // Static: node 0's store is shared whatever the variable says, as in torchrun; said once.
  Options st = parse_with_script({"--nnodes", "2", "--node-rank", "1", "--master-addr", "h"}, off);
  EXPECT_TRUE(st.share_worker_store);
  auto ignored = [](const std::string& s) { return s.starts_with("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 ignored"); };
  EXPECT_EQ(std::count_if(st.infos.begin(), st.infos.end(), ignored), 1);
}

// ------------------------------------------------------------------ script and its args

TEST_F(LauncherOptions, EverythingAfterScriptGoesToScript) {
  Options o = parse_with_script({"--nproc-per-node", "2"}, {}, {"--nproc-per-node", "9", "-m", "--", "--bogus"});
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_FALSE(o.module);
  EXPECT_EQ(o.script, script_);
  EXPECT_EQ(o.script_args, (Args{"--nproc-per-node", "9", "-m", "--", "--bogus"}));
}

TEST_F(LauncherOptions, DoubleDashSeparator) {
  Options o = parse({"--nproc-per-node", "2", "--", script_, "--lr", "0.1"});
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.script, script_);
  EXPECT_EQ(o.script_args, (Args{"--lr", "0.1"}));
}

// What Python's argparse gives torchrun's script (3.11 and 3.13 alike): the command line's
// first "--" is dropped right after the script too, and only the first.
TEST_F(LauncherOptions, DoubleDashAfterTheScriptAsArgparse) {
  EXPECT_EQ(parse({script_, "--", "x"}).script_args, (Args{"x"}));
  EXPECT_EQ(parse({script_, "x", "--", "y"}).script_args, (Args{"x", "--", "y"}));
  EXPECT_EQ(parse({"--", script_, "--", "y"}).script_args, (Args{"--", "y"}));
  EXPECT_EQ(parse({script_, "--", "--", "y"}).script_args, (Args{"--", "y"}));
  EXPECT_EQ(parse({"--nproc-per-node", "2", script_, "--", "--lr", "1"}).script_args, (Args{"--lr", "1"}));
  EXPECT_EQ(parse({script_, "--nproc-per-node", "3", "--", "x"}).script_args,
            (Args{"--nproc-per-node", "3", "--", "x"}));
}

// What runs as it is and what runs under $PYTHON_EXEC -u: torchrun runs every script with
// Python; ddprun also runs binaries and other languages' #! scripts directly.
TEST_F(LauncherOptions, WhatRunsDirectly) {
  auto direct = [&](const std::string& name, const std::string& text, mode_t mode = 0755) {
    return ddprun::runs_directly(parse({dir_.write(name, text, mode)}));
  };
  EXPECT_TRUE(direct("bin", std::string("\x7f" "ELF\x02\x01", 6)));
  EXPECT_TRUE(direct("run.sh", "#!/bin/sh\necho hi\n"));
  EXPECT_TRUE(direct("run_bash", "#! /usr/bin/env bash\necho hi\n"));
  EXPECT_FALSE(direct("train_sb", "#!/usr/bin/env python3\nprint(1)\n"));  // the same Python as every rank
  EXPECT_FALSE(direct("train_py3", "#!/usr/bin/python3.11 -u\nprint(1)\n"));
  EXPECT_FALSE(direct("train_noext", "print(1)\n"));  // no #!: Python's (was: Exec format error)
  EXPECT_FALSE(direct("run2.sh", "#!/bin/sh\n", 0644));  // not executable
  EXPECT_FALSE(direct("x.py", "#!/bin/sh\n"));
  if (::geteuid() != 0) {
    EXPECT_TRUE(direct("xonly", "#!/usr/bin/env python3\n", 0111));  // unreadable: only exec runs it
  }
  EXPECT_TRUE(ddprun::runs_directly(parse({"--no-python", "sh", "-c", "true"}, {{"PATH", "/usr/bin:/bin"}})));
}

// --virtual-local-rank with fewer CUDA_VISIBLE_DEVICES entries than workers would hand a
// worker a device the user excluded ("4" and 2 workers gave rank 1 device 1; "" gave 0, 1).
TEST_F(LauncherOptions, VirtualLocalRankNeedsADeviceForEveryWorker) {
  for (const char* visible : {"4", "", "-1", "4,"}) {
    SCOPED_TRACE(visible);
    const std::string err = usage_error_with_script({"--virtual-local-rank", "--nproc-per-node", "2"},
                                                    {{"CUDA_VISIBLE_DEVICES", visible}});
    EXPECT_NE(err.find("each worker needs one of its own"), std::string::npos) << err;
  }
  EXPECT_TRUE(parse_with_script({"--virtual-local-rank", "--nproc-per-node", "2"}, {{"CUDA_VISIBLE_DEVICES", "4, 5"}})
                  .virtual_local_rank);
  EXPECT_TRUE(parse_with_script({"--virtual-local-rank", "--nproc-per-node", "2"}).virtual_local_rank);  // unset: all
}

TEST_F(LauncherOptions, NoPythonResolvesFromPath) {
  Options o = parse({"--no-python", "sh", "-c", "true"}, {{"PATH", "/usr/bin:/bin"}});
  EXPECT_TRUE(o.no_python);
  EXPECT_EQ(o.script, "sh");
  EXPECT_EQ(o.script_args, (Args{"-c", "true"}));
}

TEST_F(LauncherOptions, SignalsToHandle) {
  Options o = parse_with_script({"--signals-to-handle", "SIGTERM,USR1,15,sigint"});
  EXPECT_EQ(o.signals_to_handle, (std::vector<int>{SIGTERM, SIGUSR1, SIGTERM, SIGINT}));
  EXPECT_EQ(o.forwarded(SIGINT), SIGINT);
  // SIGINT stops the job also when it is not listed: the workers get SIGTERM, as torchrun's
  // KeyboardInterrupt stops them.
  Options t = parse_with_script({"--signals-to-handle", "SIGTERM"});
  EXPECT_EQ(t.stop_signals(), (std::vector<int>{SIGTERM, SIGINT}));
  EXPECT_EQ(t.forwarded(SIGINT), SIGTERM);
  EXPECT_EQ(t.forwarded(SIGTERM), SIGTERM);
  EXPECT_EQ(ddprun::parse_signal("--x", "SIGHUP"), SIGHUP);
  EXPECT_EQ(ddprun::parse_signal("--x", "quit"), SIGQUIT);
  EXPECT_EQ(ddprun::signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(ddprun::signal_name(SIGKILL), "SIGKILL");
}

TEST_F(LauncherOptions, NnodesForms) {
  Options a = parse_with_script({"--nnodes", "1"});
  EXPECT_EQ(a.min_nodes, 1);
  EXPECT_EQ(a.max_nodes, 1);
  Options b = parse_with_script({"--nnodes", "1:1"});
  EXPECT_EQ(b.min_nodes, 1);
  EXPECT_EQ(b.max_nodes, 1);
}

TEST_F(LauncherOptions, RdzvEndpointGivesStaticMasterAddress) {
  Options a = parse_with_script({"--rdzv-endpoint", "node0:1234"});
  EXPECT_EQ(a.master_addr, "node0");
  EXPECT_EQ(a.master_port, 1234);
  Options b = parse_with_script({"--rdzv-endpoint=[::1]:2345"});
  EXPECT_EQ(b.master_addr, "::1");
  EXPECT_EQ(b.master_port, 2345);
  Options c = parse_with_script({"--rdzv-endpoint", "node1"});
  EXPECT_EQ(c.master_addr, "node1");
  EXPECT_EQ(c.master_port, 29500);
  std::string msg = usage_error_with_script({"--rdzv-endpoint", "node0:99999"});
  EXPECT_NE(msg.find("--rdzv-endpoint"), std::string::npos) << msg;
  std::string msg2 = usage_error_with_script({"--rdzv-endpoint", ":80"});
  EXPECT_NE(msg2.find("--rdzv-endpoint"), std::string::npos) << msg2;
}

TEST_F(LauncherOptions, C10dEndpointForms) {
  Options a = parse_with_script({"--rdzv-backend", "c10d", "--rdzv-endpoint", "head:1234", "--nnodes", "2"});
  EXPECT_TRUE(a.dynamic());
  EXPECT_EQ(a.rdzv_host, "head");
  EXPECT_EQ(a.rdzv_port, 1234);
  Options b = parse_with_script({"--rdzv_backend=c10d", "--rdzv_endpoint=head", "--nnodes=1:4"});
  EXPECT_EQ(b.rdzv_port, 29400);  // torchrun's default for c10d
  EXPECT_EQ(b.min_nodes, 1);
  EXPECT_EQ(b.max_nodes, 4);
  Options c = parse_with_script({"--rdzv-backend=c10d", "--rdzv-endpoint=[fe80::1]:5"});
  EXPECT_EQ(c.rdzv_host, "fe80::1");
  EXPECT_EQ(c.rdzv_port, 5);
  Options d = parse_with_script({"--rdzv-backend=c10d", "--rdzv-endpoint=[::1]"});
  EXPECT_EQ(d.rdzv_host, "::1");
  EXPECT_EQ(d.rdzv_port, 29400);
  Options e = parse_with_script({"--rdzv-backend=c10d"});  // one node: its own store, a free port
  EXPECT_EQ(e.rdzv_host, "localhost");
  EXPECT_EQ(e.rdzv_port, 0);
  Options f = parse_with_script({}, {{"PET_RDZV_BACKEND", "c10d"}, {"PET_RDZV_ENDPOINT", "10.0.0.1:29401"},
                                     {"PET_NNODES", "2:3"}, {"PET_RDZV_ID", "job7"}});
  EXPECT_EQ(f.rdzv_host, "10.0.0.1");
  EXPECT_EQ(f.rdzv_port, 29401);
  EXPECT_EQ(f.max_nodes, 3);
  EXPECT_EQ(f.rdzv_id, "job7");
}

// torchrun 2.x's --standalone spelled out: c10d at localhost:0, one node that hosts a store
// on a port the system picks. Port 0 with more nodes, or a node told not to host, is refused.
TEST_F(LauncherOptions, C10dEndpointPortZeroIsOneNodeHostingAtAFreePort) {
  Options a = parse_with_script({"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "--nnodes=1"});
  EXPECT_EQ(a.rdzv_host, "localhost");
  EXPECT_EQ(a.rdzv_port, 0);
  Options b = parse_with_script({"--rdzv-backend=c10d", "--rdzv-endpoint=[::1]:0"});
  EXPECT_EQ(b.rdzv_host, "::1");
  EXPECT_EQ(b.rdzv_port, 0);
  for (auto nnodes : {"2", "1:2"}) {
    std::string msg = usage_error_with_script({"--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--nnodes",
                                               nnodes});
    EXPECT_NE(msg.find("port 0 picks a free port that other nodes cannot know; with --nnodes " + std::string(nnodes) +
                       " give a port 1..65535, got 'localhost:0'"),
              std::string::npos)
        << msg;
  }
  std::string msg = usage_error_with_script(
      {"--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-conf", "is_host=0"});
  EXPECT_NE(msg.find("is_host=0 says it does not host it"), std::string::npos) << msg;
  // The same without an endpoint: one node, its own store at a free port.
  msg = usage_error_with_script({"--rdzv-backend", "c10d", "--rdzv-conf", "is_host=0"});
  EXPECT_NE(msg.find("--rdzv-backend c10d without --rdzv-endpoint (one node): port 0 picks a free port for the "
                     "store this node hosts, but --rdzv-conf is_host=0 says it does not host it"),
            std::string::npos)
      << msg;
  msg = usage_error_with_script({"--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:65536"});
  EXPECT_NE(msg.find("the port is not a number 0..65535"), std::string::npos) << msg;
  // Static rendezvous: the endpoint is the master address, whose port other nodes use.
  msg = usage_error_with_script({"--rdzv-endpoint", "node0:0"});
  EXPECT_NE(msg.find("the port is not a number 1..65535"), std::string::npos) << msg;
}

TEST_F(LauncherOptions, RdzvConfTypedWithTorchrunDefaults) {
  Options d = parse_with_script({});
  EXPECT_EQ(d.rdzv_conf.join_timeout, 600);
  EXPECT_EQ(d.rdzv_conf.last_call_timeout, 30);
  EXPECT_EQ(d.rdzv_conf.close_timeout, 30);
  EXPECT_EQ(d.rdzv_conf.read_timeout, 60);
  EXPECT_EQ(d.rdzv_conf.keep_alive_interval, 5);
  EXPECT_EQ(d.rdzv_conf.keep_alive_max_attempt, 3);
  EXPECT_FALSE(d.rdzv_conf.is_host.has_value());
  Options o = parse_with_script(
      {"--rdzv-conf", " join_timeout = 20 ,last_call_timeout=0.5,is_host=yes,keep_alive_interval=1,"
                      "keep_alive_max_attempt=2,read_timeout=7,close_timeout=3,timeout=900"});
  EXPECT_EQ(o.rdzv_conf.join_timeout, 20);
  EXPECT_EQ(o.rdzv_conf.last_call_timeout, 0.5);
  EXPECT_EQ(o.rdzv_conf.is_host, true);
  EXPECT_EQ(o.rdzv_conf.keep_alive_interval, 1);
  EXPECT_EQ(o.rdzv_conf.keep_alive_max_attempt, 2);
  EXPECT_EQ(o.rdzv_conf.read_timeout, 7);
  EXPECT_EQ(o.rdzv_conf.close_timeout, 3);
  EXPECT_TRUE(o.warnings.empty()) << o.warnings.front();  // 'timeout' is torchrun's own injected key
  EXPECT_EQ(parse_with_script({"--rdzv-conf", "is_host=f"}).rdzv_conf.is_host, false);
}

// ddprun's own key: a loss below MIN waits this long for newcomers; it needs restarts to wait
// for, and says so when there are none.
TEST_F(LauncherOptions, ReplaceTimeoutIsKnownAndWarnsWithoutRestarts) {
  EXPECT_EQ(parse_with_script({}).rdzv_conf.replace_timeout, 0);
  const std::vector<std::string> c10d{"--rdzv-backend=c10d", "--rdzv-endpoint=h", "--nnodes=2", "--rdzv-id=j"};
  auto with = [&](std::vector<std::string> extra) {
    auto args = c10d;
    args.insert(args.end(), extra.begin(), extra.end());
    return parse_with_script(args);
  };
  Options o = with({"--rdzv-conf", "replace_timeout=90", "--max-restarts", "3"});
  EXPECT_EQ(o.rdzv_conf.replace_timeout, 90);
  EXPECT_TRUE(o.warnings.empty()) << o.warnings.front();
  Options n = with({"--rdzv-conf", "replace_timeout=90"});
  ASSERT_EQ(n.warnings.size(), 1u);
  EXPECT_NE(n.warnings[0].find("replace_timeout=90 waits for nodes to replace lost ones only while restarts remain, "
                               "and --max-restarts is 0"),
            std::string::npos)
      << n.warnings[0];
  const std::string msg = usage_error_with_script({"--rdzv-conf", "replace_timeout=-1"});
  EXPECT_NE(msg.find("replace_timeout expects a non-negative number of seconds"), std::string::npos) << msg;
}

TEST_F(LauncherOptions, UnknownRdzvConfKeyWarnsAndIsKept) {
  Options o = parse_with_script({"--rdzv-conf", "bogus_key=1,join_timeout=5"});
  ASSERT_EQ(o.warnings.size(), 1u);
  EXPECT_NE(o.warnings[0].find("bogus_key"), std::string::npos) << o.warnings[0];
  EXPECT_EQ(o.rdzv_conf.raw.at("bogus_key"), "1");
  // etcd's client keys belong to etcd only.
  Options c = parse_with_script({"--rdzv-backend=c10d", "--rdzv-conf", "cacert=/x.pem"});
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("cacert"), std::string::npos);
}

TEST_F(LauncherOptions, C10dIgnoresNodeRankAndMasterWithOneWarningEach) {
  Options o = parse_with_script({"--rdzv-backend=c10d", "--rdzv-endpoint=h", "--nnodes=2", "--rdzv-id=j",
                                 "--node-rank=1", "--master-addr=x", "--master-port=1"});
  ASSERT_EQ(o.warnings.size(), 3u);
  EXPECT_NE(o.warnings[0].find("--node-rank is ignored"), std::string::npos) << o.warnings[0];
  EXPECT_NE(o.warnings[1].find("--master-addr"), std::string::npos) << o.warnings[1];
  EXPECT_NE(o.warnings[2].find("--master-port"), std::string::npos) << o.warnings[2];
  // A multi-node job without a run id would merge with another job on the same endpoint.
  Options n = parse_with_script({"--rdzv-backend=c10d", "--rdzv-endpoint=h", "--nnodes=2"});
  ASSERT_EQ(n.warnings.size(), 1u);
  EXPECT_NE(n.warnings[0].find("--rdzv-id"), std::string::npos);
}

TEST_F(LauncherOptions, StandaloneNamesTheRendezvousFlagsItIgnores) {
  Options o = parse_with_script({"--standalone", "--rdzv-backend=etcd", "--rdzv-endpoint", "head:29400",
                                 "--master-port=1234"});
  ASSERT_EQ(o.warnings.size(), 1u);
  EXPECT_NE(o.warnings[0].find("--standalone ignores --rdzv-backend, --rdzv-endpoint, --master-port"),
            std::string::npos)
      << o.warnings[0];
  EXPECT_EQ(o.rdzv_backend, "static");
  // A scheduler's PET_* variables are not named, as for the other backends.
  EXPECT_TRUE(parse_with_script({"--standalone"}, {{"PET_RDZV_ENDPOINT", "head:29400"}}).warnings.empty());
  EXPECT_TRUE(parse_with_script({"--standalone"}).warnings.empty());
}

TEST_F(LauncherOptions, EtcdEndpointsAndConf) {
  for (const char* backend : {"etcd", "etcd-v2"}) {  // both names: etcd's v3 API
    Options a = parse_with_script({"--rdzv-backend", backend, "--rdzv-endpoint", "e1:2379,e2,[::1]:3000", "--nnodes",
                                   "2:3", "--rdzv-id", "j"});
    EXPECT_TRUE(a.dynamic());
    EXPECT_EQ(a.rdzv_backend, backend);
    EXPECT_EQ(a.rdzv_endpoint, "e1:2379,e2,[::1]:3000");
    EXPECT_EQ(a.rdzv_host, "e1");  // the first member: this node's outgoing address is towards it
    EXPECT_EQ(a.rdzv_port, 2379);
    EXPECT_TRUE(a.warnings.empty()) << a.warnings.front();
  }
  Options b = parse_with_script({"--rdzv-backend=etcd", "--rdzv-endpoint=h", "--rdzv-id=j", "--nnodes=2"});
  EXPECT_EQ(b.rdzv_port, 2379);  // etcd's port when left out
  // torchrun's etcd keys: no warning; https with its files; "timeout" is the join timeout.
  Options c = parse_with_script({"--rdzv-backend=etcd", "--rdzv-endpoint=https://h:2379", "--rdzv-id=j",
                                 "--rdzv-conf", "protocol=https,cacert=/ca.pem,cert=/c.pem,key=/k.pem,timeout=45,"
                                                "last_call_timeout=2,keep_alive_interval=1"});
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
  EXPECT_EQ(c.rdzv_conf.raw.at("cacert"), "/ca.pem");
  EXPECT_EQ(c.rdzv_conf.raw.at("key"), "/k.pem");
  EXPECT_EQ(c.rdzv_conf.join_timeout, 45);
  EXPECT_EQ(c.rdzv_conf.last_call_timeout, 2);
  EXPECT_EQ(c.rdzv_conf.keep_alive_interval, 1);
  // join_timeout, when given, wins over timeout.
  Options d = parse_with_script({"--rdzv-backend=etcd", "--rdzv-endpoint=h", "--rdzv-id=j", "--rdzv-conf",
                                 "timeout=45,join_timeout=50"});
  EXPECT_EQ(d.rdzv_conf.join_timeout, 50);
  // is_host means nothing with etcd: one warning.
  Options e = parse_with_script({"--rdzv-backend=etcd", "--rdzv-endpoint=h", "--rdzv-id=j", "--rdzv-conf=is_host=1"});
  ASSERT_EQ(e.warnings.size(), 1u);
  EXPECT_NE(e.warnings[0].find("is_host is ignored"), std::string::npos) << e.warnings[0];
  // A keep-alive window shorter than a leader election: one warning.
  Options g = parse_with_script({"--rdzv-backend=etcd", "--rdzv-endpoint=h", "--rdzv-id=j", "--rdzv-conf",
                                 "keep_alive_interval=0.5,keep_alive_max_attempt=3"});
  ASSERT_EQ(g.warnings.size(), 1u);
  EXPECT_NE(g.warnings[0].find("leader election"), std::string::npos) << g.warnings[0];
  // PET_* spellings.
  Options f = parse_with_script({}, {{"PET_RDZV_BACKEND", "etcd-v2"}, {"PET_RDZV_ENDPOINT", "10.0.0.1:2379,10.0.0.2"},
                                     {"PET_NNODES", "1:2"}, {"PET_RDZV_ID", "job8"}});
  EXPECT_EQ(f.rdzv_backend, "etcd-v2");
  EXPECT_EQ(f.rdzv_host, "10.0.0.1");
}

TEST_F(LauncherOptions, StandaloneStaysStaticWithC10dBackend) {
  Options o = parse_with_script({"--standalone", "--rdzv-backend", "c10d"});
  EXPECT_TRUE(o.standalone);
  EXPECT_FALSE(o.dynamic());
  EXPECT_TRUE(o.warnings.empty()) << o.warnings.front();  // what torchrun's --standalone is
}

// torchrun takes --standalone --nnodes 1:N (a templated line), waits out its last call for
// nodes that cannot come and runs one: one node here at once, and a warning that says so.
TEST_F(LauncherOptions, StandaloneTakesARangeFromOneAsOneNode) {
  Options o = parse_with_script({"--standalone", "--nnodes", "1:4"});
  EXPECT_EQ(o.min_nodes, 1);
  EXPECT_EQ(o.max_nodes, 1);
  EXPECT_FALSE(o.dynamic());
  ASSERT_EQ(o.warnings.size(), 1u);
  EXPECT_EQ(o.warnings[0], "--standalone runs one node: --nnodes 1:4 is taken as 1 (no other node can join it)");
  EXPECT_THROW(parse_with_script({"--standalone", "--nnodes", "2:4"}), ddp::UsageError);  // at least 2: never
}

TEST_F(LauncherOptions, LocalRanksFilter) {
  Options o = parse_with_script({"--local-ranks-filter", "0,2"});
  ASSERT_TRUE(o.local_ranks_filter.has_value());
  EXPECT_EQ(*o.local_ranks_filter, (std::set<int>{0, 2}));
}

TEST_F(LauncherOptions, LocalRanksFilterOfRanksThisNodeLacksIsSaid) {
  EXPECT_TRUE(parse_with_script({"--nproc-per-node", "2", "--local-ranks-filter", "0,1"}).warnings.empty());
  Options none = parse_with_script({"--nproc-per-node", "2", "--local-ranks-filter", "7"});
  ASSERT_EQ(none.warnings.size(), 1u);
  EXPECT_EQ(none.warnings[0], "--local-ranks-filter: this node has 2 workers (local ranks 0..1), no local rank 7: "
                              "no worker's output reaches the console");
  Options some = parse_with_script({"--local-ranks-filter", "0,3,5"});
  ASSERT_EQ(some.warnings.size(), 1u);
  EXPECT_EQ(some.warnings[0], "--local-ranks-filter: this node has 1 worker (local rank 0), no local ranks 3,5: "
                              "the console shows local rank 0 only");
}

TEST_F(LauncherOptions, NprocCpu) {
  EXPECT_GE(parse_with_script({"--nproc-per-node", "cpu"}).nproc_per_node, 1);
}

// cpu/auto without GPUs: one worker per CPU this process may run on (a Slurm step's CPUs,
// taskset, a cpuset), not the machine's; said when fewer.
TEST_F(LauncherOptions, NprocCpuCountsTheCpusThisProcessMayUse) {
  cpu_set_t was;
  ASSERT_EQ(sched_getaffinity(0, sizeof was, &was), 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &was)) {
      CPU_SET(c, &one);
      break;
    }
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  Options o = parse_with_script({"--nproc-per-node", "cpu"});  // (auto: the same where no GPU is visible)
  ASSERT_EQ(sched_setaffinity(0, sizeof was, &was), 0);
  EXPECT_EQ(o.nproc_per_node, 1);
  if (sysconf(_SC_NPROCESSORS_ONLN) > 1) {
    ASSERT_EQ(o.infos.size(), 1u);
    EXPECT_EQ(o.infos[0], fmt::format("--nproc-per-node: 1 worker, one per CPU this process may run on (its "
                                      "affinity; the machine has {})",
                                      sysconf(_SC_NPROCESSORS_ONLN)));
  }
}

TEST_F(LauncherOptions, Help) {
  Options o = parse({"--help"});
  EXPECT_TRUE(o.help);
  EXPECT_NE(o.help_text.find("--nproc-per-node"), std::string::npos);
  EXPECT_TRUE(parse({"-h"}).help);
}

TEST_F(LauncherOptions, RdzvIdUpTo200Bytes) {
  const Args c10d{"--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id"};
  Args ok = c10d, long_id = c10d;
  ok.push_back(std::string(200, 'a'));
  EXPECT_EQ(parse_with_script(ok).rdzv_id, std::string(200, 'a'));
  long_id.push_back(std::string(250, 'a'));
  EXPECT_EQ(usage_error_with_script(long_id),
            fmt::format("--rdzv-id: '{}...' is 250 bytes long, at most 200", std::string(20, 'a')));
  EXPECT_EQ(usage_error_with_script({"--standalone"}, {{"PET_RDZV_ID", std::string(10000, 'b')}}),
            fmt::format("PET_RDZV_ID: '{}...' is 10000 bytes long, at most 200", std::string(20, 'b')));
  // An id with '/' stays as given: only the run's folder name is made safe (tmpdirs).
  Args slash = c10d;
  slash.push_back("../../esc");
  EXPECT_EQ(parse_with_script(slash).rdzv_id, "../../esc");
}

// --master-addr and --local-addr get --rdzv-endpoint's host check; an IPv6 address loses its
// brackets (MASTER_ADDR goes to torch as it is).
TEST_F(LauncherOptions, MasterAndLocalAddrAreHosts) {
  EXPECT_EQ(parse_with_script({"--master-addr", "node-0.example"}).master_addr, "node-0.example");
  EXPECT_EQ(parse_with_script({"--master-addr", "[::1]"}).master_addr, "::1");
  EXPECT_EQ(parse_with_script({"--master-addr", "fe80::1"}).master_addr, "fe80::1");
  EXPECT_EQ(parse_with_script({"--local-addr", "[fe80::2]"}).local_addr, "fe80::2");
  for (const char* bad : {"a b", "x\ny", " ", "", "localhost:29500", "-h", "[::1", "a/b"}) {
    std::string msg = usage_error_with_script({"--master-addr", bad});
    EXPECT_TRUE(msg.starts_with("--master-addr: ")) << msg;
    EXPECT_NE(msg.find(fmt::format("got '{}'", bad)), std::string::npos) << msg;
    EXPECT_TRUE(usage_error_with_script({"--local-addr", bad}).starts_with("--local-addr: ")) << bad;
  }
  EXPECT_TRUE(usage_error_with_script({}, {{"PET_MASTER_ADDR", " "}}).starts_with("PET_MASTER_ADDR: "));
}

// --summary-json is checked before anything runs: its missing folders are made (as
// --log-dir's are), and a place it cannot be written is a usage error.
TEST_F(LauncherOptions, SummaryJsonPlaceCheckedBeforeTheJob) {
  const std::string nested = dir_.file("a/b/s.json");
  EXPECT_EQ(parse_with_script({"--summary-json", nested}).summary_json, nested);
  EXPECT_TRUE(std::filesystem::is_directory(dir_.file("a/b")));
  EXPECT_EQ(usage_error_with_script({"--summary-json", dir_.path()}),
            fmt::format("--summary-json: '{}' is a directory", dir_.path()));
  EXPECT_EQ(usage_error_with_script({"--summary-json", dir_.path() + "/new/"}),
            fmt::format("--summary-json: '{}/new/' names a folder, not a file", dir_.path()));
  std::string msg = usage_error_with_script({"--summary-json", script_ + "/s.json"});
  EXPECT_TRUE(msg.starts_with(fmt::format("--summary-json: cannot create the folder '{}'", script_))) << msg;
  msg = usage_error_with_script({}, {{"PET_SUMMARY_JSON", "/proc/ddprun-test/s.json"}});
  EXPECT_TRUE(msg.starts_with("PET_SUMMARY_JSON: ")) << msg;
  // One file per node in a shared folder: {host} is this host's name (each time it appears).
  char host[256] = {0};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  EXPECT_EQ(parse_with_script({"--summary-json", dir_.file("{host}/s_{host}.json")}).summary_json,
            dir_.file(fmt::format("{}/s_{}.json", host, host)));
  EXPECT_TRUE(std::filesystem::is_directory(dir_.file(host)));
}

// --log-dir is made and checked before this node joins: a place it cannot be is a usage
// error (exit 2), as --summary-json's; the run's own folder is made later, inside it.
TEST_F(LauncherOptions, LogDirCheckedBeforeTheJob) {
  const std::string nested = dir_.file("logs/a/b");
  EXPECT_EQ(parse_with_script({"--log-dir", nested}).log_dir, nested);
  EXPECT_TRUE(std::filesystem::is_directory(nested));
  EXPECT_TRUE(std::filesystem::is_empty(nested));
  std::string msg = usage_error_with_script({"--log-dir", script_ + "/logs"});
  EXPECT_TRUE(msg.starts_with(fmt::format("--log-dir: cannot create the folder '{}/logs': ", script_))) << msg;
  msg = usage_error_with_script({"--log-dir", script_});
  EXPECT_TRUE(msg.starts_with("--log-dir: ")) << msg;
  msg = usage_error_with_script({"--log-dir", "/proc/self/ddprun-logs"});
  EXPECT_TRUE(msg.starts_with("--log-dir: cannot create the folder '/proc/self/ddprun-logs': ")) << msg;
  msg = usage_error_with_script({}, {{"PET_LOG_DIR", "/proc/ddprun-test/logs"}});
  EXPECT_TRUE(msg.starts_with("PET_LOG_DIR: ")) << msg;
}

// ------------------------------------------------------------------ bad input

struct BadCase {
  const char* name;
  Args args;           // the script is appended unless no_script
  const char* expect;  // a substring the message must contain (the flag)
  bool no_script = false;
};

class LauncherOptionsBad : public LauncherOptions, public ::testing::WithParamInterface<BadCase> {};

TEST_P(LauncherOptionsBad, ThrowsUsageErrorNamingTheFlag) {
  const BadCase& c = GetParam();
  std::string msg = c.no_script ? usage_error(c.args) : usage_error_with_script(c.args);
  EXPECT_NE(msg.find(c.expect), std::string::npos) << "message: '" << msg << "' lacks '" << c.expect << "'";
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line expected: " << msg;
}

INSTANTIATE_TEST_SUITE_P(
    All, LauncherOptionsBad,
    ::testing::Values(
        BadCase{"UnknownFlag", {"--bogus-flag", "1"}, "--bogus-flag"},
        BadCase{"UnknownShortFlag", {"-x"}, "-x"},
        BadCase{"NprocZero", {"--nproc-per-node", "0"}, "--nproc-per-node"},
        BadCase{"NprocAbc", {"--nproc-per-node", "abc"}, "--nproc-per-node"},
        BadCase{"NprocNegative", {"--nproc-per-node=-2"}, "--nproc-per-node"},
        BadCase{"EndpointLabelTooLong", {"--rdzv-endpoint", std::string(64, 'a') + ".example:29400"},
                "a label of a host name is at most 63 characters, one has 64"},
        BadCase{"MasterAddrTooLong", {"--master-addr", std::string(50, 'b') + "." + std::string(50, 'b') + "." +
                                                           std::string(50, 'b') + "." + std::string(50, 'b') + "." +
                                                           std::string(60, 'b')},
                "--master-addr: a host name is at most 253 characters, this one has 264"},
        BadCase{"NnodesReversed", {"--nnodes", "3:1"}, "--nnodes"},
        BadCase{"NnodesZero", {"--nnodes", "0"}, "--nnodes"},
        BadCase{"MasterPortTooBig", {"--master-port", "70000"}, "--master-port"},
        BadCase{"MasterPortNotNumber", {"--master-port", "http"}, "--master-port"},
        BadCase{"MaxRestartsNegative", {"--max-restarts", "-1"}, "--max-restarts"},
        BadCase{"ShutdownTimeoutNegative", {"--shutdown-timeout", "-3"}, "--shutdown-timeout"},
        BadCase{"MissingValue", {"--role"}, "--role", true},
        BadCase{"MissingScript", {"--nproc-per-node", "2"}, "training_script", true},
        BadCase{"NonexistentScript", {"/nonexistent/dir/train.py"}, "/nonexistent/dir/train.py", true},
        BadCase{"NoPythonWithModule", {"--no-python", "-m"}, "--no-python"},
        BadCase{"ModuleWithNoPython", {"-m", "--no-python"}, "--module"},
        BadCase{"StandaloneWithNnodes", {"--standalone", "--nnodes", "2"}, "--nnodes"},
        BadCase{"EtcdWithoutEndpoint", {"--rdzv-backend", "etcd"}, "--rdzv-endpoint"},
        BadCase{"EtcdV2WithoutEndpoint", {"--rdzv-backend", "etcd-v2", "--nnodes", "2"}, "--rdzv-endpoint"},
        BadCase{"EtcdEmptyEntry", {"--rdzv-backend=etcd", "--rdzv-endpoint", "a:2379,,b"}, "--rdzv-endpoint"},
        BadCase{"EtcdPortTooBig", {"--rdzv-backend=etcd", "--rdzv-endpoint", "a:2379,b:70000"}, "--rdzv-endpoint"},
        BadCase{"EtcdPortZero", {"--rdzv-backend=etcd", "--rdzv-endpoint", "a:0"}, "--rdzv-endpoint"},
        BadCase{"EtcdBareIpv6", {"--rdzv-backend=etcd", "--rdzv-endpoint", "fe80::1"}, "--rdzv-endpoint"},
        BadCase{"EtcdSchemeMismatch", {"--rdzv-backend=etcd", "--rdzv-endpoint", "https://a:2379"}, "--rdzv-endpoint"},
        BadCase{"EtcdProtocolFtp", {"--rdzv-backend=etcd", "--rdzv-endpoint=a", "--rdzv-conf=protocol=ftp"}, "protocol"},
        BadCase{"EtcdCacertWithoutHttps",
                {"--rdzv-backend=etcd", "--rdzv-endpoint=a", "--rdzv-conf=cacert=/ca.pem"}, "protocol=https"},
        BadCase{"EtcdKeyWithoutCert",
                {"--rdzv-backend=etcd", "--rdzv-endpoint=a", "--rdzv-conf=protocol=https,key=/k.pem"}, "cert"},
        BadCase{"EtcdTimeoutNotSeconds",
                {"--rdzv-backend=etcd", "--rdzv-endpoint=a", "--rdzv-conf=timeout=soon"}, "timeout"},
        BadCase{"EtcdJoinBelowLastCall",
                {"--rdzv-backend=etcd", "--rdzv-endpoint=a", "--nnodes=1:2", "--rdzv-conf=timeout=3"}, "join_timeout"},
        BadCase{"RdzvC10dMultiNodeWithoutEndpoint", {"--rdzv-backend", "c10d", "--nnodes", "2"}, "--rdzv-endpoint"},
        BadCase{"ElasticRangeNeedsC10d", {"--nnodes", "1:3"}, "--rdzv-backend c10d"},
        BadCase{"C10dEndpointPortTooBig", {"--rdzv-backend=c10d", "--rdzv-endpoint", "h:65536"}, "--rdzv-endpoint"},
        BadCase{"C10dEndpointPortZeroManyNodes", {"--rdzv-backend=c10d", "--rdzv-endpoint", "h:0", "--nnodes", "2"},
                "--rdzv-endpoint"},
        BadCase{"C10dEndpointEmptyPort", {"--rdzv-backend=c10d", "--rdzv-endpoint", "h:"}, "--rdzv-endpoint"},
        BadCase{"C10dEndpointNoHost", {"--rdzv-backend=c10d", "--rdzv-endpoint", ":29400"}, "--rdzv-endpoint"},
        BadCase{"C10dEndpointBareIpv6", {"--rdzv-backend=c10d", "--rdzv-endpoint", "fe80::1"}, "brackets"},
        BadCase{"C10dEndpointUnclosedIpv6", {"--rdzv-backend=c10d", "--rdzv-endpoint", "[::1:29400"}, "']'"},
        BadCase{"C10dEndpointBadChars", {"--rdzv-backend=c10d", "--rdzv-endpoint", "a b:1"}, "--rdzv-endpoint"},
        BadCase{"C10dEmptyRunId", {"--rdzv-backend=c10d", "--rdzv-endpoint", "h:1", "--nnodes", "2", "--rdzv-id", ""},
                "--rdzv-id is empty: the nodes of a job meet by their run id"},
        BadCase{"C10dEndpointUrl", {"--rdzv-backend=c10d", "--rdzv-endpoint", "http://head:29400"},
                "a URL (no scheme goes before the host)"},
        BadCase{"C10dEndpointList", {"--rdzv-backend=c10d", "--rdzv-endpoint", "h1:29400,h2:29400"},
                "a list (one endpoint here: a list of members is etcd's)"},
        BadCase{"RdzvConfNoValue", {"--rdzv-conf", "join_timeout"}, "--rdzv-conf"},
        BadCase{"RdzvConfEmptyKey", {"--rdzv-conf", "=3"}, "--rdzv-conf"},
        BadCase{"RdzvConfEmptyValue", {"--rdzv-conf", "join_timeout="}, "--rdzv-conf"},
        BadCase{"RdzvConfNotSeconds", {"--rdzv-conf", "join_timeout=soon"}, "join_timeout"},
        BadCase{"RdzvConfNegative", {"--rdzv-conf", "last_call_timeout=-1"}, "last_call_timeout"},
        BadCase{"RdzvConfTooLong", {"--rdzv-conf", "keep_alive_interval=99999999999"}, "up to 10000000 s (115 days)"},
        BadCase{"RdzvConfMaxAttemptZero", {"--rdzv-conf", "keep_alive_max_attempt=0"}, "keep_alive_max_attempt"},
        BadCase{"RdzvConfIntervalTooShort", {"--rdzv-conf", "keep_alive_interval=0.001"},
                "keep_alive_interval expects at least 0.1 s"},
        BadCase{"RdzvConfReadTimeoutTooShort", {"--rdzv-conf", "read_timeout=1e-9"}, "read_timeout expects at least 0.1 s"},
        BadCase{"RdzvConfMaxAttemptTooMany", {"--rdzv-conf", "keep_alive_max_attempt=1001"}, "from 1 to 1000"},
        BadCase{"RdzvConfWindowTooLong", {"--rdzv-conf", "keep_alive_interval=1000000,keep_alive_max_attempt=11"},
                "the keep-alive window (keep_alive_interval 1000000 x keep_alive_max_attempt 11 = 11000000 s) is "
                "longer than 10000000 s (115 days)"},
        BadCase{"RdzvConfMaxAttemptFraction", {"--rdzv-conf", "keep_alive_max_attempt=1.5"}, "keep_alive_max_attempt"},
        BadCase{"RdzvConfIsHostWord", {"--rdzv-conf", "is_host=maybe"}, "is_host"},
        BadCase{"RdzvConfStoreTypeFile", {"--rdzv-conf", "store_type=file"}, "store_type"},
        BadCase{"JoinTimeoutBelowLastCall",
                {"--rdzv-backend=c10d", "--rdzv-endpoint=h", "--nnodes=1:2", "--rdzv-conf=join_timeout=3"},
                "join_timeout"},
        BadCase{"RdzvUnknown", {"--rdzv-backend", "zookeeper"}, "--rdzv-backend"},
        BadCase{"LogsSpecs", {"--logs-specs", "x"}, "--logs-specs"},
        BadCase{"RedirectsFive", {"--redirects", "5"}, "--redirects"},
        BadCase{"RedirectsShortFive", {"-r5"}, "-r"},
        BadCase{"TeeBadMap", {"--tee", "0:9"}, "--tee"},
        BadCase{"LocalRanksFilterLetters", {"--local-ranks-filter", "a,b"}, "--local-ranks-filter"},
        BadCase{"SignalsUnknown", {"--signals-to-handle", "SIGFOO"}, "--signals-to-handle"},
        BadCase{"SignalsKill", {"--signals-to-handle", "SIGKILL"}, "--signals-to-handle"},
        BadCase{"StartMethod", {"--start-method", "thread"}, "--start-method"},
        BadCase{"NumaBindingMode", {"--numa-binding", "nodes"}, "--numa-binding"}),
    [](const ::testing::TestParamInfo<BadCase>& i) { return std::string(i.param.name); });

TEST_F(LauncherOptions, NoPythonNonexistentCommand) {
  std::string msg = usage_error({"--no-python", "definitely-not-a-command-xyz"}, {{"PATH", "/usr/bin:/bin"}});
  EXPECT_NE(msg.find("definitely-not-a-command-xyz"), std::string::npos) << msg;
}

// A path that --no-python cannot run is refused before any worker starts (it failed in
// every worker, with a failure summary and exit 126), as a missing one is.
TEST_F(LauncherOptions, NoPythonUnrunnablePath) {
  const std::string plain = dir_.write("train.sh", "echo hi\n", 0644);
  std::string msg = usage_error({"--no-python", plain});
  EXPECT_NE(msg.find("'" + plain + "' is not executable (chmod +x)"), std::string::npos) << msg;
  msg = usage_error({"--no-python", dir_.file("")});
  EXPECT_NE(msg.find("is a directory"), std::string::npos) << msg;
  EXPECT_TRUE(parse({"--no-python", dir_.write("run.sh", "echo hi\n", 0755)}).no_python);
}

TEST(FilterList, CommasSplitAndTwoCommasAreOne) {
  using V = std::vector<std::string>;
  EXPECT_EQ(ddprun::parse_filter_list("loss,a,,b"), (V{"loss", "a,b"}));
  EXPECT_EQ(ddprun::parse_filter_list(""), V{});
  EXPECT_EQ(ddprun::parse_filter_list("a,,,b,"), (V{"a,", "b"}));  // an empty filter would match every line
}

TEST_F(LauncherOptions, DuplicateFiltersPerStream) {
  auto o = parse_with_script({"--tee", "3", "--duplicate-stdout-filters", "x,y", "--duplicate-stderr_filters", "z"});
  EXPECT_EQ(o.duplicate_filters[0], (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(o.duplicate_filters[1], (std::vector<std::string>{"z"}));
  EXPECT_TRUE(o.warnings.empty());
}

TEST_F(LauncherOptions, EventLogHandlerIsAcceptedAndConsoleSaysThereIsNoLog) {
  EXPECT_TRUE(parse_with_script({"--event-log-handler", "null"}).warnings.empty());
  EXPECT_TRUE(parse_with_script({"--event_log_handler", "dynamic_rendezvous"}).warnings.empty());
  auto o = parse_with_script({}, {{"PET_EVENT_LOG_HANDLER", "console"}});
  ASSERT_EQ(o.warnings.size(), 1u);
  EXPECT_NE(o.warnings[0].find("PET_EVENT_LOG_HANDLER console: ddprun keeps no torchelastic event log"),
            std::string::npos)
      << o.warnings[0];
  std::string msg = usage_error({"--event-log-handler", "file", script_});
  EXPECT_NE(msg.find("--event-log-handler: expected null, console or dynamic_rendezvous, got 'file'"),
            std::string::npos)
      << msg;
}

TEST_F(LauncherOptions, LogsSpecsDefaultIsTorchrunsOwnLayout) {
  EXPECT_EQ(parse_with_script({"--logs-specs", "default"}).logs_specs, "default");
  std::string msg = usage_error({"--logs-specs", "mine", script_});
  EXPECT_NE(msg.find("--logs-specs: 'mine' would be a Python plug-in"), std::string::npos) << msg;
}

TEST_F(LauncherOptions, ArgsAfterBadScriptNotParsed) {
  // A flag-looking argument after the script belongs to the script, even a bad one.
  Options o = parse_with_script({}, {}, {"--redirects", "5", "--nnodes", "3:1"});
  EXPECT_EQ(o.script_args.size(), 4u);
}

// ------------------------------------------------------------------ stacks (docs/stacks.md)

TEST_F(LauncherOptions, StackDumpsOffStopsOnSigquitAsTorchrun) {
  Options o = parse_with_script({"--no-stack-dumps"});
  EXPECT_FALSE(o.stack_dumps);
  EXPECT_EQ(o.signals_to_handle, stop_signals({SIGQUIT}));
  EXPECT_FALSE(parse_with_script({}, {{"PET_NO_STACK_DUMPS", "1"}}).stack_dumps);
  // A list given keeps SIGQUIT a stop signal (ddprun --dump-stacks sends SIGURG then).
  EXPECT_EQ(parse_with_script({"--signals-to-handle", "SIGTERM,SIGQUIT"}).signals_to_handle,
            (std::vector<int>{SIGTERM, SIGQUIT}));
}

TEST_F(LauncherOptions, HangTimeout) {
  EXPECT_DOUBLE_EQ(parse_with_script({"--hang-timeout", "5"}).hang_timeout, 5.0);
  EXPECT_DOUBLE_EQ(parse_with_script({}, {{"PET_HANG_TIMEOUT", "2.5"}}).hang_timeout, 2.5);
  EXPECT_NE(usage_error_with_script({"--hang-timeout", "-1"}).find("--hang-timeout"), std::string::npos);
  EXPECT_NE(usage_error_with_script({"--hang-timeout", "soon"}).find("'soon'"), std::string::npos);
  // Too large for a deadline: the bound is named, not "a non-negative number" (1e12 is one).
  EXPECT_NE(usage_error_with_script({"--hang-timeout", "1e12"}).find("(at most 1e9), got '1e12'"), std::string::npos);
}

// torchrun ignores a --tee/--redirects entry for a local rank the node lacks; so does ddprun,
// but it says so, as it does for --local-ranks-filter.
TEST_F(LauncherOptions, TeeAndRedirectsOfLocalRanksThisNodeLacksAreNamed) {
  auto o = parse_with_script({"--nproc-per-node", "2", "--tee", "7:1", "--redirects", "0:3,5:2,6:1"});
  ASSERT_EQ(o.warnings.size(), 2u);
  EXPECT_EQ(o.warnings[0], "--tee: this node has 2 workers (local ranks 0..1), no local rank 7: what it says for it is "
                           "unused");
  EXPECT_EQ(o.warnings[1], "--redirects: this node has 2 workers (local ranks 0..1), no local ranks 5,6: what it says "
                           "for them is unused");
  EXPECT_TRUE(parse_with_script({"--nproc-per-node", "2", "--tee", "1:1"}).warnings.empty());
}

TEST_F(LauncherOptions, DumpStacksCommand) {
  EXPECT_EQ(parse({"--dump-stacks"}).dump_stacks, 0);
  EXPECT_EQ(parse({"--dump-stacks", "1234"}).dump_stacks, 1234);
  // Not a PET_ switch: a scheduler's environment never turns a job into a dump command.
  EXPECT_EQ(parse_with_script({}, {{"PET_DUMP_STACKS", "1"}}).dump_stacks, -1);
  EXPECT_EQ(parse({"--dump-stacks"}, {{"PET_MASTER_PORT", "1234"}}).dump_stacks, 0);
  EXPECT_NE(usage_error({"--dump-stacks", "x1"}).find("expected the pid"), std::string::npos);
  EXPECT_NE(usage_error({"--dump-stacks", "0"}).find("expected the pid"), std::string::npos);
  EXPECT_NE(usage_error({"--dump-stacks", "12", "13"}).find("only a pid"), std::string::npos);
  EXPECT_NE(usage_error({"--dump-stacks", "--nproc-per-node", "2"}).find("only a pid"), std::string::npos);
  // --dump-stacks=PID names the job too (before: read as a switch, it dumped whichever job ran).
  EXPECT_EQ(parse({"--dump-stacks=1234"}).dump_stacks, 1234);
  EXPECT_EQ(parse({"--dump_stacks=99999"}).dump_stacks, 99999);
  EXPECT_EQ(parse({"--dump-stacks=true"}).dump_stacks, 0);
  EXPECT_EQ(parse({"--dump-stacks=1"}).dump_stacks, 0);  // a switch's "on" (pid 1: --dump-stacks 1)
  EXPECT_EQ(parse({"--dump-stacks=7"}).dump_stacks, 7);
  EXPECT_NE(usage_error({"--dump-stacks=12", "13"}).find("only a pid"), std::string::npos);
  EXPECT_NE(usage_error({"--dump-stacks=00"}).find("expected the pid"), std::string::npos);
}

}  // namespace


// LOGLEVEL is torchrun's and often the script's own: every name Python's logging takes is
// taken (NOTSET: everything), in any case; a value it does not take is refused and named.
TEST_F(LauncherOptions, LogLevelTakesPythonsNames) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"NOTSET", "debug"}, {"DEBUG", "debug"}, {"info", "info"},      {"WARN", "warning"},
      {"WARNING", "warning"}, {"ERROR", "error"}, {"CRITICAL", "error"}, {"FATAL", "error"}};
  for (const auto& [given, want] : cases)
    EXPECT_EQ(parse_with_script({}, {{"LOGLEVEL", given}}).log_level, want) << given;
  const std::string e = usage_error_with_script({}, {{"LOGLEVEL", "loud"}});
  EXPECT_NE(e.find("LOGLEVEL"), std::string::npos) << e;
  EXPECT_NE(e.find("NOTSET"), std::string::npos) << e;
  EXPECT_NE(e.find("'loud'"), std::string::npos) << e;
}
