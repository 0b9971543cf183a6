#include "launcher/stack_dump.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <optional>
#include <map>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "collectives/progress_record.hpp"
#include "ddp/error.hpp"
#include "launcher/fileio.hpp"
#include "launcher/output.hpp"
#include "launcher/process.hpp"

namespace ddprun {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// A dump is complete once its file stopped growing for this long (faulthandler writes it
// from one signal handler in well under a millisecond; it marks no end), or at once when
// it has grown and no thread of the process is running any more (the handler returned).
constexpr std::chrono::milliseconds kQuiet{50};
constexpr std::chrono::milliseconds kPoll{1};

// Whether some thread of pid is running or runnable (R), or in an uninterruptible wait (D,
// as in a write): one may still be in the dump's signal handler. True when unreadable.
bool some_thread_busy(pid_t pid) {
  auto threads = thread_states(pid);
  return !threads || std::any_of(threads->begin(), threads->end(), [](const auto& t) {
           return t.second == 'R' || t.second == 'D' || t.second == 0;
         });
}

// Whether pid is root or one of its descendants (a wrapper script's python).
bool in_tree(pid_t pid, pid_t root) {
  for (int depth = 0; depth < 32 && pid > 1; ++depth) {
    if (pid == root) return true;
    pid_t parent = 0;
    if (!process_state(pid, &parent)) return false;
    pid = parent;
  }
  return false;
}

// A number of the bootstrap's first line in the file ("ddprun-stacks pid=<pid> fd=<fd>"):
// the one after `tag`, or -1.
int announced(const std::string& file, std::string_view tag) {
  auto head = read_file(file, 64);
  if (!head || !head->starts_with(kAnnounce)) return -1;
  const std::string line = head->substr(0, head->find('\n'));
  const size_t at = line.find(tag);
  int n = -1;
  if (at != std::string::npos) std::from_chars(line.data() + at + tag.size(), line.data() + line.size(), n);
  return n;
}

pid_t announced_pid(const std::string& file) { return announced(file, kAnnounce); }

off_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : 0;
}

// The file's bytes from `offset` on (at most 4 MiB): only the new dump, however many
// earlier ones the file holds.
std::string read_from(const std::string& path, off_t offset) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string out;
  char buf[65536];
  for (ssize_t n; out.size() < (4u << 20) && (n = ::pread(fd, buf, sizeof buf, offset)) > 0; offset += n)
    out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

struct Asked {
  size_t idx;
  pid_t pid;  // the process that was signalled
  off_t start, size;
  Clock::time_point changed;
};

// One look at a worker that was asked: true once its answer is settled (in `out`).
bool settled(const StackTarget& t, Asked& a, RankStack& out, Clock::time_point now) {
  off_t size = file_size(t.file);
  if (size != a.size) {
    a.size = size;
    a.changed = now;
    return false;
  }
  if (size > a.start && (now - a.changed >= kQuiet || (!some_thread_busy(a.pid) && file_size(t.file) == size))) {
    out.text = readable_native(read_from(t.file, a.start));
    if (out.text.empty() || out.text.back() != '\n') return false;
    out.kind = RankStack::Kind::kStack;
    return true;
  }
  if (size <= a.start && process_gone(a.pid)) {  // (a forked child's /proc file goes with it: size 0)
    out.kind = RankStack::Kind::kExited;
    return true;
  }
  return false;
}

}  // namespace

std::string native_threads(pid_t pid) {
  auto threads = thread_states(pid);
  if (!threads) return "gone";
  std::map<std::string, int> states;
  int n = 0;
  for (const auto& [tid, state] : *threads) {
    std::string what = state ? std::string(1, state) : "?";
    std::string wchan = read_file(fmt::format("/proc/{}/task/{}/wchan", pid, tid), 128).value_or("");
    if (!wchan.empty() && wchan != "0") what += " " + wchan;
    ++states[what];
    ++n;
  }
  std::vector<std::string> parts;
  for (const auto& [what, count] : states) parts.push_back(fmt::format("{}x {}", count, what));
  return fmt::format("{} thread{}: {}", n, n == 1 ? "" : "s", fmt::join(parts, ", "));
}

