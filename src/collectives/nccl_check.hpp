// Checked CUDA/NCCL calls (internal): every failure throws CollectiveError with file:line,
// the call's text and the library's own error string.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <fmt/format.h>

#include "ddp/error.hpp"

#define DDP_CUDA_CHECK(call)                                                                  \
  do {                                                                                        \
    cudaError_t ddp_err_ = (call);                                                            \
    if (ddp_err_ != cudaSuccess)                                                              \
      throw ::ddp::CollectiveError(fmt::format("{}:{}: {} failed: {} ({})", __FILE__,         \
                                               __LINE__, #call, cudaGetErrorString(ddp_err_), \
                                               cudaGetErrorName(ddp_err_)));                  \
  } while (0)

// ncclInProgress is not an error in non-blocking mode: the caller polls for completion.
#define DDP_NCCL_CHECK(call, comm)                                                            \
  do {                                                                                        \
    ncclResult_t ddp_res_ = (call);                                                           \
    if (ddp_res_ != ncclSuccess && ddp_res_ != ncclInProgress) {                              \
      const char* ddp_last_ = ncclGetLastError(comm);                                         \
      throw ::ddp::CollectiveError(fmt::format("{}:{}: {} failed: {}{}{}", __FILE__, __LINE__, \
                                               #call, ncclGetErrorString(ddp_res_),           \
                                               ddp_last_ && *ddp_last_ ? ": " : "",           \
                                               ddp_last_ ? ddp_last_ : ""));                  \
    }                                                                                         \
  } while (0)
