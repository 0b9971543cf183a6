#include "launcher/report.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "ddp/error_file.hpp"
#include "launcher/fileio.hpp"
#include "launcher/options.hpp"

namespace ddprun {

using nlohmann::json;

namespace {

std::optional<json> read_error_json(const std::string& path) {
  if (path.empty()) return std::nullopt;
  auto text = read_file(path);
  if (!text) return std::nullopt;
  try {
    json j = json::parse(*text);
    if (j.is_object()) return j;  // (a record is one; `[1]` is valid JSON, and no record)
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// A worker's bytes (its stderr's tail, a script path) need not be UTF-8: shown as U+FFFD,
// never an exception that loses the file.
std::string dump_json(const json& j) { return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n"; }

double epoch_seconds(std::chrono::system_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

std::string indent(const std::string& text, const std::string& pad) {
  std::string out;
  std::istringstream ss(text);
  bool first = true;
  for (std::string line; std::getline(ss, line);) {
    if (!first) out += "\n" + pad;
    out += line;
    first = false;
  }
  return out;
}

// Failures whose cause and fix ddprun can name, matched in the worker's traceback or stderr.
struct KnownCause {
  std::string_view text;  // exactly as the worker printed it
  std::string_view hint;
};
constexpr KnownCause kKnownCauses[] = {
    // Debian's (and some other) torch 2.x builds lack libuv, which TCPStore uses by default;
    // init_process_group(env://) and torchrun create their stores without asking.
    {"use_libuv was requested but PyTorch was build without libuv support",
     "hint: this PyTorch was built without libuv, yet its TCPStore defaults to use_libuv=True: "
     "pass use_libuv=False to TCPStore (a sitecustomize.py can make it the default) or use a "
     "torch built with libuv (USE_LIBUV=0 does not help)"},
    // torch's DataLoader workers set crash handlers of their own (no faulthandler dump), and
    // the line that says how one died ("is killed by signal: ...") is often above the tail.
    {"RuntimeError: DataLoader worker (pid(s) ",
     "hint: a DataLoader worker process died; the rank's output (above, or its --log-dir file) says of what "
     "(\"DataLoader worker (pid N) is killed by signal: ...\"; Killed is often the kernel's out-of-memory killer). "
     "No Python stack of a worker's crash is shown (torch's workers handle SIGSEGV, SIGBUS and SIGFPE "
     "themselves): with num_workers=0 the dataset runs in the rank, whose crash stack the summary shows"},
};

bool mentions(const WorkerResult& w, std::string_view text) {
  if (traceback_of(w).find(text) != std::string::npos) return true;
  for (const auto& line : w.stderr_tail)
    if (line.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace

std::string failure_hints(const WorkerResult& root, const std::vector<WorkerResult>& others) {
  std::string out;
  auto seen = [&](std::string_view text) {
    bool any = mentions(root, text);
    for (size_t i = 0; !any && i < others.size(); ++i) any = mentions(others[i], text);
    return any;
  };
  for (const auto& cause : kKnownCauses)
    if (seen(cause.text)) out += fmt::format("{}\n", cause.hint);
  // torchrun's workers run the Python torchrun was installed into; ddprun's run PYTHON_EXEC,
  // else the first python3 on PATH, which may be another (a pyenv shim, a system Python).
  if (!root.interpreter.empty() && seen("ModuleNotFoundError: No module named"))
    out += fmt::format("hint: the workers ran {} ($PYTHON_EXEC, else the first python3 on PATH): if the module "
                       "is installed for another Python, set PYTHON_EXEC to that interpreter (a venv's bin/python)\n",
                       root.interpreter);
  return out;
}

std::string format_time(std::chrono::system_clock::time_point t) {
  auto tt = std::chrono::system_clock::to_time_t(t);
  tm tmv{};
  localtime_r(&tt, &tmv);
  char buf[32];
  strftime(buf, sizeof buf, "%Y-%m-%d_%H:%M:%S", &tmv);
  return buf;
}

std::string traceback_of(const WorkerResult& w) {
  if (auto j = read_error_json(w.error_file)) {
    try {
      const json& m = (*j)["message"];
      if (m.is_object()) {
        std::string msg = m.value("message", "");
        std::string stack;
        if (m.contains("extraInfo") && m["extraInfo"].is_object())
          stack = m["extraInfo"].value("py_callstack", "");
        if (!stack.empty()) return stack;
        if (!msg.empty()) return msg;
      } else if (m.is_string()) {
        return m.get<std::string>();
      }
    } catch (const std::exception&) {
    }
  }
  if (w.state == WorkerResult::State::kExecFailed) return w.exec_error;
  std::string out;
  if (w.signal) out = fmt::format("Signal {} ({}) received by PID {}", w.signal, signal_name(w.signal), w.pid);
  if (!w.killed_for.empty()) out += (out.empty() ? "" : ": ") + w.killed_for;
  if (!w.crash_stack.empty()) out += (out.empty() ? "" : "\n") + w.crash_stack;
  if (!w.stderr_tail.empty()) {
    if (!out.empty()) out += "\n";
    const size_t n = w.stderr_tail.size();
    out += fmt::format("last {} of {}:", n == 1 ? "line" : fmt::format("{} lines", n),
                       w.tail_has_stdout ? "output" : "stderr");
    for (auto& l : w.stderr_tail) out += "\n  " + l;
  }
  if (out.empty()) out = w.tail_has_stdout ? "(no error file and no output)" : "(no error file and no output on stderr)";
  return out;
}

std::vector<WorkerResult> other_failures(const std::vector<WorkerResult>& workers, const WorkerResult& root) {
  std::vector<WorkerResult> out;
  std::copy_if(workers.begin(), workers.end(), std::back_inserter(out),
               [&](const WorkerResult& w) { return w.rank != root.rank && w.failed(); });
  return out;
}

std::string failure_summary(const std::string& script, const WorkerResult& root,
                            const std::vector<WorkerResult>& others, const std::string& where) {
  const std::string rule(60, '='), thin(60, '-');
  auto block = [](const WorkerResult& w, size_t idx) {
    bool has_file = !w.error_file.empty() && read_error_json(w.error_file).has_value();
    // As torchrun's, nothing after the pid (log parsers match the line whole); the
    // signal's name, or why the program could not start, is in the traceback line.
    std::string code = fmt::format("{} (pid: {})", w.torch_exit_code(), w.pid);
    return fmt::format(
        "[{}]:\n  time      : {}\n  host      : {}\n  rank      : {} (local_rank: {})\n{}  exitcode  : {}\n"
        "  error_file: {}\n  traceback : {}\n",
        idx, format_time(w.end), w.host, w.rank, w.local_rank,
        w.round >= 0 ? fmt::format("  round     : {}\n", w.round) : "", code, has_file ? w.error_file : "<N/A>",
        indent(traceback_of(w), "              "));
  };
  std::string s = rule + "\n" + script + " FAILED\n" + thin + "\nFailures:\n";
  if (others.empty()) s += "  <NO_OTHER_FAILURES>\n";
  for (size_t i = 0; i < others.size(); ++i) s += block(others[i], i + 1);
  s += thin + "\nRoot Cause (first observed failure):\n" + block(root, 0);
  if (!where.empty()) s += thin + "\n" + where;
  s += failure_hints(root, others) + rule + "\n";
  return s;
}

namespace {
void write_record(const std::string& path, const std::string& doc) {
  if (!write_file(path, doc)) spdlog::error("cannot write TORCHELASTIC_ERROR_FILE {}: {}", path, ddp::errno_text(errno));
}
}  // namespace

void write_root_cause_error_file(const std::string& path, const WorkerResult& root, const std::string& script) {
  json out;
  auto j = read_error_json(root.error_file);
  if (j && (*j)["message"].is_object()) {
    out = *j;
    out["message"]["errorCode"] = root.torch_exit_code();
  } else if (j && (*j)["message"].is_string()) {
    out = *j;  // an older record's string message: copied as it is, as torchrun does
  } else {
    out["message"] = {
        {"message", fmt::format("ChildFailedError: {} failed: rank {} (local_rank {}) exited with {}", script,
                                root.rank, root.local_rank,
                                root.signal ? signal_name(root.signal) : std::to_string(root.exit_code))},
        {"errorCode", root.torch_exit_code()},
        {"extraInfo", {{"py_callstack", traceback_of(root)}, {"timestamp", std::to_string(static_cast<long>(epoch_seconds(root.end)))}}}};
  }
  write_record(path, dump_json(out));
}

void write_launcher_error_file(const std::string& kind, const std::string& text, const std::string& detail) {
  const char* path = getenv("TORCHELASTIC_ERROR_FILE");
  if (!path || !*path) return;
  write_record(path, ddp::error_file_json(kind, text, detail.empty() ? "ddprun: error: " + text + "\n" : detail,
                                          static_cast<long long>(::time(nullptr))));
}

void write_signal_error_file(int sig) {
  write_launcher_error_file("SignalException", fmt::format("Process {} got signal: {}", ::getpid(), sig));
}

std::string error_kind(const std::exception& e) {
  if (dynamic_cast<const ddp::TimeoutError*>(&e)) return "TimeoutError";
  if (dynamic_cast<const ddp::NetworkError*>(&e)) return "NetworkError";
  if (dynamic_cast<const ddp::StoreError*>(&e)) return "StoreError";
  if (dynamic_cast<const ddp::SystemError*>(&e)) return "SystemError";
  return "Error";
}

bool write_summary_json(const std::string& path, const JobOutcome& o, const std::string& run_id) {
  auto state_name = [](WorkerResult::State s) {
    switch (s) {
      case WorkerResult::State::kRunning: return "running";
      case WorkerResult::State::kSucceeded: return "succeeded";
      case WorkerResult::State::kFailed: return "failed";
      case WorkerResult::State::kExecFailed: return "exec_failed";
      case WorkerResult::State::kStopped: return "stopped";
    }
    return "unknown";
  };
  auto worker_json = [&](const WorkerResult& w) {
    json j = {{"attempt", w.attempt},       {"rank", w.rank},
              {"local_rank", w.local_rank}, {"host", w.host},
              {"pid", w.pid},               {"state", state_name(w.state)},
              // -N when signal N ended it (the failure summary's exitcode, torchrun's): never 0
              {"exit_code", w.torch_exit_code()},
              {"signal", w.signal ? json(signal_name(w.signal)) : json(nullptr)},
              {"stopped_by_ddprun", w.stopped_by_ddprun},
              {"start", epoch_seconds(w.start)}, {"end", epoch_seconds(w.end)},
              {"duration_s", std::chrono::duration<double>(w.end - w.start).count()}};
    if (w.round >= 0) j["round"] = w.round;
    if (!w.error_file.empty() && access(w.error_file.c_str(), F_OK) == 0) j["error_file"] = w.error_file;  // (written)
    if (w.failed()) j["traceback"] = traceback_of(w);
    return j;
  };
  json j;
  j["status"] = o.status;
  j["exit_code"] = o.exit_code;
  j["reason"] = o.reason;
  if (!o.message.empty()) j["message"] = o.message;
  j["signal"] = o.signal ? json(signal_name(o.signal)) : json(nullptr);
  j["run_id"] = run_id;
  j["restarts"] = o.restarts;
  j["start"] = epoch_seconds(o.start);
  j["end"] = epoch_seconds(o.end);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto secs = [](const timeval& tv) { return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) / 1e6; };
  // VmHWM, not ru_maxrss: after exec, ru_maxrss still counts the image that exec'd us
  // (a forked Python parent, say), which is not ddprun's memory.
  long hwm_kb = ru.ru_maxrss;
  if (auto status = read_file("/proc/self/status")) {
    std::istringstream lines(*status);
    for (std::string line; std::getline(lines, line);)
      if (line.starts_with("VmHWM:")) hwm_kb = std::stol(line.substr(6));
  }
  j["launcher"] = {{"pid", getpid()},
                   {"max_rss_kb", hwm_kb},
                   {"user_cpu_s", secs(ru.ru_utime)},
                   {"system_cpu_s", secs(ru.ru_stime)}};
  j["root_cause"] = o.root_cause ? worker_json(*o.root_cause) : json(nullptr);
  j["workers"] = json::array();
  for (auto& w : o.workers) j["workers"].push_back(worker_json(w));
  if (write_file(path, dump_json(j))) return true;
  spdlog::error("cannot write --summary-json {}: {}", path, ddp::errno_text(errno));
  return false;
}

void conclude(JobOutcome& outcome, const JobEnd& e, const std::string& script, const ShowText& show) {
  outcome.status = "failed";
  if (e.signal) {
    outcome.status = "signaled";
    outcome.reason = "signal";
    outcome.signal = e.signal;
    outcome.exit_code = 128 + e.signal;
    spdlog::warn("stopped after {}: exiting with {}", signal_name(e.signal), outcome.exit_code);
    write_signal_error_file(e.signal);
  } else if (e.root) {
    outcome.reason = "worker_failed";
    outcome.root_cause = *e.root;
    outcome.exit_code = e.root->status_code();
    show(failure_summary(script, *e.root, e.others, e.where));
    if (const char* ef = getenv("TORCHELASTIC_ERROR_FILE"); ef && *ef) write_root_cause_error_file(ef, *e.root, script);
  } else if (e.hang_report) {
    outcome.reason = "hang";
    outcome.exit_code = kHangExitCode;
    show(*e.hang_report);
    // (Its "<script> HUNG: <why>" line; the whole report in the callstack's place.)
    const std::string why = e.hang_reason ? script + " HUNG: " + *e.hang_reason : *e.hang_report;
    write_launcher_error_file("TimeoutError", why, *e.hang_report);
  } else if (e.remote) {
    outcome.reason = e.remote_node_only ? "lost_contact" : "another_node";
    outcome.message = *e.remote;
    outcome.exit_code = 1;
    if (e.remote_node_only) spdlog::error("{}", *e.remote);
    else spdlog::error("the job failed on another node: {}{}", *e.remote, e.where.empty() ? "" : "\n" + e.where);
    if (e.remote_node_only) write_launcher_error_file("NetworkError", *e.remote);  // (another node's: written there)
  } else {
    outcome.status = "succeeded";
    outcome.reason = "succeeded";
    outcome.exit_code = 0;
  }
}

}  // namespace ddprun