std::vector<RankStack> take_stacks(const std::vector<StackTarget>& targets, Clock::time_point deadline,
                                   const std::function<bool()>& interrupted) {
  std::vector<RankStack> out(targets.size());
  std::vector<Asked> asked;
  for (size_t i = 0; i < targets.size(); ++i) {
    const StackTarget& t = targets[i];
    RankStack& r = out[i];
    r.rank = t.rank, r.local_rank = t.local_rank, r.pid = t.pid;
    if (process_gone(t.pid)) {
      r.kind = RankStack::Kind::kExited;
      continue;
    }
    pid_t who = announced_pid(t.file);
    if (who <= 0 || !in_tree(who, t.pid)) {
      r.kind = RankStack::Kind::kNoBootstrap;
      r.native = native_threads(t.pid);
      continue;
    }
    off_t start = file_size(t.file);
    if (kill(who, kWorkerSignal) != 0) {
      r.kind = RankStack::Kind::kExited;
      continue;
    }
    asked.push_back(Asked{i, who, start, start, Clock::now()});
  }
  while (!asked.empty()) {
    const auto now = Clock::now();
    std::erase_if(asked, [&](Asked& a) { return settled(targets[a.idx], a, out[a.idx], now); });
    if (asked.empty() || now >= deadline || (interrupted && interrupted())) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(kPoll, deadline - now));
  }
  for (Asked& a : asked) {  // the deadline passed
    RankStack& r = out[a.idx];
    r.text = readable_native(read_from(targets[a.idx].file, a.start));
    r.kind = r.text.empty() ? RankStack::Kind::kNoAnswer : RankStack::Kind::kIncomplete;
    if (r.text.empty()) r.native = native_threads(a.pid);
  }
  return out;
}

namespace {

// The processes `t`'s rank (pid `who`) forked that answer into a file of their own: the
// bootstrap's at-fork hook put one on the rank's descriptor number (its announcement says
// which) and announced the child there; one that exec'd since has none. Read through /proc
// (no file system is asked: a stalled one never stalls ddprun here). At most kMostForked;
// `more` counts those past it.
std::vector<StackTarget> forked_targets(const StackTarget& t, pid_t who, size_t& more) {
  std::vector<StackTarget> out;
  const int fd = announced(t.file, " fd=");
  if (fd < 0 || who <= 0) return out;
  const auto link = [fd](pid_t pid) {
    std::error_code ec;
    return fs::read_symlink(fmt::format("/proc/{}/fd/{}", pid, fd), ec).string();
  };
  const std::string rank_file = link(who);
  for (pid_t kid : descendants(-1, who)) {
    std::string path = fmt::format("/proc/{}/fd/{}", kid, fd);
    // (Still the rank's file, as in a child forked from C: not read.)
    const std::string own = link(kid);
    if (own.empty() || own == rank_file || announced_pid(path) != kid) continue;
    if (out.size() == kMostForked)
      ++more;
    else
      out.push_back(StackTarget{t.rank, t.local_rank, kid, std::move(path)});
  }
  return out;
}

}  // namespace

void take_forked_stacks(const std::vector<StackTarget>& targets, std::vector<RankStack>& stacks,
                        Clock::time_point deadline, const std::function<bool()>& interrupted) {
  std::vector<StackTarget> kids;
  std::vector<size_t> owner;
  for (size_t i = 0; i < targets.size() && i < stacks.size(); ++i) {
    if (stacks[i].kind != RankStack::Kind::kStack) continue;
    for (auto& k : forked_targets(targets[i], announced_pid(targets[i].file), stacks[i].forked_not_asked)) {
      kids.push_back(std::move(k));
      owner.push_back(i);
    }
  }
  if (kids.empty() || Clock::now() >= deadline || (interrupted && interrupted())) {
    for (auto& s : stacks) s.forked_not_asked = 0;  // (none was asked: no "more not asked")
    return;
  }
  // Each in a file of its own, announced there as a rank is in its: asked as the ranks were.
  auto answers = take_stacks(kids, deadline, interrupted);
  for (size_t j = 0; j < answers.size(); ++j)
    if (answers[j].kind != RankStack::Kind::kExited && answers[j].kind != RankStack::Kind::kNoBootstrap)
      stacks[owner[j]].forked.push_back(std::move(answers[j]));
}

namespace {
constexpr std::string_view kHangDump = "hang on node ", kFailureDump = "failure on node ";
}

std::string dump_name(DumpKind kind, int node, const std::string& host, int number) {
  switch (kind) {
    case DumpKind::kHang: return fmt::format("{}{} ({})", kHangDump, node, host);
    case DumpKind::kFailure: return fmt::format("{}{} ({})", kFailureDump, node, host);
    case DumpKind::kOnDemand: break;
  }
  return fmt::format("dump {} asked on node {} ({})", number, node, host);
}

DumpKind dump_kind(std::string_view what) {
  if (what.starts_with(kHangDump)) return DumpKind::kHang;
  if (what.starts_with(kFailureDump)) return DumpKind::kFailure;
  return DumpKind::kOnDemand;
}

std::string bootstrap_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  fs::path dir = (exe.parent_path() / ".." / "share" / "ddprun" / "python").lexically_normal();
  if (::access((dir / "sitecustomize.py").c_str(), R_OK) != 0) return "";
  return dir.string();
}

// ------------------------------------------------------------------ the supervisor's hooks

