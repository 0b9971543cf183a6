// A process group: the ranks of one job joined for collectives. Create one from the
// environment ddprun (or torchrun) sets, or from explicit options, then call collectives:
//
//   auto pg = ddp::init_process_group_from_env();          // RANK, WORLD_SIZE, MASTER_* ...
//   pg->all_reduce(std::span<float>(grad), {.op = ddp::ReduceOp::kAvg});
//
// Every collective is blocking and must be called by every rank in the same order with
// the same count/dtype/options (the CPU backend checks: a call that differs between ranks
// is a CollectiveError on every rank, naming both). Errors throw ddp::CollectiveError or
// ddp::TimeoutError (ddp/error.hpp) naming the operation, this rank, the peer involved and
// the cause; after a failure the group is unusable and every later call throws at once.
//
// Backends:
//   kCpu   host buffers; ring all-reduce over shared memory (ranks on one host) and TCP
//          (between hosts), a flat shared-memory algorithm for small messages and a
//          shared-memory slice all-reduce for large ones when ranks outnumber the CPUs.
//   kNccl  CUDA device buffers (void* device pointers), work enqueued on the group's CUDA
//          stream and waited for (the call returns when the result is in place). That stream
//          is non-blocking and does not wait for work the caller queued elsewhere: finish
//          kernels and async copies that write the input first, or pass your own stream as
//          ProcessGroupOptions::cuda_stream. DeviceBuffer's copies are complete on return.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "ddp/collectives.hpp"
#include "ddp/store.hpp"
#include "ddp/types.hpp"

namespace ddp {

enum class Backend { kCpu, kNccl };

// How the CPU backend links ranks. kAuto: shared memory between ranks on the same host
// (same hostname, boot id and namespaces), TCP otherwise. kTcp: TCP everywhere.
enum class Transport { kAuto, kTcp };

struct ProcessGroupOptions {
  int rank = -1;
  int world_size = -1;
  // Rendezvous store (all ranks must see the same keys). Required for world_size > 1.
  std::shared_ptr<Store> store;
  Backend backend = Backend::kCpu;
  // Bound on bootstrap and default bound on each collective (options.timeout == 0).
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Key namespace inside the store; give each group that lives beside another its own name.
  // A group made again under a name used before (destroyed, then made anew) gets keys of its
  // own by itself.
  std::string name = "pg";
  // This rank's index on its host (-1: unknown). NCCL uses it as the default device.
  int local_rank = -1;

  // CPU backend.
  Transport transport = Transport::kAuto;
  // Address other ranks use to reach this one over TCP. Empty: 127.0.0.1 when every rank
  // is on this host, else $DDP_HOST, else the local address routing to $MASTER_ADDR, else
  // the hostname's first IPv4 address.
  std::string host;
  // Messages of at most this many bytes per rank take the flat shared-memory algorithm
  // when every rank is on one host (0 disables it). Rank 0's value holds for every rank.
  // small_message_bytes, chunk_bytes, shm_ring_bytes and slice_stage_bytes: at most 1 TiB.
  size_t small_message_bytes = 64 << 10;
  // Pipelining granularity of the ring algorithms.
  size_t chunk_bytes = 128 << 10;
  // Capacity of each shared-memory link (rounded up to 64 bytes).
  size_t shm_ring_bytes = 2 << 20;
  // All-reduce messages of at least this many bytes per rank take the shared-memory slice
  // algorithm when every rank is on one host (each rank stages its input in shared memory,
  // reduces one 1/n slice for everyone, all copy the result out: two barriers per stage
  // instead of 2(n-1) ring steps). 0 disables it. kAutoSlice: the first rank of the host
  // picks (on when the group has more ranks than that rank may run on CPUs; then from
  // 128 KiB, see docs/libddp.md), and every rank follows its choice.
  static constexpr size_t kAutoSlice = ~size_t{0};
  size_t slice_min_bytes = kAutoSlice;
  // Bytes of each rank's input staged per barrier pair by the slice algorithm (rounded up
  // to 64); the host's segment then holds (ranks + 1) such areas.
  size_t slice_stage_bytes = 1 << 20;
  // Overrides the host identity (hostname, boot id, namespaces) that decides which ranks
  // share memory; ranks with different ids talk TCP. For tests and unusual containers.
  std::string host_id;

  // NCCL backend.
  int device = -1;              // CUDA device; -1: local_rank (or rank) modulo device count
  void* cuda_stream = nullptr;  // cudaStream_t to enqueue on; null: the group creates one
};

// What ddprun/torchrun put in a worker's environment.
struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  bool use_agent_store = false;  // TORCHELASTIC_USE_AGENT_STORE == "True"
  int restart_count = 0;         // TORCHELASTIC_RESTART_COUNT
};

// Reads the variables above; throws UsageError naming a missing or malformed one.
LaunchEnv read_launch_env();

// One thread at a time: a call made while another thread's call on the same group is in
// progress throws UsageError (groups of their own for threads that communicate at once).
// Bad arguments (a null buffer, a root outside the group, an unknown dtype or op, a count
// whose bytes overflow, span sizes that disagree) throw UsageError before anything is sent:
// the group stays usable. A failure of the collective itself (a peer lost, a timeout) makes
// the group unusable: every later call repeats it.
class ProcessGroup {
 public:
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  Backend backend() const { return backend_; }
  std::chrono::milliseconds default_timeout() const { return timeout_; }

