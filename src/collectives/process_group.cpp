// ProcessGroup front end: argument checks, deadlines, error context, the factories and
// the bootstrap from ddprun's environment.
#include "ddp/process_group.hpp"

#include <pthread.h>
#include <unistd.h>

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "backends.hpp"
#include "progress.hpp"
#include "ddp/error.hpp"
#include "ddp/tcp_store.hpp"
#include "store/server.hpp"

namespace ddp {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
  }
  return "unknown";
}

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kAvg: return "avg";
  }
  return "unknown";
}

namespace {
// Forks of this process since it loaded libddp (the child's count is one more than its
// parent's): a group belongs to the process that made it. A forked child that called it
// spoke on its parent's links and rings: a peer's result came out wrong (101 for 2) with
// no error anywhere (QA).
std::atomic<unsigned> g_forks{0};
const int g_fork_watch = ::pthread_atfork(nullptr, nullptr, [] { g_forks.fetch_add(1, std::memory_order_relaxed); });
}  // namespace

ProcessGroup::ProcessGroup(int rank, int size, Backend backend, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), backend_(backend), timeout_(timeout), op_timeout_(timeout),
      forks_(g_forks.load(std::memory_order_relaxed)) {
  (void)g_fork_watch;
}

ProcessGroup::~ProcessGroup() = default;

bool ProcessGroup::made_here() const { return forks_ == g_forks.load(std::memory_order_relaxed); }

const char* ProcessGroup::op_name(Op op) {
  switch (op) {
    case Op::kAllReduce: return "all_reduce";
    case Op::kBroadcast: return "broadcast";
    case Op::kAllGather: return "all_gather";
    case Op::kReduceScatter: return "reduce_scatter";
    case Op::kBarrier: return "barrier";
  }
  return "collective";
}

void ProcessGroup::check_span_sizes(const char* op, size_t expected, size_t got) const {
  if (expected != got)
    throw UsageError(fmt::format("ddp {} on rank {}: buffer sizes disagree (expected {} elements, got {})", op,
                                 rank_, expected, got));
}

namespace {
// The progress record's name for an operation (collectives/progress_record.hpp).
uint32_t progress_op(int op) { return static_cast<uint32_t>(op) + 1; }
}  // namespace

template <class F>
void ProcessGroup::run(Op op, size_t bytes, std::chrono::milliseconds timeout, F&& body) {
  const char* name = op_name(op);
  if (!made_here())
    throw UsageError(fmt::format("ddp {} on rank {}: called in a process forked from the one that made the group "
                                 "(pid {} is the fork): a group's links belong to its maker; call it there, or "
                                 "make a group in the child",
                                 name, rank_, ::getpid()));
  // Two threads in one group would interleave their bytes on the same links and rings:
  // torn results, then a hang. The second is refused; the first goes on.
  if (busy_.exchange(true, std::memory_order_acquire))
    throw UsageError(fmt::format("ddp {} on rank {}: called while another thread's call on this process group is "
                                 "in progress: a group is used by one thread at a time (give each thread a group "
                                 "of its own)",
                                 name, rank_));
  struct Free {
    std::atomic<bool>& busy;
    ~Free() { busy.store(false, std::memory_order_release); }
  } free_on_return{busy_};
  if (!failure_.empty())
    throw CollectiveError(fmt::format("ddp {} on rank {}: the process group is unusable after an "
                                      "earlier failure: {}",
                                      name, rank_, failure_));
  if (timeout.count() < 0)
    throw UsageError(fmt::format("ddp {} on rank {}: a timeout of {} ms: give a positive one, or 0 for the "
                                 "group's ({} ms)",
                                 name, rank_, timeout.count(), timeout_.count()));
  op_timeout_ = timeout.count() > 0 ? timeout : timeout_;
  auto deadline = detail::deadline_after(op_timeout_);
  auto prefix = [&] { return fmt::format("ddp {} failed on rank {} of {}: ", name, rank_, size_); };
  // What ddprun shows as this rank's collective when it takes the workers' stacks.
  auto& progress = detail::Progress::get();
  progress.begin(progress_op(static_cast<int>(op)),
                 backend_ == Backend::kNccl ? detail::ProgressRecord::kNccl : detail::ProgressRecord::kCpu, bytes);
  try {
    body(deadline);
    progress.end();
    return;
  } catch (const TimeoutError& e) {
    failure_ = prefix() + e.what();
  } catch (const std::exception& e) {
    failure_ = prefix() + e.what();
    on_failure(failure_);
    throw CollectiveError(failure_);
  }
  on_failure(failure_);
  throw TimeoutError(failure_);
}