namespace {

std::string worker_dir(const WorkerResult& w) { return fs::path(w.error_file).parent_path().string(); }
std::string stack_file(const WorkerResult& w) { return worker_dir(w) + "/stacks"; }
std::string heartbeat_file(const WorkerResult& w) { return worker_dir(w) + "/heartbeat"; }
std::string progress_file(const WorkerResult& w) { return worker_dir(w) + "/progress"; }

// The ranks of this attempt that are no longer running (but `skip`), beside those whose
// stacks were taken, in rank order: a rank that finished early is often why the others
// wait (a collective it never joins), and must not vanish from "where each rank is".
std::vector<RankStack> with_ended(std::vector<RankStack> stacks, const std::vector<WorkerResult>& workers,
                                  const WorkerResult* skip) {
  using S = WorkerResult::State;
  for (const auto& w : workers) {
    if (w.state == S::kRunning || (skip && w.rank == skip->rank)) continue;  // (by rank: no process, pid -1)
    RankStack s;
    s.rank = w.rank;
    s.local_rank = w.local_rank;
    s.pid = w.pid;
    s.kind = RankStack::Kind::kExited;
    s.given = w.signal ? fmt::format("not running: killed by {}", signal_name(w.signal))
                       : fmt::format("not running: exited with code {}", w.exit_code);
    stacks.push_back(std::move(s));
  }
  std::stable_sort(stacks.begin(), stacks.end(), [](const RankStack& a, const RankStack& b) { return a.rank < b.rank; });
  return stacks;
}

// A libddp worker's record (collectives/progress_record.hpp) as plain values.
struct Record {
  char magic[8];
  uint64_t version, started, completed;
  uint32_t op, backend;
  uint64_t bytes;
  int64_t since_ns;
};
static_assert(sizeof(Record) == sizeof(ddp::detail::ProgressRecord));

// Read consistently: twice, until both reads agree on an even version. nullopt: no record
// (not a libddp worker).
std::optional<Record> read_record(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::optional<Record> out;
  Record a, b;
  for (int i = 0; i < 100 && !out; ++i) {
    if (::pread(fd, &a, sizeof a, 0) != static_cast<ssize_t>(sizeof a) ||
        ::pread(fd, &b, sizeof b, 0) != static_cast<ssize_t>(sizeof b))
      break;
    if (std::memcmp(a.magic, ddp::detail::ProgressRecord::kMagic, sizeof a.magic) != 0) break;
    if (std::memcmp(&a, &b, sizeof a) == 0 && (a.version & 1) == 0) out = a;
  }
  ::close(fd);
  return out;
}

std::string seconds(std::chrono::milliseconds d) { return fmt::format("{:g}", static_cast<double>(d.count()) / 1000); }

}  // namespace

bool StackDumps::stop_pending() const {
  sigset_t pending;
  if (sigpending(&pending) != 0) return false;
  for (int s : o_.stop_signals())
    if (sigismember(&pending, s) == 1) return true;
  return false;
}

StackDumps::StackDumps(const Options& o, std::string hostname)
    : o_(o), hostname_(std::move(hostname)),
      hang_timeout_(static_cast<long>(o.hang_timeout * 1000)) {
  if (!o.stack_dumps) return;
  bootstrap_ = bootstrap_dir();
  if (bootstrap_.empty())
    spdlog::warn("stack dumps: the worker bootstrap (share/ddprun/python/sitecustomize.py next to {}) is missing: "
                 "Python workers will show no stacks",
                 fs::read_symlink("/proc/self/exe").string());
}

std::vector<int> StackDumps::trigger_signals(const Options& o) {
  if (!o.stack_dumps) return {};
  std::vector<int> sigs{SIGURG};
  if (std::find(o.signals_to_handle.begin(), o.signals_to_handle.end(), SIGQUIT) == o.signals_to_handle.end())
    sigs.push_back(SIGQUIT);
  return sigs;
}

bool StackDumps::is_trigger(int sig) const {
  auto sigs = trigger_signals(o_);
  return std::find(sigs.begin(), sigs.end(), sig) != sigs.end();
}

std::string StackDumps::collectives(const std::vector<WorkerResult>& workers) const {
  std::vector<RankCollective> ranks;
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  const int64_t now_ns = static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
  for (const auto& w : workers) {
    if (w.state != WorkerResult::State::kRunning && w.state != WorkerResult::State::kFailed) continue;
    auto r = read_record(progress_file(w));
    if (!r || r->started == 0) continue;
    RankCollective c;
    c.rank = w.rank;
    c.op = ddp::detail::progress_op_name(r->op);
    c.number = r->started;
    c.in_flight = r->completed < r->started;
    c.bytes = r->bytes;
    c.backend = r->backend == ddp::detail::ProgressRecord::kNccl ? "nccl" : "cpu";
    c.seconds = static_cast<double>(std::max<int64_t>(0, now_ns - r->since_ns)) / 1e9;
    ranks.push_back(c);
  }
  std::string lines = collective_lines(ranks);
  return lines.empty() ? "" : "[ddprun] libddp collectives (the one in flight, or the last one):\n" + lines;
}

uint64_t StackDumps::collectives_done(const WorkerResult& w) const {
  auto r = read_record(progress_file(w));
  return r ? r->completed : 0;
}

