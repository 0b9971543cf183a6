// NCCL backend (compiled when CUDA and NCCL are found). Device = options.device, else
// LOCAL_RANK (modulo the device count). The ncclUniqueId travels from rank 0 through the
// store; the communicator is created non-blocking (blocking = 0) and every wait polls
// (ncclCommGetAsyncError, cudaStreamQuery) against the deadline, aborting the communicator
// when it passes, so a dead peer yields an error instead of a hang.
#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "backends.hpp"
#include "ddp/nccl.hpp"
#include "ddp/tcp_store.hpp"
#include "nccl_check.hpp"
#include "slices.hpp"

namespace ddp {

bool nccl_available() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

namespace {

// A device number the caller may use: a clear error for a negative one, none visible, or
// one past the last (CUDA's own errors name a driver version when there is no GPU at all).
void need_device(int device, const char* who) {
  if (device < 0) throw UsageError(fmt::format("{}: device {} is no CUDA device number", who, device));
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    throw CollectiveError(fmt::format("{}: no CUDA device is visible (cudaGetDeviceCount returned 0 or failed)", who));
  if (device >= count)
    throw UsageError(fmt::format("{}: device {}, but {} CUDA device{} visible", who, device, count,
                                 count == 1 ? " is" : "s are"));
}

void need_range(const char* who, size_t offset, size_t n, size_t bytes) {
  if (offset > bytes || n > bytes - offset)
    throw UsageError(fmt::format("{}: {} bytes at offset {} do not fit in the buffer's {} bytes", who, n, offset,
                                 bytes));
}

}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes, int device) : bytes_(bytes), device_(device) {
  need_device(device, "DeviceBuffer");
  DDP_CUDA_CHECK(cudaSetDevice(device));
  if (bytes) DDP_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) {
    cudaSetDevice(device_);
    cudaFree(ptr_);
  }
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(o.ptr_), bytes_(o.bytes_), device_(o.device_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) {
      cudaSetDevice(device_);
      cudaFree(ptr_);
    }
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    device_ = o.device_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}
void DeviceBuffer::copy_from_host(const void* src, size_t n, size_t offset) {
  need_range("DeviceBuffer::copy_from_host", offset, n, bytes_);
  if (n == 0) return;  // (an empty buffer has no device to set)
  DDP_CUDA_CHECK(cudaSetDevice(device_));
  DDP_CUDA_CHECK(cudaMemcpy(static_cast<char*>(ptr_) + offset, src, n, cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return before the DMA lands, and the groups' streams
  // are non-blocking (they do not wait for the legacy stream): finish it here.
  DDP_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}
void DeviceBuffer::copy_to_host(void* dst, size_t n, size_t offset) const {
  need_range("DeviceBuffer::copy_to_host", offset, n, bytes_);
  if (n == 0) return;
  DDP_CUDA_CHECK(cudaSetDevice(device_));
  DDP_CUDA_CHECK(cudaMemcpy(dst, static_cast<const char*>(ptr_) + offset, n, cudaMemcpyDeviceToHost));
}
void DeviceBuffer::fill_zero() {
  if (bytes_ == 0) return;
  DDP_CUDA_CHECK(cudaSetDevice(device_));
  DDP_CUDA_CHECK(cudaMemset(ptr_, 0, bytes_));
  DDP_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));  // cudaMemset is asynchronous
}

namespace detail {
namespace {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

ncclDataType_t to_nccl(DType t) {
  switch (t) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kUInt8: return ncclUint8;
  }
  throw CollectiveError("unknown dtype");
}

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kProd: return ncclProd;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kAvg: return ncclAvg;
  }
  throw CollectiveError("unknown reduce op");
}

