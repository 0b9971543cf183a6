#include "launcher/options.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <type_traits>
#include <sys/resource.h>
#include <sys/stat.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ddp/error.hpp"
#include "launcher/fileio.hpp"
#include "launcher/flags.hpp"
#include "launcher/gpu.hpp"
#include "launcher/net.hpp"
#include "launcher/numa.hpp"
#include "launcher/preload.hpp"
#include "launcher/process.hpp"
#include "launcher/slurm.hpp"
#include "launcher/version.hpp"
#include "rendezvous/etcd/http.hpp"

extern char** environ;

namespace ddprun {

using ddp::UsageError;

namespace {

// A value and where it came from ("--master-port" or "PET_MASTER_PORT").
struct Given {
  std::string value;
  std::string source;
};

// The flags given (canonical name -> value), read one at a time by the steps below.
class Flags {
 public:
  std::map<std::string, Given> m;
  bool has(const char* n) const { return m.count(n) > 0; }
  const Given& at(const char* n) const { return m.at(n); }
  const std::string& value(const char* n) const { return m.at(n).value; }
  // The flag's source for messages: how it was given, else its canonical spelling.
  std::string source(const char* n) const { return has(n) ? at(n).source : std::string("--") + n; }
  bool flag(const char* n) const;
  std::string dump_stacks_pid;  // --dump-stacks=PID's PID
};

bool truthy(const std::string& source, const std::string& v) {
  std::string l = v;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  if (l == "1" || l == "true" || l == "yes" || l == "on" || l == "t" || l == "y") return true;
  if (l == "0" || l == "false" || l == "no" || l == "off" || l == "f" || l == "n" || l.empty()) return false;
  // torchrun reads a PET_ switch as bool(int(value)): any other integer is on (as Python's
  // int(): white space around it, a sign, '_' between digits).
  std::string digits = l;
  digits.erase(0, digits.find_first_not_of(" \t\n\r\f\v"));
  digits.erase(digits.find_last_not_of(" \t\n\r\f\v") + 1);
  if (!digits.empty() && (digits[0] == '+' || digits[0] == '-')) digits.erase(0, 1);
  bool number = !digits.empty() && digits.front() != '_' && digits.back() != '_' &&
                digits.find("__") == std::string::npos;
  bool nonzero = false;
  for (char c : digits) {
    number = number && (std::isdigit(static_cast<unsigned char>(c)) || c == '_');
    nonzero = nonzero || (c >= '1' && c <= '9');
  }
  if (number) return nonzero;
  throw UsageError(fmt::format("{}: expected a number (0 is off) or true/false, yes/no, on/off; got '{}'", source, v));
}

bool Flags::flag(const char* n) const { return has(n) && truthy(at(n).source, at(n).value); }

// Without the white space around it (Python's str.strip()).
std::string trim(std::string s) {
  constexpr const char* kSpace = " \t\n\r\f\v";
  s.erase(0, s.find_first_not_of(kSpace));
  s.erase(s.find_last_not_of(kSpace) + 1);
  return s;
}

template <typename T>
bool parse_number(const std::string& text, T& out) {
  // As Python's int() and float() read torchrun's values: spaces (a value read from a file
  // ends with a newline) and a leading '+' are allowed.
  const std::string trimmed = trim(text);
  std::string_view s(trimmed);
  if (s.size() > 1 && s[0] == '+' && s[1] != '+' && s[1] != '-') s.remove_prefix(1);
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(out)) return false;  // NaN compares false with every bound
  }
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
    throw UsageError(fmt::format("{}: expected a {} number of seconds (at most 1e9), got '{}'", g.source,
                                 allow_zero ? "non-negative" : "positive", g.value));
  return v;
}


// Calls f(item) for each comma-separated item of s.
template <typename F>
void for_each_item(const std::string& s, F f) {
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    f(s.substr(start, end - start));
    start = end + 1;
  }
}

// Why h is not a host name or address ("" when it is one): the check of --rdzv-endpoint's
// host, --master-addr and --local-addr.
std::string bad_host(const std::string& h) {
  if (h.empty()) return "no host";
  if (h[0] == '-') return "a host name or address cannot start with '-'";
  if (h.find(':') == std::string::npos) {  // a name or IPv4 address: DNS's lengths (RFC 1035)
    if (h.size() > 253) return fmt::format("a host name is at most 253 characters, this one has {}", h.size());
    for (size_t at = 0, dot; at <= h.size(); at = dot + 1) {
      dot = std::min(h.find('.', at), h.size());
      if (dot - at > 63) return fmt::format("a label of a host name is at most 63 characters, one has {}", dot - at);
    }
  }
  for (char ch : h)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '-' && ch != '_' && ch != ':')
      return "a host name or address has letters, digits, '.', '-', '_' (and ':' for IPv6) only";
  return "";
}

// --master-addr, --local-addr: a host name or address without a port. An IPv6 address may
// come in brackets ([::1]): they are dropped, as MASTER_ADDR goes to torch's TCPStore, which
// resolves the bare address.
std::string parse_host(const Given& g) {
  std::string h = trim(g.value);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  std::string why = bad_host(h);
  if (why.empty() && std::count(h.begin(), h.end(), ':') == 1)
    why = "one ':' makes it host:port (IPv6 has two or more)";
  if (!why.empty())
    throw UsageError(fmt::format("{}: {}; expected a host name or address without a port, got '{}'", g.source,
                                 why, g.value));
  return h;
}

// ------------------------------------------------------------------ 1. the command line

struct CommandLine {
  Flags given;
  std::string script;
  std::vector<std::string> script_args;
};

