#include "launcher/flags.hpp"

#include <algorithm>
#include <cctype>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ddp/error.hpp"

namespace ddprun {

namespace {

using K = FlagKind;

// torchrun 2.x's flags (reference: torchrun-compat.md) followed by ddprun's own.
const FlagSpec kFlags[] = {
    {"nnodes", 0, K::kValue, "1:1", "Nodes and workers", "number of nodes, N or MIN:MAX (MIN:MAX needs c10d)",
     nullptr, "", "N[:M]"},
    {"nproc-per-node", 0, K::kValue, "1", "Nodes and workers",
     "workers per node: N, auto (GPUs, else CPUs), cpu (CPU count), gpu (visible GPUs)", nullptr, "auto cpu gpu",
     "N"},
    {"node-rank", 0, K::kValue, "0", "Nodes and workers",
     "this node's index, 0..nnodes-1 (static rendezvous; c10d ignores it)", nullptr, "", "N"},
    {"standalone", 0, K::kFlag, "", "Rendezvous", "single node: a store on localhost at a free port, a random run id"},
    {"master-addr", 0, K::kValue, "127.0.0.1", "Rendezvous", "address of node 0, which hosts the store (static)",
     nullptr, "", "HOST"},
    {"master-port", 0, K::kValue, "29500", "Rendezvous", "port of node 0's store (static)", nullptr, "", "PORT"},
    {"local-addr", 0, K::kValue, "", "Rendezvous",
     "this node's address as other nodes see it (identity, rank order, MASTER_ADDR)", nullptr, "", "HOST"},
    {"rdzv-backend", 0, K::kValue, "static", "Rendezvous",
     "static; c10d: dynamic rounds in a store at --rdzv-endpoint; etcd, etcd-v2: dynamic rounds in etcd (v3 API)",
     nullptr,
     "static c10d etcd etcd-v2", "NAME"},
    {"rdzv-endpoint", 0, K::kValue, "", "Rendezvous",
     "host[:port] of the rendezvous store (c10d default port 29400; IPv6 as [addr]:port; port 0, one node only: "
     "this node hosts it at a free port, as torchrun 2.x's --standalone does); etcd: its members, "
     "host[:port][,host[:port]...] (default port 2379)",
     nullptr, "",
     "HOST[:PORT]"},
    {"no-slurm", 0, K::kFlag, "", "Rendezvous",
     "ignore SLURM_*: in an srun step ddprun otherwise takes the node count, node rank, store host (the step's "
     "first node), a port from the job and step ids and the run id from Slurm"},
    {"rdzv-id", 0, K::kValue, "none", "Rendezvous", "job id shared by all nodes", nullptr, "", "ID"},
    {"rdzv-conf", 0, K::kValue, "", "Rendezvous",
     "k=v,...: join_timeout=600 last_call_timeout=30 close_timeout=30 read_timeout=60 keep_alive_interval=5 "
     "keep_alive_max_attempt=3 is_host=0|1 (seconds); ddprun's replace_timeout=0 (a loss that leaves fewer than "
     "MIN nodes waits this long for nodes to take the lost ones' places; 0: the job stops); etcd: "
     "protocol=http|https cacert=PEM cert=PEM key=PEM timeout=SECONDS (join_timeout)",
     nullptr, "", "K=V,..."},
    {"max-restarts", 0, K::kValue, "0", "Supervision", "restarts of the whole worker group before failing", nullptr,
     "", "N"},
    {"monitor-interval", 0, K::kValue, "0.1", "Supervision",
     "accepted for compatibility: ddprun notices exits and waiting nodes at once", nullptr, "", "SECONDS"},
    {"shutdown-timeout", 0, K::kValue, "30", "Supervision", "seconds between SIGTERM and SIGKILL at teardown",
     "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "", "SECONDS"},
    {"signals-to-handle", 0, K::kValue, "SIGTERM,SIGINT,SIGHUP", "Supervision",
     "signals forwarded to workers before stopping (SIGUSR1/SIGUSR2 are always forwarded; SIGQUIT dumps every "
     "rank's stack unless listed here)",
     nullptr, "", "SIG,..."},
    {"hang-timeout", 0, K::kValue, "0", "Supervision",
     "when no rank made progress (an output line, a touch of $DDPRUN_HEARTBEAT_FILE, a libddp collective) for "
     "this long: show every "
     "rank's stack, name the ranks that differ, stop the job, exit 124 (0: off)",
     nullptr, "", "SECONDS"},
    {"no-stack-dumps", 0, K::kFlag, "", "Supervision",
     "no stack bootstrap on the workers' PYTHONPATH, no stacks on SIGQUIT (which then stops, as torchrun's), at a "
     "failure or a hang"},
    {"start-method", 0, K::kValue, "spawn", "Supervision", "spawn, fork or forkserver (accepted for compatibility)",
     nullptr, "spawn fork forkserver", "NAME"},
    {"event-log-handler", 0, K::kValue, "null", "Supervision",
     "null, console or dynamic_rendezvous (accepted for compatibility: ddprun keeps no torchelastic event log)",
     nullptr, "null console dynamic_rendezvous", "NAME"},
    {"role", 0, K::kValue, "default", "Worker command", "role name (ROLE_NAME)", nullptr, "", "NAME"},
    {"module", 'm', K::kFlag, "", "Worker command", "run the script as 'python -m'"},
    {"no-python", 0, K::kFlag, "", "Worker command", "run the script directly, not through python"},
    {"run-path", 0, K::kFlag, "", "Worker command", "run the script through python (as runpy.run_path would); takes precedence over --no-python and --module"},
    {"virtual-local-rank", 0, K::kFlag, "", "Worker command",
     "LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES=<its GPU> for every worker (its entry of CUDA_VISIBLE_DEVICES: one each)"},
    {"preload", 0, K::kValue, "", "Worker command",
     "import these Python modules once per node (e.g. torch,numpy) in a warm process and fork every worker from "
     "it, restarts too (docs/preload.md)",
     nullptr, "", "MODULES"},
    {"numa-binding", 0, K::kValue, "", "Worker command",
     "bind each worker to the CPUs near the GPU of its local rank: node, socket, exclusive or core-complex "
     "(torchrun's modes)",
     nullptr, "node socket exclusive core-complex", "MODE"},
    {"log-dir", 0, K::kValue, "", "Output", "base folder for per-rank log files", nullptr, "", "DIR"},
    {"redirects", 'r', K::kValue, "0", "Output",
     "send output to log files only: 0 none, 1 stdout, 2 stderr, 3 both, or a map 0:1,1:2", nullptr, "0 1 2 3",
     "MAP"},
    {"tee", 't', K::kValue, "0", "Output", "write output to log files and the console: values as --redirects",
     nullptr, "0 1 2 3", "MAP"},
    {"local-ranks-filter", 0, K::kValue, "", "Output", "only these local ranks reach the console, e.g. 0,2", nullptr,
     "", "N,..."},
    {"log-line-prefix-template", 0, K::kValue, "[rank${rank}]:", "Output",
     "prefix of every forwarded line; ${rank} ${local_rank} ${role_name} ${hostname}; empty = raw",
     "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "", "TEMPLATE"},
    {"log-timestamps", 0, K::kFlag, "", "Output", "prefix forwarded lines with the time they were read"},
    {"no-worker-tty", 0, K::kFlag, "", "Output",
     "workers write into pipes also when ddprun's output is a terminal (by default each worker then writes into "
     "a pseudo-terminal of its own: isatty() is true, C stdio flushes each line, the width is the terminal's less "
     "the prefix)"},
    {"duplicate-stdout-filters", 0, K::kValue, "", "Output",
     "copy the --tee'd stdout lines that contain any of these strings (',,' is a comma) into the attempt's "
     "filtered_stdout.log",
     nullptr, "", "TEXT,..."},
    {"duplicate-stderr-filters", 0, K::kValue, "", "Output",
     "the same for stderr, into filtered_stderr.log", nullptr, "", "TEXT,..."},
    {"logs-specs", 0, K::kValue, "", "Output",
     "default (torchrun's own log layout, which ddprun writes); other names are Python plug-ins, not supported",
     nullptr, "default", "NAME"},
    {"log-level", 0, K::kValue, "warning", "Output", "ddprun's own messages: debug, info, warning, error", "LOGLEVEL",
     "debug info warning error", "LEVEL"},
    {"summary-json", 0, K::kValue, "", "Output",
     "write this node's ranks' outcome and what ended the job as JSON to this path ({host}: this host's name)",
     nullptr, "", "FILE"},
    // Never from PET_HELP or PET_VERSION (torchrun has no such fallback): a variable left in
    // the environment must not turn every job into a help or version print.
    {"help", 'h', K::kFlag, "", "Other", "show this help and exit", nullptr, nullptr, "VALUE", false},
    {"version", 0, K::kFlag, "", "Other", "show the version and exit", nullptr, nullptr, "VALUE", false},
    {"dump-stacks", 0, K::kFlag, "", "Other",
     "ddprun --dump-stacks [PID]: print every rank's stack in the output of the running ddprun job (PID: which "
     "one, when several run); the job runs on",
     nullptr, nullptr, "VALUE", false},
};

}  // namespace

std::span<const FlagSpec> flag_table() { return kFlags; }

const FlagSpec* find_flag(std::string_view name) {
  for (auto& f : kFlags)
    if (name == f.name) return &f;
  return nullptr;
}

const FlagSpec& lookup_long_flag(const std::string& raw) {
  std::string name = raw;
  std::replace(name.begin(), name.end(), '_', '-');
  if (auto* f = find_flag(name)) return *f;
  std::vector<const FlagSpec*> matches;
  for (auto& f : kFlags)
    if (std::string_view(f.name).starts_with(name)) matches.push_back(&f);
  if (matches.size() == 1) return *matches[0];
  if (matches.empty()) throw ddp::UsageError(fmt::format("unrecognized argument --{} (see ddprun --help)", raw));
  std::vector<std::string> names;
  for (auto* m : matches) names.push_back(std::string("--") + m->name);
  throw ddp::UsageError(fmt::format("ambiguous option --{} could match {}", raw, fmt::join(names, ", ")));
}

std::string pet_name(const FlagSpec& f) {
  std::string n = "PET_";
  for (const char* p = f.name; *p; ++p) n += *p == '-' ? '_' : static_cast<char>(std::toupper(*p));
  return n;
}

std::string help_text() {
  CLI::App app("ddprun: launches and supervises distributed training workers; a drop-in for torchrun.",
               "ddprun");
  app.set_help_flag();  // ddprun handles -h itself
  app.footer(
      "\nUnderscore spellings (--nproc_per_node) and unambiguous prefixes are accepted.\n"
      "Every option but --help and --version falls back to the environment variable PET_<NAME>\n"
      "(PET_NPROC_PER_NODE=4).\n"
      "Everything after the training script is passed to the script.");
  std::string sink;
  bool bsink = false;
  for (auto& f : kFlags) {
    std::string names;
    if (f.short_name) names = fmt::format("-{},", f.short_name);
    names += fmt::format("--{}", f.name);
    std::string help = f.help;
    if (f.extra_env) help += fmt::format(" (env {})", f.extra_env);
    CLI::Option* o = f.kind == K::kFlag ? app.add_flag(names, bsink, help) : app.add_option(names, sink, help);
    if (f.kind == K::kValue) o->type_name(f.metavar);
    if (*f.def) o->default_str(f.def);
    o->group(f.group);
  }
  app.add_option("training_script", sink,
                 "the worker program (a .py script, a module with -m, or an executable), then its arguments")
      ->type_name("");
  return app.help();
}

}  // namespace ddprun