class NcclGroup final : public GroupBase {
 public:
  explicit NcclGroup(const ProcessGroupOptions& o)
      : GroupBase(o.rank, o.world_size, Backend::kNccl, o.timeout),
        store_(o.world_size > 1 ? o.store : nullptr), abort_key_(o.name + "/nccl/abort") {
    auto deadline = detail::deadline_after(o.timeout);
    try {
      int ndev = cuda_device_count();
      if (ndev == 0)
        throw CollectiveError("no CUDA device is visible (cudaGetDeviceCount returned 0 or failed)");
      int local = o.local_rank >= 0 ? o.local_rank : o.rank;
      device_ = o.device >= 0 ? o.device : local % ndev;
      DDP_CUDA_CHECK(cudaSetDevice(device_));
      if (o.cuda_stream) {
        stream_ = static_cast<cudaStream_t>(o.cuda_stream);
      } else {
        DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        own_stream_ = true;
      }
      DDP_CUDA_CHECK(cudaMalloc(&scratch_, 16));

      ncclUniqueId id{};
      std::string key = o.name + "/nccl/unique_id";
      if (o.world_size > 1) {
        if (o.rank == 0) {
          DDP_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
          o.store->set(key, std::string(reinterpret_cast<const char*>(&id), sizeof id));
        } else {
          wait_for_keys(*o.store, {key}, deadline,
                        "waiting for rank 0's ncclUniqueId (store key " + key + ")",
                        [&] { return peer_failure(); });
          std::string v = o.store->get(key);
          if (v.size() != sizeof id)
            throw CollectiveError(fmt::format("store key {} holds {} bytes, expected an "
                                              "ncclUniqueId of {}",
                                              key, v.size(), sizeof id));
          std::copy(v.begin(), v.end(), reinterpret_cast<char*>(&id));
        }
      } else {
        DDP_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
      }
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      DDP_NCCL_CHECK(ncclCommInitRankConfig(&comm_, o.world_size, id, o.rank, &config), comm_);
      wait_comm_ready(deadline, "communicator initialisation (ncclCommInitRankConfig)",
                      /*watch_peers=*/true);
    } catch (const TimeoutError& e) {
      release(true);
      publish_failure(init_failure(e));
      throw TimeoutError(init_failure(e));
    } catch (const Error& e) {
      release(true);
      publish_failure(init_failure(e));
      throw CollectiveError(init_failure(e));
    }
  }

  ~NcclGroup() override { release(!failure().empty()); }