// One option at args[i] (advancing i past its value); false at the training script.
bool take_option(const std::vector<std::string>& args, size_t& i, Flags& given) {
  const std::string& a = args[i];
  const FlagSpec* spec = nullptr;
  std::optional<std::string> inline_value;
  std::string shown;
  if (a.starts_with("--")) {
    std::string body = a.substr(2);
    auto eq = body.find('=');
    if (eq != std::string::npos) inline_value = body.substr(eq + 1), body.resize(eq);
    spec = &lookup_long_flag(body);
    shown = std::string("--") + spec->name;
  } else if (a.size() >= 2 && a[0] == '-' && !std::isdigit(static_cast<unsigned char>(a[1]))) {
    for (auto& f : flag_table())
      if (f.short_name == a[1]) spec = &f;
    if (!spec) throw UsageError(fmt::format("unrecognized argument {} (see ddprun --help)", a));
    if (a.size() > 2) inline_value = a.substr(a[2] == '=' ? 3 : 2);
    shown = fmt::format("-{}", a[1]);
  } else {
    return false;
  }
  if (spec->kind == FlagKind::kFlag) {
    if (inline_value && spec->short_name && !a.starts_with("--"))
      throw UsageError(fmt::format("{}: takes no value, got '{}'", shown, *inline_value));
    // --dump-stacks=PID names the job as --dump-stacks PID does (a pid is no on/off switch;
    // read as one, it dumped whichever job was running).
    if (inline_value && spec->name == std::string_view("dump-stacks") && *inline_value != "0" && *inline_value != "1" &&
        std::all_of(inline_value->begin(), inline_value->end(), [](unsigned char ch) { return std::isdigit(ch); })) {
      given.m[spec->name] = {"1", shown};
      given.dump_stacks_pid = *inline_value;
      return true;
    }
    bool on = inline_value ? truthy(shown, *inline_value) : true;
    given.m[spec->name] = {on ? "1" : "0", shown};
    return true;
  }
  if (!inline_value) {
    if (i + 1 >= args.size()) throw UsageError(fmt::format("{}: expected a value", shown));
    inline_value = args[++i];
  }
  // --preload is ddprun's own list: given twice, it takes both (torchrun's flags: the last).
  if (spec->name == std::string_view("preload") && given.has("preload") && !inline_value->empty())
    inline_value = given.value("preload") + "," + *inline_value;
  given.m[spec->name] = {*inline_value, shown};
  return true;
}

// Splits torchrun's options from the script and its arguments, then fills in what the
// command line did not give from PET_<NAME> (and a flag's extra variable).
CommandLine read_command_line(const std::vector<std::string>& args, const std::map<std::string, std::string>& env) {
  CommandLine c;
  size_t i = 0;
  bool separated = false;
  for (; i < args.size(); ++i) {
    if (args[i] == "--") {
      ++i;
      separated = true;
      break;
    }
    if (!take_option(args, i, c.given)) break;
  }
  if (i < args.size()) {
    c.script = args[i];
    // As argparse (torchrun's parser): the command line's first "--" is dropped when it comes
    // right after the script too (`train.py -- --lr 1` gives the script `--lr 1`).
    const size_t first = i + 1 + (!separated && i + 1 < args.size() && args[i + 1] == "--" ? 1 : 0);
    c.script_args.assign(args.begin() + static_cast<long>(first), args.end());
  }
  for (auto& f : flag_table()) {
    if (c.given.has(f.name) || !f.pet) continue;
    for (std::string var : {pet_name(f), std::string(f.extra_env ? f.extra_env : "")}) {
      if (var.empty()) continue;
      auto it = env.find(var);
      if (it == env.end()) continue;
      // PET_PRELOAD="" (a cluster's template with nothing to preload) is no preload.
      if (it->second.empty() && f.name == std::string_view("preload")) continue;
      c.given.m[f.name] = {it->second, var};
      break;
    }
  }
  return c;
}

// ------------------------------------------------------------------ 2. one group at a time

// ddprun holds about 16 open files of its own (its standard streams, the event loop's,
// the store's), and each worker four or more (its output pipes, its pidfd, its store
// connection), two more with log files: a count that no `ulimit -n` of this process allows
// is refused now, before one folder per rank is made (99999999 workers filled /dev/shm's
// inodes before failing). The limit is the machine's, not a usage error: exit 1, as when the
// pipes themselves run out. (Measured: 6 workers fit 32 files, 11 fit 48; with --log-dir and
// --tee, 3 and 6.)
void check_worker_count(const Given& n, int count, bool log_files) {
  constexpr rlim_t kOwnFiles = 16;
  const rlim_t per_worker = log_files ? 6 : 4;
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_max == RLIM_INFINITY) return;
  const rlim_t fit = rl.rlim_max > kOwnFiles ? (rl.rlim_max - kOwnFiles) / per_worker : 0;
  if (static_cast<rlim_t>(count) <= fit) return;
  throw ddp::Error(fmt::format("{}: {} workers need about {} open files ({} for ddprun, {} a worker{}), and this "
                               "process may open at most {} (the hard limit, ulimit -Hn): {}",
                               n.source, count, kOwnFiles + static_cast<uint64_t>(count) * per_worker, kOwnFiles,
                               per_worker, log_files ? " with log files" : "", static_cast<uint64_t>(rl.rlim_max),
                               fit ? fmt::format("at most {} worker{} per node", static_cast<uint64_t>(fit),
                                                   fit == 1 ? "" : "s")
                                   : std::string("raise it to run any worker")));
}

// The CPUs this process may run on (its affinity: a Slurm step's --cpus-per-task, taskset,
// a container's cpuset), not every CPU of the machine (torchrun's os.cpu_count()): a step
// given 4 of 128 CPUs runs 4 workers. Said at info when fewer than the machine's.
int usable_cpus(Options& o) {
  const long online = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return static_cast<int>(online);
  const int usable = std::max(1, CPU_COUNT(&set));
  if (usable < online)
    o.infos.push_back(fmt::format("--nproc-per-node: {} worker{}, one per CPU this process may run on (its affinity; "
                                  "the machine has {})",
                                  usable, usable > 1 ? "s" : "", online));
  return usable;
}

void read_nodes(Options& o, const Flags& g) {
  if (g.has("nnodes")) {
    const auto& n = g.at("nnodes");
    auto colon = n.value.find(':');
    int lo = 0, hi = 0;
    bool ok = colon == std::string::npos
                  ? parse_number(n.value, lo) && (hi = lo, true)
                  : parse_number(n.value.substr(0, colon), lo) && parse_number(n.value.substr(colon + 1), hi);
    if (!ok || lo < 1 || hi < lo)
      throw UsageError(fmt::format("{}: expected N or MIN:MAX with 1 <= MIN <= MAX, got '{}'", n.source, n.value));
    o.min_nodes = lo;
    o.max_nodes = hi;
  }
  if (g.has("nproc-per-node")) {
    const auto& n = g.at("nproc-per-node");
    o.nproc_per_node_spec = n.value;
    int count = 0;
    if (parse_number(n.value, count)) {
      if (count < 1)
        throw UsageError(
            fmt::format("{}: expected a positive integer or auto, cpu, gpu; got '{}'", n.source, n.value));
      o.nproc_per_node = count;
      auto on = [&](const char* f) { return g.has(f) && !g.value(f).empty() && g.value(f) != "0"; };
      check_worker_count(n, count, on("log-dir") || on("tee") || on("redirects"));
    } else if (n.value == "cpu" || n.value == "auto" || n.value == "gpu") {
      GpuCount gpus = n.value == "cpu" ? GpuCount{} : visible_gpus(!g.flag("no-slurm"));
      if (n.value == "gpu" && gpus.n == 0)
        throw UsageError(fmt::format("{}: 'gpu' but no GPU is visible ({})", n.source, gpus.from));
      if (gpus.n > 0)
        o.infos.push_back(fmt::format("{} {}: {} worker{}, one per GPU ({})", n.source, n.value, gpus.n,
                                      gpus.n > 1 ? "s" : "", gpus.from));
      o.nproc_per_node = gpus.n > 0 ? gpus.n : usable_cpus(o);
    } else {
      throw UsageError(fmt::format("{}: expected a positive integer or auto, cpu, gpu; got '{}'", n.source, n.value));
    }
  }
  if (g.has("node-rank")) o.node_rank = parse_int(g.at("node-rank"), 0, 1 << 20, "a node index >= 0");
}

