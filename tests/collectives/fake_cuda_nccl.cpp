// Scripted CUDA runtime + NCCL double (see fake_cuda_nccl.hpp). Every entry point takes one
// global lock; state lives until fake::reset so that stale handles are detected, not used.
#include "fake_cuda_nccl.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "ddp/types.hpp"

// The handle types are opaque in the real headers; the double gives them bodies.
struct CUstream_st {
  int device = 0;
  bool live = true;
  struct Clique* clique = nullptr;  // last work enqueued: (clique, sequence number)
  uint64_t seq = 0;
  bool pending = false;
  int polls_left = 0;
  struct ncclComm* fails = nullptr;  // work that never finishes and fails this communicator
};

struct Post {
  char kind = 0;  // 'a'll-reduce, 'b'roadcast, 'g'ather, 's'catter
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  ncclDataType_t type{};
  ncclRedOp_t op{};
  int root = 0;
  bool posted = false;
};

struct Clique {
  int nranks = 0;
  std::vector<ncclComm*> members;
  int joined = 0;
  std::map<uint64_t, std::vector<Post>> work;  // seq -> one post per rank
  std::set<uint64_t> done;
};

struct ncclComm {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  int device = 0;
  bool live = true;
  int polls_left = 0;  // GetAsyncError reports ncclInProgress this many more times
  bool finalizing = false;
  uint64_t next_seq = 0;
  ncclResult_t async_error = ncclSuccess;
  std::string last_error;
  Post deferred;  // a call that returned ncclInProgress, not yet on its stream
  cudaStream_t deferred_stream = nullptr;
};