namespace {
// Argument checks, before anything is sent: a UsageError leaves the group usable. (The
// message is made only on failure: these run before every call, the cheapest included.)
[[noreturn]] void refuse(int rank, const char* op, const std::string& what) {
  throw UsageError(fmt::format("ddp {} on rank {}: {}", op, rank, what));
}

void need(bool ok, int rank, const char* op, const char* what) {
  if (!ok) refuse(rank, op, what);
}

// A known dtype, and count elements (times `blocks`: all_gather's output, reduce_scatter's
// input) whose bytes fit in an address space (64-bit Linux gives a process 128 TiB at most:
// a larger count is a caller's mistake, which would read past its buffer).
void need_elements(size_t count, DType dtype, size_t blocks, int rank, const char* op) {
  constexpr size_t kAddressable = size_t(1) << 47;
  const size_t bytes = dtype_size(dtype);
  if (bytes == 0) refuse(rank, op, fmt::format("unknown dtype {}", static_cast<int>(dtype)));
  size_t total = 0;  // (bytes * blocks cannot overflow: 8 x an int's ranks at most)
  if (__builtin_mul_overflow(count, bytes * blocks, &total) || total > kAddressable)
    refuse(rank, op, fmt::format("{} elements of {} (x {} ranks) do not fit in memory", count, dtype_name(dtype),
                                 blocks));
}

void need_op(ReduceOp op, int rank, const char* name) {
  if (static_cast<unsigned>(op) > static_cast<unsigned>(ReduceOp::kAvg))
    refuse(rank, name, fmt::format("unknown reduce op {}", static_cast<int>(op)));
}
}  // namespace

void ProcessGroup::all_reduce(void* data, size_t count, DType dtype, const AllReduceOptions& o) {
  need(data || count == 0, rank_, "all_reduce", "null buffer");
  need_elements(count, dtype, 1, rank_, "all_reduce");
  need_op(o.op, rank_, "all_reduce");
  run(Op::kAllReduce, count * dtype_size(dtype), o.timeout,
      [&](auto dl) { do_all_reduce(data, count, dtype, o.op, dl); });
}

void ProcessGroup::broadcast(void* data, size_t count, DType dtype, const BroadcastOptions& o) {
  need(data || count == 0, rank_, "broadcast", "null buffer");
  if (o.root < 0 || o.root >= size_)
    refuse(rank_, "broadcast", fmt::format("root {} is not a rank of this group of {}", o.root, size_));
  need_elements(count, dtype, 1, rank_, "broadcast");
  run(Op::kBroadcast, count * dtype_size(dtype), o.timeout, [&](auto dl) { do_broadcast(data, count, dtype, o.root, dl); });
}

void ProcessGroup::all_gather(const void* input, void* output, size_t count, DType dtype,
                              const AllGatherOptions& o) {
  need((input && output) || count == 0, rank_, "all_gather", "null buffer");
  need_elements(count, dtype, static_cast<size_t>(size_), rank_, "all_gather");
  run(Op::kAllGather, count * dtype_size(dtype), o.timeout,
      [&](auto dl) { do_all_gather(input, output, count, dtype, dl); });
}

void ProcessGroup::reduce_scatter(const void* input, void* output, size_t count, DType dtype,
                                  const ReduceScatterOptions& o) {
  need((input && output) || count == 0, rank_, "reduce_scatter", "null buffer");
  need_elements(count, dtype, static_cast<size_t>(size_), rank_, "reduce_scatter");
  need_op(o.op, rank_, "reduce_scatter");
  run(Op::kReduceScatter, count * dtype_size(dtype), o.timeout,
      [&](auto dl) { do_reduce_scatter(input, output, count, dtype, o.op, dl); });
}

void ProcessGroup::barrier(const BarrierOptions& o) {
  run(Op::kBarrier, 0, o.timeout, [&](auto dl) { do_barrier(dl); });
}

namespace {
void need_positive_timeout(const ProcessGroupOptions& o) {
  if (o.timeout.count() <= 0)
    throw UsageError(fmt::format("ddp::init_process_group: timeout must be positive (got {} ms)", o.timeout.count()));
}

// The CPU backend's sizes: beyond 1 TiB (a value meant as "no limit", or a negative number
// cast to size_t) their rounding up to cache lines would overflow.
void need_sane_sizes(const ProcessGroupOptions& o) {
  constexpr size_t kMax = size_t{1} << 40;
  const std::pair<const char*, size_t> sizes[] = {{"small_message_bytes", o.small_message_bytes},
                                                  {"chunk_bytes", o.chunk_bytes},
                                                  {"shm_ring_bytes", o.shm_ring_bytes},
                                                  {"slice_stage_bytes", o.slice_stage_bytes}};
  for (auto& [name, v] : sizes)
    if (v > kMax)
      throw UsageError(fmt::format("ddp::init_process_group: {} = {} is more than 1 TiB", name, v));
}

}  // namespace