void StackDumps::add_env(std::map<std::string, std::string>& env, const WorkerResult& w) const {
  if (hang_timeout_.count() > 0) env["DDPRUN_HEARTBEAT_FILE"] = heartbeat_file(w);
  if (!o_.stack_dumps) return;
  // libddp's: its collective record, and where a C++ worker writes its native stack.
  env["DDPRUN_PROGRESS_FILE"] = progress_file(w);
  env["DDPRUN_STACK_FILE"] = stack_file(w);
  if (bootstrap_.empty()) return;
  auto pp = env.find("PYTHONPATH");
  env["PYTHONPATH"] = pp == env.end() || pp->second.empty() ? bootstrap_ : bootstrap_ + ":" + pp->second;
  env["DDPRUN_PID"] = std::to_string(getpid());
}

bool StackDumps::failure_notice(int sig, pid_t sender, const std::vector<WorkerResult>& workers, bool stopping,
                                const WorkerResult*& failing) const {
  failing = nullptr;
  if (sig != kWorkerSignal || sender <= 0) return false;
  for (const auto& w : workers)
    if (sender == w.pid || (w.state == WorkerResult::State::kRunning && in_tree(sender, w.pid))) {
      // The first failure's stacks are taken (those after it follow from it).
      if (failing_ < 0 && !stopping && w.state == WorkerResult::State::kRunning) {
        spdlog::info("rank {} is failing (an uncaught exception): taking the other ranks' stacks", w.rank);
        failing = &w;
      }
      return true;
    }
  return false;
}

std::vector<StackTarget> StackDumps::targets(const std::vector<WorkerResult>& workers, const WorkerResult* skip) const {
  std::vector<StackTarget> out;
  for (const auto& w : workers)
    if (w.state == WorkerResult::State::kRunning && (!skip || w.pid != skip->pid))
      out.push_back(StackTarget{w.rank, w.local_rank, w.pid, stack_file(w)});
  return out;
}

// The output's prefix, and the rank's in front when it does not name it (a raw template, one
// of local ranks only): a block of stacks must say whose it is.
std::vector<std::string> StackDumps::prefixes(const std::vector<RankStack>& stacks, const std::string& host) const {
  std::string tpl = o_.log_line_prefix_template.value_or("[rank${rank}]:");
  if (tpl.find("${rank}") == std::string::npos) tpl = "[rank${rank}]:" + tpl;
  std::vector<std::string> out;
  for (const auto& s : stacks)
    out.push_back(expand_prefix(tpl, s.rank, s.local_rank, o_.role, host));
  return out;
}

std::string StackDumps::save(const std::string& attempt_dir, const std::string& name, const std::string& text) {
  const std::string path = attempt_dir + "/" + name;
  if (write_file(path, text)) return path;
  spdlog::warn("cannot write {}: {}", path, ddp::errno_text(errno));
  return "";
}

std::string StackDumps::on_demand(const std::vector<WorkerResult>& workers, const std::string& attempt_dir,
                                  const std::string& what, const std::string& trigger, bool stopping) {
  const std::string why = trigger.empty() ? what : fmt::format("{} ({})", trigger, what);
  auto ts = targets(workers, nullptr);
  const int number = ++dumps_;
  Taken& kept = kept_.emplace_back(Taken{what, fmt::format("stacks_{}_all_nodes.txt", number), {}});
  if (kept_.size() > 8) kept_.pop_front();  // (kept is the last: still valid)
  if (ts.empty()) {
    spdlog::warn("{}: every rank's stack was asked for, but no worker is running", why);
    return "";
  }
  const auto t0 = Clock::now();
  const bool remote = trigger.empty();
  if (last_dump_ && (remote || last_dump_->remote) && t0 - last_dump_->at < kShared) {
    spdlog::warn("{}: the stacks of this node's ranks shown {:.2f} s ago, for {}; {}", why,
                 std::chrono::duration<double>(t0 - last_dump_->at).count(), last_dump_->what,
                 stopping ? "the workers are being stopped" : "the job runs on");
    kept.stacks = last_dump_->stacks;
    return "";
  }
  auto stacks = take_stacks(ts, t0 + kOnDemand, [this] { return stop_pending(); });
  take_forked_stacks(ts, stacks, t0 + kOnDemand, [this] { return stop_pending(); });
  stacks = with_ended(std::move(stacks), workers, nullptr);
  not_reading_ += Clock::now() - t0;
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  std::string body = full_dump(stacks, prefixes(stacks));
  std::string where = where_lines(stacks);
  std::string file =
      save(attempt_dir, fmt::format("stacks_{}.txt", number), full_dump(stacks, prefixes(stacks), true) + "where:\n" + where);
  const bool forked = std::any_of(stacks.begin(), stacks.end(), [](auto& s) { return !s.forked.empty(); });
  auto answered = std::count_if(stacks.begin(), stacks.end(),
                                [](auto& s) { return s.kind == RankStack::Kind::kStack; });
  spdlog::warn("{}: the stacks of {} rank{} on {} ({} answered in {:.2f} s{}){}", why, ts.size(),
               ts.size() == 1 ? "" : "s", hostname_, answered, took,
               file.empty() || (o_.log_dir.empty() && !forked) ? ""
               : o_.log_dir.empty() ? fmt::format(", every thread of the processes they forked in {}", file)
                                    : ", saved in " + file,
               dump_kind(what) == DumpKind::kHang ? ""
               : stopping                         ? "; the workers are being stopped"
                                                  : "; the job runs on");
  last_dump_ = LastDump{what, remote, Clock::now(), stacks};
  kept.stacks = std::move(stacks);
  return body + "[ddprun] where each rank is (main thread, innermost frame first):\n" + where + collectives(workers);
}

