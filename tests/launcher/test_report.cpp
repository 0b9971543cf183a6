// What ddprun reports when a job ends: torchrun's failure summary, tracebacks from torch's
// @record error files (else the stderr tail), the root-cause error file, --summary-json.
#include <csignal>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ddp/error.hpp"
#include "launcher/report.hpp"
#include "test_util.hpp"

namespace {

using ddprun::WorkerResult;
using nlohmann::json;
using State = WorkerResult::State;

WorkerResult failed_worker(int rank, int exit_code, int sig = 0) {
  WorkerResult w;
  w.attempt = 0;
  w.rank = rank;
  w.local_rank = rank;
  w.pid = 11500 + rank;
  w.host = "nodeA";
  w.state = State::kFailed;
  w.exit_code = exit_code;
  w.signal = sig;
  w.start = std::chrono::system_clock::now() - std::chrono::seconds(3);
  w.end = std::chrono::system_clock::now();
  return w;
}

// torch's @record writes this shape (torch.distributed.elastic.multiprocessing.errors).
std::string record_error_json(const std::string& callstack) {
  json j = {{"message",
             {{"message", "ValueError: bad batch 7"},
              {"extraInfo", {{"py_callstack", callstack}, {"timestamp", "1764454701"}}}}}};
  return j.dump();
}

const char* kTraceback =
    "Traceback (most recent call last):\n"
    "  File \"/work/train.py\", line 12, in main\n"
    "    raise ValueError(\"bad batch 7\")\n"
    "ValueError: bad batch 7\n";

TEST(LauncherReport, SummaryShapeSingleFailure) {
  WorkerResult root = failed_worker(1, 3);
  std::string s = ddprun::failure_summary("train.py", root, {});
  const std::string rule(60, '='), thin(60, '-');
  EXPECT_TRUE(s.starts_with(rule + "\ntrain.py FAILED\n" + thin + "\nFailures:\n  <NO_OTHER_FAILURES>\n" + thin +
                            "\nRoot Cause (first observed failure):\n[0]:\n"))
      << s;
  EXPECT_TRUE(s.ends_with(rule + "\n")) << s;
  EXPECT_NE(s.find("  host      : nodeA\n"), std::string::npos) << s;
  EXPECT_NE(s.find("  rank      : 1 (local_rank: 1)\n"), std::string::npos) << s;
  EXPECT_NE(s.find("  exitcode  : 3 (pid: 11501)"), std::string::npos) << s;
  EXPECT_NE(s.find("  error_file: <N/A>\n"), std::string::npos) << s;
  EXPECT_NE(s.find("  time      : " + ddprun::format_time(root.end) + "\n"), std::string::npos) << s;
  EXPECT_NE(s.find("  traceback : "), std::string::npos) << s;
}

TEST(LauncherReport, FormatTime) {
  std::string t = ddprun::format_time(std::chrono::system_clock::now());
  // 2026-11-29_22:18:21
  ASSERT_EQ(t.size(), 19u) << t;
  EXPECT_EQ(t[4], '-');
  EXPECT_EQ(t[10], '_');
  EXPECT_EQ(t[13], ':');
}

TEST(LauncherReport, SignalShownAsNegativeExitCode) {
  WorkerResult root = failed_worker(0, 0, SIGKILL);
  std::string s = ddprun::failure_summary("train.py", root, {});
  EXPECT_NE(s.find("exitcode  : -9 (pid: 11500)\n"), std::string::npos) << s;  // as torchrun's: no more
  EXPECT_NE(s.find("Signal 9 (SIGKILL) received by PID 11500"), std::string::npos) << s;
  EXPECT_EQ(root.torch_exit_code(), -9);
  EXPECT_EQ(root.status_code(), 137);
}

TEST(LauncherReport, OtherFailuresListed) {
  WorkerResult root = failed_worker(2, 1);
  WorkerResult other = failed_worker(3, 0, SIGSEGV);
  WorkerResult another = failed_worker(1, 4);
  std::string s = ddprun::failure_summary("train.py", root, {other, another});
  EXPECT_EQ(s.find("<NO_OTHER_FAILURES>"), std::string::npos) << s;
  const size_t failures = s.find("Failures:\n"), root_at = s.find("Root Cause (first observed failure):");
  ASSERT_NE(failures, std::string::npos);
  ASSERT_NE(root_at, std::string::npos);
  // The others come before the root cause block, numbered from 1.
  const size_t one = s.find("[1]:\n"), two = s.find("[2]:\n"), zero = s.find("[0]:\n");
  EXPECT_LT(failures, one);
  EXPECT_LT(one, two);
  EXPECT_LT(two, root_at);
  EXPECT_LT(root_at, zero);
  EXPECT_NE(s.find("rank      : 3 (local_rank: 3)"), std::string::npos);
  EXPECT_NE(s.find("Signal 11 (SIGSEGV) received by PID 11503"), std::string::npos) << s;
  EXPECT_NE(s.find("rank      : 2 (local_rank: 2)"), std::string::npos);
}

// As torchrun: the ranks ddprun stopped because the root failed are no failures of their
// own (the summary says <NO_OTHER_FAILURES>); a rank that failed by itself meanwhile is one.
TEST(LauncherReport, RanksStoppedForTheRootAreNoOtherFailures) {
  WorkerResult root = failed_worker(2, 1);
  WorkerResult stopped = failed_worker(0, 0, SIGTERM);
  stopped.state = State::kStopped;
  stopped.stopped_by_ddprun = true;
  WorkerResult finished = failed_worker(1, 0);
  finished.state = State::kSucceeded;
  WorkerResult crashed = failed_worker(3, 0, SIGSEGV);
  const auto others = ddprun::other_failures({stopped, root, finished, crashed}, root);
  ASSERT_EQ(others.size(), 1u);
  EXPECT_EQ(others[0].rank, 3);
  EXPECT_NE(ddprun::failure_summary("train.py", root, ddprun::other_failures({stopped, root}, root))
                .find("Failures:\n  <NO_OTHER_FAILURES>\n"),
            std::string::npos);
}

TEST(LauncherReport, TracebackFromRecordErrorFile) {
  ddprun_test::TempDir dir;
  WorkerResult root = failed_worker(0, 1);
  root.error_file = dir.write("error.json", record_error_json(kTraceback));
  root.stderr_tail = {"something else on stderr"};
  EXPECT_EQ(ddprun::traceback_of(root), kTraceback);
  std::string s = ddprun::failure_summary("train.py", root, {});
  EXPECT_NE(s.find("  error_file: " + root.error_file + "\n"), std::string::npos) << s;
  EXPECT_NE(s.find("ValueError: bad batch 7"), std::string::npos) << s;
  EXPECT_NE(s.find("raise ValueError(\"bad batch 7\")"), std::string::npos) << s;
  // Multi-line tracebacks are indented under "traceback :".
  EXPECT_NE(s.find("  traceback : Traceback (most recent call last):\n              "), std::string::npos) << s;
}

TEST(LauncherReport, MissingOrBrokenErrorFileFallsBackToStderrTail) {
  ddprun_test::TempDir dir;
  WorkerResult root = failed_worker(0, 2);
  root.error_file = dir.file("does-not-exist.json");
  root.stderr_tail = {"loading data", "RuntimeError: out of cheese"};
  std::string s = ddprun::failure_summary("train.py", root, {});
  EXPECT_NE(s.find("error_file: <N/A>"), std::string::npos) << s;
  EXPECT_NE(s.find("RuntimeError: out of cheese"), std::string::npos) << s;
  EXPECT_NE(s.find("loading data"), std::string::npos) << s;

  root.error_file = dir.write("broken.json", "{not json");
  std::string t = ddprun::traceback_of(root);
  EXPECT_NE(t.find("RuntimeError: out of cheese"), std::string::npos) << t;
}

TEST(LauncherReport, SignalAndStderrTailTogether) {
  WorkerResult root = failed_worker(0, 0, SIGSEGV);
  root.stderr_tail = {"about to crash"};
  std::string t = ddprun::traceback_of(root);
  EXPECT_NE(t.find("SIGSEGV"), std::string::npos) << t;
  EXPECT_NE(t.find("about to crash"), std::string::npos) << t;
}

TEST(LauncherReport, ExecFailureShowsItsMessage) {
  WorkerResult root = failed_worker(0, 126);
  root.state = State::kExecFailed;
  root.exec_error = "cannot execute /x/run.sh: Permission denied";
  std::string s = ddprun::failure_summary("/x/run.sh", root, {});
  EXPECT_NE(s.find("cannot execute /x/run.sh: Permission denied"), std::string::npos) << s;
  EXPECT_NE(s.find("exitcode  : 126"), std::string::npos) << s;
}

// Debian's torch 2.6 lacks libuv; what every worker then prints (torch/distributed/rendezvous.py).
const char* kNoLibuv = "RuntimeError: use_libuv was requested but PyTorch was build without libuv support";

std::vector<std::string> hint_lines(const std::string& summary) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = summary.find("\nhint: ", at)) != std::string::npos) {
    ++at;
    out.push_back(summary.substr(at, summary.find('\n', at) - at));
  }
  return out;
}