namespace fake {
namespace {

struct State {
  Script script;
  Counters counters;
  std::map<std::string, std::shared_ptr<Clique>> cliques;  // by unique id bytes
  std::deque<std::unique_ptr<ncclComm>> comms;             // never freed before reset
  std::deque<std::unique_ptr<CUstream_st>> streams;
  std::map<void*, int> allocations;  // pointer -> device
  std::set<int> legacy_busy;          // devices whose legacy stream may still be copying
  uint64_t next_id = 1;
};

std::mutex mu;
State& state() {
  static State s;
  return s;
}
thread_local int current_device = 0;
thread_local std::string thread_last_error;

void misuse(const std::string& what) { state().counters.misuse.push_back(what); }

bool live(ncclComm* c, const char* fn) {
  for (auto& p : state().comms)
    if (p.get() == c) {
      if (!c->live) misuse(std::string(fn) + " on a destroyed or aborted communicator");
      return c->live;
    }
  misuse(std::string(fn) + " on an unknown communicator");
  return false;
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

double load(ncclDataType_t t, const void* p, size_t i) {
  switch (t) {
    case ncclUint8: return static_cast<const uint8_t*>(p)[i];
    case ncclInt32: return static_cast<const int32_t*>(p)[i];
    case ncclInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case ncclFloat16: return static_cast<const ddp::Half*>(p)[i].to_float();
    case ncclBfloat16: return static_cast<const ddp::BFloat16*>(p)[i].to_float();
    case ncclFloat32: return static_cast<const float*>(p)[i];
    case ncclFloat64: return static_cast<const double*>(p)[i];
    default: std::abort();
  }
}

void store(ncclDataType_t t, void* p, size_t i, double v) {
  switch (t) {
    case ncclUint8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); return;
    case ncclInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case ncclInt64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); return;
    case ncclFloat16: static_cast<ddp::Half*>(p)[i] = ddp::Half::from_float(static_cast<float>(v)); return;
    case ncclBfloat16:
      static_cast<ddp::BFloat16*>(p)[i] = ddp::BFloat16::from_float(static_cast<float>(v));
      return;
    case ncclFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case ncclFloat64: static_cast<double*>(p)[i] = v; return;
    default: std::abort();
  }
}

double combine(ncclRedOp_t op, double a, double b) {
  switch (op) {
    case ncclSum: case ncclAvg: return a + b;
    case ncclProd: return a * b;
    case ncclMin: return std::min(a, b);
    case ncclMax: return std::max(a, b);
    default: std::abort();
  }
}

// Reduces element i of every rank's block `block` (of `count` elements).
double reduced(const std::vector<Post>& posts, size_t block, size_t i) {
  const Post& p0 = posts[0];
  size_t at = block * p0.count + i;
  double v = load(p0.type, p0.send, at);
  for (size_t r = 1; r < posts.size(); ++r) v = combine(p0.op, v, load(p0.type, posts[r].send, at));
  if (p0.op == ncclAvg) {
    v /= static_cast<double>(posts.size());
    if (p0.type == ncclInt32 || p0.type == ncclInt64 || p0.type == ncclUint8) v = static_cast<double>(static_cast<int64_t>(v));
  }
  return v;
}

// Runs one collective once every rank has posted it (inputs are all read before any output
// is written, so in-place calls are correct).
void execute(std::vector<Post>& posts) {
  const Post& p0 = posts[0];
  const size_t n = posts.size(), es = type_size(p0.type);
  std::vector<std::vector<uint8_t>> out(n);
  for (size_t r = 0; r < n; ++r) {
    const Post& p = posts[r];
    switch (p.kind) {
      case 'a':
        out[r].resize(p.count * es);
        for (size_t i = 0; i < p.count; ++i) store(p.type, out[r].data(), i, reduced(posts, 0, i));
        break;
      case 'b':
        out[r].assign(static_cast<const uint8_t*>(posts[p.root].send),
                      static_cast<const uint8_t*>(posts[p.root].send) + p.count * es);
        break;
      case 'g':
        out[r].resize(n * p.count * es);
        for (size_t q = 0; q < n; ++q) std::memcpy(out[r].data() + q * p.count * es, posts[q].send, p.count * es);
        break;
      case 's':
        out[r].resize(p.count * es);
        for (size_t i = 0; i < p.count; ++i) store(p.type, out[r].data(), i, reduced(posts, r, i));
        break;
    }
  }
  for (size_t r = 0; r < n; ++r) std::memcpy(posts[r].recv, out[r].data(), out[r].size());
}

// Puts one rank's part of a collective on its stream; the last rank to arrive runs it.
void submit(ncclComm* comm, Post post, cudaStream_t stream) {
  State& s = state();
  Clique& c = *comm->clique;
  uint64_t seq = comm->next_seq++;
  auto& posts = c.work[seq];
  posts.resize(c.nranks);
  post.posted = true;
  posts[comm->rank] = post;
  stream->clique = &c;
  stream->seq = seq;
  stream->pending = true;
  stream->polls_left = s.script.stream_polls;
  if (std::all_of(posts.begin(), posts.end(), [](const Post& p) { return p.posted; })) {
    const Post& p0 = posts[0];
    for (const Post& p : posts)
      if (p.kind != p0.kind || p.count != p0.count || p.type != p0.type || p.op != p0.op || p.root != p0.root)
        misuse("ranks enqueued different collectives");
    execute(posts);
    c.done.insert(seq);
    c.work.erase(seq);
  }
  if (s.script.async_error != ncclSuccess) {
    if (s.script.async_error_while_running) {
      stream->fails = comm;
    } else {
      comm->async_error = s.script.async_error;
      comm->last_error = s.script.error_text;
    }
  }
}

ncclResult_t enqueue(Post post, ncclComm* comm, cudaStream_t stream, const char* fn) {
  std::lock_guard lk(mu);
  State& s = state();
  if (!live(comm, fn)) return ncclInvalidArgument;
  if (!stream || !stream->live) {
    misuse(std::string(fn) + " on a destroyed stream");
    return ncclInvalidArgument;
  }
  if (comm->polls_left > 0 || comm->clique->joined < comm->clique->nranks)
    misuse(std::string(fn) + " while the communicator is still in progress (non-blocking mode "
           "requires polling ncclCommGetAsyncError to ncclSuccess first)");
  if (stream->device != comm->device || current_device != comm->device)
    misuse(std::string(fn) + ": stream, current device and communicator device differ");
  for (const void* p : {post.send, static_cast<const void*>(post.recv)})
    if (post.count && !s.allocations.count(const_cast<void*>(p))) misuse(std::string(fn) + ": buffer is not device memory");
  if (s.legacy_busy.count(comm->device))
    misuse(std::string(fn) + " enqueued while a host-to-device copy or memset may still be "
           "running on the legacy stream, which a non-blocking stream does not wait for");
  s.counters.types.push_back(post.type);
  if (post.kind == 'a' || post.kind == 's') s.counters.ops.push_back(post.op);
  if (s.script.fail_enqueue != ncclSuccess) {
    thread_last_error = comm->last_error = s.script.error_text;
    return s.script.fail_enqueue;
  }
  comm->polls_left = s.script.enqueue_polls;
  if (comm->polls_left == 0) {
    submit(comm, post, stream);
    return ncclSuccess;
  }
  // Non-blocking mode: the work reaches the stream only once the communicator has been polled
  // back to ncclSuccess.
  comm->deferred = post;
  comm->deferred_stream = stream;
  return ncclInProgress;
}

}  // namespace

