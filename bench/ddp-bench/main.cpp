// ddp-bench: all_reduce performance in the style of nccl-tests' all_reduce_perf.
//
//   ddprun --standalone --nproc-per-node 2 build/bin/ddp-bench -b 8 -e 256M -f 2
//   build/bin/ddp-bench --spawn 2 -b 1K -e 64M -f 4        (no launcher: forks 2 ranks)
//
// Per message size: time per call (us, the slowest rank's average), algbw = bytes/time,
// busbw = algbw * 2(n-1)/n, and the number of wrong elements in a checked call.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ddp/ddp.hpp>

#include "spawn.hpp"

namespace {

struct Args {
  size_t min_bytes = 8;
  size_t max_bytes = 256ull << 20;
  double factor = 2;
  ddp::Backend backend = ddp::Backend::kCpu;
  ddp::Transport transport = ddp::Transport::kAuto;
  int iters = 20;
  int warmup = 5;
  ddp::DType dtype = ddp::DType::kFloat32;
  ddp::ReduceOp op = ddp::ReduceOp::kSum;
  int spawn = 0;
  bool check = true;
  size_t chunk = 0, ring = 0, small = SIZE_MAX;  // 0/SIZE_MAX: libddp defaults
  size_t slice = SIZE_MAX, slice_stage = 0;       // SIZE_MAX/0: libddp defaults
};

size_t parse_size(const std::string& s) {
  size_t pos = 0;
  double v = std::stod(s, &pos);
  std::string suf = s.substr(pos);
  double mul = 1;
  if (suf == "K" || suf == "k" || suf == "KiB") mul = 1024;
  else if (suf == "M" || suf == "m" || suf == "MiB") mul = 1024.0 * 1024;
  else if (suf == "G" || suf == "g" || suf == "GiB") mul = 1024.0 * 1024 * 1024;
  else if (!suf.empty() && suf != "B") throw ddp::UsageError("ddp-bench: bad size " + s);
  return static_cast<size_t>(v * mul);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw ddp::UsageError("ddp-bench: " + k + " needs a value");
      return argv[++i];
    };
    if (k == "-b" || k == "--minbytes") a.min_bytes = parse_size(value());
    else if (k == "-e" || k == "--maxbytes") a.max_bytes = parse_size(value());
    else if (k == "-f" || k == "--stepfactor") a.factor = std::stod(value());
    else if (k == "-n" || k == "--iters") a.iters = std::stoi(value());
    else if (k == "-w" || k == "--warmup") a.warmup = std::stoi(value());
    else if (k == "-c" || k == "--check") a.check = std::stoi(value()) != 0;
    else if (k == "--spawn") a.spawn = std::stoi(value());
    else if (k == "--chunk") a.chunk = parse_size(value());
    else if (k == "--shm-ring") a.ring = parse_size(value());
    else if (k == "--small") a.small = parse_size(value());
    else if (k == "--slice") a.slice = parse_size(value());
    else if (k == "--slice-stage") a.slice_stage = parse_size(value());
    else if (k == "--backend") {
      std::string b = value();
      if (b == "cpu") a.backend = ddp::Backend::kCpu;
      else if (b == "nccl") a.backend = ddp::Backend::kNccl;
      else throw ddp::UsageError("ddp-bench: --backend cpu|nccl");
    } else if (k == "--transport") {
      std::string t = value();
      if (t == "auto") a.transport = ddp::Transport::kAuto;
      else if (t == "tcp") a.transport = ddp::Transport::kTcp;
      else throw ddp::UsageError("ddp-bench: --transport auto|tcp");
    } else if (k == "-d" || k == "--dtype") {
      std::string t = value();
      if (t == "float" || t == "float32") a.dtype = ddp::DType::kFloat32;
      else if (t == "double" || t == "float64") a.dtype = ddp::DType::kFloat64;
      else if (t == "half" || t == "float16") a.dtype = ddp::DType::kFloat16;
      else if (t == "bfloat16") a.dtype = ddp::DType::kBFloat16;
      else if (t == "int32") a.dtype = ddp::DType::kInt32;
      else throw ddp::UsageError("ddp-bench: --dtype float|double|half|bfloat16|int32");
    } else if (k == "-h" || k == "--help") {
      std::puts("usage: ddp-bench [-b MIN] [-e MAX] [-f FACTOR] [-n|--iters N] [-w|--warmup N]\n"
                "                 [--dtype float] [--backend cpu|nccl] [--transport auto|tcp]\n"
                "                 [-c 0|1] [--spawn N] [--chunk B] [--shm-ring B] [--small B]\n"
                "                 [--slice B (0: never)] [--slice-stage B]\n"
                "sizes accept K/M/G suffixes; under ddprun the job comes from the environment");
      std::exit(0);
    } else {
      throw ddp::UsageError("ddp-bench: unknown argument " + k + " (try --help)");
    }
  }
  if (a.factor <= 1 || a.iters < 1 || a.warmup < 0 || a.min_bytes > a.max_bytes)
    throw ddp::UsageError("ddp-bench: need -f > 1, --iters >= 1, -b <= -e");
  return a;
}