std::optional<StackDumps::Taken> StackDumps::take_kept(const std::string& what) {
  auto it = std::find_if(kept_.begin(), kept_.end(), [&](const Taken& t) { return t.what == what; });
  if (it == kept_.end()) return std::nullopt;
  Taken t = std::move(*it);
  kept_.erase(it);
  return t;
}

// The node that asked reads every answer at once: 16 MiB in all, at most 512 KiB a node
// (under etcd's request limit); each rank's signature is whole whatever is cut.
static size_t answer_budget(const JobPlan& plan) {
  return std::clamp<size_t>((size_t{16} << 20) / std::max(1, plan.group_world_size), size_t{16} << 10,
                            size_t{512} << 10);
}

NodeStacks StackDumps::mine(const JobPlan& plan, std::vector<RankStack> stacks) const {
  return NodeStacks{plan.group_rank, hostname_, plan.rank_base, o_.nproc_per_node, std::move(stacks)};
}

std::string StackDumps::answer(const std::string& what, const JobPlan& plan) {
  auto kept = take_kept(what);
  return encode_node_stacks(mine(plan, kept ? std::move(kept->stacks) : std::vector<RankStack>{}), answer_budget(plan));
}

namespace {

// Every rank of the job, from the nodes' answers (this node's among them): those that were
// running with their stacks, the others with why there is none.
struct JobView {
  std::vector<RankStack> all;
  std::map<int, std::string> node_of;  // rank -> "node 1 (hostb)", for the ranks of nodes that answered
  std::vector<int> silent_nodes;
  std::string body;  // every answer's full dumps
  size_t ranks_seen = 0;  // the ranks whose nodes answered (the first of `all`)
};

std::string node_text(int node, const std::string& host) { return fmt::format("node {} ({})", node, host); }

// `root` (-1: none): a rank that failed on this node, left out of the view but not missing.
JobView job_view(std::vector<NodeStacks> nodes, const JobPlan& plan, int root, const std::string& host,
                 const std::function<std::vector<std::string>(const NodeStacks&)>& prefixes) {
  std::sort(nodes.begin(), nodes.end(), [](auto& a, auto& b) { return a.node < b.node; });
  JobView v;
  for (const auto& n : nodes) {
    v.body += full_dump(n.ranks, prefixes(n));
    for (const auto& r : n.ranks) v.node_of[r.rank] = node_text(n.node, n.host);
    v.all.insert(v.all.end(), n.ranks.begin(), n.ranks.end());
  }
  if (root >= 0) v.node_of[root] = node_text(plan.group_rank, host);
  auto add = [&v](int rank, const char* why) {
    RankStack s;
    s.rank = rank;
    s.given = why;
    v.all.push_back(std::move(s));
  };
  for (const auto& n : nodes)  // ranks that had exited, or not started
    for (int r = n.first_rank; r < n.first_rank + n.nranks; ++r)
      if (v.node_of.try_emplace(r, node_text(n.node, n.host)).second) add(r, "not running on its node");
  v.ranks_seen = v.all.size();
  for (int n = 0; n < plan.group_world_size; ++n)
    if (std::none_of(nodes.begin(), nodes.end(), [&](auto& a) { return a.node == n; })) v.silent_nodes.push_back(n);
  for (int r = 0; r < plan.world_size; ++r)
    if (!v.node_of.contains(r)) add(r, "no answer from its node");
  return v;
}

}  // namespace