constexpr size_t kLongestRdzvId = 200;

void read_rendezvous(Options& o, const Flags& g) {
  o.standalone = g.flag("standalone");
  o.no_slurm = g.flag("no-slurm");
  if (g.has("master-addr")) o.master_addr = parse_host(g.at("master-addr"));
  if (g.has("master-port")) o.master_port = parse_int(g.at("master-port"), 0, 65535, "a port number 0..65535");
  if (g.has("local-addr")) o.local_addr = parse_host(g.at("local-addr"));
  if (g.has("rdzv-backend")) o.rdzv_backend = g.value("rdzv-backend");
  if (g.has("rdzv-endpoint")) o.rdzv_endpoint = g.value("rdzv-endpoint");
  if (g.has("rdzv-id")) o.rdzv_id = g.value("rdzv-id");
  // The id names the run's folder (<id>_<8 characters>, within a file name's 255 bytes).
  if (o.rdzv_id.size() > kLongestRdzvId)
    throw UsageError(fmt::format("{}: '{}...' is {} bytes long, at most {}", g.source("rdzv-id"),
                                 o.rdzv_id.substr(0, 20), o.rdzv_id.size(), kLongestRdzvId));
  if (g.has("rdzv-conf"))
    o.rdzv_conf = parse_rdzv_conf(g.source("rdzv-conf"), g.value("rdzv-conf"), o.rdzv_backend, o.warnings);
}

std::vector<int> parse_signal_list(const std::string& source, const std::string& sigs) {
  std::vector<int> out;
  for_each_item(sigs, [&](std::string s) {
    s = trim(s);
    if (s.empty()) return;
    int sig = parse_signal(source, s);
    if (sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD)
      throw UsageError(fmt::format("{}: {} cannot be handled", source, signal_name(sig)));
    out.push_back(sig);
  });
  return out;
}

void read_supervision(Options& o, const Flags& g) {
  if (g.has("max-restarts")) o.max_restarts = parse_int(g.at("max-restarts"), 0, 1 << 30, "an integer >= 0");
  if (g.has("monitor-interval")) o.monitor_interval = parse_seconds(g.at("monitor-interval"), false);
  if (g.has("shutdown-timeout")) o.shutdown_timeout = parse_seconds(g.at("shutdown-timeout"), true);
  o.stack_dumps = !g.flag("no-stack-dumps");
  if (g.has("hang-timeout")) o.hang_timeout = parse_seconds(g.at("hang-timeout"), true);
  // torchrun stops on SIGQUIT too; ddprun shows every rank's stack instead (docs/stacks.md)
  // unless the list is given or stack dumps are off.
  // Under nohup (SIGHUP ignored at start), SIGHUP stays ignored unless the list names it.
  std::string default_signals = sighup_ignored_at_start() ? "SIGTERM,SIGINT" : "SIGTERM,SIGINT,SIGHUP";
  if (!o.stack_dumps) default_signals += ",SIGQUIT";
  o.signals_to_handle = parse_signal_list(g.source("signals-to-handle"), g.has("signals-to-handle")
                                                                             ? g.value("signals-to-handle")
                                                                             : default_signals);
  // torchrun 2.x's handlers of its own event log; ddprun keeps none, and says so.
  if (g.has("event-log-handler")) {
    const std::string& h = g.value("event-log-handler");
    if (h != "null" && h != "console" && h != "dynamic_rendezvous")
      throw UsageError(fmt::format("{}: expected null, console or dynamic_rendezvous, got '{}'",
                                   g.source("event-log-handler"), h));
    if (h == "console")
      o.warnings.push_back(fmt::format("{} console: ddprun keeps no torchelastic event log, so none is printed; "
                                       "--log-level info shows what ddprun does",
                                       g.source("event-log-handler")));
  }
  if (g.has("start-method")) {
    o.start_method = g.value("start-method");
    if (o.start_method != "spawn" && o.start_method != "fork" && o.start_method != "forkserver")
      throw UsageError(fmt::format("{}: expected spawn, fork or forkserver, got '{}'", g.source("start-method"),
                                   o.start_method));
  }
}

void read_worker_command(Options& o, const Flags& g) {
  o.module = g.flag("module");
  o.no_python = g.flag("no-python");
  o.run_path = g.flag("run-path");
  // As torchrun's: --run-path takes precedence over --no-python and --module (before
  // anything that depends on them: --preload, PET_PRELOAD).
  if (o.run_path && (o.no_python || o.module)) {
    o.warnings.push_back(fmt::format("--run-path takes precedence over {} (as in torchrun): the script runs as Python",
                                     o.no_python ? "--no-python" : "--module"));
    o.no_python = o.module = false;
  }
  o.virtual_local_rank = g.flag("virtual-local-rank");
  if (g.has("role")) o.role = g.value("role");
  if (g.has("numa-binding")) {
    o.numa_binding = g.value("numa-binding");
    if (!numa_mode(o.numa_binding)) throw UsageError(bad_numa_mode(g.source("numa-binding"), o.numa_binding));
  }
  if (g.has("preload")) {
    for_each_item(g.value("preload"), [&](const std::string& m) { o.preload.push_back(m); });
    if (auto err = check_preload_list(o.preload); !err.empty())
      throw UsageError(fmt::format("{}: {}", g.source("preload"), err));
    // PET_PRELOAD may be set for every job of a cluster: it only applies to Python workers.
    if (!o.preload.empty() && o.no_python) {
      if (g.source("preload").starts_with("--"))
        throw UsageError("--preload imports Python modules for Python workers; --no-python runs none");
      o.infos.push_back("PET_PRELOAD ignored: --no-python runs no Python workers");
      o.preload.clear();
    }
  }
}

