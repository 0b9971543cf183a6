// Per-collective options (gloo style: one options struct per operation; the process group,
// i.e. the context, is separate). A timeout of zero means "the group's default timeout".
//
//   group.all_reduce(data, count, DType::kFloat32, {.op = ReduceOp::kAvg, .timeout = 10s});
#pragma once

#include <chrono>

#include "ddp/types.hpp"

namespace ddp {

struct AllReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  std::chrono::milliseconds timeout{0};
};

struct BroadcastOptions {
  int root = 0;
  std::chrono::milliseconds timeout{0};
};

struct AllGatherOptions {
  std::chrono::milliseconds timeout{0};
};

struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;
  std::chrono::milliseconds timeout{0};
};

struct BarrierOptions {
  std::chrono::milliseconds timeout{0};
};

}  // namespace ddp