std::string StackDumps::job_wide(const rdzv::DumpAnswers& got, const JobPlan& plan, const std::string& attempt_dir) {
  auto kept = take_kept(got.what);
  if (!kept) return "";
  std::vector<NodeStacks> nodes{mine(plan, std::move(kept->stacks))};
  for (auto& r : nodes[0].ranks) r.forked.clear(), r.forked_not_asked = 0;  // (the other nodes send none: one rule for all)
  for (const auto& a : got.answers)
    if (auto n = decode_node_stacks(a)) nodes.push_back(std::move(*n));
  const JobView v = job_view(std::move(nodes), plan, kept->root, hostname_,
                             [this](const NodeStacks& n) { return prefixes(n.ranks, n.host); });
  const std::string where = where_lines(v.all);
  std::string file = save(attempt_dir, kept->job_file, v.body + "where:\n" + where);
  const double took = std::chrono::duration<double>(got.took).count();
  const size_t answered_nodes = static_cast<size_t>(plan.group_world_size) - v.silent_nodes.size();
  std::string answered =
      v.silent_nodes.empty()
          ? fmt::format("every node answered ({} nodes, {} ranks, in {:.2f} s)", answered_nodes, plan.world_size, took)
          : fmt::format("{} of {} other node{} answered within {:.2f} s; no answer from node{} {}", answered_nodes - 1,
                        got.asked, got.asked == 1 ? "" : "s", took, v.silent_nodes.size() == 1 ? "" : "s",
                        rank_ranges(v.silent_nodes));
  // (A failure's summary shows the view: said at info, as each failed attempt's may be.)
  spdlog::log(got.what == failure_what_ ? spdlog::level::info : spdlog::level::warn, "{}: {}{}", got.what, answered,
              o_.log_dir.empty() || file.empty() ? "" : "; every node's saved in " + file);
  // Which ranks stand out is judged among those whose nodes answered.
  const std::vector<RankStack> seen(v.all.begin(), v.all.begin() + static_cast<std::ptrdiff_t>(v.ranks_seen));
  std::set<std::string> odd_nodes;  // where the ranks that stand out are
  for (int r : outliers(seen)) odd_nodes.insert(v.node_of.at(r));
  const std::string odd = odd_nodes.empty() ? "" : fmt::format(": on {}", fmt::join(odd_nodes, ", "));
  if (got.what == hang_what_ && hang_) {  // the summary's block shows the whole job
    hang_view_.named = standing_out(seen) + odd;
    hang_view_.where = where;
    hang_view_.file = file;
    compose_hang_report();
  }
  if (got.what == failure_what_) {  // the summary's note shows the whole job (and nothing more now)
    failure_note_ = fmt::format("Where the other ranks of the job were (main thread, innermost frame first{}):\n{}{}{}",
                                file.empty() ? "" : "; every thread of every node: " + file, where,
                                odd.empty() ? "" : "  " + standing_out(seen) + odd + "\n", failure_table_);
    return "";
  }
  return fmt::format("[ddprun] where each rank of the job is (main thread, innermost frame first):\n{}  {}{}\n", where,
                     standing_out(seen), odd);
}

void StackDumps::at_failure(const std::vector<WorkerResult>& workers, const WorkerResult& root,
                            const std::string& attempt_dir, const std::string& what) {
  if (failing_ > 0) return;  // taken when a rank announced its failure (the root cause)
  failing_ = root.pid;
  failure_note_ = failure_stacks(workers, &root, attempt_dir, "Where the other ranks were");
  root_note_ = true;
  if (!failure_note_.empty()) spdlog::info("rank {} failed; {}", root.rank, failure_note_);
  if (what.empty() || !o_.stack_dumps) return;
  failure_what_ = what;
  kept_.push_back(Taken{what, "stacks_at_failure_all_nodes.txt", at_end_.value_or(std::vector<RankStack>{}), root.rank});
}

void StackDumps::at_remote_failure(const std::vector<WorkerResult>& workers, const std::string& attempt_dir) {
  if (failing_ >= 0) return;  // this node's own failure was taken first
  failing_ = 0;
  failure_note_ = failure_stacks(workers, nullptr, attempt_dir, "Where this node's ranks were");
}

void StackDumps::at_expiry(const std::vector<WorkerResult>& workers, const WorkerResult& expired,
                           const std::string& attempt_dir) {
  if (failing_ > 0) return;
  failing_ = expired.pid;  // at_failure keeps these
  failure_note_ = failure_stacks(workers, nullptr, attempt_dir,
                                 fmt::format("Where each rank was when rank {}'s timer expired", expired.rank));
}

std::string StackDumps::failure_stacks(const std::vector<WorkerResult>& workers, const WorkerResult* root,
                                       const std::string& attempt_dir, const std::string& title) {
  if (!o_.stack_dumps) return "";
  auto ts = targets(workers, root);
  if (ts.empty()) return "";
  auto stacks = with_ended(take_stacks(ts, Clock::now() + kAtFailure, [this] { return stop_pending(); }), workers, root);
  failure_file_ = save(attempt_dir, "stacks_at_failure.txt", full_dump(stacks, prefixes(stacks)));
  failure_title_ = title;
  at_end_ = stacks;
  failure_table_ = collectives(workers);
  return failure_text(stacks);
}

std::string StackDumps::failure_text(const std::vector<RankStack>& stacks) const {
  return fmt::format("{} (main thread, innermost frame first{}):\n{}{}", failure_title_,
                     failure_file_.empty() ? "" : "; every thread: " + failure_file_, where_lines(stacks),
                     failure_table_);
}