std::set<int> parse_rank_list(const Given& g) {
  std::set<int> ranks;
  for_each_item(g.value, [&](const std::string& item) {
    int r = 0;
    if (!parse_number(item, r) || r < 0)
      throw UsageError(fmt::format("{}: expected local ranks like 0,2; got '{}'", g.source, g.value));
    ranks.insert(r);
  });
  return ranks;
}

std::string parse_log_level(const Given& g) {
  std::string l = g.value;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  if (l == "warn") l = "warning";
  if (l == "critical" || l == "fatal") l = "error";
  if (l == "notset") l = "debug";  // Python's logging: everything (LOGLEVEL is torchrun's, and often the script's too)
  static const std::set<std::string> levels{"trace", "debug", "info", "warning", "error", "off"};
  if (!levels.count(l))
    throw UsageError(fmt::format("{}: expected debug, info, warning or error (or Python's names: NOTSET, WARN, "
                                 "CRITICAL, FATAL; or trace, off), got '{}'",
                                 g.source, g.value));
  return l;
}

void read_output(Options& o, const Flags& g) {
  o.log_timestamps = g.flag("log-timestamps");
  o.worker_tty = !g.flag("no-worker-tty");
  if (g.has("log-dir")) o.log_dir = g.value("log-dir");
  if (g.has("redirects")) o.redirects = parse_std_map(g.source("redirects"), g.value("redirects"));
  if (g.has("tee")) o.tee = parse_std_map(g.source("tee"), g.value("tee"));
  if (g.has("local-ranks-filter") && !g.value("local-ranks-filter").empty())
    o.local_ranks_filter = parse_rank_list(g.at("local-ranks-filter"));
  if (g.has("log-line-prefix-template")) o.log_line_prefix_template = g.value("log-line-prefix-template");
  if (g.has("log-level")) o.log_level = parse_log_level(g.at("log-level"));
  if (g.has("summary-json")) o.summary_json = g.value("summary-json");
  if (g.has("logs-specs")) o.logs_specs = g.value("logs-specs");
  for (int i : {0, 1})
    if (const char* flag = i ? "duplicate-stderr-filters" : "duplicate-stdout-filters"; g.has(flag))
      o.duplicate_filters[i] = parse_filter_list(g.value(flag));
}


// ------------------------------------------------------------------ 3. combinations

void check_worker_command(const Options& o, const Flags& g) {
  if (o.script.empty()) throw UsageError("the following argument is required: training_script (see ddprun --help)");
  if (o.module && o.no_python)
    throw UsageError("--no-python and --module cannot be used together: a module needs python");
  // "default" names torchrun's DefaultLogsSpecs: the layout ddprun writes anyway.
  if (!o.logs_specs.empty() && o.logs_specs != "default")
    throw UsageError(fmt::format("{}: '{}' would be a Python plug-in (entry point group torchrun.logs_specs), "
                                 "which ddprun cannot load; only 'default' (torchrun's own layout) is supported: use "
                                 "--log-dir, --tee, --redirects",
                                 g.source("logs-specs"), o.logs_specs));
}

// --virtual-local-rank gives each worker one entry of CUDA_VISIBLE_DEVICES: a list shorter
// than the workers would hand some of them a device the user did not give.
void check_virtual_local_rank(const Options& o, const std::map<std::string, std::string>& env) {
  if (!o.virtual_local_rank) return;
  const auto ids = visible_device_ids(env);
  if (ids && static_cast<int>(ids->size()) < o.nproc_per_node)
    throw UsageError(fmt::format("--virtual-local-rank: CUDA_VISIBLE_DEVICES='{}' gives {} device(s) for {} workers "
                                 "(--nproc-per-node): each worker needs one of its own",
                                 env.at("CUDA_VISIBLE_DEVICES"), ids->size(), o.nproc_per_node));
}

// --numa-binding: each local rank's CPUs, found once (the machine does not change).
void bind_near_gpus(Options& o, const Flags& g, const std::map<std::string, std::string>& env) {
  if (o.numa_binding.empty()) return;
  o.worker_cpus = numa_binding_plan(o.numa_binding, g.source("numa-binding"), o.nproc_per_node, env);
  for (size_t lr = 0; lr < o.worker_cpus.size(); ++lr)
    o.infos.push_back(fmt::format("{}: local rank {} runs on CPUs {}", g.source("numa-binding"), lr,
                                  cpu_list_text(o.worker_cpus[lr])));
}

// torchrun accepts local ranks this node does not have, and then shows nothing of them:
// say so, and what the console still shows.
// The filters copy only lines that are tee'd (and shown), as torchrun's: say so when none is.
void check_duplicate_filters(Options& o, const Flags& g) {
  for (int i : {0, 1}) {
    if (o.duplicate_filters[i].empty()) continue;
    bool fed = false;
    for (int lr = 0; lr < o.nproc_per_node && !fed; ++lr)
      fed = (o.tee.of(lr) & (i + 1)) && (!o.local_ranks_filter || o.local_ranks_filter->count(lr));
    if (!fed)
      o.warnings.push_back(fmt::format("{}: no local rank's {} is given to --tee{}, so no line is copied",
                                       g.source(i ? "duplicate-stderr-filters" : "duplicate-stdout-filters"),
                                       i ? "stderr" : "stdout", o.local_ranks_filter ? " and shown" : ""));
  }
}

// "this node has 2 workers (local ranks 0..1), no local rank 7" for local ranks a flag names
// that this node lacks.
std::string ranks_this_node_lacks(const Options& o, const std::vector<int>& missing) {
  const int n = o.nproc_per_node;
  return fmt::format("this node has {} worker{} ({}), no local rank{} {}", n, n > 1 ? "s" : "",
                     n > 1 ? fmt::format("local ranks 0..{}", n - 1) : "local rank 0", missing.size() > 1 ? "s" : "",
                     fmt::join(missing, ","));
}

