// nccl-raw-bench: the anchor for libddp's NCCL overhead. A bare ncclAllReduce loop on one
// GPU (world size 1, as NCCL allows one rank per GPU), each call followed by a stream
// synchronisation, which is what a blocking ddp::ProcessGroup::all_reduce amounts to.
// Prints the same columns as ddp-bench:  nccl-raw-bench [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS]
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

#define CHECK_CUDA(x)                                                                          \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)
#define CHECK_NCCL(x)                                                                           \
  do {                                                                                          \
    ncclResult_t r_ = (x);                                                                      \
    if (r_ != ncclSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, ncclGetErrorString(r_)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

size_t parse_size(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  switch (end && *end ? *end : ' ') {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return static_cast<size_t>(v);
}

}  // namespace

int main(int argc, char** argv) {
  size_t min_bytes = 8, max_bytes = 256 << 20;
  double factor = 2;
  int iters = 20, warmup = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "-b") min_bytes = parse_size(argv[i + 1]);
    else if (k == "-e") max_bytes = parse_size(argv[i + 1]);
    else if (k == "-f") factor = std::atof(argv[i + 1]);
    else if (k == "-n") iters = std::atoi(argv[i + 1]);
    else if (k == "-w") warmup = std::atoi(argv[i + 1]);
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "nccl-raw-bench: no GPU\n");
    return 77;
  }
  int dev = 0;
  ncclComm_t comm;
  CHECK_CUDA(cudaSetDevice(dev));
  CHECK_NCCL(ncclCommInitAll(&comm, 1, &dev));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* buf = nullptr;
  CHECK_CUDA(cudaMalloc(&buf, max_bytes));
  CHECK_CUDA(cudaMemset(buf, 0, max_bytes));
  std::printf("# nccl-raw-bench: ncclAllReduce float sum, 1 rank, iters %d, sync per call\n", iters);
  std::printf("#%13s %12s %11s %12s\n", "size(B)", "count", "time(us)", "algbw(GB/s)");
  for (double sz = static_cast<double>(min_bytes); sz <= static_cast<double>(max_bytes) * 1.0000001; sz *= factor) {
    size_t count = static_cast<size_t>(sz) / 4;
    if (!count) continue;
    for (int i = 0; i < warmup; ++i) {
      CHECK_NCCL(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
    }
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      CHECK_NCCL(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
    }
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    std::printf("%14zu %12zu %11.2f %12.3f\n", count * 4, count, us, static_cast<double>(count * 4) / us / 1e3);
  }
  CHECK_CUDA(cudaFree(buf));
  CHECK_NCCL(ncclCommDestroy(comm));
  return 0;
}
