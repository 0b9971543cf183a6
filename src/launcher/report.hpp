// What ddprun tells a person (and a scheduler) when a job ends: torchrun's failure summary
// with tracebacks, ddprun's own TORCHELASTIC_ERROR_FILE, and --summary-json.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ddprun {

struct WorkerResult {
  int attempt = 0;
  int64_t round = -1;  // the dynamic rendezvous's round it ran in (-1: static)
  int rank = 0, local_rank = 0;
  pid_t pid = -1;
  std::string host;
  std::string error_file;
  bool no_folder = false;  // its folder could not be made (a full disk): no file of its is promised it
  enum class State { kRunning, kSucceeded, kFailed, kExecFailed, kStopped } state = State::kRunning;
  int exit_code = 0;  // as waitpid said, 128+N never used here
  int signal = 0;     // killed by this signal
  bool stopped_by_ddprun = false;  // ddprun signalled it before it exited
  std::chrono::system_clock::time_point start, end;
  std::string exec_error;
  std::string killed_for;  // why ddprun signalled it while it ran (an expired file timer)
  std::vector<std::string> stderr_tail;
  bool tail_has_stdout = false;  // stdout's lines among them (one pipe carried both)
  std::string interpreter;       // the Python that ran its script ("" when it ran directly)
  std::string crash_stack;       // killed by a fatal signal: its Python stack then (stacks.hpp)

  bool failed() const { return state == State::kFailed || state == State::kExecFailed; }
  // torchrun's exit code: negative signal number when killed.
  int torch_exit_code() const { return signal ? -signal : exit_code; }
  // What ddprun exits with when this worker is the root cause.
  int status_code() const { return signal ? 128 + signal : exit_code; }
};

// The traceback shown for a failed worker: its error file's py_callstack (torch's @record
// format), else how it died (with its Python stack at a crash), and the tail of its stderr.
std::string traceback_of(const WorkerResult& w);

// One "hint: ..." line per known cause (a torch without libuv, say) that the failed workers'
// tracebacks or stderr show, naming the cause and the fix; empty when none does.
std::string failure_hints(const WorkerResult& root, const std::vector<WorkerResult>& others);

// The summary's other failures (torchrun's "Failures:"): the workers of `workers` that
// failed by themselves, root aside. Not those ddprun stopped because root failed (torchrun
// shows <NO_OTHER_FAILURES> then; 63 stopped ranks would bury the one that failed).
std::vector<WorkerResult> other_failures(const std::vector<WorkerResult>& workers, const WorkerResult& root);

// torchrun's summary block; root first among failures (earliest end time), then `where`
// (where the other ranks were when it failed, launcher/stack_dump.hpp), then the hints.
std::string failure_summary(const std::string& script, const WorkerResult& root,
                            const std::vector<WorkerResult>& others, const std::string& where = "");

// Writes the root cause to path as torchrun does (the worker's error JSON plus errorCode,
// or a ChildFailedError record). Errors are logged, not thrown.
void write_root_cause_error_file(const std::string& path, const WorkerResult& root, const std::string& script);

// ddprun's own end (an error of its, a signal, a hang, this node cut off) in
// TORCHELASTIC_ERROR_FILE when set, in the form torchrun's @record on its main writes its
// launcher's (torch's ErrorHandler.record_exception; ddp::error_file_json): {"message":
// {"message": "<kind>: <text>", "extraInfo": {"py_callstack", "timestamp"}}}; a scheduler
// (TorchX) shows it. Not when another node failed: the root cause's node writes that. Errors
// are logged, not thrown. `detail` (py_callstack's place): the report shown, else
// "ddprun: error: <text>".
void write_launcher_error_file(const std::string& kind, const std::string& text, const std::string& detail = "");
// torch's SignalException record: "Process <ddprun's pid> got signal: <n>".
void write_signal_error_file(int sig);
// The error family's name for `e` ("TimeoutError", "NetworkError", ...), as that record's kind.
std::string error_kind(const std::exception& e);

struct JobOutcome {
  std::string status;  // "succeeded", "failed", "signaled"
  // What ended the job (first match of JobEnd): "succeeded", "signal", "worker_failed",
  // "hang", "another_node" (message: what that node said), "lost_contact" (message: why),
  // "rendezvous" (this node's join failed; message: why).
  std::string reason;
  std::string message;
  int exit_code = 0;
  int signal = 0;      // signal ddprun received, if any
  int restarts = 0;
  std::optional<WorkerResult> root_cause;
  std::vector<WorkerResult> workers;  // every worker of every attempt
  std::chrono::system_clock::time_point start, end;
};

// False (and an error logged) when it cannot be written.
bool write_summary_json(const std::string& path, const JobOutcome& outcome, const std::string& run_id);

// What ddprun exits with when no rank made progress for --hang-timeout (as timeout(1)).
inline constexpr int kHangExitCode = 124;

// How the job ended as this node saw it, first match wins: ddprun got a signal; a worker
// of this node failed first (root, with the others of its attempt); no rank made progress
// (--hang-timeout: its report); the round ended elsewhere (its text; node_only: this node
// lost contact, not a failure of the job).
struct JobEnd {
  int signal = 0;
  const WorkerResult* root = nullptr;
  std::vector<WorkerResult> others;
  std::string where;  // the stacks' note under the root cause or the remote failure
  const std::string* hang_report = nullptr;
  const std::string* hang_reason = nullptr;  // the <why> of its "<script> HUNG: <why>" line
  std::optional<std::string> remote;
  bool remote_node_only = false;
};

// Fills outcome's status, exit code and root cause, and shows what ended the job: torchrun's
// summary (through `show`) and error file for a root cause, the hang report (`show`), or one
// error line (spdlog).
using ShowText = std::function<void(const std::string&)>;
void conclude(JobOutcome& outcome, const JobEnd& end, const std::string& script, const ShowText& show);

std::string format_time(std::chrono::system_clock::time_point t);  // 2026-11-29_22:18:21

}  // namespace ddprun
