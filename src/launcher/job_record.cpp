#include "launcher/job_record.hpp"

#include <algorithm>
#include <chrono>

#include "launcher/background.hpp"
#include "launcher/node_signals.hpp"
#include "launcher/stack_dump.hpp"

namespace ddprun {

namespace {
using SysClock = std::chrono::system_clock;
constexpr int kHistoryAttempts = 64;  // attempts whose workers --summary-json lists
}  // namespace

void JobRecord::start() { outcome_.start = SysClock::now(); }

// --summary-json lists the workers of the last kHistoryAttempts attempts: a job that
// restarts a thousand times does not hold a thousand attempts' records. Only a failed
// worker's record keeps its stderr (its traceback).
void JobRecord::keep(const std::vector<WorkerResult>& workers, int attempt) {
  for (auto& w : workers) {
    outcome_.workers.push_back(w);
    if (!w.failed()) outcome_.workers.back().stderr_tail = std::vector<std::string>();
  }
  std::erase_if(outcome_.workers, [&](const WorkerResult& w) { return w.attempt <= attempt - kHistoryAttempts; });
}

void JobRecord::end(int restarts) {
  outcome_.restarts = restarts;
  outcome_.end = SysClock::now();
}

// The signal that ended the job: none when it came while the workers stopped after a
// failure (here or on another node) or a hang, which is then how the job ended (its summary
// and exit code). Not after another kind of end (a newcomer's restart, another node's
// signal or loss): the signal ended those. (Only what is reported: the node still leaves
// the rendezvous as stopped by its signal, within its SIGKILL escalation.)
int JobRecord::Ending::signal() const {
  const bool failed = root || stacks.hang() || (remote && remote->kind == RoundEnd::Kind::kFailed);
  return failed && signals.came_while_stopping() ? 0 : signals.got();
}

void JobRecord::report(const Ending& e, const std::string& run_id, const ShowText& show) {
  JobEnd end;
  end.signal = e.signal();
  if (e.root) {
    end.root = &*e.root;
    end.others = other_failures(e.workers, *e.root);
  }
  end.where = e.stacks.failure_note();
  if (e.stacks.hang()) {
    end.hang_report = &e.stacks.hang_report();
    end.hang_reason = &*e.stacks.hang();
  }
  if (e.remote) {
    end.remote = e.remote->describe();
    end.remote_node_only = e.remote->node_only();
  }
  conclude(outcome_, end, o_.script, show);
  // A scheduler that reads the summary must not take a missing one for a success: ddprun's
  // own failure, exit 1 (as any error of ddprun's that is not a usage error).
  if (!o_.summary_json.empty() && !write_summary_json(o_.summary_json, outcome_, run_id) && outcome_.exit_code == 0)
    outcome_.exit_code = 1;
}

void JobRecord::report_join_end(const std::string& why, int exit_code, int restarts, const std::string& run_id) {
  end(restarts);
  outcome_.status = exit_code == 0 ? "succeeded" : "failed";
  outcome_.reason = exit_code == 0 ? "succeeded" : "rendezvous";
  outcome_.message = why;
  outcome_.exit_code = exit_code;
  if (!o_.summary_json.empty()) write_summary_json(o_.summary_json, outcome_, run_id);
}

// A node stopping on a signal is gone by the time the SIGKILL escalation would have
// ended (at least NodeSignals::kLastGoodbye after now): the goodbye is bounded by it.
void JobRecord::leave(const Ending& e) {
  using F = FinishKind;
  if (abandoned_anything()) return;  // a join still runs inside the rendezvous: leave it be
  if (e.signals.got()) return rdzv_.finish(F::kNodeStopped, e.signals.end_note(), e.signals.leave_by());
  if (!e.root && !e.remote && !e.stacks.hang()) return rdzv_.finish(F::kSucceeded, "", std::nullopt);
  rdzv_.finish(e.remote && e.remote->node_only() ? F::kNodeStopped : F::kJobFailed, e.stop_reason, std::nullopt);
}

}  // namespace ddprun
