#include "launcher/options.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <csignal>
#include <cstring>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ddp/error.hpp"
#include "launcher/gpu.hpp"
#include "launcher/process.hpp"
#include "launcher/version.hpp"

extern char** environ;

namespace ddprun {

using ddp::UsageError;

namespace {

enum class Kind { kValue, kFlag };

struct FlagSpec {
  const char* name;   // canonical long name, dashes
  char short_name;    // 0 if none
  Kind kind;
  const char* def;    // default shown in --help ("" = none)
  const char* group;
  const char* help;
  const char* extra_env = nullptr;  // another environment fallback after PET_<NAME>
};

// torchrun 2.x's flags (reference: torchrun-compat.md) followed by ddprun's own.
const FlagSpec kFlags[] = {
    {"nnodes", 0, Kind::kValue, "1:1", "Nodes and workers", "number of nodes, N or MIN:MAX"},
    {"nproc-per-node", 0, Kind::kValue, "1", "Nodes and workers",
     "workers per node: N, auto (GPUs, else CPUs), cpu (CPU count), gpu (visible GPUs)"},
    {"node-rank", 0, Kind::kValue, "0", "Nodes and workers", "this node's index, 0..nnodes-1 (static rendezvous)"},
    {"standalone", 0, Kind::kFlag, "", "Rendezvous", "single node: a store on localhost at a free port, a random run id"},
    {"master-addr", 0, Kind::kValue, "127.0.0.1", "Rendezvous", "address of node 0, which hosts the store"},
    {"master-port", 0, Kind::kValue, "29500", "Rendezvous", "port of node 0's store"},
    {"local-addr", 0, Kind::kValue, "", "Rendezvous", "this node's address as other nodes see it"},
    {"rdzv-backend", 0, Kind::kValue, "static", "Rendezvous", "static (c10d, etcd, etcd-v2: not supported yet)"},
    {"rdzv-endpoint", 0, Kind::kValue, "", "Rendezvous", "host[:port] of the rendezvous backend"},
    {"rdzv-id", 0, Kind::kValue, "none", "Rendezvous", "job id shared by all nodes"},
    {"rdzv-conf", 0, Kind::kValue, "", "Rendezvous", "k=v,...: join_timeout=600, keep_alive_interval=5, keep_alive_max_attempt=3 (seconds)"},
    {"max-restarts", 0, Kind::kValue, "0", "Supervision", "restarts of the whole worker group before failing"},
    {"monitor-interval", 0, Kind::kValue, "0.1", "Supervision",
     "accepted for compatibility: ddprun notices exits at once"},
    {"shutdown-timeout", 0, Kind::kValue, "30", "Supervision", "seconds between SIGTERM and SIGKILL at teardown",
     "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"},
    {"signals-to-handle", 0, Kind::kValue, "SIGTERM,SIGINT,SIGHUP,SIGQUIT", "Supervision",
     "signals forwarded to workers before stopping (SIGUSR1/SIGUSR2 are always forwarded)"},
    {"start-method", 0, Kind::kValue, "spawn", "Supervision", "spawn, fork or forkserver (accepted for compatibility)"},
    {"role", 0, Kind::kValue, "default", "Worker command", "role name (ROLE_NAME)"},
    {"module", 'm', Kind::kFlag, "", "Worker command", "run the script as 'python -m'"},
    {"no-python", 0, Kind::kFlag, "", "Worker command", "run the script directly, not through python"},
    {"run-path", 0, Kind::kFlag, "", "Worker command", "run the script through python (as runpy.run_path would)"},
    {"virtual-local-rank", 0, Kind::kFlag, "", "Worker command",
     "LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES=<its GPU> for every worker"},
    {"numa-binding", 0, Kind::kValue, "", "Worker command", "not supported yet"},
    {"log-dir", 0, Kind::kValue, "", "Output", "base folder for per-rank log files"},
    {"redirects", 'r', Kind::kValue, "0", "Output",
     "send output to log files only: 0 none, 1 stdout, 2 stderr, 3 both, or a map 0:1,1:2"},
    {"tee", 't', Kind::kValue, "0", "Output", "write output to log files and the console: values as --redirects"},
    {"local-ranks-filter", 0, Kind::kValue, "", "Output", "only these local ranks reach the console, e.g. 0,2"},
    {"log-line-prefix-template", 0, Kind::kValue, "[rank${rank}]:", "Output",
     "prefix of every forwarded line; ${rank} ${local_rank} ${role_name} ${hostname}; empty = raw",
     "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"},
    {"log-timestamps", 0, Kind::kFlag, "", "Output", "prefix forwarded lines with the time they were read"},
    {"logs-specs", 0, Kind::kValue, "", "Output", "not supported yet"},
    {"log-level", 0, Kind::kValue, "warning", "Output", "ddprun's own messages: debug, info, warning, error",
     "LOGLEVEL"},
    {"summary-json", 0, Kind::kValue, "", "Output", "write the job's outcome (every rank) as JSON to this path"},
    {"help", 'h', Kind::kFlag, "", "Other", "show this help and exit"},
    {"version", 0, Kind::kFlag, "", "Other", "show the version and exit"},
};

const FlagSpec* find_exact(std::string_view name) {
  for (auto& f : kFlags)
    if (name == f.name) return &f;
  return nullptr;
}

std::string pet_name(const FlagSpec& f) {
  std::string n = "PET_";
  for (const char* p = f.name; *p; ++p) n += *p == '-' ? '_' : static_cast<char>(std::toupper(*p));
  return n;
}

// A value and where it came from ("--master-port" or "PET_MASTER_PORT").
struct Given {
  std::string value;
  std::string source;
};

// Long option lookup with argparse's rules: underscores equal dashes, an unambiguous
// prefix selects its flag.
const FlagSpec& lookup_long(const std::string& raw) {
  std::string name = raw;
  std::replace(name.begin(), name.end(), '_', '-');
  if (auto* f = find_exact(name)) return *f;
  std::vector<const FlagSpec*> matches;
  for (auto& f : kFlags)
    if (std::string_view(f.name).starts_with(name)) matches.push_back(&f);
  if (matches.size() == 1) return *matches[0];
  if (matches.empty()) throw UsageError(fmt::format("unrecognized argument --{} (see ddprun --help)", raw));
  std::vector<std::string> names;
  for (auto* m : matches) names.push_back(std::string("--") + m->name);
  throw UsageError(fmt::format("ambiguous option --{} could match {}", raw, fmt::join(names, ", ")));
}

bool truthy(const std::string& source, const std::string& v) {
  std::string l = v;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  if (l == "1" || l == "true" || l == "yes" || l == "on") return true;
  if (l == "0" || l == "false" || l == "no" || l == "off" || l.empty()) return false;
  throw UsageError(fmt::format("{}: expected 1 or 0, got '{}'", source, v));
}

template <typename T>
bool parse_number(const std::string& s, T& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

int parse_int(const Given& g, long lo, long hi, const char* what) {
  long v = 0;
  if (!parse_number(g.value, v) || v < lo || v > hi)
    throw UsageError(fmt::format("{}: expected {}, got '{}'", g.source, what, g.value));
  return static_cast<int>(v);
}

double parse_seconds(const Given& g, bool allow_zero) {
  double v = 0;
  if (!parse_number(g.value, v) || v < 0 || (!allow_zero && v == 0) || v > 1e9)
    throw UsageError(fmt::format("{}: expected a {} number of seconds, got '{}'", g.source,
                                 allow_zero ? "non-negative" : "positive", g.value));
  return v;
}

std::string help_text() {
  CLI::App app("ddprun: launches and supervises distributed training workers; a drop-in for torchrun.",
               "ddprun");
  app.set_help_flag();  // ddprun handles -h itself
  app.footer(
      "\nUnderscore spellings (--nproc_per_node) and unambiguous prefixes are accepted.\n"
      "Every option falls back to the environment variable PET_<NAME> (PET_NPROC_PER_NODE=4).\n"
      "Everything after the training script is passed to the script.");
  std::string sink;
  bool bsink = false;
  for (auto& f : kFlags) {
    std::string names;
    if (f.short_name) names = fmt::format("-{},", f.short_name);
    names += fmt::format("--{}", f.name);
    std::string help = f.help;
    if (f.extra_env) help += fmt::format(" (env {})", f.extra_env);
    CLI::Option* o = f.kind == Kind::kFlag ? app.add_flag(names, bsink, help) : app.add_option(names, sink, help);
    if (f.kind == Kind::kValue) o->type_name("VALUE");
    if (*f.def) o->default_str(f.def);
    o->group(f.group);
  }
  app.add_option("training_script", sink,
                 "the worker program (a .py script, a module with -m, or an executable), then its arguments")
      ->type_name("");
  return app.help();
}

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

std::map<std::string, std::string> current_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) env.emplace(std::string(*e, static_cast<size_t>(eq - *e)), std::string(eq + 1));
  }
  return env;
}