void check_output(Options& o, const Flags& g) {
  check_duplicate_filters(o, g);
  for (auto [map, name] : {std::pair{&o.tee, "tee"}, std::pair{&o.redirects, "redirects"}}) {
    std::vector<int> missing;
    for (const auto& [lr, bits] : map->per_rank)
      if (lr >= o.nproc_per_node) missing.push_back(lr);
    if (!missing.empty())
      o.warnings.push_back(fmt::format("{}: {}: what it says for {} is unused", g.source(name),
                                       ranks_this_node_lacks(o, missing), missing.size() > 1 ? "them" : "it"));
  }
  if (!o.local_ranks_filter) return;
  std::vector<int> missing, shown;
  for (int r : *o.local_ranks_filter) (r < o.nproc_per_node ? shown : missing).push_back(r);
  if (missing.empty()) return;
  o.warnings.push_back(fmt::format(
      "{}: {}: {}", g.source("local-ranks-filter"), ranks_this_node_lacks(o, missing),
      shown.empty() ? std::string("no worker's output reaches the console")
                    : fmt::format("the console shows local rank{} {} only", shown.size() > 1 ? "s" : "",
                                  fmt::join(shown, ","))));
}

// Whether a flag was typed on the command line (not given by a PET_* variable, which a
// scheduler often sets for every job: warning about those would be noise).
bool typed(const Flags& g, const char* f) { return g.has(f) && g.at(f).source.starts_with("-"); }

// --standalone: one node, a store on localhost at a free port, a random run id (set later).
void check_standalone(Options& o, const Flags& g) {
  // torchrun takes a range from 1 (a job's line templated as --nnodes=1:$MAX), waits out its
  // last call for nodes that cannot come (its store's port is known to no other), and runs one.
  if (o.max_nodes > 1 && o.min_nodes == 1) {
    o.warnings.push_back(fmt::format("--standalone runs one node: {} {} is taken as 1 (no other node can join it)",
                                     g.source("nnodes"), g.value("nnodes")));
    o.max_nodes = 1;
  }
  if (o.max_nodes > 1)
    throw UsageError(fmt::format("--standalone runs one node, but {} asks for {}", g.source("nnodes"),
                                 g.value("nnodes")));
  if (o.node_rank != 0)
    throw UsageError(fmt::format("--standalone runs one node, but {} is {}", g.source("node-rank"), o.node_rank));
  // As torchrun, --standalone replaces the rendezvous flags; typed ones are named (but
  // c10d, which torchrun's --standalone is).
  std::vector<std::string> ignored;
  for (const char* f : {"rdzv-backend", "rdzv-endpoint", "rdzv-id", "master-addr", "master-port"})
    if (typed(g, f) && !(f == std::string_view("rdzv-backend") && g.value(f) == "c10d")) ignored.push_back(g.source(f));
  if (!ignored.empty())
    o.warnings.push_back(fmt::format("--standalone ignores {}: it hosts its own store on localhost at a free port",
                                     fmt::join(ignored, ", ")));
  o.rdzv_backend = "static";
}

void check_static(Options& o, const Flags& g) {
  if (!o.rdzv_endpoint.empty() && !o.standalone) {
    // torchrun's static rendezvous takes host[:port] from --rdzv-endpoint over
    // --master-addr/--master-port.
    parse_endpoint(g.source("rdzv-endpoint"), o.rdzv_endpoint, o.master_port, o.master_addr, o.master_port);
    if (o.master_port == 0)
      throw UsageError(fmt::format("{}: expected host[:port] with a port 1..65535, got '{}'",
                                   g.source("rdzv-endpoint"), o.rdzv_endpoint));
  }
  if (o.min_nodes != o.max_nodes)
    throw UsageError(fmt::format("{}: elastic node ranges ({}) need dynamic rendezvous: add --rdzv-backend c10d "
                                 "--rdzv-endpoint HOST[:PORT]",
                                 g.source("nnodes"), g.value("nnodes")));
  if (o.node_rank >= o.max_nodes)
    throw UsageError(fmt::format("{}: node rank {} is outside 0..{} (--nnodes {})", g.source("node-rank"),
                                 o.node_rank, o.max_nodes - 1, o.max_nodes));
  if (o.max_nodes > 1 && o.master_port == 0)
    throw UsageError("--master-port 0 picks a free port, which other nodes cannot know: give a port for --nnodes > 1");
}

double conf_seconds(const std::string& source, const std::string& key, const std::string& v, bool allow_zero);

// --rdzv-backend etcd / etcd-v2 (both over etcd's v3 API): one or more endpoints, torchrun's
// etcd keys (protocol, cacert, cert, key; "timeout" is its join timeout).
void check_etcd(Options& o, const Flags& g) {
  const std::string src = g.source("rdzv-backend");
  if (o.rdzv_endpoint.empty())
    throw UsageError(fmt::format("{} needs --rdzv-endpoint HOST[:PORT][,HOST[:PORT]...] (the etcd members; port "
                                 "2379 when left out)",
                                 src));
  RdzvConf& c = o.rdzv_conf;
  auto conf = [&](const char* k) { return c.raw.count(k) ? c.raw.at(k) : std::string(); };
  const std::string protocol = conf("protocol").empty() ? "http" : conf("protocol");
  if (protocol != "http" && protocol != "https")
    throw UsageError(fmt::format("--rdzv-conf: protocol expects http or https, got '{}'", protocol));
  if (protocol == "http")
    for (const char* k : {"cacert", "cert", "key"})
      if (!conf(k).empty())
        throw UsageError(fmt::format("--rdzv-conf: {} needs protocol=https (TLS to etcd)", k));
  if (!conf("key").empty() && conf("cert").empty())
    throw UsageError("--rdzv-conf: key is given without cert (the client certificate it belongs to)");
  std::vector<rdzv::etcd::Endpoint> eps;
  try {
    eps = rdzv::etcd::parse_endpoints(o.rdzv_endpoint, protocol == "https");
  } catch (const ddp::UsageError& e) {
    throw UsageError(fmt::format("{}: {}", g.source("rdzv-endpoint"), e.what()));
  }
  o.rdzv_host = eps.front().host;  // for this node's outgoing address
  o.rdzv_port = eps.front().port;
  if (c.raw.count("timeout") && !c.raw.count("join_timeout"))
    c.join_timeout = conf_seconds("--rdzv-conf", "timeout", conf("timeout"), false);  // torchrun's etcd name
  if (c.keep_alive_interval * c.keep_alive_max_attempt < 3)
    o.warnings.push_back(fmt::format(
        "--rdzv-conf: the keep-alive window ({} s = keep_alive_interval x keep_alive_max_attempt) is shorter than an "
        "etcd leader election may take (2-3 s with etcd's default election timeout of 1 s): when the leader fails, "
        "nodes that cannot renew their lease for that long stop",
        c.keep_alive_interval * c.keep_alive_max_attempt));
  if (c.is_host)
    o.warnings.push_back(fmt::format("--rdzv-conf is_host is ignored with {} rendezvous: etcd hosts the rendezvous, "
                                     "and each round's node rank 0 hosts its workers' store",
                                     o.rdzv_backend));
}

