// What each worker runs and sees: its command line and its environment, exactly as
// torchrun 2.x builds them (reference: torchrun-compat.md).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "launcher/options.hpp"

namespace ddprun {

// The job as this node sees it once rendezvous is done.
struct JobPlan {
  int world_size = 1;
  int rank_base = 0;  // global rank of this node's local rank 0
  int group_rank = 0;
  int group_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool use_agent_store = false;
  std::string run_id = "none";
  std::string hostname;
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT: counted restarts before this round
  int64_t round = -1;     // the dynamic rendezvous's round (-1: static)
};

struct WorkerCommand {
  std::string path;               // what execve runs
  std::vector<std::string> argv;  // argv[0] first
  std::string interpreter;        // the Python it runs the script with ("" when run directly)
};

// [$PYTHON_EXEC|python3, -u, (-m), script, args] or [script, args] for --no-python and
// executables that are not .py files; ${local_rank} in args replaced.
WorkerCommand worker_command(const Options& o, int local_rank, const std::map<std::string, std::string>& env);

// What every worker of this node gets, whatever its rank and round: ddprun's environment
// plus the node's torchrun variables.
std::map<std::string, std::string> node_environment(const Options& o, const std::map<std::string, std::string>& base);

// --preload's warm process: node_environment without any of the variables that
// worker_environment sets per rank and round, even where ddprun's own environment has them
// (a Kubeflow pod exports RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for its torchrun):
// a module that reads them at import finds none, as the warm process has no rank.
std::map<std::string, std::string> warm_environment(const Options& o, const std::map<std::string, std::string>& base);

// The worker's whole environment: node_environment plus its rank's and round's variables.
std::map<std::string, std::string> worker_environment(const Options& o, const JobPlan& plan, int local_rank,
                                                      const std::string& error_file,
                                                      const std::map<std::string, std::string>& base);

// True when OMP_NUM_THREADS will be set to 1 for the workers (torchrun's rule), so that
// the launcher prints torchrun's warning once.
bool sets_omp_threads(const Options& o, const std::map<std::string, std::string>& base);

std::vector<std::string> to_envp(const std::map<std::string, std::string>& env);

}  // namespace ddprun