  // In place: data (count elements) becomes the reduction over all ranks.
  void all_reduce(void* data, size_t count, DType dtype, const AllReduceOptions& opts = {});
  // In place: data on every rank becomes the root's.
  void broadcast(void* data, size_t count, DType dtype, const BroadcastOptions& opts = {});
  // output (count * size() elements) = every rank's input (count elements), in rank order.
  void all_gather(const void* input, void* output, size_t count, DType dtype,
                  const AllGatherOptions& opts = {});
  // input holds count * size() elements; output (count elements) = the reduction of every
  // rank's input block number rank().
  void reduce_scatter(const void* input, void* output, size_t count, DType dtype,
                      const ReduceScatterOptions& opts = {});
  void barrier(const BarrierOptions& opts = {});

  template <class T>
  void all_reduce(std::span<T> data, const AllReduceOptions& opts = {}) {
    all_reduce(data.data(), data.size(), dtype_of<T>(), opts);
  }
  template <class T>
  void broadcast(std::span<T> data, const BroadcastOptions& opts = {}) {
    broadcast(data.data(), data.size(), dtype_of<T>(), opts);
  }
  template <class T>
  void all_gather(std::span<const T> input, std::span<T> output, const AllGatherOptions& opts = {}) {
    check_span_sizes("all_gather", input.size() * static_cast<size_t>(size_), output.size());
    all_gather(input.data(), output.data(), input.size(), dtype_of<T>(), opts);
  }
  template <class T>
  void reduce_scatter(std::span<const T> input, std::span<T> output,
                      const ReduceScatterOptions& opts = {}) {
    check_span_sizes("reduce_scatter", output.size() * static_cast<size_t>(size_), input.size());
    reduce_scatter(input.data(), output.data(), output.size(), dtype_of<T>(), opts);
  }
  // The same with a mutable input span (std::span<const T> is not deduced from one).
  template <class T>
  void all_gather(std::span<T> input, std::span<T> output, const AllGatherOptions& opts = {}) {
    all_gather(std::span<const T>(input), output, opts);
  }
  template <class T>
  void reduce_scatter(std::span<T> input, std::span<T> output, const ReduceScatterOptions& opts = {}) {
    reduce_scatter(std::span<const T>(input), output, opts);
  }

  // Set once a collective failed: the reason every later call reports (empty if healthy).
  std::string failure() const { return failure_; }

 protected:
  ProcessGroup(int rank, int size, Backend backend, std::chrono::milliseconds timeout);

  enum class Op { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kBarrier };
  static const char* op_name(Op op);

  virtual void do_all_reduce(void* data, size_t count, DType dtype, ReduceOp op,
                             std::chrono::steady_clock::time_point deadline) = 0;
  virtual void do_broadcast(void* data, size_t count, DType dtype, int root,
                            std::chrono::steady_clock::time_point deadline) = 0;
  virtual void do_all_gather(const void* input, void* output, size_t count, DType dtype,
                             std::chrono::steady_clock::time_point deadline) = 0;
  virtual void do_reduce_scatter(const void* input, void* output, size_t count, DType dtype,
                                 ReduceOp op, std::chrono::steady_clock::time_point deadline) = 0;
  virtual void do_barrier(std::chrono::steady_clock::time_point deadline) = 0;
  // Called once when a collective throws: tell peers (best effort) and release resources
  // that would make them wait. Must not throw.
  virtual void on_failure(const std::string& /*reason*/) noexcept {}
  // The timeout of the collective in progress (what its timeout message names); the
  // group's until the first collective (init_process_group's wait).
  std::chrono::milliseconds op_timeout() const { return op_timeout_; }
  // Whether this process made the group (not a child forked since): a group's links are
  // its maker's alone.
  bool made_here() const;

 private:
  template <class F>
  void run(Op op, size_t bytes, std::chrono::milliseconds timeout, F&& body);
  void check_span_sizes(const char* op, size_t expected, size_t got) const;

  int rank_;
  int size_;
  Backend backend_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds op_timeout_;
  std::string failure_;
  std::atomic<bool> busy_{false};  // a call is in progress (one thread at a time)
  unsigned forks_;                 // the process's fork count when the group was made (its maker's)
};

// Joins a group from explicit options (throws UsageError on bad options, TimeoutError or
// CollectiveError if peers do not show up or cannot be reached).
std::unique_ptr<ProcessGroup> init_process_group(ProcessGroupOptions options);

// Joins from the environment ddprun sets: rank/world size/local rank from RANK, WORLD_SIZE,
// LOCAL_RANK; the store (a TcpStore client of MASTER_ADDR:MASTER_PORT) under the prefix
// "ddp/attempt_<TORCHELASTIC_RESTART_COUNT>". With TORCHELASTIC_USE_AGENT_STORE=True (ddprun,
// torchrun's static launch, its c10d from torch 2.4) that store is the launcher's; otherwise
// (torchrun's c10d before 2.4, a job started without a launcher) rank 0 hosts it on
// MASTER_PORT of every interface, as PyTorch's env:// does, for as long as the group lives,
// and throws SystemError naming MASTER_PORT when it cannot listen there. Other fields of
// `options` (backend, timeout, transport, ...) are kept; rank, world_size, local_rank and
// store are overwritten.
std::unique_ptr<ProcessGroup> init_process_group_from_env(ProcessGroupOptions options = {});

}  // namespace ddp