void StackDumps::settle_root(const std::vector<WorkerResult>& workers, const WorkerResult& root) {
  // Only this node's note on its root cause (an expired timer's shows every rank, and a
  // job-wide note was composed with the other nodes' answers).
  if (!root_note_ || !at_end_ || !failure_what_.empty()) return;
  std::vector<RankStack>& stacks = *at_end_;
  // The root cause and the ranks the summary lists as failures are not "the other ranks".
  auto failed = [&](pid_t pid) {
    return pid == root.pid ||
           std::any_of(workers.begin(), workers.end(), [&](const WorkerResult& w) { return w.pid == pid && w.failed(); });
  };
  const size_t before = stacks.size();
  std::erase_if(stacks, [&](const RankStack& s) { return failed(s.pid); });
  bool changed = stacks.size() != before;
  // The rank whose notice took the stacks, when it is not the root cause: its own was not
  // taken, and it is failing.
  auto announcer = std::find_if(workers.begin(), workers.end(), [&](const WorkerResult& w) { return w.pid == announcer_; });
  if (announcer_ > 0 && failing_ == announcer_ && announcer != workers.end() && !failed(announcer_)) {
    RankStack s;
    s.rank = announcer->rank;
    s.local_rank = announcer->local_rank;
    s.pid = announcer->pid;
    s.kind = RankStack::Kind::kExited;
    s.given = kFailingOnAnException;
    stacks.push_back(std::move(s));
    std::stable_sort(stacks.begin(), stacks.end(), [](const RankStack& a, const RankStack& b) { return a.rank < b.rank; });
    failing_ = root.pid;
    changed = true;
  }
  changed |= name_exited_by_themselves(stacks, workers);
  if (changed) failure_note_ = stacks.empty() && failure_table_.empty() ? "" : failure_text(stacks);
}

std::string StackDumps::crash_stack_of(const WorkerResult& w) const {
  const std::string fatal = fatal_signal_name(w.signal);
  if (!o_.stack_dumps || fatal.empty()) return "";
  const std::string file = stack_file(w);
  return crash_stack(read_from(file, std::max<off_t>(0, file_size(file) - (1 << 20))), fatal, file);
}

// Such a rank had finished as the others failed: often the one they waited for (it skipped
// a collective).
bool name_exited_by_themselves(std::vector<RankStack>& stacks, const std::vector<WorkerResult>& workers) {
  bool changed = false;
  auto exiting = [](const RankStack& s) {
    // (Not answering, or gone between the ask and its answer: "exited before it answered".)
    if (s.kind == RankStack::Kind::kNoAnswer || (s.kind == RankStack::Kind::kExited && s.given.empty())) return true;
    const std::string sig = s.signature();
    return s.kind == RankStack::Kind::kStack &&
           (sig == kNoPythonFrame || sig.find("_shutdown (threading.py:") != std::string::npos);
  };
  for (auto& s : stacks) {
    if (!exiting(s)) continue;
    auto w = std::find_if(workers.begin(), workers.end(), [&](const WorkerResult& x) { return x.rank == s.rank; });
    if (w == workers.end() || w->state != WorkerResult::State::kSucceeded || w->stopped_by_ddprun) continue;
    s.kind = RankStack::Kind::kExited;
    s.given = "not running: exited with code 0 (by itself, as the others failed)";
    changed = true;
  }
  return changed;
}

void StackDumps::attempt_started() {
  job_seen_.reset();
  collectives_seen_.clear();
  heartbeats_seen_.clear();
  failure_note_.clear();
  failing_ = -1;
  announcer_ = -1;
  root_note_ = false;
  hang_.reset();
  hang_report_.clear();
  hang_what_.clear();
  failure_what_.clear();
  failure_table_.clear();
  at_end_.reset();
  progress_ = Clock::now();
  next_check_.reset();
  if (hang_timeout_.count() > 0)
    next_check_ = progress_ + std::min<std::chrono::milliseconds>(hang_timeout_, std::chrono::seconds(1));
}

std::optional<StackDumps::Clock::time_point> StackDumps::next_hang_check() const { return next_check_; }

