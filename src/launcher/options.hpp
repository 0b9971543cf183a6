// ddprun's command line: torchrun 2.x's flags (dash and underscore spellings, PET_<NAME>
// environment fallbacks, unambiguous prefixes of long flags) plus ddprun's own.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ddprun {

// Per-rank stream routing of --redirects / --tee: bit 1 stdout, bit 2 stderr.
struct StdMap {
  int all = 0;                   // applies to ranks not in per_rank
  std::map<int, int> per_rank;   // "0:1,1:2"
  int of(int local_rank) const {
    auto it = per_rank.find(local_rank);
    return it == per_rank.end() ? all : it->second;
  }
};

struct Options {
  // Nodes and workers
  int min_nodes = 1, max_nodes = 1;
  std::string nproc_per_node_spec = "1";  // as given: N, auto, cpu, gpu
  int nproc_per_node = 1;                 // resolved
  int node_rank = 0;
  // Rendezvous
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::string rdzv_id = "none";
  std::map<std::string, std::string> rdzv_conf;
  bool standalone = false;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string local_addr;
  // Supervision
  int max_restarts = 0;
  double monitor_interval = 0.1;  // accepted for compatibility; ddprun is event driven
  double shutdown_timeout = 30;
  std::vector<int> signals_to_handle;  // signal numbers
  std::string start_method = "spawn";
  std::string role = "default";
  // Worker command
  bool module = false, no_python = false, run_path = false;
  bool virtual_local_rank = false;
  std::string script;
  std::vector<std::string> script_args;
  // Output
  std::string log_dir;
  StdMap redirects, tee;
  std::optional<std::set<int>> local_ranks_filter;
  std::optional<std::string> log_line_prefix_template;
  bool log_timestamps = false;
  std::string log_level = "warning";
  std::string summary_json;
  // Not supported yet, kept to refuse with a clear error
  std::string logs_specs, numa_binding;

  // Derived
  bool help = false, version = false;
  std::string help_text;
};

// Parses argv (argv[0] excluded) with env as the PET_* source. Throws ddp::UsageError with
// one line naming the flag and what is accepted. nproc_per_node "gpu"/"auto" is resolved
// with gpu_count(), "cpu"/"auto" with the CPU count.
Options parse_options(const std::vector<std::string>& args,
                      const std::map<std::string, std::string>& env);

// Parses --redirects/--tee values: "0".."3" or "0:1,1:2". Throws UsageError.
StdMap parse_std_map(const std::string& flag, const std::string& value);

// "SIGTERM", "TERM" or "15" -> 15; throws UsageError naming the flag.
int parse_signal(const std::string& flag, const std::string& name);
std::string signal_name(int sig);  // 15 -> "SIGTERM"

// The environment as a map (for parse_options).
std::map<std::string, std::string> current_environment();

}  // namespace ddprun