std::unique_ptr<ProcessGroup> init_process_group(ProcessGroupOptions o) {
  need_positive_timeout(o);
  need_sane_sizes(o);
  if (o.world_size < 1)
    throw UsageError(fmt::format("ddp::init_process_group: world_size must be >= 1 (got {})",
                                 o.world_size));
  if (o.rank < 0 || o.rank >= o.world_size)
    throw UsageError(fmt::format("ddp::init_process_group: rank {} is outside [0, {})", o.rank,
                                 o.world_size));
  if (o.world_size > 1 && !o.store)
    throw UsageError("ddp::init_process_group: a store is required when world_size > 1");
  if (o.backend != Backend::kCpu && o.backend != Backend::kNccl)
    throw UsageError(fmt::format("ddp::init_process_group: backend {} is none of Backend::kCpu, Backend::kNccl",
                                 static_cast<int>(o.backend)));
  if (o.transport != Transport::kAuto && o.transport != Transport::kTcp)
    throw UsageError(fmt::format("ddp::init_process_group: transport {} is none of Transport::kAuto, "
                                 "Transport::kTcp",
                                 static_cast<int>(o.transport)));
  // A group made again under a name used before on this store (destroy and re-init, as
  // torch allows) takes keys of its own: the store still holds the last one's (its shared
  // memory segment's name, its ports), which it would read. Each rank counts its own groups
  // of a name in the store itself (ranks may be threads of one process).
  if (o.world_size > 1) {
    const int64_t before = o.store->add(fmt::format("{}/made_by_rank_{}", o.name, o.rank), 1) - 1;
    if (before > 0) o.name += fmt::format("#{}", before);
  }
  if (o.backend == Backend::kNccl) return detail::make_nccl_group(o);
  return detail::make_cpu_group(o);
}

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, int fallback, bool required) {
  const char* v = env(name);
  if (!v) {
    if (required)
      throw UsageError(fmt::format(
          "{} is not set: run this worker under ddprun (or torchrun), or build the process group "
          "from explicit options with ddp::init_process_group",
          name));
    return fallback;
  }
  int x = 0;
  auto [p, ec] = std::from_chars(v, v + std::char_traits<char>::length(v), x);
  if (ec == std::errc::result_out_of_range && *p == '\0')
    throw UsageError(fmt::format("{}='{}' is out of range", name, v));
  if (ec != std::errc() || *p != '\0')
    throw UsageError(fmt::format("{}='{}' is not an integer", name, v));
  return x;
}

// What the variables the group uses must say (each one named). LOCAL_RANK and
// LOCAL_WORLD_SIZE are not checked against each other: the group does not use them, and
// launchers set them as they see fit (a helper group of one keeps the job's; submitit's
// LOCAL_WORLD_SIZE is a quotient); MASTER_PORT only matters, and is checked, with peers.
void check_launch_env(const LaunchEnv& e) {
  auto bad = [](const std::string& what) { throw UsageError(what); };
  if (e.world_size < 1) bad(fmt::format("WORLD_SIZE={} must be at least 1", e.world_size));
  if (e.rank < 0 || e.rank >= e.world_size)
    bad(fmt::format("RANK={} is outside [0, WORLD_SIZE={})", e.rank, e.world_size));
  if (e.local_rank < 0) bad(fmt::format("LOCAL_RANK={} is negative", e.local_rank));
  if (e.world_size > 1 && (e.master_port < 0 || e.master_port > 65535))
    bad(fmt::format("MASTER_PORT={} is not a TCP port (0-65535)", e.master_port));
  if (e.restart_count < 0) bad(fmt::format("TORCHELASTIC_RESTART_COUNT={} is negative", e.restart_count));
}

}  // namespace

LaunchEnv read_launch_env() {
  LaunchEnv e;
  e.rank = env_int("RANK", 0, true);
  e.world_size = env_int("WORLD_SIZE", 1, true);
  e.local_rank = env_int("LOCAL_RANK", e.rank, false);
  e.local_world_size = env_int("LOCAL_WORLD_SIZE", e.world_size, false);
  e.master_addr = env("MASTER_ADDR") ? env("MASTER_ADDR") : "";
  e.master_port = env_int("MASTER_PORT", 0, false);
  const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
  e.use_agent_store = agent && std::string_view(agent) == "True";
  e.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", 0, false);
  check_launch_env(e);
  return e;
}

namespace {

// The job's store as a client of MASTER_ADDR:MASTER_PORT: the agent's (ddprun's, or
// torchrun's: generation 1 up to torch 2.1), or the one rank 0 hosts (host_store).
std::shared_ptr<TcpStore> connect_store(const LaunchEnv& e, const std::string& host,
                                        std::chrono::milliseconds timeout) {
  auto connect_timeout = std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(60));
  return std::make_shared<TcpStore>(TcpStoreOptions{host, static_cast<uint16_t>(e.master_port), timeout,
                                                    connect_timeout, WireGeneration::kAuto});
}