void check_c10d_endpoint(Options& o, const Flags& g) {
  const std::string src = g.source("rdzv-backend");
  if (o.rdzv_endpoint.empty()) {
    if (o.max_nodes > 1)
      throw UsageError(fmt::format("{} with --nnodes {} needs --rdzv-endpoint HOST[:PORT] (the store every node "
                                   "meets in); without it each node would host its own",
                                   src, g.value("nnodes")));
    o.rdzv_host = "localhost";  // one node: a store of its own at a free port
    o.rdzv_port = 0;
  } else {
    // Port 0: the store's host picks a free port (torchrun 2.x's --standalone is c10d at
    // localhost:0), which no other node could learn: one node only, and it hosts the store.
    parse_endpoint(g.source("rdzv-endpoint"), o.rdzv_endpoint, 29400, o.rdzv_host, o.rdzv_port, true);
    if (o.rdzv_port == 0 && o.max_nodes > 1)
      throw UsageError(fmt::format("{}: port 0 picks a free port that other nodes cannot know; with {} {} give a "
                                   "port 1..65535, got '{}'",
                                   g.source("rdzv-endpoint"), g.source("nnodes"), g.value("nnodes"),
                                   o.rdzv_endpoint));
  }
  if (o.rdzv_port == 0 && o.rdzv_conf.is_host == false)
    throw UsageError(fmt::format("{}: port 0 picks a free port for the store this node hosts, but --rdzv-conf "
                                 "is_host=0 says it does not host it",
                                 o.rdzv_endpoint.empty() ? src + " c10d without --rdzv-endpoint (one node)"
                                                         : g.source("rdzv-endpoint")));
}

void check_dynamic(Options& o, const Flags& g) {
  const std::string src = g.source("rdzv-backend");
  if (o.rdzv_backend == "etcd" || o.rdzv_backend == "etcd-v2")
    check_etcd(o, g);
  else if (o.rdzv_backend == "c10d")
    check_c10d_endpoint(o, g);
  else
    throw UsageError(fmt::format("{}: expected static, c10d, etcd or etcd-v2, got '{}'", src, o.rdzv_backend));
  // Warned only when typed on the command line (typed()).
  if (typed(g, "node-rank"))
    o.warnings.push_back(fmt::format("{} is ignored with {} rendezvous: node ranks come from the rendezvous "
                                     "(sorted by address, then a random id)",
                                     g.source("node-rank"), o.rdzv_backend));
  for (const char* f : {"master-addr", "master-port"})
    if (typed(g, f))
      o.warnings.push_back(fmt::format("{} is only used by static rendezvous; {} rendezvous ignores it",
                                       g.source(f), o.rdzv_backend));
  const RdzvConf& c = o.rdzv_conf;
  if (o.min_nodes < o.max_nodes && c.join_timeout <= c.last_call_timeout)
    throw UsageError(fmt::format("--rdzv-conf: join_timeout ({} s) must exceed last_call_timeout ({} s) when "
                                 "--nnodes is a range: a round with fewer than {} nodes waits for the last call",
                                 c.join_timeout, c.last_call_timeout, o.max_nodes));
  // torchrun makes an empty run id a random one, its own on every agent: nodes that never
  // meet. One node may (as --standalone); several need the same id on each.
  if (o.rdzv_id.empty() && o.max_nodes > 1)
    throw UsageError(fmt::format("{} is empty: the nodes of a job meet by their run id; give every node the same one",
                                 g.source("rdzv-id")));
  if (o.rdzv_id == "none" && o.max_nodes > 1)
    o.warnings.push_back(
        "--rdzv-id is not set (it is 'none'): two jobs that share this endpoint would merge; give each job its own "
        "id");
}

void check_rendezvous(Options& o, const Flags& g) {
  if (o.standalone) return check_standalone(o, g);
  if (o.dynamic()) check_dynamic(o, g);
  else check_static(o, g);
  if (o.rdzv_conf.replace_timeout > 0 && o.max_restarts == 0 && o.max_nodes > 1)
    o.warnings.push_back(fmt::format("--rdzv-conf replace_timeout={} waits for nodes to replace lost ones only while "
                                     "restarts remain, and --max-restarts is 0: a loss ends the job",
                                     o.rdzv_conf.raw.at("replace_timeout")));
}

// torchrun's c10d shares its agent's store with the workers from torch 2.4 on, unless
// TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: then rank 0's worker hosts one on MASTER_PORT, a free
// port picked each round (TORCHELASTIC_USE_AGENT_STORE=False), as before 2.4. A static job's
// workers share node 0's store whatever it says, in torchrun too.
void read_store_sharing(Options& o, const std::map<std::string, std::string>& env) {
  auto v = env.find("TORCH_DISABLE_SHARE_RDZV_TCP_STORE");
  if (v == env.end() || v->second != "1") return;
  if (!o.dynamic() && !o.standalone) {
    o.infos.push_back("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 ignored: a static job's workers share node 0's store, "
                      "as torchrun's do");
    return;
  }
  o.share_worker_store = false;
  o.infos.push_back("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: the workers get no agent store "
                    "(TORCHELASTIC_USE_AGENT_STORE=False); rank 0's worker hosts theirs on MASTER_PORT, a free port "
                    "each round");
}

// ------------------------------------------------------------------ 4. the target

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

// The file's first line: a "#!" line names its interpreter; else its first bytes.
bool runs_directly(const Options& o) {
  if (o.run_path) return false;  // Python's, whatever the file is (torchrun: runpy.run_path)
  if (o.no_python) return true;
  if (o.module || o.script.ends_with(".py") || !is_executable_file(o.script)) return false;
  const auto first = read_file(o.script, 256);
  if (!first) return true;  // executable, not readable (mode 0711): only exec can run it
  const std::string& head = *first;
  if (head.starts_with("\x7f" "ELF")) return true;
  if (!head.starts_with("#!")) return false;  // no interpreter named: Python's, as torchrun's
  const std::string line = head.substr(2, head.find('\n') - 2);
  return line.find("python") == std::string::npos;
}

