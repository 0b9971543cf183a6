// A scripted stand-in for the CUDA runtime and NCCL, linked into test_nccl_logic in place of
// libcudart and libnccl, so that the NCCL backend's own logic (unique-id exchange, non-blocking
// init, stream and error polling, abort at the deadline, clean shutdown, checked calls) runs on
// machines without a GPU. It implements the functions nccl_group.cpp calls, with the real
// headers' signatures:
//   - "device memory" is host memory; cudaSetDevice is per thread, as in CUDA;
//   - ranks are threads; communicators that were created from the same ncclUniqueId form one
//     clique, whose init completes only when every rank has joined;
//   - a collective completes when every rank of the clique has enqueued it (checked for
//     matching count/type/op/root), and its stream reports cudaErrorNotReady until then;
//   - failures are injected through Script;
//   - host-to-device cudaMemcpy and cudaMemset leave the device's legacy stream busy until
//     cudaStreamSynchronize(cudaStreamLegacy), as with pageable memory on a real GPU;
//   - misuse (a call on a destroyed or aborted communicator, a stream or device mismatch, a
//     freed pointer, two ranks on one device, a collective enqueued while the legacy stream
//     may still be writing its input, a blocking cudaStreamSynchronize on a collective
//     stream) is recorded in Counters::misuse.
// The real library is exercised by test_nccl (ctest label "gpu").
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>
#include <vector>

namespace fake {

struct Script {
  int device_count = 1;
  // After the last rank joins, each rank's ncclCommGetAsyncError reports ncclInProgress this
  // many more times before ncclSuccess.
  int init_polls = 3;
  // Collective calls return ncclInProgress and the communicator stays in progress for this
  // many polls (non-blocking mode).
  int enqueue_polls = 1;
  // cudaStreamQuery reports cudaErrorNotReady this many times after the work completed.
  int stream_polls = 2;
  // ncclCommFinalize leaves the communicator in progress for this many polls.
  int finalize_polls = 2;
  // Injected failures.
  bool fail_cuda_malloc = false;             // cudaMalloc -> cudaErrorMemoryAllocation
  int fail_cuda_malloc_device = -1;          // ... only on this device
  ncclResult_t fail_enqueue = ncclSuccess;   // returned by every collective call
  ncclResult_t async_error = ncclSuccess;    // reported by GetAsyncError after a collective
  bool async_error_while_running = false;    // ... only once the work is on the stream (a
                                             // kernel waiting on a dead peer)
  std::string error_text = "fake: injected failure";  // ncclGetLastError for the above
};

struct Counters {
  int inits = 0;
  int finalizes = 0;
  int destroys = 0;
  int aborts = 0;
  int live_comms = 0;
  int live_streams = 0;
  int live_allocations = 0;
  bool all_non_blocking = true;                // every init had config.blocking == 0
  std::vector<int> comm_devices;               // device of each communicator, in init order
  std::vector<ncclDataType_t> types;           // of each collective call, in order
  std::vector<ncclRedOp_t> ops;                // of each reducing collective call
  std::vector<std::string> misuse;
};

// Resets all state (call at the start of each test, with no communicator alive).
void reset(const Script& s = {});
Counters counters();

}  // namespace fake