// The servers rank 0 hosts, by port, each kept from the process's first group on it to the
// process's exit: a group made again after one was destroyed, or a second beside it, finds
// the store where the other ranks still are, with its counters (the made_by_rank keys that
// give a group made again keys of its own) and its failure notices. Before, each group
// started and stopped a server of its own: the others' calls on the old one failed with
// "Connection reset" as it stopped, and a second group beside the first could not listen
// (EADDRINUSE on rank 0's own port). Stopped at exit by the process that started them; a
// forked child, where no thread serves them, neither uses nor stops its parent's.
struct HostedServers {
  struct Entry {
    std::shared_ptr<detail::StoreServer> server;
    pid_t pid;
  };
  std::mutex mu;
  std::map<uint16_t, Entry> by_port;
};

HostedServers& hosted_servers() {
  static auto* h = new HostedServers;  // never destroyed: stop_hosted_servers runs at exit
  return *h;
}

void stop_hosted_servers() {
  auto& h = hosted_servers();
  std::lock_guard lock(h.mu);
  for (auto& [port, entry] : h.by_port)
    if (entry.pid == getpid()) entry.server->stop();
}

std::shared_ptr<detail::StoreServer> hosted_server(uint16_t port) {
  auto& h = hosted_servers();
  std::lock_guard lock(h.mu);
  auto found = h.by_port.find(port);
  if (found != h.by_port.end() && found->second.pid == getpid()) return found->second.server;
  if (found != h.by_port.end())  // the parent's, forked: not served here, and not ours to stop
    new std::shared_ptr<detail::StoreServer>(std::move(found->second.server));
  auto server = std::make_shared<detail::StoreServer>(detail::StoreServerOptions{.host = "", .port = port});
  server->start();
  static const bool at_exit = std::atexit(stop_hosted_servers) == 0;  // after the server's statics
  (void)at_exit;
  h.by_port[port] = {server, getpid()};
  return server;
}

// No launcher shares its store with the workers (TORCHELASTIC_USE_AGENT_STORE not True:
// torchrun's c10d before torch 2.4, or a job started without a launcher, every rank given
// RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT): rank 0 serves the store on MASTER_PORT of
// every interface, as PyTorch's env:// does, from its first group to its exit (hosted_server).
std::shared_ptr<TcpStore> host_store(const LaunchEnv& e, std::chrono::milliseconds timeout) {
  try {
    (void)hosted_server(static_cast<uint16_t>(e.master_port));
  } catch (const SystemError& err) {
    throw SystemError(fmt::format("rank 0 hosts the job's store (TORCHELASTIC_USE_AGENT_STORE is not "
                                  "True) but cannot listen on MASTER_PORT={}",
                                  e.master_port),
                      err.code());
  }
  return connect_store(e, "127.0.0.1", timeout);
}

}  // namespace

std::unique_ptr<ProcessGroup> init_process_group_from_env(ProcessGroupOptions o) {
  detail::arm_native_stack_dump();  // a job stuck before its first collective still answers
  need_positive_timeout(o);  // (before any store is reached with it)
  LaunchEnv e = read_launch_env();
  o.rank = e.rank;
  o.world_size = e.world_size;
  o.local_rank = e.local_rank;
  o.store.reset();
  if (e.world_size > 1) {
    if (e.master_addr.empty() || e.master_port <= 0 || e.master_port > 65535)
      throw UsageError(fmt::format("MASTER_ADDR/MASTER_PORT not set or invalid ('{}', {}): run "
                                   "under ddprun or pass a store explicitly",
                                   e.master_addr, e.master_port));
    std::shared_ptr<TcpStore> tcp;
    if (e.use_agent_store) {
      try {
        tcp = connect_store(e, e.master_addr, o.timeout);
      } catch (const NetworkError& err) {
        throw NetworkError(fmt::format("rank {}: the launcher's store (TORCHELASTIC_USE_AGENT_STORE=True, "
                                       "MASTER_ADDR:MASTER_PORT) could not be reached: is the launcher still running? {}",
                                       e.rank, err.what()));
      }
    } else if (e.rank == 0) {
      tcp = host_store(e, o.timeout);
    } else {
      try {
        tcp = connect_store(e, e.master_addr, o.timeout);
      } catch (const NetworkError& err) {
        throw NetworkError(fmt::format("rank {}: rank 0 hosts the job's store (TORCHELASTIC_USE_AGENT_STORE is not "
                                       "True), and it never answered: is rank 0 running, and is MASTER_ADDR its "
                                       "host? {}",
                                       e.rank, err.what()));
      }
    }
    o.store = std::make_shared<PrefixStore>(fmt::format("ddp/attempt_{}", e.restart_count), std::move(tcp));
  }
  return init_process_group(std::move(o));
}

}  // namespace ddp