TEST(LauncherReport, NoLibuvHintOnceFromStderrTails) {
  WorkerResult root = failed_worker(0, 1), other = failed_worker(1, 1);
  root.stderr_tail = other.stderr_tail = {"  File \"rendezvous.py\", line 185, in _create_c10d_store", kNoLibuv};
  std::string s = ddprun::failure_summary("train.py", root, {other});
  auto hints = hint_lines(s);
  ASSERT_EQ(hints.size(), 1u) << s;  // one line, however many workers show the error
  EXPECT_NE(hints[0].find("built without libuv"), std::string::npos) << hints[0];
  EXPECT_NE(hints[0].find("use_libuv=False"), std::string::npos) << hints[0];
  EXPECT_NE(hints[0].find("sitecustomize.py"), std::string::npos) << hints[0];
  EXPECT_NE(hints[0].find("torch built with libuv"), std::string::npos) << hints[0];
  // Inside the summary, right before its closing rule.
  EXPECT_TRUE(s.ends_with(hints[0] + "\n" + std::string(60, '=') + "\n")) << s;
}

TEST(LauncherReport, NoLibuvHintFromRecordErrorFileOrAnotherFailure) {
  ddprun_test::TempDir dir;
  WorkerResult root = failed_worker(0, 1);
  root.error_file = dir.write("error.json", record_error_json(std::string("Traceback...\n") + kNoLibuv + "\n"));
  EXPECT_EQ(hint_lines(ddprun::failure_summary("train.py", root, {})).size(), 1u);
  // The root cause died of something else; a later failure shows the error.
  WorkerResult first = failed_worker(2, 0, SIGKILL), later = failed_worker(3, 1);
  later.stderr_tail = {kNoLibuv};
  EXPECT_EQ(hint_lines(ddprun::failure_summary("train.py", first, {later})).size(), 1u);
}