void reset(const Script& script) {
  std::lock_guard lk(mu);
  State& s = state();
  s.script = script;
  s.counters = Counters{};
  s.cliques.clear();
  s.comms.clear();
  s.streams.clear();
  for (auto& [p, device] : s.allocations) std::free(p);
  s.allocations.clear();
  s.legacy_busy.clear();
  s.next_id = 1;
}

Counters counters() {
  std::lock_guard lk(mu);
  return state().counters;
}

}  // namespace fake

using fake::mu;
using fake::state;

// ---- CUDA runtime -------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* count) {
  std::lock_guard lk(mu);
  *count = state().script.device_count;
  return *count > 0 ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaErrorInvalidValue";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorNotReady: return "device not ready";
    default: return "invalid argument";
  }
}

cudaError_t cudaSetDevice(int device) {
  std::lock_guard lk(mu);
  if (device < 0 || device >= state().script.device_count) return cudaErrorInvalidDevice;
  fake::current_device = device;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  std::lock_guard lk(mu);
  fake::State& s = state();
  if (s.script.fail_cuda_malloc || s.script.fail_cuda_malloc_device == fake::current_device)
    return cudaErrorMemoryAllocation;
  *ptr = std::malloc(std::max<size_t>(size, 1));
  s.allocations[*ptr] = fake::current_device;
  s.counters.live_allocations++;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  std::lock_guard lk(mu);
  fake::State& s = state();
  if (!ptr) return cudaSuccess;
  auto it = s.allocations.find(ptr);
  if (it == s.allocations.end()) {
    fake::misuse("cudaFree of a pointer that is not a live allocation");
    return cudaErrorInvalidValue;
  }
  s.allocations.erase(it);
  s.counters.live_allocations--;
  std::free(ptr);
  return cudaSuccess;
}

// From pageable memory, host-to-device copies and memsets may finish after they return,
// on the legacy default stream.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  std::lock_guard lk(mu);
  std::memcpy(dst, src, n);
  if (kind == cudaMemcpyHostToDevice) state().legacy_busy.insert(fake::current_device);
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int v, size_t n) {
  std::lock_guard lk(mu);
  std::memset(p, v, n);
  state().legacy_busy.insert(fake::current_device);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  std::lock_guard lk(mu);
  if (stream == nullptr || stream == cudaStreamLegacy) {
    state().legacy_busy.erase(fake::current_device);
    return cudaSuccess;
  }
  // The backend must poll its stream against a deadline, never block on it.
  fake::misuse("cudaStreamSynchronize on a collective stream (blocks without a deadline)");
  return cudaErrorInvalidValue;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  std::lock_guard lk(mu);
  fake::State& s = state();
  s.streams.push_back(std::make_unique<CUstream_st>());
  s.streams.back()->device = fake::current_device;
  *stream = s.streams.back().get();
  s.counters.live_streams++;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::lock_guard lk(mu);
  if (!stream || !stream->live) {
    fake::misuse("cudaStreamDestroy of a destroyed stream");
    return cudaErrorInvalidValue;
  }
  stream->live = false;
  state().counters.live_streams--;
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  std::lock_guard lk(mu);
  if (!stream || !stream->live) {
    fake::misuse("cudaStreamQuery of a destroyed stream");
    return cudaErrorInvalidValue;
  }
  if (!stream->pending) return cudaSuccess;
  if (stream->fails) {  // the kernel spins on a dead peer; NCCL's watchdog reports it
    stream->fails->async_error = state().script.async_error;
    stream->fails->last_error = state().script.error_text;
    return cudaErrorNotReady;
  }
  if (!stream->clique->done.count(stream->seq)) return cudaErrorNotReady;
  if (stream->polls_left > 0) {
    stream->polls_left--;
    return cudaErrorNotReady;
  }
  stream->pending = false;
  return cudaSuccess;
}