 protected:
  void do_all_reduce(void* data, size_t count, DType dt, ReduceOp op, TimePoint dl) override {
    if (count == 0) return;
    enqueue_and_wait(dl, "ncclAllReduce", [&] {
      DDP_NCCL_CHECK(ncclAllReduce(data, data, count, to_nccl(dt), to_nccl(op), comm_, stream_), comm_);
    });
  }
  void do_broadcast(void* data, size_t count, DType dt, int root, TimePoint dl) override {
    if (count == 0) return;
    enqueue_and_wait(dl, "ncclBroadcast", [&] {
      DDP_NCCL_CHECK(ncclBroadcast(data, data, count, to_nccl(dt), root, comm_, stream_), comm_);
    });
  }
  void do_all_gather(const void* in, void* out, size_t count, DType dt, TimePoint dl) override {
    if (count == 0) return;
    enqueue_and_wait(dl, "ncclAllGather", [&] {
      DDP_NCCL_CHECK(ncclAllGather(in, out, count, to_nccl(dt), comm_, stream_), comm_);
    });
  }
  void do_reduce_scatter(const void* in, void* out, size_t count, DType dt, ReduceOp op,
                         TimePoint dl) override {
    if (count == 0) return;
    enqueue_and_wait(dl, "ncclReduceScatter", [&] {
      DDP_NCCL_CHECK(ncclReduceScatter(in, out, count, to_nccl(dt), to_nccl(op), comm_, stream_),
                     comm_);
    });
  }
  void do_barrier(TimePoint dl) override {
    enqueue_and_wait(dl, "barrier (ncclAllReduce of one byte)", [&] {
      DDP_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclUint8, ncclMax, comm_, stream_), comm_);
    });
  }
  void on_failure(const std::string&) noexcept override {
    if (comm_) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
  }

 private:
  std::string init_failure(const Error& e) const {
    return fmt::format("ddp init_process_group (nccl) on rank {} of {}{}: {}", rank(), size(),
                       device_ >= 0 ? fmt::format(" (device {})", device_) : "", e.what());
  }

  // Tells the other ranks' initialisation to stop waiting for this one (best effort).
  void publish_failure(const std::string& why) noexcept {
    if (!store_) return;
    try {
      StoreCallDeadline bounded(kAbortNoticeBudget);
      store_->compare_set(abort_key_, "", why);  // the first failure is the root cause
    } catch (...) {
    }
  }

  // What another rank published when its initialisation failed, if it did.
  std::optional<std::string> peer_failure() {
    if (!store_ || !store_->check({abort_key_})) return std::nullopt;
    return "another rank failed: " + store_->get(abort_key_);
  }

  // Polls the communicator until it leaves ncclInProgress (non-blocking mode). With
  // watch_peers (initialisation), a failure another rank published ends it early: NCCL would
  // otherwise wait for that rank until the deadline.
  void wait_comm_ready(TimePoint dl, const char* what, bool watch_peers = false) {
    auto next_check = Clock::now() + std::chrono::milliseconds(100);
    for (;;) {
      ncclResult_t st = ncclInProgress;
      DDP_NCCL_CHECK(ncclCommGetAsyncError(comm_, &st), comm_);
      if (st == ncclSuccess) return;
      if (st != ncclInProgress)
        throw CollectiveError(fmt::format("{} failed: {}: {}", what, ncclGetErrorString(st),
                                          ncclGetLastError(comm_)));
      if (Clock::now() >= dl) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw TimeoutError(fmt::format("{} did not complete before the deadline; communicator "
                                       "aborted (a peer may be dead or unreachable)",
                                       what));
      }
      if (watch_peers && Clock::now() >= next_check) {
        next_check = Clock::now() + std::chrono::milliseconds(100);
        if (auto why = peer_failure()) {
          ncclCommAbort(comm_);
          comm_ = nullptr;
          throw CollectiveError(fmt::format("gave up {}; communicator aborted: {}", what, *why));
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  template <class Enqueue>
  void enqueue_and_wait(TimePoint dl, const char* what, Enqueue&& enqueue) {
    if (!comm_) throw CollectiveError("the NCCL communicator was aborted");
    DDP_CUDA_CHECK(cudaSetDevice(device_));
    enqueue();
    wait_comm_ready(dl, what);  // the call itself may complete asynchronously
    // Never block on the stream: poll it, and the communicator's async error, to the deadline.
    int spins = 0;
    for (;;) {
      cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) DDP_CUDA_CHECK(q);
      ncclResult_t st = ncclSuccess;
      DDP_NCCL_CHECK(ncclCommGetAsyncError(comm_, &st), comm_);
      if (st != ncclSuccess && st != ncclInProgress)
        throw CollectiveError(fmt::format("{} failed asynchronously: {}: {}", what,
                                          ncclGetErrorString(st), ncclGetLastError(comm_)));
      if (Clock::now() >= dl) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw TimeoutError(fmt::format("{} on device {} did not complete before the deadline; "
                                       "communicator aborted (a peer may be dead or stuck)",
                                       what, device_));
      }
      if (++spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void release(bool abort) noexcept {
    if (comm_) {
      if (abort) {
        ncclCommAbort(comm_);
      } else {
        // Finalize (non-blocking: poll briefly), then destroy; abort if it does not settle.
        ncclResult_t r = ncclCommFinalize(comm_);
        auto dl = Clock::now() + std::chrono::seconds(10);
        ncclResult_t st = ncclInProgress;
        while (r == ncclSuccess || r == ncclInProgress) {
          if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess || st != ncclInProgress) break;
          if (Clock::now() > dl) break;
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        if ((r == ncclSuccess || r == ncclInProgress) && st == ncclSuccess)
          ncclCommDestroy(comm_);
        else
          ncclCommAbort(comm_);
      }
      comm_ = nullptr;
    }
    if (scratch_) cudaFree(scratch_);
    scratch_ = nullptr;
    if (own_stream_ && stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  std::shared_ptr<Store> store_;  // world size > 1: where init failures are published
  std::string abort_key_;
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  bool own_stream_ = false;
  void* scratch_ = nullptr;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_nccl_group(const ProcessGroupOptions& o) {
  return std::make_unique<NcclGroup>(o);
}

}  // namespace detail
}  // namespace ddp