bool StackDumps::hung_now(Clock::time_point last_output, const std::vector<WorkerResult>& workers,
                          bool several_nodes, std::optional<int64_t> job_progress, Clock::time_point job_read_at,
                          bool& moved) {
  const auto now = Clock::now();
  moved = false;
  if (!next_check_ || now < *next_check_) return false;
  // Heartbeats are only seen when looked for: at least once a second, and when the
  // timeout would end.
  const Clock::duration interval = std::min<Clock::duration>(hang_timeout_, std::chrono::seconds(1));
  // This look came much later than it was due: ddprun did not run (its container paused, the
  // machine stopped), nor, as a rule, did its workers, and the time is not theirs to account
  // for (a one-node container paused past --hang-timeout was declared hung as it resumed,
  // its ranks printing their next lines; QA). Not added to a Ctrl-Z's, counted already.
  if (const auto late = now - *next_check_; late > std::chrono::seconds(2)) not_reading_ = std::max(not_reading_, late);
  const auto before = progress_;
  progress_ = std::min(now, std::max(progress_, last_output) + not_reading_);
  not_reading_ = {};
  const auto sys_now = std::chrono::system_clock::now();
  for (const auto& w : workers) {
    if (w.state != WorkerResult::State::kRunning) continue;
    // A libddp collective that ended since the last look is progress.
    if (uint64_t done = collectives_done(w); done != collectives_seen_[w.pid]) {
      collectives_seen_[w.pid] = done;
      progress_ = now;
    }
    // A touch is a change of the file's time since the last look, dated by it but never
    // before that look nor after now: a file whose clock is ahead (a time set in the future)
    // or behind (another machine's file server) cannot stop or fake progress.
    struct stat st {};
    if (::stat(heartbeat_file(w).c_str(), &st) != 0) continue;
    const int64_t ns = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
    auto [seen, first] = heartbeats_seen_.try_emplace(w.pid, ns);
    if (!first && seen->second == ns) continue;
    seen->second = ns;
    auto mtime = std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
        std::chrono::nanoseconds(ns)));
    auto touched = now - std::chrono::duration_cast<Clock::duration>(sys_now - mtime);
    progress_ = std::max(progress_, std::clamp(touched, std::min(last_look_, now), now));
  }
  last_look_ = now;
  moved = progress_ > before;
  // Another node's progress (it added to the job-wide count since the last check).
  // (The count is the round's, from 0: a first count above 0 is progress this round.)
  if (job_progress && *job_progress != job_seen_.value_or(0)) progress_ = now;
  if (job_progress) job_seen_ = job_progress;
  if (now - progress_ < hang_timeout_) {
    next_check_ = std::max<Clock::time_point>(now + std::chrono::milliseconds(10),
                                              std::min(now + interval, progress_ + hang_timeout_));
    return false;
  }
  const auto settled = progress_ + hang_timeout_ + interval;  // every node has added since
  if (several_nodes && (!job_progress || job_read_at < settled) && now < settled + std::chrono::seconds(10)) {
    next_check_ = now + std::chrono::milliseconds(100);
    return false;
  }
  next_check_.reset();
  return true;
}

std::string StackDumps::on_hang(const std::vector<WorkerResult>& workers, const std::string& attempt_dir,
                                const std::string& what) {
  hang_ = fmt::format("no rank made progress for {} s (--hang-timeout)", seconds(hang_timeout_));
  std::vector<RankStack> stacks;
  if (o_.stack_dumps) {
    const auto ts = targets(workers, nullptr);
    const auto deadline = Clock::now() + kAtHang;
    stacks = take_stacks(ts, deadline, [this] { return stop_pending(); });
    take_forked_stacks(ts, stacks, deadline, [this] { return stop_pending(); });
    stacks = with_ended(std::move(stacks), workers, nullptr);
  }
  std::string body = full_dump(stacks, prefixes(stacks));
  std::string file = stacks.empty() ? "" : save(attempt_dir, "stacks_at_hang.txt", full_dump(stacks, prefixes(stacks), true));
  std::string named = stacks.empty() ? "stacks are off (--no-stack-dumps)" : standing_out(stacks);
  hang_view_ = HangView{named, where_lines(stacks), collectives(workers), file};
  compose_hang_report();
  if (!what.empty() && o_.stack_dumps) {
    hang_what_ = what;
    kept_.push_back(Taken{what, "stacks_at_hang_all_nodes.txt", stacks});
  }
  at_end_ = stacks;
  spdlog::error("{}: {}; stopping the workers (a failed attempt: exit status {} unless --max-restarts restarts it)",
                *hang_, named, kHangExitCode);
  if (stacks.empty()) return collectives(workers);  // (--no-stack-dumps: no empty heading)
  return body + "[ddprun] where each rank is (main thread, innermost frame first):\n" + where_lines(stacks) +
         collectives(workers);
}

void StackDumps::compose_hang_report() {
  const HangView& v = hang_view_;
  const std::string rule(60, '='), thin(60, '-');
  const std::string every = v.file.empty() ? "" : "every thread of every rank: " + v.file + "\n";
  hang_report_ = fmt::format("{}\n{} HUNG: {}\n{}\n{}\n{}{}{}{}\n", rule, o_.script, *hang_, thin, v.named, v.where,
                             v.collectives, every, rule);
}

std::string StackDumps::answer_while_stopping(const JobPlan& plan) const {
  return encode_node_stacks(mine(plan, at_end_.value_or(std::vector<RankStack>{})), answer_budget(plan));
}

std::string StackDumps::answer_finished(const JobPlan& plan) const {
  std::vector<RankStack> ranks(static_cast<size_t>(std::max(0, o_.nproc_per_node)));
  for (size_t i = 0; i < ranks.size(); ++i) {
    ranks[i].local_rank = static_cast<int>(i);
    ranks[i].rank = plan.rank_base + ranks[i].local_rank;
    ranks[i].kind = RankStack::Kind::kExited;
    ranks[i].given = "finished (exit code 0), its node waits for the others";
  }
  return encode_node_stacks(mine(plan, std::move(ranks)), answer_budget(plan));
}

}  // namespace ddprun