void put(ddp::DType t, void* b, size_t i, double v) {
  switch (t) {
    case ddp::DType::kFloat32: static_cast<float*>(b)[i] = static_cast<float>(v); break;
    case ddp::DType::kFloat64: static_cast<double*>(b)[i] = v; break;
    case ddp::DType::kFloat16: static_cast<ddp::Half*>(b)[i] = ddp::Half::from_float(static_cast<float>(v)); break;
    case ddp::DType::kBFloat16: static_cast<ddp::BFloat16*>(b)[i] = ddp::BFloat16::from_float(static_cast<float>(v)); break;
    default: static_cast<int32_t*>(b)[i] = static_cast<int32_t>(v);
  }
}
double get(ddp::DType t, const void* b, size_t i) {
  switch (t) {
    case ddp::DType::kFloat32: return static_cast<const float*>(b)[i];
    case ddp::DType::kFloat64: return static_cast<const double*>(b)[i];
    case ddp::DType::kFloat16: return static_cast<const ddp::Half*>(b)[i].to_float();
    case ddp::DType::kBFloat16: return static_cast<const ddp::BFloat16*>(b)[i].to_float();
    default: return static_cast<const int32_t*>(b)[i];
  }
}

int bench(const Args& a, ddp::ProcessGroup& pg) {
  using Clock = std::chrono::steady_clock;
  const int n = pg.size(), r = pg.rank();
  const size_t es = ddp::dtype_size(a.dtype);
  const bool gpu = pg.backend() == ddp::Backend::kNccl;
  std::vector<uint8_t> host(a.max_bytes + es);
  std::optional<ddp::DeviceBuffer> dev;
  if (gpu) {
    const char* lr = std::getenv("LOCAL_RANK");
    int ndev = std::max(1, ddp::cuda_device_count());
    dev.emplace(a.max_bytes + es, (lr ? std::atoi(lr) : r) % ndev);
  }
  void* buf = gpu ? dev->data() : host.data();
  // Slowest rank's value (timings) or total (error counts), reduced on the host.
  auto host_reduce = [&](double v, ddp::ReduceOp op) {
    if (gpu) return v;  // rank 0's own figure on GPUs (the call is synchronous anyway)
    pg.all_reduce(&v, 1, ddp::DType::kFloat64, {.op = op});
    return v;
  };

  if (r == 0) {
    std::printf("# ddp-bench all_reduce: backend %s, %d ranks, dtype %s, op %s, iters %d, warmup %d\n",
                gpu ? "nccl" : "cpu", n, std::string(ddp::dtype_name(a.dtype)).c_str(),
                std::string(ddp::reduce_op_name(a.op)).c_str(), a.iters, a.warmup);
    std::printf("#%13s %12s %9s %11s %12s %12s %8s\n", "size(B)", "count", "type", "time(us)",
                "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  }
  double bw_sum = 0;
  int bw_n = 0;
  long long total_wrong = 0;
  for (double sz = static_cast<double>(a.min_bytes); sz <= static_cast<double>(a.max_bytes) * 1.0000001;
       sz *= a.factor) {
    size_t count = static_cast<size_t>(sz) / es;
    if (count == 0) continue;
    size_t bytes = count * es;
    // Timing runs on zeros (no overflow to inf across iterations).
    if (gpu) dev->fill_zero();
    else std::memset(host.data(), 0, bytes);
    for (int i = 0; i < a.warmup; ++i) pg.all_reduce(buf, count, a.dtype, {.op = a.op});
    pg.barrier();
    auto t0 = Clock::now();
    for (int i = 0; i < a.iters; ++i) pg.all_reduce(buf, count, a.dtype, {.op = a.op});
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / a.iters;
    us = host_reduce(us, ddp::ReduceOp::kMax);
    long long wrong = 0;
    if (a.check) {
      // Rank r contributes r + (i % 7): the sum is exact in every supported dtype.
      std::vector<uint8_t>& h = host;
      for (size_t i = 0; i < count; ++i) put(a.dtype, h.data(), i, r + static_cast<double>(i % 7));
      if (gpu) dev->copy_from_host(h.data(), bytes);
      pg.all_reduce(buf, count, a.dtype, {.op = ddp::ReduceOp::kSum});
      if (gpu) dev->copy_to_host(h.data(), bytes);
      const double base = n * (n - 1) / 2.0;
      for (size_t i = 0; i < count; ++i)
        if (get(a.dtype, h.data(), i) != base + n * static_cast<double>(i % 7)) ++wrong;
      wrong = static_cast<long long>(host_reduce(static_cast<double>(wrong), ddp::ReduceOp::kSum));
    }
    total_wrong += wrong;
    double algbw = static_cast<double>(bytes) / us / 1e3;
    double busbw = algbw * 2.0 * (n - 1) / n;
    bw_sum += busbw;
    ++bw_n;
    if (r == 0)
      std::printf("%14zu %12zu %9s %11.3f %12.3f %12.3f %8lld\n", bytes, count,
                  std::string(ddp::dtype_name(a.dtype)).c_str(), us, algbw, busbw, wrong);
    std::fflush(stdout);
  }
  if (r == 0) {
    std::printf("# Out of bounds values : %lld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %.3f GB/s\n", bw_n ? bw_sum / bw_n : 0.0);
  }
  return total_wrong ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::run_main([&] {
    Args a = parse(argc, argv);
    ddp::ProcessGroupOptions o;
    o.backend = a.backend;
    o.transport = a.transport;
    o.timeout = std::chrono::seconds(300);
    if (a.chunk) o.chunk_bytes = a.chunk;
    if (a.ring) o.shm_ring_bytes = a.ring;
    if (a.small != SIZE_MAX) o.small_message_bytes = a.small;
    if (a.slice != SIZE_MAX) o.slice_min_bytes = a.slice;
    if (a.slice_stage) o.slice_stage_bytes = a.slice_stage;
    return ddp_testing::with_process_group(a.spawn, o, [&](ddp::ProcessGroup& pg) { return bench(a, pg); });
  });
}