// A DataLoader worker's death fails its rank with a RuntimeError whose cause (the signal) is
// often above the stderr tail: the hint says where to look, and how to get the crash's stack.
TEST(LauncherReport, DataLoaderWorkerDeathHint) {
  WorkerResult root = failed_worker(0, 1);
  root.stderr_tail = {"    raise RuntimeError('DataLoader worker (pid(s) {}) exited unexpectedly'.format(pids_str)) from e",
                      "RuntimeError: DataLoader worker (pid(s) 11337) exited unexpectedly"};
  auto hints = hint_lines(ddprun::failure_summary("train.py", root, {}));
  ASSERT_EQ(hints.size(), 1u);
  EXPECT_NE(hints[0].find("is killed by signal"), std::string::npos) << hints[0];
  EXPECT_NE(hints[0].find("num_workers=0"), std::string::npos) << hints[0];
}

TEST(LauncherReport, NoHintForOtherErrors) {
  WorkerResult root = failed_worker(0, 1);
  root.stderr_tail = {"RuntimeError: use_libuv is great", "RuntimeError: PyTorch was build without cheese"};
  std::string s = ddprun::failure_summary("train.py", root, {});
  EXPECT_TRUE(hint_lines(s).empty()) << s;
  EXPECT_EQ(s.find("hint:"), std::string::npos) << s;
  EXPECT_EQ(ddprun::failure_hints(root, {}), "");
}