StdMap parse_std_map(const std::string& flag, const std::string& value) {
  StdMap m;
  auto bad = [&] {
    return UsageError(fmt::format("{}: expected 0 (none), 1 (stdout), 2 (stderr), 3 (both) or a map like "
                                  "0:1,1:2; got '{}'",
                                  flag, value));
  };
  int v = 0;
  if (parse_number(value, v)) {
    if (v < 0 || v > 3) throw bad();
    m.all = v;
    return m;
  }
  size_t start = 0;
  while (start < value.size()) {
    size_t end = value.find(',', start);
    if (end == std::string::npos) end = value.size();
    std::string item = value.substr(start, end - start);
    auto colon = item.find(':');
    int rank = 0, s = 0;
    if (colon == std::string::npos || !parse_number(item.substr(0, colon), rank) || rank < 0 ||
        !parse_number(item.substr(colon + 1), s) || s < 0 || s > 3)
      throw bad();
    m.per_rank[rank] = s;
    start = end + 1;
  }
  if (m.per_rank.empty()) throw bad();
  return m;
}

int parse_signal(const std::string& flag, const std::string& name) {
  int n = 0;
  if (parse_number(name, n) && n > 0 && n < NSIG) return n;
  std::string up = name;
  std::transform(up.begin(), up.end(), up.begin(), [](unsigned char c) { return std::toupper(c); });
  if (!up.starts_with("SIG")) up = "SIG" + up;
  for (int s = 1; s < NSIG; ++s)
    if (signal_name(s) == up) return s;
  throw UsageError(fmt::format("{}: unknown signal '{}' (e.g. SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1)", flag, name));
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : fmt::format("SIG{}", sig);
}

