// ddprun's command line: torchrun 2.x's flags (dash and underscore spellings, PET_<NAME>
// environment fallbacks, unambiguous prefixes of long flags) plus ddprun's own.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <algorithm>

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
  // Whether any rank's stream goes to a file.
  bool any() const {
    return all != 0 || std::any_of(per_rank.begin(), per_rank.end(), [](const auto& r) { return r.second != 0; });
  }
};

// --rdzv-conf, typed (torchrun's keys and defaults; seconds unless said otherwise).
struct RdzvConf {
  double join_timeout = 600;       // a whole round join
  double last_call_timeout = 30;   // extra wait once MIN nodes are in
  double close_timeout = 30;       // closing the rendezvous at the end
  double read_timeout = 60;        // reaching the endpoint's store, and each store call
  double heartbeat_timeout = 5;    // one keep-alive call
  double keep_alive_interval = 5;  // how often a node says it is alive
  int keep_alive_max_attempt = 3;  // silent this many intervals: the node is lost
  double replace_timeout = 0;      // ddprun's: a loss below MIN waits this long for newcomers (0: stops)
  std::optional<bool> is_host;     // host the store at the endpoint (default: inferred)
  std::map<std::string, std::string> raw;  // every key as given (backend-specific ones too)
};

struct Options {
  // Nodes and workers
  int min_nodes = 1, max_nodes = 1;
  std::string nproc_per_node_spec = "1";  // as given: N, auto, cpu, gpu
  int nproc_per_node = 1;                 // resolved
  int node_rank = 0;
  // Rendezvous
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;        // as given
  std::string rdzv_host;            // dynamic backends: the endpoint's host (no brackets)
  int rdzv_port = 29400;            // dynamic backends: the endpoint's port
  std::string rdzv_id = "none";
  RdzvConf rdzv_conf;
  bool standalone = false;
  // false with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (c10d, etcd, --standalone), as in torchrun
  // 2.4+: the workers get no agent store, and each round's rank 0 worker hosts theirs.
  bool share_worker_store = true;
  bool no_slurm = false;  // --no-slurm: nothing derived from SLURM_* (launcher/slurm.hpp)
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string local_addr;
  // Supervision
  int max_restarts = 0;
  double monitor_interval = 0.1;  // accepted for compatibility; ddprun is event driven
  double shutdown_timeout = 30;
  std::vector<int> signals_to_handle;  // signal numbers
  // The signals that stop the job: --signals-to-handle, and SIGINT always. A Ctrl-C that
  // is not in the list stops the workers with SIGTERM within --shutdown-timeout, as
  // torchrun's KeyboardInterrupt does, instead of ending ddprun at once (and the workers
  // with it, by SIGKILL). forwarded(): what a stop signal sends the workers.
  std::vector<int> stop_signals() const {
    auto s = signals_to_handle;
    if (std::find(s.begin(), s.end(), SIGINT) == s.end()) s.push_back(SIGINT);
    return s;
  }
  int forwarded(int sig) const {
    bool listed = std::find(signals_to_handle.begin(), signals_to_handle.end(), sig) != signals_to_handle.end();
    return sig == SIGINT && !listed ? SIGTERM : sig;
  }
  std::string start_method = "spawn";
  std::string role = "default";
  // Stacks (docs/stacks.md): the worker bootstrap and the triggers; --hang-timeout (0: off).
  bool stack_dumps = true;
  double hang_timeout = 0;
  // Worker command
  bool module = false, no_python = false, run_path = false;
  bool virtual_local_rank = false;
  std::vector<std::string> preload;  // --preload: modules a warm process imports (docs/preload.md)
  std::string script;
  std::vector<std::string> script_args;
  // Output
  std::string log_dir;
  StdMap redirects, tee;
  std::optional<std::set<int>> local_ranks_filter;
  std::optional<std::string> log_line_prefix_template;
  bool log_timestamps = false;
  bool worker_tty = true;  // a worker stream shown on a terminal is a pseudo-terminal (not --no-worker-tty)
  // --duplicate-std{out,err}-filters: [0] stdout's, [1] stderr's ("" items dropped).
  std::vector<std::string> duplicate_filters[2];
  std::string log_level = "warning";
  std::string summary_json;
  std::string numa_binding;  // --numa-binding's mode ("": none)
  // Not supported yet, kept to refuse with a clear error
  std::string logs_specs;

  // Derived
  bool help = false, version = false;
  pid_t dump_stacks = -1;  // --dump-stacks [PID]: 0 = the only job on this machine
  std::string help_text;
  std::vector<std::string> warnings;  // printed once logging is set up (e.g. an ignored flag)
  std::vector<std::string> infos;     // printed at info level once logging is set up
  std::vector<std::set<int>> worker_cpus;  // --numa-binding: each local rank's CPUs (numa.hpp)
  // The flags given explicitly (command line or PET_*): canonical name -> how, e.g.
  // "node-rank" -> "--node-rank" or "PET_NODE_RANK". Anything absent took its default.
  std::map<std::string, std::string> given;

  bool dynamic() const { return rdzv_backend != "static"; }
};

// Parses argv (argv[0] excluded) with env as the PET_* source. Throws ddp::UsageError with
// one line naming the flag and what is accepted. nproc_per_node "gpu"/"auto" is resolved
// with gpu_count(), "cpu"/"auto" with the CPU count.
Options parse_options(const std::vector<std::string>& args,
                      const std::map<std::string, std::string>& env);

// Parses --rdzv-conf "k=v,k=v" (torchrun's rules: split on ',', then on the first '=',
// keys and values stripped). A bad value throws UsageError naming the key; a key unknown to
// `backend` is kept in raw and reported in warnings.
RdzvConf parse_rdzv_conf(const std::string& source, const std::string& value, const std::string& backend,
                         std::vector<std::string>& warnings);

// Splits "host", "host:port", "[v6]" or "[v6]:port"; port is default_port when absent, 0
// only when allow_zero. Throws UsageError naming source.
void parse_endpoint(const std::string& source, const std::string& value, int default_port, std::string& host,
                    int& port, bool allow_zero = false);

// Parses --redirects/--tee values: "0".."3" or "0:1,1:2". Throws UsageError.
StdMap parse_std_map(const std::string& flag, const std::string& value);
// --duplicate-std{out,err}-filters: "a,,b,c" -> {"a,b", "c"}; empty items are dropped.
std::vector<std::string> parse_filter_list(const std::string& value);

// "SIGTERM", "TERM" or "15" -> 15; throws UsageError naming the flag.
int parse_signal(const std::string& flag, const std::string& name);
// Whether the worker program runs as it is, not as `$PYTHON_EXEC -u script`: --no-python,
// or an executable that is no .py and no Python program (an ELF binary, or a "#!" line
// whose interpreter is not a python: a shell script). A Python file, executable or not, with
// or without its own "#!python" line, runs under $PYTHON_EXEC -u as under torchrun.
bool runs_directly(const Options& o);

std::string signal_name(int sig);  // 15 -> "SIGTERM"

// The environment as a map (for parse_options).
std::map<std::string, std::string> current_environment();

}  // namespace ddprun