// A module the workers' Python lacks (often: python3 from PATH is not the one with torch):
// the hint names the interpreter that ran and PYTHON_EXEC; none for a worker run directly.
TEST(LauncherReport, MissingModuleHintNamesTheInterpreter) {
  WorkerResult root = failed_worker(0, 1);
  root.stderr_tail = {"  File \"train.py\", line 1, in <module>", "ModuleNotFoundError: No module named 'torch'"};
  root.interpreter = "/root/.pyenv/shims/python3";
  auto hints = hint_lines(ddprun::failure_summary("train.py", root, {}));
  ASSERT_EQ(hints.size(), 1u);
  EXPECT_NE(hints[0].find("the workers ran /root/.pyenv/shims/python3"), std::string::npos) << hints[0];
  EXPECT_NE(hints[0].find("set PYTHON_EXEC"), std::string::npos) << hints[0];
  root.interpreter.clear();  // --no-python, an executable
  EXPECT_EQ(ddprun::failure_hints(root, {}), "");
}

TEST(LauncherReport, RootCauseErrorFileFromWorkerRecord) {
  ddprun_test::TempDir dir;
  WorkerResult root = failed_worker(0, 1);
  root.error_file = dir.write("worker.json", record_error_json(kTraceback));
  const std::string out = dir.file("root.json");
  ddprun::write_root_cause_error_file(out, root, "train.py");
  json j = json::parse(ddprun_test::read_file(out));
  EXPECT_EQ(j["message"]["errorCode"], 1);
  EXPECT_EQ(j["message"]["message"], "ValueError: bad batch 7");
  EXPECT_EQ(j["message"]["extraInfo"]["py_callstack"], kTraceback);
}

TEST(LauncherReport, RootCauseErrorFileWithoutWorkerRecord) {
  ddprun_test::TempDir dir;
  WorkerResult root = failed_worker(3, 0, SIGKILL);
  const std::string out = dir.file("root.json");
  ddprun::write_root_cause_error_file(out, root, "train.py");
  json j = json::parse(ddprun_test::read_file(out));
  EXPECT_EQ(j["message"]["errorCode"], -9);
  std::string msg = j["message"]["message"];
  EXPECT_NE(msg.find("train.py"), std::string::npos) << msg;
  EXPECT_NE(msg.find("SIGKILL"), std::string::npos) << msg;
  EXPECT_TRUE(j["message"]["extraInfo"].contains("py_callstack"));
  EXPECT_TRUE(j["message"]["extraInfo"].contains("timestamp"));
}

// A record whose message is a string (an older torch's, a hand-written one) is copied as it
// is, as torchrun does; JSON that is no record (an array) is no record, and no exception.
TEST(LauncherReport, RootCauseErrorFileKeepsAStringMessage) {
  ddprun_test::TempDir dir;
  WorkerResult root = failed_worker(0, 4);
  root.error_file = dir.write("worker.json", R"({"message": "custom failure: disk full on /data", "extra": 1})");
  const std::string out = dir.file("root.json");
  ddprun::write_root_cause_error_file(out, root, "train.py");
  json j = json::parse(ddprun_test::read_file(out));
  EXPECT_EQ(j["message"], "custom failure: disk full on /data");
  EXPECT_EQ(j["extra"], 1);
  root.error_file = dir.write("array.json", "[1, 2]");
  ddprun::write_root_cause_error_file(out, root, "train.py");
  EXPECT_NE(json::parse(ddprun_test::read_file(out))["message"]["message"].get<std::string>().find("ChildFailedError"),
            std::string::npos);
}