Options parse_options(const std::vector<std::string>& args, const std::map<std::string, std::string>& env) {
  Options o;
  std::map<std::string, Given> given;  // canonical name -> value

  // 1. Split torchrun's options from the script and its arguments.
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    const FlagSpec* spec = nullptr;
    std::optional<std::string> inline_value;
    std::string shown;
    if (a.starts_with("--")) {
      std::string body = a.substr(2);
      auto eq = body.find('=');
      if (eq != std::string::npos) inline_value = body.substr(eq + 1), body.resize(eq);
      spec = &lookup_long(body);
      shown = std::string("--") + spec->name;
    } else if (a.size() >= 2 && a[0] == '-' && !std::isdigit(static_cast<unsigned char>(a[1]))) {
      for (auto& f : kFlags)
        if (f.short_name == a[1]) spec = &f;
      if (!spec) throw UsageError(fmt::format("unrecognized argument {} (see ddprun --help)", a));
      if (a.size() > 2) inline_value = a.substr(a[2] == '=' ? 3 : 2);
      shown = fmt::format("-{}", a[1]);
    } else {
      break;  // the training script
    }
    if (spec->kind == Kind::kFlag) {
      if (inline_value && spec->short_name && !a.starts_with("--"))
        throw UsageError(fmt::format("{}: takes no value, got '{}'", shown, *inline_value));
      bool on = inline_value ? truthy(shown, *inline_value) : true;
      given[spec->name] = {on ? "1" : "0", shown};
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) throw UsageError(fmt::format("{}: expected a value", shown));
      inline_value = args[++i];
    }
    given[spec->name] = {*inline_value, shown};
  }
  if (i < args.size()) {
    o.script = args[i];
    o.script_args.assign(args.begin() + static_cast<long>(i) + 1, args.end());
  }

  // 2. Environment fallbacks for what the command line did not give.
  for (auto& f : kFlags) {
    if (given.count(f.name)) continue;
    for (std::string var : {pet_name(f), std::string(f.extra_env ? f.extra_env : "")}) {
      if (var.empty()) continue;
      auto it = env.find(var);
      if (it == env.end()) continue;
      given[f.name] = {it->second, var};
      break;
    }
  }
  auto has = [&](const char* n) { return given.count(n) > 0; };
  auto flag = [&](const char* n) { return has(n) && truthy(given[n].source, given[n].value); };
  auto value = [&](const char* n) -> const std::string& { return given[n].value; };

  if (flag("help")) {
    o.help = true;
    o.help_text = help_text();
    return o;
  }
  if (flag("version")) {
    o.version = true;
    return o;
  }

  // 3. Convert and validate, one flag at a time.
  o.standalone = flag("standalone");
  o.module = flag("module");
  o.no_python = flag("no-python");
  o.run_path = flag("run-path");
  o.virtual_local_rank = flag("virtual-local-rank");
  o.log_timestamps = flag("log-timestamps");

  if (has("nnodes")) {
    const auto& g = given["nnodes"];
    auto colon = g.value.find(':');
    int lo = 0, hi = 0;
    bool ok = colon == std::string::npos
                  ? parse_number(g.value, lo) && (hi = lo, true)
                  : parse_number(g.value.substr(0, colon), lo) && parse_number(g.value.substr(colon + 1), hi);
    if (!ok || lo < 1 || hi < lo)
      throw UsageError(fmt::format("{}: expected N or MIN:MAX with 1 <= MIN <= MAX, got '{}'", g.source, g.value));
    o.min_nodes = lo;
    o.max_nodes = hi;
  }
  if (has("nproc-per-node")) {
    const auto& g = given["nproc-per-node"];
    o.nproc_per_node_spec = g.value;
    int n = 0;
    if (parse_number(g.value, n)) {
      if (n < 1) throw UsageError(fmt::format("{}: expected a positive integer or auto, cpu, gpu; got '{}'", g.source, g.value));
      o.nproc_per_node = n;
    } else if (g.value == "cpu" || g.value == "auto" || g.value == "gpu") {
      int gpus = g.value == "cpu" ? 0 : gpu_count();
      if (g.value == "gpu" && gpus == 0)
        throw UsageError(fmt::format("{}: 'gpu' but no GPU is visible (CUDA_VISIBLE_DEVICES, driver)", g.source));
      o.nproc_per_node = gpus > 0 ? gpus : static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
    } else {
      throw UsageError(fmt::format("{}: expected a positive integer or auto, cpu, gpu; got '{}'", g.source, g.value));
    }
  }
  if (has("node-rank")) o.node_rank = parse_int(given["node-rank"], 0, 1 << 20, "a node index >= 0");
  if (has("master-addr")) o.master_addr = value("master-addr");
  if (o.master_addr.empty()) throw UsageError(fmt::format("{}: expected a host name or address", given["master-addr"].source));
  if (has("master-port")) o.master_port = parse_int(given["master-port"], 0, 65535, "a port number 0..65535");
  if (has("local-addr")) o.local_addr = value("local-addr");
  if (has("rdzv-backend")) o.rdzv_backend = value("rdzv-backend");
  if (has("rdzv-endpoint")) o.rdzv_endpoint = value("rdzv-endpoint");
  if (has("rdzv-id")) o.rdzv_id = value("rdzv-id");
  if (has("rdzv-conf") && !value("rdzv-conf").empty()) {
    const auto& g = given["rdzv-conf"];
    size_t start = 0;
    while (start < g.value.size()) {
      size_t end = g.value.find(',', start);
      if (end == std::string::npos) end = g.value.size();
      std::string kv = g.value.substr(start, end - start);
      auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0)
        throw UsageError(fmt::format("{}: expected key=value pairs separated by commas, got '{}'", g.source, kv));
      o.rdzv_conf[kv.substr(0, eq)] = kv.substr(eq + 1);
      start = end + 1;
    }
  }
  if (has("max-restarts")) o.max_restarts = parse_int(given["max-restarts"], 0, 1 << 30, "an integer >= 0");
  if (has("monitor-interval")) o.monitor_interval = parse_seconds(given["monitor-interval"], false);
  if (has("shutdown-timeout")) o.shutdown_timeout = parse_seconds(given["shutdown-timeout"], true);
  {
    std::string sigs = has("signals-to-handle") ? value("signals-to-handle") : "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
    std::string src = has("signals-to-handle") ? given["signals-to-handle"].source : "--signals-to-handle";
    size_t start = 0;
    while (start <= sigs.size() && !sigs.empty()) {
      size_t end = sigs.find(',', start);
      if (end == std::string::npos) end = sigs.size();
      std::string s = sigs.substr(start, end - start);
      s.erase(0, s.find_first_not_of(' '));
      s.erase(s.find_last_not_of(' ') + 1);
      if (!s.empty()) {
        int sig = parse_signal(src, s);
        if (sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD)
          throw UsageError(fmt::format("{}: {} cannot be handled", src, signal_name(sig)));
        o.signals_to_handle.push_back(sig);
      }
      start = end + 1;
    }
  }
  if (has("start-method")) {
    o.start_method = value("start-method");
    if (o.start_method != "spawn" && o.start_method != "fork" && o.start_method != "forkserver")
      throw UsageError(fmt::format("{}: expected spawn, fork or forkserver, got '{}'", given["start-method"].source,
                                   o.start_method));
  }
  if (has("role")) o.role = value("role");
  if (has("log-dir")) o.log_dir = value("log-dir");
  if (has("redirects")) o.redirects = parse_std_map(given["redirects"].source, value("redirects"));
  if (has("tee")) o.tee = parse_std_map(given["tee"].source, value("tee"));
  if (has("local-ranks-filter") && !value("local-ranks-filter").empty()) {
    const auto& g = given["local-ranks-filter"];
    std::set<int> ranks;
    size_t start = 0;
    while (start <= g.value.size()) {
      size_t end = g.value.find(',', start);
      if (end == std::string::npos) end = g.value.size();
      int r = 0;
      if (!parse_number(g.value.substr(start, end - start), r) || r < 0)
        throw UsageError(fmt::format("{}: expected local ranks like 0,2; got '{}'", g.source, g.value));
      ranks.insert(r);
      start = end + 1;
    }
    o.local_ranks_filter = ranks;
  }
  if (has("log-line-prefix-template")) o.log_line_prefix_template = value("log-line-prefix-template");
  if (has("log-level")) {
    std::string l = value("log-level");
    std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
    if (l == "warn") l = "warning";
    if (l == "critical" || l == "fatal") l = "error";
    static const std::set<std::string> levels{"trace", "debug", "info", "warning", "error", "off"};
    if (!levels.count(l))
      throw UsageError(fmt::format("{}: expected debug, info, warning or error, got '{}'", given["log-level"].source,
                                   value("log-level")));
    o.log_level = l;
  }
  if (has("summary-json")) o.summary_json = value("summary-json");
  if (has("logs-specs")) o.logs_specs = value("logs-specs");
  if (has("numa-binding")) o.numa_binding = value("numa-binding");

  // 4. Combinations.
  if (o.script.empty()) throw UsageError("the following argument is required: training_script (see ddprun --help)");
  if (o.module && o.no_python)
    throw UsageError("--no-python and --module cannot be used together: a module needs python");
  if (o.module && o.run_path) throw UsageError("--run-path and --module cannot be used together");
  if (o.no_python && o.run_path) throw UsageError("--run-path and --no-python cannot be used together");
  if (o.standalone) {
    if (o.max_nodes > 1)
      throw UsageError(fmt::format("--standalone runs one node, but {} asks for {}", given["nnodes"].source,
                                   value("nnodes")));
    if (o.node_rank != 0)
      throw UsageError(fmt::format("--standalone runs one node, but {} is {}", given["node-rank"].source, o.node_rank));
    o.rdzv_backend = "static";
  }
  if (o.rdzv_backend != "static") {
    if (o.rdzv_backend == "c10d" || o.rdzv_backend == "etcd" || o.rdzv_backend == "etcd-v2")
      throw UsageError(fmt::format("{}: '{}' rendezvous is not supported yet; use static rendezvous (--nnodes N "
                                   "--node-rank I --master-addr H --master-port P) or --standalone",
                                   given["rdzv-backend"].source, o.rdzv_backend));
    throw UsageError(fmt::format("{}: expected static or c10d, got '{}'", given["rdzv-backend"].source, o.rdzv_backend));
  }
  if (!o.rdzv_endpoint.empty() && !o.standalone) {
    // torchrun's static rendezvous takes host[:port] from --rdzv-endpoint over
    // --master-addr/--master-port.
    const auto& g = given["rdzv-endpoint"];
    std::string host = o.rdzv_endpoint;
    auto colon = host.rfind(':');
    if (colon != std::string::npos && host.find(']') == std::string::npos && host.find(':') != colon) colon = std::string::npos;
    if (colon != std::string::npos) {
      Given port{host.substr(colon + 1), g.source};
      o.master_port = parse_int(port, 1, 65535, "host[:port] with a port 1..65535");
      host.resize(colon);
    }
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    if (host.empty()) throw UsageError(fmt::format("{}: expected host[:port], got '{}'", g.source, o.rdzv_endpoint));
    o.master_addr = host;
  }
  if (o.min_nodes != o.max_nodes)
    throw UsageError(fmt::format("{}: elastic node ranges ({}) need c10d rendezvous, which is not supported yet; "
                                 "give a fixed N",
                                 given["nnodes"].source, value("nnodes")));
  if (o.node_rank >= o.max_nodes)
    throw UsageError(fmt::format("{}: node rank {} is outside 0..{} (--nnodes {})", given["node-rank"].source,
                                 o.node_rank, o.max_nodes - 1, o.max_nodes));
  if (o.max_nodes > 1 && o.master_port == 0)
    throw UsageError("--master-port 0 picks a free port, which other nodes cannot know: give a port for --nnodes > 1");
  if (!o.logs_specs.empty())
    throw UsageError(fmt::format("{}: log spec plug-ins are not supported yet; use --log-dir, --tee, --redirects",
                                 given["logs-specs"].source));
  if (!o.numa_binding.empty())
    throw UsageError(fmt::format("{}: NUMA binding is not supported yet", given["numa-binding"].source));

  // 5. The target must exist before any worker starts.
  bool direct = o.no_python || (!o.module && !o.script.ends_with(".py") && is_executable_file(o.script));
  if (o.no_python) {
    auto path = env.find("PATH");
    std::string resolved =
        find_executable(o.script, path == env.end() ? "/usr/local/bin:/usr/bin:/bin" : path->second);
    if (resolved.empty() || (o.script.find('/') != std::string::npos && ::access(o.script.c_str(), F_OK) != 0))
      throw UsageError(fmt::format("training script '{}' not found{}", o.script,
                                   o.script.find('/') == std::string::npos ? " in PATH" : ""));
  } else if (!o.module && !direct) {
    struct stat st {};
    if (::stat(o.script.c_str(), &st) != 0)
      throw UsageError(fmt::format("training script '{}' not found: {}", o.script, ddp::errno_text(errno)));
    if (S_ISDIR(st.st_mode) && ::access((o.script + "/__main__.py").c_str(), F_OK) != 0)
      throw UsageError(fmt::format("training script '{}' is a directory without __main__.py", o.script));
  }
  return o;
}

}  // namespace ddprun
