// The job as this node reports it: every attempt's workers (for --summary-json) as the
// attempts end, and, once no further round follows, what ended the job (report.hpp) and
// how this node leaves the rendezvous.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launcher/options.hpp"
#include "launcher/rendezvous.hpp"
#include "launcher/report.hpp"

namespace ddprun {

class NodeSignals;
class StackDumps;

class JobRecord {
 public:
  // How the last attempt ended on this node.
  struct Ending {
    const NodeSignals& signals;                // a signal that stopped this node
    const std::optional<WorkerResult>& root;   // the root cause, here
    const std::vector<WorkerResult>& workers;  // the last attempt's
    const StackDumps& stacks;                  // where the ranks were; a hang
    const std::optional<RoundEnd>& remote;     // the round ended elsewhere (or the rendezvous ended it)
    const std::string& stop_reason;            // why no further round followed a failure
    int signal() const;                        // the signal that ended the job (0: none)
  };

  JobRecord(const Options& o, Rendezvous& rdzv) : o_(o), rdzv_(rdzv) {}

  void start();
  // After each attempt: its workers (with the attempt's number in each).
  void keep(const std::vector<WorkerResult>& workers, int attempt);
  void end(int restarts);
  // The summary (exit status, root cause, the report's lines, through `show`) and
  // --summary-json.
  void report(const Ending& e, const std::string& run_id, const ShowText& show);
  // The goodbye to the rendezvous.
  void leave(const Ending& e);
  // A join that ended the job (the rendezvous said its goodbye): --summary-json says so
  // with the attempts before it: exit 0, the job succeeded without this node (reason
  // "succeeded"); else reason "rendezvous", the error as its message.
  void report_join_end(const std::string& why, int exit_code, int restarts, const std::string& run_id);
  const JobOutcome& outcome() const { return outcome_; }

 private:
  const Options& o_;
  Rendezvous& rdzv_;
  JobOutcome outcome_;
};

}  // namespace ddprun