namespace {

// The target must exist before any worker starts.
void check_target(const Options& o, const std::map<std::string, std::string>& env) {
  bool direct = runs_directly(o);
  if (o.no_python) {
    auto path = env.find("PATH");
    std::string resolved =
        find_executable(o.script, path == env.end() ? "/usr/local/bin:/usr/bin:/bin" : path->second);
    if (resolved.empty() || (o.script.find('/') != std::string::npos && ::access(o.script.c_str(), F_OK) != 0))
      throw UsageError(fmt::format("training script '{}' not found{}", o.script,
                                   o.script.find('/') == std::string::npos ? " in PATH" : ""));
    struct stat st {};
    if (::stat(resolved.c_str(), &st) == 0 && (S_ISDIR(st.st_mode) || ::access(resolved.c_str(), X_OK) != 0))
      throw UsageError(fmt::format("training script '{}' is {}: --no-python runs it as a program", o.script,
                                   S_ISDIR(st.st_mode) ? "a directory" : "not executable (chmod +x)"));
  } else if (!o.module && !direct) {
    struct stat st {};
    if (::stat(o.script.c_str(), &st) != 0)
      throw UsageError(fmt::format("training script '{}' not found: {}", o.script, ddp::errno_text(errno)));
    if (S_ISDIR(st.st_mode) && ::access((o.script + "/__main__.py").c_str(), F_OK) != 0)
      throw UsageError(fmt::format("training script '{}' is a directory without __main__.py", o.script));
  }
}

// "{host}" in a --summary-json path: this host's name (one file per node where every node
// writes to one shared folder).
void expand_summary_json(Options& o) {
  const std::string_view tag = "{host}";
  if (o.summary_json.find(tag) == std::string::npos) return;
  const std::string host = host_name();
  for (size_t at = 0; (at = o.summary_json.find(tag, at)) != std::string::npos; at += host.size())
    o.summary_json.replace(at, tag.size(), host);
}

// --summary-json is written when the job ends: a place it cannot be written is found now,
// before any worker runs. Its missing folders are made, as --log-dir's are.
void check_summary_json(Options& o, const Flags& g) {
  if (o.summary_json.empty()) return;
  expand_summary_json(o);
  const std::string src = g.source("summary-json");
  const std::filesystem::path path(o.summary_json);
  if (!path.has_filename()) throw UsageError(fmt::format("{}: '{}' names a folder, not a file", src, o.summary_json));
  const std::string parent = path.has_parent_path() ? path.parent_path().string() : ".";
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec) throw UsageError(fmt::format("{}: cannot create the folder '{}': {}", src, parent, ec.message()));
  struct stat st {};
  if (::stat(o.summary_json.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw UsageError(fmt::format("{}: '{}' is a directory", src, o.summary_json));
    if (::access(o.summary_json.c_str(), W_OK) != 0)
      throw UsageError(fmt::format("{}: cannot write '{}': {}", src, o.summary_json, ddp::errno_text(errno)));
  } else if (::access(parent.c_str(), W_OK | X_OK) != 0) {
    throw UsageError(fmt::format("{}: cannot write '{}' in '{}': {}", src, o.summary_json, parent,
                                 ddp::errno_text(errno)));
  }
}

// --log-dir is made (with its missing folders) and must be writable: found now, before
// this node joins the rendezvous, as a usage error (exit 2) like --summary-json's.
void check_log_dir(const Options& o, const Flags& g) {
  if (o.log_dir.empty()) return;
  const std::string src = g.source("log-dir");
  std::error_code ec;
  std::filesystem::create_directories(o.log_dir, ec);
  if (ec) throw UsageError(fmt::format("{}: cannot create the folder '{}': {}", src, o.log_dir, ec.message()));
  if (::access(o.log_dir.c_str(), W_OK | X_OK) != 0)
    throw UsageError(fmt::format("{}: cannot write in '{}': {}", src, o.log_dir, ddp::errno_text(errno)));
}

// `ddprun --dump-stacks [PID]`: nothing else on the line.
Options parse_dump_stacks(const CommandLine& c) {
  Options o;
  o.dump_stacks = 0;
  const std::string& pid = c.given.dump_stacks_pid.empty() ? c.script : c.given.dump_stacks_pid;
  if (!pid.empty() && (!parse_number(pid, o.dump_stacks) || o.dump_stacks <= 0))
    throw UsageError(fmt::format("--dump-stacks: expected the pid of a running ddprun, got '{}'", pid));
  auto typed = std::count_if(c.given.m.begin(), c.given.m.end(),
                             [](auto& kv) { return kv.second.source.starts_with("-"); });
  if (!c.script_args.empty() || typed > 1 || (!c.given.dump_stacks_pid.empty() && !c.script.empty()))
    throw UsageError("--dump-stacks takes only a pid: ddprun --dump-stacks [PID]");
  return o;
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

void parse_endpoint(const std::string& source, const std::string& value, int default_port, std::string& host,
                    int& port, bool allow_zero) {
  const std::string v = trim(value);
  auto bad = [&](const std::string& why) {
    return UsageError(fmt::format("{}: {}; expected host[:port] or [ipv6]:port, got '{}'", source, why, value));
  };
  std::string h = v, p;
  if (v.find("://") != std::string::npos) throw bad("a URL (no scheme goes before the host)");
  if (v.find(',') != std::string::npos) throw bad("a list (one endpoint here: a list of members is etcd's)");
  if (v.starts_with('[')) {
    auto close = v.find(']');
    if (close == std::string::npos) throw bad("an IPv6 address without its closing ']'");
    h = v.substr(1, close - 1);
    std::string rest = v.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') throw bad("text after ']' that is not ':port'");
      p = rest.substr(1);
      if (p.empty()) throw bad("an empty port");
    }
  } else if (auto colon = v.find(':'); colon != std::string::npos) {
    if (v.find(':', colon + 1) != std::string::npos) throw bad("an IPv6 address must be written in brackets");
    h = v.substr(0, colon);
    p = v.substr(colon + 1);
    if (p.empty()) throw bad("an empty port");
  }
  if (auto why = bad_host(h); !why.empty()) throw bad(why);
  port = default_port;
  if (!p.empty()) {
    long n = 0;
    if (p.size() > 5 || !parse_number(p, n) || n < (allow_zero ? 0 : 1) || n > 65535)
      throw bad(allow_zero ? "the port is not a number 0..65535" : "the port is not a number 1..65535");
    port = static_cast<int>(n);
  }
  host = h;
}

