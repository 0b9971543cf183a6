// A stack dump asked on one node, answered by every other (docs/stacks.md, "Several
// nodes"): each node that showed its ranks' stacks appends its answer to the round's
// "dumps/<R>" log, one line "<what>\t<answer>" (the answer is the launcher's, opaque here);
// the node that asked reads that log until every other node of the round has answered, or
// its deadline (whatever the backend does), on threads of its own, and hands what came to
// the caller through the RoundSignal (notify_fd). The log is dropped with its round (forget_round).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/backend.hpp"
#include "rendezvous/round_signal.hpp"

namespace ddprun::rdzv::detail {

inline std::string dumps_log(int64_t r) { return "dumps/" + std::to_string(r); }

// One line of the dumps log: the dump it answers, then the answer (no tab or newline in
// `what`, no newline in `answer`).
std::string dump_answer_line(const std::string& what, const std::string& answer);

class DumpGatherer {
 public:
  explicit DumpGatherer(RoundSignal& signal) : signal_(signal) {}
  ~DumpGatherer();  // ends every gather in progress (reporting nothing) and joins it
  DumpGatherer(const DumpGatherer&) = delete;
  DumpGatherer& operator=(const DumpGatherer&) = delete;

  // Reads round r's dumps log on `b` (a backend object of its own) for `nodes` answers to
  // `what`, until `deadline`; then the RoundSignal gets them (DumpAnswers), all or not, with
  // the time since t0 (when they were asked for).
  void start(std::unique_ptr<Backend> b, int64_t r, std::string what, size_t nodes,
             std::chrono::steady_clock::time_point t0, std::chrono::steady_clock::time_point deadline);

 private:
  // One gather: its reader (the backend calls) and what it read; the gather's own thread
  // reports at the deadline even while the reader is stuck in a call (a frozen store).
  struct Gather {
    std::shared_ptr<Backend> backend;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::string> answers;  // mu
    bool read_all = false, stop = false;  // mu
    std::thread thread;
    std::atomic<bool> done{false};
  };
  void run(Gather& g, int64_t r, const std::string& what, size_t nodes,
           std::chrono::steady_clock::time_point t0, std::chrono::steady_clock::time_point deadline);
  static void read(Gather& g, int64_t r, const std::string& what, size_t nodes,
                   std::chrono::steady_clock::time_point deadline);
  static void stop(Gather& g);

  RoundSignal& signal_;
  std::list<Gather> gathers_;  // the caller's thread only
};

}  // namespace ddprun::rdzv::detail
