#include "launcher/slurm.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ddp/error.hpp"

namespace ddprun::slurm {

using ddp::UsageError;

// ------------------------------------------------------------------ host lists

namespace {

constexpr size_t kMaxHosts = size_t{1} << 20;  // a whole list; Slurm caps one range at 64K

struct Range {
  unsigned long lo = 0, hi = 0;
  int width = 0;  // digits of the low bound: the zero padding
};

// One token: text[0] [ranges[0]] text[1] [ranges[1]] ... text[n].
struct Token {
  std::vector<std::string> text;
  std::vector<std::vector<Range>> ranges;
};

class Malformed {
 public:
  Malformed(const std::string& text, const std::string& source) : text_(text), source_(source) {}
  UsageError operator()(const std::string& why) const {
    return UsageError(fmt::format("{}: malformed Slurm host list '{}': {}", source_, text_, why));
  }

 private:
  const std::string& text_;
  const std::string& source_;
};

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 18 &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// "1-3,07" -> ranges.
std::vector<Range> parse_ranges(const std::string& body, const Malformed& bad) {
  std::vector<Range> out;
  size_t start = 0;
  for (;;) {
    size_t end = body.find(',', start);
    std::string item = body.substr(start, end == std::string::npos ? std::string::npos : end - start);
    auto dash = item.find('-');
    std::string lo = item.substr(0, dash), hi = dash == std::string::npos ? lo : item.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi))
      throw bad(fmt::format("'[{}]' must hold numbers or ranges like 1-4, separated by commas", body));
    Range r{std::stoul(lo), std::stoul(hi), static_cast<int>(lo.size())};
    if (r.lo > r.hi) throw bad(fmt::format("the range {} runs backwards", item));
    if (r.hi - r.lo >= kMaxHosts) throw bad(fmt::format("the range {} is too large", item));
    out.push_back(r);
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

Token parse_token(const std::string& tok, const Malformed& bad) {
  Token t;
  t.text.emplace_back();
  for (size_t i = 0; i < tok.size(); ++i) {
    char c = tok[i];
    if (c == '{' || c == '}') throw bad("host list functions ({...}) are not supported");
    if (c != '[') {
      t.text.back() += c;
      continue;
    }
    size_t close = tok.find(']', i);  // the splitter checked the nesting
    t.ranges.push_back(parse_ranges(tok.substr(i + 1, close - i - 1), bad));
    t.text.emplace_back();
    i = close;
  }
  return t;
}

// Splits at commas and blanks outside brackets; checks the brackets pair up, unnested.
std::vector<std::string> split_tokens(const std::string& text, const Malformed& bad) {
  std::vector<std::string> out;
  std::string cur;
  bool inside = false;
  for (char c : text) {
    if (c == '[') {
      if (inside) throw bad("brackets cannot nest");
      inside = true;
    } else if (c == ']') {
      if (!inside) throw bad("a ']' without its '['");
      inside = false;
    } else if (!inside && (c == ',' || c == ' ' || c == '\t' || c == '\n')) {
      if (!cur.empty()) out.push_back(std::move(cur));
      cur.clear();
      continue;
    }
    cur += c;
  }
  if (inside) throw bad("a '[' without its ']'");
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

// Slurm's loop order (hostlist.c, _push_range_list): the last bracket is the innermost
// loop; the ones before it are expanded from the right, the rightmost outermost.
std::vector<size_t> loop_order(size_t n) {
  std::vector<size_t> order;
  for (size_t k = n - 1; k-- > 0;) order.push_back(k);
  order.push_back(n - 1);
  return order;
}

void expand_token(const Token& t, std::vector<std::string>& out, const Malformed& bad) {
  const size_t n = t.ranges.size();
  if (n == 0) {
    out.push_back(t.text[0]);
    return;
  }
  size_t total = 1;
  std::vector<std::vector<std::string>> values(n);
  for (size_t k = 0; k < n; ++k) {
    for (const Range& r : t.ranges[k])
      for (unsigned long v = r.lo; v <= r.hi; ++v) values[k].push_back(fmt::format("{:0{}}", v, r.width));
    total *= values[k].size();
    if (total + out.size() > kMaxHosts) throw bad(fmt::format("more than {} hosts", kMaxHosts));
  }
  const std::vector<size_t> order = loop_order(n);
  std::vector<size_t> at(n, 0);  // the current value of each bracket
  for (size_t made = 0; made < total; ++made) {
    std::string host = t.text[0];
    for (size_t k = 0; k < n; ++k) host += values[k][at[k]] + t.text[k + 1];
    out.push_back(std::move(host));
    for (size_t level = n; level-- > 0;) {  // advance the innermost loop first
      size_t k = order[level];
      if (++at[k] < values[k].size()) break;
      at[k] = 0;
    }
  }
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& text, const std::string& source) {
  Malformed bad(text, source);
  std::vector<std::string> hosts;
  for (const std::string& tok : split_tokens(text, bad)) expand_token(parse_token(tok, bad), hosts, bad);
  if (hosts.empty()) throw bad("no host in it");
  return hosts;
}

// ------------------------------------------------------------------ the environment

namespace {

using EnvMap = std::map<std::string, std::string>;

// The first of names that is set (and not empty): {name, value}.
std::optional<std::pair<std::string, std::string>> first_set(const EnvMap& env,
                                                             std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (auto it = env.find(n); it != env.end() && !it->second.empty())
      return std::make_pair(std::string(n), it->second);
  return std::nullopt;
}

long parse_count(const std::string& var, const std::string& value, long lo) {
  long v = 0;
  auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || p != value.data() + value.size() || v < lo)
    throw UsageError(fmt::format("{}: expected an integer >= {} from Slurm, got '{}'", var, lo, value));
  return v;
}

}  // namespace

std::string Env::step_name() const { return step_id ? fmt::format("{}.{}", job_id, *step_id) : job_id; }

std::vector<std::string> Env::nodes() const { return expand_hostlist(nodelist, nodelist_var); }

// A heterogeneous step's SLURM_NODEID counts the nodes of its first component first, each
// component's in its own list's order (`srun --het-group=0,1` on components n3 and n[1-2]:
// n3 is 0, while SLURM_STEP_NODELIST is n[1-3]). The components in the step are those whose
// nodes all are the step's; together they must be exactly the step's nodes.
std::vector<std::string> Env::nodes_by_id() const {
  std::vector<std::string> listed = nodes();
  if (het_lists.empty()) return listed;
  const std::set<std::string> in_step(listed.begin(), listed.end());
  std::vector<std::string> order;
  for (const auto& [var, text] : het_lists) {
    std::vector<std::string> component = expand_hostlist(text, var);
    const std::set<std::string> mine(component.begin(), component.end());
    // A step within one component (srun -N2 on a part of it) is numbered as its list.
    if (std::all_of(listed.begin(), listed.end(), [&](const auto& n) { return mine.count(n) > 0; })) return listed;
    if (std::all_of(component.begin(), component.end(), [&](const auto& n) { return in_step.count(n) > 0; }))
      order.insert(order.end(), component.begin(), component.end());
  }
  std::vector<std::string> a = order, b = listed;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return a == b ? order : std::vector<std::string>{};
}

std::optional<Env> read_env(const EnvMap& env) {
  auto job = first_set(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
  if (!job) return std::nullopt;
  Env s;
  s.job_id = job->second;
  if (auto step = first_set(env, {"SLURM_STEP_ID", "SLURM_STEPID"})) {
    long v = 0;  // a step that is not a number (an interactive or batch step) is no srun step
    auto [p, ec] = std::from_chars(step->second.data(), step->second.data() + step->second.size(), v);
    if (ec == std::errc() && p == step->second.data() + step->second.size() && v >= 0) s.step_id = v;
  }
  const bool step = s.in_step();
  auto nn = step ? first_set(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"})
                 : first_set(env, {"SLURM_JOB_NUM_NODES", "SLURM_NNODES"});
  if (nn) s.nnodes = static_cast<int>(parse_count(nn->first, nn->second, 1)), s.nnodes_var = nn->first;
  auto nt = step ? first_set(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"})
                 : first_set(env, {"SLURM_NTASKS", "SLURM_NPROCS"});
  if (nt) s.ntasks = static_cast<int>(parse_count(nt->first, nt->second, 1)), s.ntasks_var = nt->first;
  if (auto id = first_set(env, {"SLURM_NODEID"})) {
    s.node_id = static_cast<int>(parse_count(id->first, id->second, 0));
    s.node_id_set = true;
  }
  if (auto het = first_set(env, {"SLURM_HET_SIZE", "SLURM_PACK_SIZE"})) {
    const long n = std::min(parse_count(het->first, het->second, 1), 4096L);  // (a component per node at most)
    for (long k = 0; k < n; ++k) {
      const std::string het_var = fmt::format("SLURM_JOB_NODELIST_HET_GROUP_{}", k);
      const std::string pack_var = fmt::format("SLURM_JOB_NODELIST_PACK_GROUP_{}", k);  // Slurm before 20.02
      if (auto list = first_set(env, {het_var.c_str(), pack_var.c_str()})) s.het_lists.push_back(*list);
    }
  }
  auto list = step ? first_set(env, {"SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"})
                   : first_set(env, {"SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  if (list) s.nodelist_var = list->first, s.nodelist = list->second;
  if (auto n = first_set(env, {"SLURMD_NODENAME"})) s.nodename = n->second;
  return s;
}

// ------------------------------------------------------------------ ports and hosts

int derived_port(const std::string& job_id, long step_id) {
  constexpr unsigned long kBase = 20000, kSteps = 8, kJobs = 1595;  // 1595 * 8 + 2 skipped <= 12768 ports
  unsigned long job = 0;
  auto [p, ec] = std::from_chars(job_id.data(), job_id.data() + job_id.size(), job);
  if (ec != std::errc() || p != job_id.data() + job_id.size()) {
    job = 1469598103934665603ULL;  // FNV-1a
    for (unsigned char c : job_id) job = (job ^ c) * 1099511628211ULL;
  }
  unsigned long port = kBase + (job % kJobs) * kSteps + static_cast<unsigned long>(step_id) % kSteps;
  if (port >= 29400) ++port;  // torchrun's c10d default
  if (port >= 29500) ++port;  // torchrun's static default
  return static_cast<int>(port);
}

std::vector<std::string> resolve_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::vector<std::string> out;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return out;
  for (addrinfo* a = res; a; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {0};
    const void* src = a->ai_family == AF_INET
                          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
    if (inet_ntop(a->ai_family, src, buf, sizeof buf)) out.emplace_back(buf);
  }
  freeaddrinfo(res);
  return out;
}

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool is_address(const std::string& s) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

}  // namespace

bool same_host(const std::string& endpoint, const std::string& node, const Resolver& resolve) {
  const std::string e = lower(endpoint), n = lower(node);
  if (e == n) return true;
  if (is_address(e)) {
    auto addrs = resolve(node);
    return std::find(addrs.begin(), addrs.end(), endpoint) != addrs.end();
  }
  if (is_address(n)) return false;
  // "n1" and "n1.cluster.example": one is the short form of the other.
  auto qualified = [](const std::string& s) { return s.find('.') != std::string::npos; };
  auto short_name = [](const std::string& s) { return s.substr(0, s.find('.')); };
  return qualified(e) != qualified(n) && short_name(e) == short_name(n);
}

// ------------------------------------------------------------------ deriving the job

namespace {

bool given(const Options& o, const char* flag) { return o.given.count(flag) > 0; }

// One node: a free port (like --standalone), so that jobs sharing the node never meet.
bool free_port_for_one_node(Options& o) {
  if (o.dynamic() || o.max_nodes != 1 || given(o, "master-port") || given(o, "rdzv-endpoint")) return false;
  o.master_port = 0;
  return true;
}

void one_node(Options& o, const Env& s, const std::string& where) {
  if (free_port_for_one_node(o))
    o.infos.push_back(
        fmt::format("Slurm {} {}: one node, so the store takes a free port (as if --master-port 0; "
                    "--no-slurm turns this off)",
                    where, s.step_name()));
}

// Several ddprun per node (or in the batch shell): no multi-node job can be derived.
void not_one_per_node(Options& o, const Env& s) {
  if (!given(o, "nnodes"))
    o.warnings.push_back(fmt::format(
        "Slurm step {} runs {} tasks on {} node{} ({}={}, {}={}): ddprun derives a multi-node job only with one "
        "ddprun per node, so this task runs a 1-node job of its own. Start it with srun --ntasks-per-node=1, or "
        "give --nnodes, --node-rank and --master-addr yourself",
        s.step_name(), s.ntasks, s.nnodes, s.nnodes > 1 ? "s" : "", s.ntasks_var, s.ntasks, s.nnodes_var, s.nnodes));
  one_node(o, s, "step");
}

void in_batch_shell(Options& o, const Env& s) {
  if (s.nnodes > 1 && !given(o, "nnodes"))
    o.warnings.push_back(fmt::format(
        "Slurm job {} has {} nodes ({}={}), but ddprun runs in its batch script (or salloc shell), not in an "
        "srun step (SLURM_STEP_ID is unset): this is a 1-node job on {} alone. To use every node, start one ddprun "
        "per node: srun --ntasks-per-node=1 ddprun ...",
        s.job_id, s.nnodes, s.nodelist_var, s.nodelist, s.nodename.empty() ? "this node" : s.nodename));
  one_node(o, s, "job");
}

// True when the job is this step (its node count, given or not, is the step's). Otherwise
// (--nnodes 2 in a 1-node step: one srun per node) its other nodes run in other steps, so
// nothing step-specific (rank, head, port, run id) may be derived; warns when it differs.
bool job_is_the_step(Options& o, const Env& s) {
  if (!given(o, "nnodes") || (o.min_nodes == s.nnodes && o.max_nodes == s.nnodes)) return true;
  if (o.min_nodes == o.max_nodes)
    o.warnings.push_back(fmt::format("{} {} but Slurm step {} has {} node{} ({}={}): {}", o.given.at("nnodes"),
                                     o.max_nodes, s.step_name(), s.nnodes, s.nnodes > 1 ? "s" : "", s.nnodes_var,
                                     s.nnodes,
                                     o.max_nodes == 1 ? "each node runs a 1-node job of its own"
                                     : o.dynamic()    ? "taken as a job whose other nodes run in other steps, so "
                                                        "nothing else is derived from Slurm (the run id): give "
                                                        "--rdzv-id, or leave --nnodes out"
                                                      : "taken as a job whose other nodes run in other steps, so "
                                                        "nothing else is derived from Slurm (this node's rank, the "
                                                        "store's address): give them, or leave --nnodes out"));
  return false;
}

// The step's nodes in SLURM_NODEID order, checked against its node count and this node's
// index; empty when a heterogeneous step's order cannot be told (Env::nodes_by_id).
std::vector<std::string> step_nodes(const Env& s) {
  std::vector<std::string> nodes = s.nodes();
  if (static_cast<int>(nodes.size()) != s.nnodes)
    throw UsageError(fmt::format("{}={} lists {} hosts but {}={}", s.nodelist_var, s.nodelist, nodes.size(),
                                 s.nnodes_var, s.nnodes));
  if (s.node_id >= s.nnodes)
    throw UsageError(fmt::format("SLURM_NODEID={} is outside the step's {} nodes ({}={})", s.node_id, s.nnodes,
                                 s.nodelist_var, s.nodelist));
  return s.nodes_by_id();
}

std::string het_text(const Env& s) {
  std::vector<std::string> lists;
  for (const auto& [var, text] : s.het_lists) lists.push_back(var + "=" + text);
  return fmt::format("{}", fmt::join(lists, ", "));
}

std::string node_id_text(const Env& s) { return s.node_id_set ? std::to_string(s.node_id) : "unset"; }

// One info line per node saying what came from Slurm.
void note_derived(Options& o, const Env& s, const std::vector<std::string>& flags) {
  if (!flags.empty())
    o.infos.push_back(fmt::format("Slurm step {} ({}={}, SLURM_NODEID={}): as if given {} (--no-slurm turns this off)",
                                  s.step_name(), s.nodelist_var, s.nodelist, node_id_text(s), fmt::join(flags, " ")));
}

// Without SLURM_NODEID no node can tell its rank: a multi-node static job would give every
// node rank 0 (each hosting a store of its own, all waiting for join_timeout).
void need_node_id(const Env& s, const char* what) {
  if (!s.node_id_set)
    throw UsageError(fmt::format("Slurm step {} has {} nodes ({}={}) but SLURM_NODEID is not set (srun sets it; a "
                                 "wrapper that filters the environment drops it), so {} cannot be derived: give it, "
                                 "pass SLURM_NODEID through, or turn Slurm detection off with --no-slurm",
                                 s.step_name(), s.nnodes, s.nodelist_var, s.nodelist, what));
}

// The step's first node (SLURM_NODEID 0), where the store is hosted: `flag` names what
// to give instead when it cannot be told or does not resolve here.
std::string store_node(const Env& s, const std::vector<std::string>& nodes, const Resolver& resolve,
                       const char* flag) {
  if (nodes.empty())
    throw UsageError(fmt::format(
        "Slurm step {} is heterogeneous ({}), and which of its nodes is SLURM_NODEID 0 (the store's host) cannot be "
        "told from the components' node lists ({}): give {} (the first node of the step's first component), or turn "
        "Slurm detection off with --no-slurm",
        s.step_name(), fmt::format("{}={}", s.nodelist_var, s.nodelist), het_text(s), flag));
  if (resolve(nodes[0]).empty())
    throw ddp::Error(fmt::format(
        "Slurm step {}: its first node '{}' ({}={}) does not resolve on this node, so no node could reach the store "
        "there; give its address with {} (or turn Slurm detection off with --no-slurm)",
        s.step_name(), nodes[0], s.nodelist_var, s.nodelist, flag));
  return nodes[0];
}

void apply_static(Options& o, const Env& s, const Resolver& resolve) {
  std::vector<std::string> flags;
  if (!given(o, "nnodes")) {
    o.min_nodes = o.max_nodes = s.nnodes;
    flags.push_back(fmt::format("--nnodes {}", s.nnodes));
  }
  const bool whole = job_is_the_step(o, s);
  if (o.max_nodes == 1) return one_node(o, s, "step");
  if (!whole) return;
  const std::vector<std::string> nodes = step_nodes(s);
  if (!given(o, "node-rank")) {
    need_node_id(s, "--node-rank");
    o.node_rank = s.node_id;
    flags.push_back(fmt::format("--node-rank {}", s.node_id));
  } else if (s.node_id_set && o.node_rank != s.node_id) {
    o.warnings.push_back(fmt::format(
        "{} {} disagrees with SLURM_NODEID={} (this node{}'s index in Slurm step {}): a $SLURM_NODEID typed in the "
        "batch script is expanded there, where it is 0 on every node; leave --node-rank out and ddprun takes it "
        "from Slurm",
        o.given.at("node-rank"), o.node_rank, s.node_id, s.nodename.empty() ? "" : ", " + s.nodename, s.step_name()));
  }
  const bool endpoint = given(o, "rdzv-endpoint");
  if (!given(o, "master-addr") && !endpoint) {
    o.master_addr = store_node(s, nodes, resolve, "--master-addr");
    flags.push_back(fmt::format("--master-addr {}", nodes[0]));
  }
  if (!given(o, "master-port") && !endpoint) {
    o.master_port = derived_port(s.job_id, *s.step_id);
    flags.push_back(fmt::format("--master-port {}", o.master_port));
  }
  if (!given(o, "rdzv-id")) {
    o.rdzv_id = s.step_name();
    flags.push_back(fmt::format("--rdzv-id {}", o.rdzv_id));
  }
  note_derived(o, s, flags);
}

// c10d's is_host: node 0 hosts the store when the endpoint names the step's first node.
void apply_c10d_host(Options& o, const Env& s, const Resolver& resolve, std::vector<std::string>& flags) {
  std::string host;
  int port = 0;
  parse_endpoint(o.given.count("rdzv-endpoint") ? o.given.at("rdzv-endpoint") : "--rdzv-endpoint", o.rdzv_endpoint,
                 29400, host, port);
  if (!o.rdzv_conf.is_host && s.nnodes > 1) {
    const std::vector<std::string> nodes = step_nodes(s);
    if (!nodes.empty() && same_host(host, nodes[0], resolve)) {
      need_node_id(s, "which node hosts the store (--rdzv-conf is_host)");
      o.rdzv_conf.is_host = s.node_id == 0;
      flags.push_back(
          fmt::format("--rdzv-conf is_host={} (the endpoint {} is the step's first node {}; this is node {})",
                      s.node_id == 0 ? 1 : 0, host, nodes[0], s.node_id));
    }
  }
}

// The dynamic backends (c10d, etcd, etcd-v2): the node count and run id from the step; with
// c10d also which node hosts the store, when the endpoint is the step's first node.
void apply_dynamic(Options& o, const Env& s, const Resolver& resolve) {
  std::vector<std::string> flags;
  const bool whole = job_is_the_step(o, s);
  // c10d with no endpoint in a multi-node step: the step's first node hosts the store, as
  // on the static line (before: every node hosted a 1-node job of its own, and succeeded).
  if (o.rdzv_endpoint.empty() && o.rdzv_backend == "c10d" && s.nnodes > 1 && whole) {
    o.rdzv_endpoint = fmt::format("{}:{}", store_node(s, step_nodes(s), resolve, "--rdzv-endpoint"),
                                  derived_port(s.job_id, *s.step_id));
    flags.push_back(fmt::format("--rdzv-endpoint {}", o.rdzv_endpoint));
  }
  if (o.rdzv_endpoint.empty()) return;
  if (!given(o, "nnodes")) {
    o.min_nodes = o.max_nodes = s.nnodes;
    flags.push_back(fmt::format("--nnodes {}", s.nnodes));
  }
  if (whole && !given(o, "rdzv-id")) {
    o.rdzv_id = s.step_name();
    flags.push_back(fmt::format("--rdzv-id {}", o.rdzv_id));
  }
  if (o.rdzv_backend == "c10d") apply_c10d_host(o, s, resolve, flags);
  note_derived(o, s, flags);
}

}  // namespace

void apply(Options& o, const std::map<std::string, std::string>& env, const Resolver& resolve) {
  if (o.no_slurm || o.standalone) return;
  std::optional<Env> s = read_env(env);
  if (!s) return;
  if (!s->in_step()) return in_batch_shell(o, *s);
  if (s->ntasks != s->nnodes) return not_one_per_node(o, *s);
  if (o.dynamic()) return apply_dynamic(o, *s, resolve);
  apply_static(o, *s, resolve);
}

}  // namespace ddprun::slurm