namespace {

constexpr double kLongestConfSeconds = 1e7;
const std::string kLongestConfText = fmt::format("{:.0f} s ({} days)", kLongestConfSeconds,
                                                 static_cast<int>(kLongestConfSeconds / 86400));

double conf_seconds(const std::string& source, const std::string& key, const std::string& v, bool allow_zero) {
  double d = 0;
  if (!parse_number(v, d) || d < 0 || (!allow_zero && d == 0) || d > kLongestConfSeconds)
    throw UsageError(fmt::format("{}: {} expects a {} number of seconds up to {}, got '{}'", source, key,
                                 allow_zero ? "non-negative" : "positive", kLongestConfText, v));
  return d;
}

// The keys each backend reads (torchrun's, plus the etcd client's).
// A store call, a renewal or a wake-up on a loaded machine can take this long: a timeout or
// an interval shorter than that cannot be kept (keep_alive_interval=0.001 had even a one-node
// job declare itself lost within 0.2 s).
constexpr double kShortestCallSeconds = 0.1;

double conf_seconds_from(const std::string& source, const std::string& key, const std::string& v, double least) {
  const double d = conf_seconds(source, key, v, false);
  if (d < least)
    throw UsageError(fmt::format("{}: {} expects at least {} s (shorter, a store call or a wake-up on a loaded "
                                 "machine outlasts it), got '{}'",
                                 source, key, least, v));
  return d;
}

bool known_conf_key(const std::string& backend, const std::string& key) {
  static const std::set<std::string> common{"join_timeout",        "last_call_timeout", "close_timeout",
                                            "read_timeout",        "heartbeat_timeout", "keep_alive_interval",
                                            "keep_alive_max_attempt", "is_host",        "timeout",
                                            "store_type",          "replace_timeout"};
  static const std::set<std::string> etcd{"protocol", "cacert", "cert", "key"};
  return common.count(key) || ((backend == "etcd" || backend == "etcd-v2") && etcd.count(key));
}

void set_conf_key(RdzvConf& c, const std::string& source, const std::string& k, const std::string& v) {
  if (k == "join_timeout") c.join_timeout = conf_seconds(source, k, v, false);
  else if (k == "last_call_timeout") c.last_call_timeout = conf_seconds(source, k, v, true);
  else if (k == "close_timeout") c.close_timeout = conf_seconds(source, k, v, false);
  else if (k == "replace_timeout") c.replace_timeout = conf_seconds(source, k, v, true);
  else if (k == "read_timeout") c.read_timeout = conf_seconds_from(source, k, v, kShortestCallSeconds);
  else if (k == "heartbeat_timeout") c.heartbeat_timeout = conf_seconds_from(source, k, v, kShortestCallSeconds);
  else if (k == "keep_alive_interval") c.keep_alive_interval = conf_seconds_from(source, k, v, kShortestCallSeconds);
  else if (k == "is_host") c.is_host = truthy(fmt::format("{}: is_host", source), v);
  else if (k == "keep_alive_max_attempt") {
    long n = 0;
    if (!parse_number(v, n) || n < 1 || n > 1000)
      throw UsageError(fmt::format("{}: keep_alive_max_attempt expects an integer from 1 to 1000, got '{}'", source, v));
    c.keep_alive_max_attempt = static_cast<int>(n);
  } else if (k == "store_type" && v != "tcp") {
    throw UsageError(fmt::format("{}: store_type '{}' is not supported; ddprun's rendezvous store is tcp", source, v));
  }
}

}  // namespace

RdzvConf parse_rdzv_conf(const std::string& source, const std::string& value, const std::string& backend,
                         std::vector<std::string>& warnings) {
  RdzvConf c;
  if (trim(value).empty()) return c;
  for_each_item(value, [&](const std::string& item) {
    auto eq = item.find('=');
    std::string k = trim(item.substr(0, eq)), v = eq == std::string::npos ? "" : trim(item.substr(eq + 1));
    if (eq == std::string::npos || k.empty() || v.empty())
      throw UsageError(fmt::format("{}: expected key=value pairs separated by commas, got '{}'", source, item));
    set_conf_key(c, source, k, v);
    if (!known_conf_key(backend, k))
      warnings.push_back(fmt::format("{}: unknown key '{}' (ignored)", source, k));
    c.raw[k] = v;
  });
  // The lease's clocks count the window in nanoseconds: it has the limit of each part.
  if (double window = c.keep_alive_interval * c.keep_alive_max_attempt; window > kLongestConfSeconds)
    throw UsageError(fmt::format("{}: the keep-alive window (keep_alive_interval {} x keep_alive_max_attempt {} = "
                                 "{} s) is longer than {}",
                                 source, c.keep_alive_interval, c.keep_alive_max_attempt, window, kLongestConfText));
  return c;
}

// torchrun's comma-separated filters: ",," is a comma inside one; empty ones are dropped
// (torchrun's would match every line).
std::vector<std::string> parse_filter_list(const std::string& value) {
  std::vector<std::string> out;
  std::string item;
  for (size_t i = 0; i <= value.size(); ++i) {
    if (i < value.size() && value[i] == ',' && i + 1 < value.size() && value[i + 1] == ',') {
      item += ',';
      ++i;
    } else if (i == value.size() || value[i] == ',') {
      if (!item.empty()) out.push_back(std::move(item));
      item.clear();
    } else {
      item += value[i];
    }
  }
  return out;
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
  CommandLine c = read_command_line(args, env);
  const Flags& g = c.given;
  if (g.flag("help")) {
    o.help = true;
    o.help_text = help_text();
    return o;
  }
  if (g.flag("version")) {
    o.version = true;
    return o;
  }
  if (g.flag("dump-stacks")) return parse_dump_stacks(c);
  o.script = c.script;
  o.script_args = c.script_args;
  read_nodes(o, g);
  read_rendezvous(o, g);
  read_supervision(o, g);
  read_worker_command(o, g);
  read_output(o, g);
  for (const auto& [name, given] : g.m) o.given[name] = given.source;
  slurm::apply(o, env);  // what the command line left open, from an srun step's SLURM_*
  check_worker_command(o, g);
  check_output(o, g);
  check_rendezvous(o, g);
  read_store_sharing(o, env);
  check_target(o, env);
  check_virtual_local_rank(o, env);
  bind_near_gpus(o, g, env);
  check_summary_json(o, g);  // (last: folders are made only for a command line that is taken)
  check_log_dir(o, g);
  return o;
}

}  // namespace ddprun