// ddprun's own end, as torchrun's @record writes its launcher's: only when the variable is set.
TEST(LauncherReport, LauncherErrorFileAsTorchrunsRecord) {
  ddprun_test::TempDir dir;
  const std::string out = dir.file("launcher.json");
  unsetenv("TORCHELASTIC_ERROR_FILE");
  ddprun::write_launcher_error_file("TimeoutError", "nothing");
  EXPECT_FALSE(std::filesystem::exists(out));
  setenv("TORCHELASTIC_ERROR_FILE", out.c_str(), 1);
  ddprun::write_launcher_error_file("TimeoutError", "rendezvous: no round formed within join_timeout 5 s");
  json j = json::parse(ddprun_test::read_file(out));
  EXPECT_EQ(j["message"]["message"], "TimeoutError: rendezvous: no round formed within join_timeout 5 s");
  EXPECT_EQ(j["message"]["extraInfo"]["py_callstack"],
            "ddprun: error: rendezvous: no round formed within join_timeout 5 s\n");
  EXPECT_FALSE(j["message"].contains("errorCode"));  // (as torch's record_exception)
  EXPECT_GT(std::stol(j["message"]["extraInfo"]["timestamp"].get<std::string>()), 1700000000L);
  ddprun::write_launcher_error_file("TimeoutError", "train.py HUNG: x", "=====\ntrain.py HUNG: x\n");
  EXPECT_EQ(json::parse(ddprun_test::read_file(out))["message"]["extraInfo"]["py_callstack"], "=====\ntrain.py HUNG: x\n");
  unsetenv("TORCHELASTIC_ERROR_FILE");
  EXPECT_EQ(ddprun::error_kind(ddp::TimeoutError("t")), "TimeoutError");
  EXPECT_EQ(ddprun::error_kind(ddp::NetworkError("n")), "NetworkError");
  EXPECT_EQ(ddprun::error_kind(ddp::SystemError("s", ENOENT)), "SystemError");
  EXPECT_EQ(ddprun::error_kind(std::runtime_error("r")), "Error");
}

TEST(LauncherReport, SummaryJsonFields) {
  ddprun_test::TempDir dir;
  ddprun::JobOutcome o;
  o.status = "failed";
  o.exit_code = 3;
  o.restarts = 1;
  o.start = std::chrono::system_clock::now() - std::chrono::seconds(10);
  o.end = std::chrono::system_clock::now();
  WorkerResult a = failed_worker(0, 0, SIGTERM);
  a.state = State::kStopped;
  a.stopped_by_ddprun = true;
  WorkerResult b = failed_worker(1, 3);
  b.stderr_tail = {"boom"};
  o.workers = {a, b};
  o.root_cause = b;
  const std::string path = dir.file("summary.json");
  ddprun::write_summary_json(path, o, "run-xyz");
  json j = json::parse(ddprun_test::read_file(path));
  EXPECT_EQ(j["status"], "failed");
  EXPECT_EQ(j["exit_code"], 3);
  EXPECT_EQ(j["restarts"], 1);
  EXPECT_EQ(j["run_id"], "run-xyz");
  EXPECT_TRUE(j["signal"].is_null());
  EXPECT_TRUE(j["start"].is_number());
  EXPECT_TRUE(j["end"].is_number());
  ASSERT_TRUE(j["workers"].is_array());
  ASSERT_EQ(j["workers"].size(), 2u);
  const json& w0 = j["workers"][0];
  EXPECT_EQ(w0["rank"], 0);
  EXPECT_EQ(w0["local_rank"], 0);
  EXPECT_EQ(w0["pid"], 11500);
  EXPECT_EQ(w0["state"], "stopped");
  EXPECT_EQ(w0["signal"], "SIGTERM");
  EXPECT_EQ(w0["stopped_by_ddprun"], true);
  EXPECT_EQ(w0["attempt"], 0);
  EXPECT_NEAR(w0["duration_s"].get<double>(), 3.0, 0.5);
  const json& w1 = j["workers"][1];
  EXPECT_EQ(w1["state"], "failed");
  EXPECT_EQ(w1["exit_code"], 3);
  EXPECT_TRUE(w1["signal"].is_null());
  EXPECT_NE(w1["traceback"].get<std::string>().find("boom"), std::string::npos);
  ASSERT_TRUE(j["root_cause"].is_object());
  EXPECT_EQ(j["root_cause"]["rank"], 1);
  EXPECT_EQ(j["root_cause"]["exit_code"], 3);
}

TEST(LauncherReport, SummaryJsonSucceeded) {
  ddprun_test::TempDir dir;
  ddprun::JobOutcome o;
  o.status = "succeeded";
  WorkerResult w = failed_worker(0, 0);
  w.state = State::kSucceeded;
  o.workers = {w};
  const std::string path = dir.file("summary.json");
  ddprun::write_summary_json(path, o, "r");
  json j = json::parse(ddprun_test::read_file(path));
  EXPECT_EQ(j["status"], "succeeded");
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_TRUE(j["root_cause"].is_null());
  EXPECT_EQ(j["workers"][0]["state"], "succeeded");
  EXPECT_FALSE(j["workers"][0].contains("traceback"));
}

}  // namespace