// ---- NCCL ---------------------------------------------------------------------------------

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  std::lock_guard lk(mu);
  for (auto& c : state().comms)
    if (c.get() == comm) return comm->last_error.c_str();
  return fake::thread_last_error.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::lock_guard lk(mu);
  std::memset(id, 0, sizeof *id);
  uint64_t n = state().next_id++;
  std::memcpy(id->internal, "fake-nccl-id", 12);
  std::memcpy(id->internal + 16, &n, sizeof n);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  std::lock_guard lk(mu);
  fake::State& s = state();
  if (!config || config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t)) {
    fake::misuse("ncclCommInitRankConfig: config not made from NCCL_CONFIG_INITIALIZER");
    return ncclInvalidArgument;
  }
  if (config->blocking != 0) s.counters.all_non_blocking = false;
  if (std::memcmp(id.internal, "fake-nccl-id", 12) != 0) {
    fake::misuse("ncclCommInitRankConfig: the unique id did not come from ncclGetUniqueId");
    return ncclInvalidArgument;
  }
  auto& clique = s.cliques[std::string(id.internal, sizeof id.internal)];
  if (!clique) {
    clique = std::make_shared<Clique>();
    clique->nranks = nranks;
    clique->members.assign(nranks, nullptr);
  }
  if (clique->nranks != nranks || rank < 0 || rank >= nranks || clique->members[rank]) {
    fake::misuse("ncclCommInitRankConfig: rank or size inconsistent with the clique");
    return ncclInvalidArgument;
  }
  for (ncclComm* m : clique->members)
    if (m && m->device == fake::current_device) {
      fake::thread_last_error = "Duplicate GPU detected";
      return ncclInvalidUsage;
    }
  s.comms.push_back(std::make_unique<ncclComm>());
  ncclComm* c = s.comms.back().get();
  c->clique = clique;
  c->rank = rank;
  c->device = fake::current_device;
  c->polls_left = s.script.init_polls;
  clique->members[rank] = c;
  clique->joined++;
  s.counters.inits++;
  s.counters.live_comms++;
  s.counters.comm_devices.push_back(c->device);
  *out = c;
  return ncclInProgress;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* result) {
  std::lock_guard lk(mu);
  if (!fake::live(comm, "ncclCommGetAsyncError")) return ncclInvalidArgument;
  if (comm->async_error != ncclSuccess) {
    *result = comm->async_error;
  } else if (comm->clique->joined < comm->clique->nranks) {
    *result = ncclInProgress;  // init waits for every rank
  } else if (comm->polls_left > 0) {
    if (--comm->polls_left == 0 && comm->deferred_stream) {
      fake::submit(comm, comm->deferred, comm->deferred_stream);
      comm->deferred_stream = nullptr;
    }
    *result = comm->async_error != ncclSuccess ? comm->async_error : ncclInProgress;
  } else {
    *result = ncclSuccess;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  std::lock_guard lk(mu);
  if (!fake::live(comm, "ncclCommFinalize")) return ncclInvalidArgument;
  if (comm->polls_left > 0) fake::misuse("ncclCommFinalize while the communicator is in progress");
  comm->finalizing = true;
  comm->polls_left = state().script.finalize_polls;
  state().counters.finalizes++;
  return ncclInProgress;
}

namespace {
ncclResult_t end_comm(ncclComm_t comm, const char* fn, int fake::Counters::*counter) {
  std::lock_guard lk(mu);
  if (!fake::live(comm, fn)) return ncclInvalidArgument;
  comm->live = false;
  comm->clique->members[comm->rank] = nullptr;
  state().counters.*counter += 1;
  state().counters.live_comms--;
  return ncclSuccess;
}
}  // namespace

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  {
    std::lock_guard lk(mu);
    if (fake::live(comm, "ncclCommDestroy") && comm->finalizing && comm->polls_left > 0)
      fake::misuse("ncclCommDestroy before ncclCommFinalize completed");
  }
  return end_comm(comm, "ncclCommDestroy", &fake::Counters::destroys);
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  return end_comm(comm, "ncclCommAbort", &fake::Counters::aborts);
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return fake::enqueue({'a', send, recv, count, type, op, 0, false}, comm, stream, "ncclAllReduce");
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  return fake::enqueue({'b', send, recv, count, type, ncclSum, root, false}, comm, stream,
                       "ncclBroadcast");
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  return fake::enqueue({'g', send, recv, count, type, ncclSum, 0, false}, comm, stream,
                       "ncclAllGather");
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return fake::enqueue({'s', send, recv, count, type, op, 0, false}, comm, stream,
                       "ncclReduceScatter");
}
